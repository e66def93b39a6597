"""rollout.server.weight_transfer: ipc (vLLM's own backend: CUDA IPC handles of the trainer's tensors
to a server on the same GPU). The GPU path itself waits for a device (docs/gpu.md); here: the
payload vLLM 0.26's IPCWeightTransferUpdateInfo takes, the backend the server is started with, and
the refusals where IPC cannot work, at lint and at start."""

from __future__ import annotations

import base64
import pickle

import pytest
import torch

from rltune.rollout.server import ServerError
from rltune.rollout.vllm_ipc import update_info


def test_the_payload_is_what_vllms_ipc_backend_reads():
    tensors = {"model.embed_tokens.weight": torch.zeros(4, 3, dtype=torch.bfloat16),
               "lm_head.weight": torch.ones(2, 3)}
    seen = []

    def reduce(t):   # stands in for torch's reduce_tensor on a CUDA tensor: (rebuild, args)
        seen.append(t)
        return "rebuild", ("storage", t.shape, t.dtype, 0, "handle", len(seen), 0)

    info = update_info(tensors, reduce=reduce, gpu_uuid="GPU-1")
    assert info["names"] == list(tensors)
    assert info["dtype_names"] == ["bfloat16", "float32"]          # getattr(torch, name) on the server
    assert info["shapes"] == [[4, 3], [2, 3]]
    handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
    assert [list(h) for h in handles] == [["GPU-1"], ["GPU-1"]]    # one per tensor, keyed by the GPU's UUID
    assert [h["GPU-1"][5] for h in handles] == [1, 2] and seen == list(tensors.values())
    assert set(info) == {"names", "dtype_names", "shapes", "ipc_handles_pickled"}


def _recipe(device="auto", **server):
    from rltune.recipe.schema import Recipe

    return Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                                  "reward": {"functions": ["builtin:exact_answer"]}, "trainer": {"device": device},
                                  "rollout": {"engine": "vllm-server", "server": server}})


def test_lint_refuses_ipc_on_a_cpu_or_with_the_server_on_other_gpus():
    from rltune.recipe.rules import run_rules

    def hits(recipe):
        return [h for rl, h in run_rules(recipe) if rl.id == "vllm-server-unsupported"
                and h.path == "rollout.server.weight_transfer"]

    cpu = _recipe("cpu", weight_transfer="ipc")
    assert hits(cpu) and "the trainer runs on the CPU" in hits(cpu)[0].message
    other = _recipe("cuda", weight_transfer="ipc", devices=[1])
    assert hits(other) and "other GPUs" in hits(other)[0].message
    assert not hits(_recipe("cuda", weight_transfer="ipc")) and not hits(_recipe("auto", weight_transfer="ipc"))


def test_the_engine_refuses_ipc_on_a_cpu_before_starting_anything(monkeypatch):
    from rltune.models import load_tokenizer, resolve_model_dir
    from rltune.rollout import vllm_server

    started = []
    monkeypatch.setattr(vllm_server.ServerProcess, "start", lambda self: started.append(self) or self)
    d = resolve_model_dir("builtin:tiny-llama")
    with pytest.raises(ServerError) as e:
        vllm_server.VLLMServerRollout(d, load_tokenizer(d), _recipe(weight_transfer="ipc").rollout, device="cpu")
    assert "fix: rollout.server.weight_transfer: file" in str(e.value) and not started


def test_the_server_is_started_with_vllms_ipc_backend():
    from rltune.rollout.vllm_server import backend_name

    assert [backend_name(t) for t in ("file", "gloo", "ipc")] == ["rltune_file", "rltune_gloo", "ipc"]
