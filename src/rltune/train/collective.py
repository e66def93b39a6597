"""Statistics over the global batch when the step's experience is split across ranks.

Each rank holds its own prompts (whole groups), so group advantages are local; what needs
every rank is batch-wide: advantage whitening and the step's metrics. With one rank these
are plain local computations.
"""

from __future__ import annotations

import torch


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_initialized() else 1


def _comm_device() -> torch.device:
    """Where collective buffers must live: the rank's GPU under nccl, else the CPU (gloo)."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    if world_size() > 1:
        import torch.distributed as dist

        dist.barrier()


def broadcast_int(value: int, src: int = 0) -> int:
    """Rank `src`'s `value` on every rank (e.g. a seed drawn once for the whole run)."""
    if world_size() == 1:
        return int(value)
    import torch.distributed as dist

    t = torch.tensor([int(value)], dtype=torch.int64, device=_comm_device())
    dist.broadcast(t, src=src)
    return int(t.item())


def broadcast_object(obj, src: int = 0):
    """Rank `src`'s `obj` (picklable, small) on every rank (e.g. a rollout fleet's addresses)."""
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=src, device=_comm_device())
    return box[0]


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """(b,) per rank -> (b * world,) on every rank (every rank holds the same b)."""
    if world_size() == 1:
        return x
    import torch.distributed as dist

    local = x.contiguous().to(_comm_device())
    parts = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(parts, local)
    return torch.cat(parts).to(x.device)


def global_sum(values: list[float]) -> list[float]:
    if world_size() == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return t.tolist()


def global_max(values: list[float]) -> list[float]:
    """Element-wise maximum of `values` over ranks."""
    if world_size() == 1:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
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
