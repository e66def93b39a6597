"""Resume on another world size: a checkpoint written by N ranks continues on M.

What depends on the world size, and what a resume on another one does with it:
  - the data position: none. The sampler's cursor counts prompts of the global order, and a step
    draws rollout.batch_size / group_size prompts whatever the world size (each rank takes its
    slice), so the run continues the same prompt stream: no prompt is seen twice or skipped.
  - state.json (KL controller, reward moments, knobs, monitor): written once, by rank 0, from
    values reduced over the ranks: restored as it is.
  - the engines' weights and optimizer state: ZeRO stage 0 keeps them whole in one file, loaded as
    on the same world size. ZeRO 1-3 (and a bf16 ZeRO-0 engine, whose optimizer DeepSpeed
    partitions) keep one optimizer shard per rank: they go through DeepSpeed's universal
    checkpoint (deepspeed.checkpoint.ds_to_universal): rank 0 converts the engine's files into a
    temporary folder beside the checkpoint (every file read with `weights_only=True`, as every
    checkpoint load in rltune), every rank loads its new shard from it, the folder is removed.
  - the RNG streams: the update shuffler (the same on every rank) continues rank 0's stream; the
    sampling RNG of each rank (python, numpy, torch) starts afresh from (seed, step, rank): there
    is no per-rank stream to continue when the ranks are not the same ones. A resume on the same
    world size restores every rank's own streams exactly.
So the continued run is the same run in everything that does not depend on which rank sampled
which sequence; it cannot equal an uninterrupted run of the new world size token for token.
"""

from __future__ import annotations

import contextlib
import random
import shutil
from pathlib import Path

import torch

from .collective import barrier
from .console import LOG


def partitioned(engine) -> bool:
    """Whether the engine's optimizer state is saved one shard per rank."""
    return engine.zero_optimization_stage() >= 1 or bool(engine.bfloat16_enabled())


@contextlib.contextmanager
def _tensors_only_torch_load(allowed: list):
    """DeepSpeed's universal converter calls torch.load itself: force weights_only=True there too."""
    orig = torch.load

    def safe(f, *args, **kw):
        kw["weights_only"] = True
        with torch.serialization.safe_globals(allowed):
            return orig(f, *args, **kw)

    torch.load = safe
    try:
        yield
    finally:
        torch.load = orig


def _convert(ds_dir: Path, out: Path, allowed: list) -> None:
    import argparse

    from deepspeed.checkpoint import ds_to_universal

    args = argparse.Namespace(input_folder=str(ds_dir), output_folder=str(out), num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
    with _tensors_only_torch_load(allowed), contextlib.redirect_stdout(None):
        ds_to_universal.main(args)


def load_universal(engine, role_dir: Path, rank: int, allowed: list, frozen: bool) -> None:
    """Load a role whose optimizer state is partitioned, written by another number of ranks: rank 0
    converts it to DeepSpeed's universal format in a folder of our own beside the checkpoint, every
    rank loads its new shard from it, the folder is removed."""
    tmp = role_dir.parent.parent / f".universal-{role_dir.parent.name}-{role_dir.name}"
    if rank == 0:
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink()
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _convert(role_dir / "ds", tmp / "ds", allowed)
    barrier()
    engine._config.load_universal_checkpoint = True
    try:
        engine.load_checkpoint(str(tmp), tag="ds", load_optimizer_states=True, load_lr_scheduler_states=True,
                               load_module_strict=not frozen)
    finally:
        engine._config.load_universal_checkpoint = False
    barrier()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)


def reseed(state: dict, rank: int) -> None:
    """Each rank's sampling RNG (python, numpy, torch) from (seed, step, rank)."""
    import numpy as np

    seed = int(state.get("seed") or 0) * 1_000_003 + int(state.get("step", 0)) * 1_009 + rank
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def announce(path: Path, saved: int, world: int) -> None:
    LOG.info("resuming %s, written by %d rank(s), on %d: the optimizer state is re-partitioned, each rank's "
             "sampling RNG starts from (seed, step, rank) (docs/scale.md)", path.name, saved, world)
