"""Shared by the GPU checks (tests/gpu): the CUDA gate and the CLI helpers of tests/train.

Every module here is marked `gpu` and skipped where torch sees no CUDA device; nothing here
imports DeepSpeed, vLLM or flash-attn at module level, so collecting it on a CPU machine is safe."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))   # trainlib: real CLI runs

from trainlib import ROOT, cli_env, read_metrics, run_cli, tiny_recipe  # noqa: E402


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


REASON = ("no CUDA device (torch.cuda.is_available() is False): the GPU checks run on a machine with a GPU, "
          "`make test-gpu` (docs/gpu.md)")
GPU = [pytest.mark.gpu, pytest.mark.skipif(not cuda_available(), reason=REASON)]

# every GPU run: on the GPU, bf16, the hf engine (a torch + transformers image has no vLLM)
CUDA_OVERRIDES = {"trainer__device": "cuda", "trainer__precision": "bf16", "rollout__engine": "hf"}

__all__ = ["GPU", "CUDA_OVERRIDES", "ROOT", "cli_env", "read_metrics", "run_cli", "tiny_recipe", "cuda_available"]
