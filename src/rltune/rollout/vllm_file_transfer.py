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

import contextlib
from dataclasses import dataclass

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)


def load_into(model, weights: list) -> None:
    """(name, tensor) pairs in checkpoint naming -> the model's own `load_weights`. vLLM 0.32 checks
    an MTP model's completeness on every call (off here: one update carries part of the model);
    vLLM 0.26 has no such check."""
    try:
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check
    except ImportError:
        disable_mtp_completeness_check = contextlib.nullcontext
    with disable_mtp_completeness_check():
        model.load_weights(weights)


class SentOverHTTP:
    """vLLM 0.26 declares the trainer's side abstract on the worker's engine class (0.32 moved it to
    a trainer class): rltune's trainer sends over the server's HTTP routes (rollout/vllm_server.py)."""

    @staticmethod
    def trainer_send_weights(iterator, trainer_args) -> None:
        raise NotImplementedError("rltune's trainer sends weights over the server's HTTP routes (rollout/vllm_server.py)")


@dataclass
class FileInitInfo(WeightTransferInitInfo):
    """Nothing to set up: each update names its file."""


@dataclass
class FileUpdateInfo(WeightTransferUpdateInfo):
    path: str = ""


class FileWeightTransferEngine(SentOverHTTP, WeightTransferEngine[FileInitInfo, FileUpdateInfo]):
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
        load_into(self.model, weights)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        pass
