"""Read full (un-sharded) parameters out of a DeepSpeed engine, bucket by bucket."""

from __future__ import annotations

from typing import Iterator

import torch


def _module(engine_or_module):
    return getattr(engine_or_module, "module", engine_or_module)


def is_zero3(engine) -> bool:
    return getattr(engine, "zero_optimization_stage", lambda: 0)() == 3


def iter_full_params(engine, bucket_size: int = 64) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, full tensor) for every parameter; under ZeRO-3 gather `bucket_size`
    parameters at a time so peak memory stays at one bucket, not the whole model."""
    module = _module(engine)
    params = list(module.named_parameters())
    if not is_zero3(engine):
        for name, p in params:
            yield name, p.detach()
        return
    import deepspeed

    for i in range(0, len(params), bucket_size):
        bucket = params[i:i + bucket_size]
        with deepspeed.zero.GatheredParameters([p for _, p in bucket], modifier_rank=None):
            for name, p in bucket:
                yield name, p.detach().clone()


def full_state_dict(engine) -> dict[str, torch.Tensor]:
    """The whole state dict on CPU (gathered under ZeRO-3), for HF export."""
    module = _module(engine)
    out = {name: t.cpu().clone() for name, t in iter_full_params(engine)}
    for name, buf in module.named_buffers():
        out.setdefault(name, buf.detach().cpu().clone())
    return out
