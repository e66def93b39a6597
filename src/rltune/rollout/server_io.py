"""What travels between the trainer and its rollout servers, whatever their number (one server, a
fleet): the actor's weights in buckets, and the Experience built from the servers' answers."""

from __future__ import annotations

from .base import Sampling
from .vllm_api import torch_versions


def experience_of(prompt_ids, answers, sampling: Sampling, pad_id: int, eos_ids):
    """The Experience of a generation call from each prompt's samples (request(): ids, log-probs,
    per-token versions), prompt-major."""
    from .vllm import experience_from_samples

    samples = [s for answer in answers for s in answer]
    exp = experience_from_samples(prompt_ids, [(ids, logps) for ids, logps, _ in samples], sampling.n, pad_id, eos_ids)
    exp.versions = torch_versions([v for _, _, v in samples], exp.response_width)
    return exp


def weight_buckets(engine, actor):
    """The actor's full weights (a LoRA actor's merged) in buckets of about `sync_bucket_bytes`, as
    they are gathered (under ZeRO-3 parameter by parameter): one bucket in host memory at a time
    (ipc: a copy on the GPU)."""
    from .vllm import _with_tied_head

    weights = engine.adaptation.full_weights(actor)
    if engine.tied_embeddings:   # vLLM's CPU backend keeps its own packed copy of the head
        weights = _with_tied_head(weights, engine.adaptation.input_embedding_name(actor))
    bucket: dict = {}
    size = 0
    for name, t in weights:
        bucket[name] = (t.detach().clone() if engine.transfer == "ipc" else t.detach().to("cpu", copy=True).contiguous())
        size += bucket[name].numel() * bucket[name].element_size()
        if size >= engine.sync_bucket_bytes:
            yield bucket
            bucket, size = {}, 0
    if bucket:
        yield bucket


__all__ = ["experience_of", "weight_buckets"]
