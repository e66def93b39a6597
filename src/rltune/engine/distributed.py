"""Process-group setup for DeepSpeed on CPU (gloo) and GPU (nccl)."""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: str            # "cpu" or "cuda:N"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_device(requested: str) -> str:
    if requested == "cpu":
        return "cpu"
    import torch

    if requested == "cuda" or (requested == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise RuntimeError("trainer.device: cuda but no CUDA device is visible; use trainer.device: auto")
        return "cuda"
    return "cpu"


def init_distributed(requested_device: str = "auto", timeout_s: float = 1800.0) -> DistInfo:
    """Initialise torch.distributed through DeepSpeed (one process works without a launcher).
    `timeout_s` bounds every collective: gloo raises on the waiting rank; NCCL's watchdog aborts
    it (TORCH_NCCL_ASYNC_ERROR_HANDLING=1), so a dead or stalled peer never hangs the job."""
    device_kind = pick_device(requested_device)
    if device_kind == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # a single process started without a launcher: give it a world of one
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", str(_free_port())))
    import deepspeed
    import deepspeed.ops

    # training never uses the shared-memory comm op; skip its ~50 s JIT compile on CPU
    compat = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compat, dict):
        compat["deepspeed_shm_comm"] = False
    import torch.distributed as dist

    if not dist.is_initialized():
        from datetime import timedelta

        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        deepspeed.init_distributed(dist_backend="gloo" if device_kind == "cpu" else "nccl",
                                   verbose=False, timeout=timedelta(seconds=float(timeout_s)))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device_kind == "cuda":
        import torch

        torch.cuda.set_device(local_rank)
        return DistInfo(rank, world, local_rank, f"cuda:{local_rank}")
    return DistInfo(rank, world, local_rank, "cpu")


def shutdown_distributed(clean: bool = True) -> None:
    """Tear a multi-rank process group down before the interpreter exits.

    Left to interpreter exit, gloo's worker threads can be destroyed while still joinable
    (`terminate called without an active exception`, SIGABRT on a rank that had finished its
    work). `clean`: every rank got here the normal way, so a barrier first keeps one rank from
    closing its connections while a peer is still inside the last collective; after an error
    the peers may never arrive, so no barrier. A world of one is left as it is: nothing to race,
    and in-process callers (tests) build several runs on the same process group.
    """
    import sys

    if "torch.distributed" not in sys.modules:
        return
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() < 2:
        return
    if clean:
        try:
            if dist.get_backend() == "gloo":  # a peer that never arrives is named, not waited on forever
                from datetime import timedelta

                dist.monitored_barrier(timeout=timedelta(minutes=5))
            else:
                dist.barrier()
        except RuntimeError:
            pass  # the run's own result stands; tearing down is all that is left
    dist.destroy_process_group()


PEER_LOST = ("Timed out waiting", "Connection closed by peer", "Connection reset by peer", "Read error",
             "Watchdog caught collective operation timeout")


def peer_failure(err: BaseException) -> str | None:
    """How a collective failed because of another rank ("timed out" or "lost its connection"), or
    None for any other error."""
    text = str(err)
    if not isinstance(err, RuntimeError) or not any(m in text for m in PEER_LOST):
        return None
    return "timed out waiting for the other ranks" if "Timed out" in text or "timeout" in text else \
        "lost its connection to another rank"


@contextmanager
def process_group(requested_device: str = "auto", timeout_s: float = 1800.0):
    """`with process_group(device) as dist:` a run's ranks, torn down when the block ends (with a
    barrier when it ends normally, without one after an exception)."""
    dist = init_distributed(requested_device, timeout_s)
    clean = False
    try:
        yield dist
        clean = True
    finally:
        shutdown_distributed(clean)
