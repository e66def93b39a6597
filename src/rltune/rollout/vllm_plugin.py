"""rltune's vLLM plugin (entry point `vllm.general_plugins`, see pyproject.toml): registers the
weight-transfer backends `rltune_file` and `rltune_gloo` in every vLLM process (API server,
engine core, workers).

vLLM's own backends (`nccl`, `ipc`) are CUDA-only. `rltune_file` moves weights through a
safetensors file the trainer writes (in /dev/shm where there is one) and the server's workers
read, so a CPU server takes weights through the same RL API calls a GPU one does
(`/start_weight_update`, `/update_weights`, `/finish_weight_update`; rollout/vllm_server.py).
The file must be on a filesystem both sides see: the same machine. `rltune_gloo` broadcasts the
weights over TCP from the trainer to the server's workers in a gloo group of their own (a server
on another machine). The worker sides are `rltune.rollout.vllm_file_transfer` and
`vllm_gloo_transfer` (imported by vLLM only when the backend is used).

This module imports nothing from vLLM at import time: vLLM loads it in every process.
"""

from __future__ import annotations

BACKEND = "rltune_file"
BACKENDS = {"file": ("rltune_file", "rltune.rollout.vllm_file_transfer", "FileWeightTransferEngine"),
            "gloo": ("rltune_gloo", "rltune.rollout.vllm_gloo_transfer", "GlooWeightTransferEngine")}


def register() -> None:
    """Called by vLLM once per process; registering twice is refused by vLLM, so skip then."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except Exception:  # noqa: BLE001 - a vLLM without weight transfer: nothing to register
        return
    for name, module, cls in BACKENDS.values():
        if name not in getattr(WeightTransferEngineFactory, "_registry", {}):
            WeightTransferEngineFactory.register_engine(name, module, cls)
