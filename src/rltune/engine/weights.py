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


def persistent_buffers(module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, buffer) for each buffer `module.state_dict()` holds: a non-persistent one (a module's
    `_non_persistent_buffers_set`, e.g. the rotary embedding's inv_freq, rebuilt from the config
    at load) is not part of the model's weights, and vLLM refuses a checkpoint that names it."""
    for mod_name, mod in module.named_modules(remove_duplicate=False):
        skip = getattr(mod, "_non_persistent_buffers_set", set())
        for name, buf in mod._buffers.items():
            if buf is not None and name not in skip:
                yield (f"{mod_name}.{name}" if mod_name else name), buf


def full_state_dict(engine) -> dict[str, torch.Tensor]:
    """The whole state dict on CPU (gathered under ZeRO-3), for HF export: exactly the keys
    `module.state_dict()` has (parameters, a tied one under each of its names, and persistent
    buffers), so save_pretrained writes what it writes for the model itself."""
    module = _module(engine)
    full = {name: t.cpu().clone() for name, t in iter_full_params(engine)}
    first: dict[int, str] = {}
    out = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        out[name] = full[first.setdefault(id(p), name)]   # a tied parameter: the same tensor
    for name, buf in persistent_buffers(module):
        out.setdefault(name, buf.detach().cpu().clone())
    return out
