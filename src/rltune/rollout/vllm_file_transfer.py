"""The worker side of the `rltune_file` weight-transfer backend (vllm_plugin.py registers it).

Runs inside a vLLM server's workers: imported by vLLM's factory when the server was started with
`--weight-transfer-config '{"backend": "rltune_file"}'`. An update is one safetensors file per
`/update_weights` call, `{"update_info": {"path": ...}}`, written by the trainer
(rollout/vllm_server.py) in Hugging Face checkpoint naming. The file is read with safetensors
(no pickle: nothing in it can run code) and loaded with the model's own `load_weights` between
vLLM's layer-wise reload start and finish, as vLLM's `ipc` backend does: the CPU backend repacks
its linear weights at the finish.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)


@dataclass
class FileInitInfo(WeightTransferInitInfo):
    """Nothing to set up: each update names its file."""


@dataclass
class FileUpdateInfo(WeightTransferUpdateInfo):
    path: str = ""


class FileWeightTransferEngine(WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
    init_info_cls = FileInitInfo
    update_info_cls = FileUpdateInfo

    def init_transfer_engine(self, init_info: FileInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: FileUpdateInfo) -> None:
        from safetensors import safe_open

        if not update_info.path:
            raise ValueError("rltune_file: update_info.path is empty")
        with safe_open(update_info.path, framework="pt", device="cpu") as f:
            weights = [(name, f.get_tensor(name).to(self.device)) for name in f.keys()]
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        with disable_mtp_completeness_check():
            self.model.load_weights(weights)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        pass
