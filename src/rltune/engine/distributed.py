"""Process-group setup for DeepSpeed on CPU (gloo) and GPU (nccl)."""

from __future__ import annotations

import os
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


@contextmanager
def _env(**values: str):
    """os.environ with `values` set inside the block, as it was after it."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _init_alone(backend: str, timeout) -> None:
    """A world of one, with nothing another host can reach (issue 45 item 2): torch's TCPStore
    listens on every interface whatever MASTER_ADDR says, and anyone who reached it could read
    and write its keys and store as much as they liked in the trainer. One process has no peer to
    meet, so its store is a HashStore (no socket). Its gloo group's own listener (gloo opens one
    even for one rank) binds the loopback interface; NCCL's bootstrap too, unless the user chose
    an interface (NCCL_SOCKET_IFNAME). Groups made later in the process (the rollout server's
    weight-transfer group) choose their own interface."""
    import deepspeed
    import torch.distributed as dist

    if backend == "nccl":
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    with _env(GLOO_SOCKET_IFNAME="lo", TORCH_GLOO_SOCKET_IFNAME="lo"):
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=timeout)  # takes the group as it is
        try:   # DeepSpeed's copy of the world, made once per process for every engine's data-parallel group
            from deepspeed.utils import groups

            groups._clone_world_group()
        except Exception:  # noqa: BLE001 - another DeepSpeed: its copy is made later, on the default interface
            pass


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
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    alone = os.environ.get("WORLD_SIZE", "1") == "1"
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
        backend, timeout = "gloo" if device_kind == "cpu" else "nccl", timedelta(seconds=float(timeout_s))
        if alone:
            _init_alone(backend, timeout)
        else:
            deepspeed.init_distributed(dist_backend=backend, verbose=False, timeout=timeout)
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
