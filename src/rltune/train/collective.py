"""Statistics over the global batch when the step's experience is split across ranks.

Each rank holds its own prompts (whole groups), so group advantages are local; what needs
every rank is batch-wide: advantage whitening and the step's metrics. With one rank these
are plain local computations.

A thread may take its collectives to a group of its own (`on_group`): generation ahead
(pipeline.py) runs steps 1-2 in a producer thread on every rank while the trainer thread runs
the update's collectives, and two threads must never share one group (each group's calls must
come in the same order on every rank). `local()` makes a thread's collectives local to its rank.
"""

from __future__ import annotations

import contextlib
import threading

import torch

_THREAD = threading.local()   # .group: this thread's process group (None: the default); .local: no collectives


def _group():
    return getattr(_THREAD, "group", None)


def on_group(group) -> None:
    """This thread's collectives go to `group` from now on (a producer thread's own gloo group)."""
    _THREAD.group = group


@contextlib.contextmanager
def local():
    """This thread's collectives are its rank's alone while inside (world_size() is 1): for work
    one rank does by itself whose global figures nobody reads (async regeneration)."""
    before = getattr(_THREAD, "local", False)
    _THREAD.local = True
    try:
        yield
    finally:
        _THREAD.local = before


def world_size() -> int:
    import torch.distributed as dist

    if getattr(_THREAD, "local", False) or not dist.is_initialized():
        return 1
    return dist.get_world_size(_group())


def _comm_device() -> torch.device:
    """Where collective buffers must live: the rank's GPU under nccl, else the CPU (gloo)."""
    import torch.distributed as dist

    if dist.get_backend(_group()) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist

        dist.barrier(group=_group())


def broadcast_int(value: int, src: int = 0) -> int:
    """Rank `src`'s `value` on every rank (e.g. a seed drawn once for the whole run)."""
    if world_size() == 1:
        return int(value)
    import torch.distributed as dist

    t = torch.tensor([int(value)], dtype=torch.int64, device=_comm_device())
    dist.broadcast(t, src=src, group=_group())
    return int(t.item())


def broadcast_object(obj, src: int = 0):
    """Rank `src`'s `obj` (picklable, small) on every rank (e.g. a rollout fleet's addresses)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src, device=_comm_device(), group=_group())
    return box[0]


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """(b,) per rank -> (b * world,) on every rank (every rank holds the same b)."""
    if world_size() == 1:
        return x
    import torch.distributed as dist

    local = x.contiguous().to(_comm_device())
    parts = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(parts, local, group=_group())
    return torch.cat(parts).to(x.device)


def global_sum(values: list[float]) -> list[float]:
    if world_size() == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, group=_group())
    return t.tolist()


def global_max(values: list[float]) -> list[float]:
    """Element-wise maximum of `values` over ranks."""
    if world_size() == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_group())
    return t.tolist()


def global_whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`masked_whiten` with the mean and unbiased variance of the valid tokens of all ranks:
    (B, T) -> (B, T), 0 at masked positions."""
    from ..algo import masked_whiten

    if world_size() == 1:
        return masked_whiten(x, mask)
    m = mask.bool()
    xs = x[m].double()
    s, sq, n = global_sum([float(xs.sum()), float((xs * xs).sum()), float(xs.numel())])
    mean = s / max(n, 1.0)
    var = (sq - n * mean * mean) / max(n - 1.0, 1.0)
    y = (x - mean) * torch.rsqrt(torch.tensor(max(var, 0.0) + 1e-8, dtype=x.dtype))
    return torch.where(m, y, torch.zeros_like(y))
