"""Resume on another world size: a checkpoint written by N ranks continues on M.

What depends on the world size, and what a resume on another one does with it:
  - the data position: none. The sampler's cursor counts prompts of the global order, and a step
    draws rollout.batch_size / group_size prompts whatever the world size (each rank takes its
    slice), so the run continues the same prompt stream: no prompt is seen twice or skipped.
  - state.json (KL controller, reward moments, knobs, monitor): written once, by rank 0, from
    values reduced over the ranks: restored as it is.
  - the engines' weights and optimizer state: decided by what the role's checkpoint holds, checked
    against what DeepSpeed does for the engine (`saves_shards`). An optimizer kept whole (ZeRO
    stage 0, fp32 and bf16/fp16 alike: DeepSpeed wraps a 16-bit ZeRO-0 optimizer in its
    FP16_UnfusedOptimizer, saved in mp_rank_00_model_states.pt with its fp32 master weights) is
    loaded as on the same world size. One saved one shard per rank (`*optim_states.pt`: ZeRO
    1-3, and DeepSpeed's BF16_Optimizer where it picks one) goes through DeepSpeed's universal
    checkpoint (deepspeed.checkpoint.ds_to_universal): rank 0 converts the engine's files into a
    temporary folder beside the checkpoint (every file read with `weights_only=True`, as every
    checkpoint load in rltune), every rank loads its new shard from it, the folder is removed.
    A checkpoint whose files do not fit the engine (shards where DeepSpeed keeps the optimizer
    whole, none where it shards it, not one shard per rank that wrote it) is refused with one
    message before DeepSpeed reads it (`sharded`).
  - the RNG streams: the update shuffler (the same on every rank) continues rank 0's stream; the
    sampling RNG of each rank (python, numpy, torch) starts afresh from (seed, step, rank): there
    is no per-rank stream to continue when the ranks are not the same ones. A resume on the same
    world size restores every rank's own streams exactly.
So the continued run is the same run in everything that does not depend on which rank sampled
which sequence; it cannot equal an uninterrupted run of the new world size token for token.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import random
import shutil
import stat
from pathlib import Path

import torch

from ..errors import UserError
from .collective import barrier
from .console import LOG


OPTIM_SHARDS = "*optim_states.pt"      # DeepSpeed's per-rank optimizer files (ds_to_universal globs the same)


def shards(role_dir: Path) -> list[str]:
    """The names of the optimizer shards in a role's checkpoint (`ds/*optim_states.pt`, one per
    rank that wrote it); none where the optimizer is whole in the model-states file. A received
    checkpoint is untrusted: its names are listed, nothing in it is followed or opened, and a
    link or anything but a regular file is not a shard."""
    ds = role_dir / "ds"
    for d in (role_dir, ds):
        try:
            if not stat.S_ISDIR(os.lstat(d).st_mode):
                return []
        except OSError:
            return []
    with os.scandir(ds) as entries:
        return sorted(e.name for e in entries
                      if fnmatch.fnmatchcase(e.name, OPTIM_SHARDS) and e.is_file(follow_symlinks=False))


def saves_shards(engine) -> bool:
    """Whether DeepSpeed saves this engine's optimizer state one shard per rank. DeepSpeed 0.19.8
    decides it by the optimizer it built (engine._configure_checkpointing: `save_zero_checkpoint`
    only for one with a `dp_process_group`): a ZeRO optimizer (stage 1-3), or its BF16_Optimizer
    (bf16 with fp32 gradient accumulation at stage 1, or pipeline parallelism). At stage 0 the
    optimizer is whole whatever the precision: fp32 keeps the torch optimizer, bf16/fp16 with the
    model's dtype for gradients (rltune's) wrap it in FP16_(Unfused)Optimizer
    (_do_optimizer_sanity_check: DDP_BFLOAT16/FP16), saved in mp_rank_00_model_states.pt."""
    return hasattr(getattr(engine, "optimizer", None), "dp_process_group")


def sharded(role_dir: Path, engine, role: str, saved_world: int) -> bool:
    """Whether the role's checkpoint holds its optimizer state one shard per rank; a checkpoint
    whose files do not fit what DeepSpeed does for `engine` is refused with a message (it would
    fail inside DeepSpeed with a missing file or a None state)."""
    found = shards(role_dir)
    expected = saves_shards(engine)
    stage = engine.zero_optimization_stage()
    fix = ("resume with the ZeRO stage it was written with, or from another checkpoint, or start fresh with "
           "--resume never")
    where = f"checkpoint {role_dir.parent}: {role}/ds"
    if found and not expected:
        raise UserError(f"{where} holds the optimizer state one shard per rank ({len(found)} {OPTIM_SHARDS} "
                        f"files: ZeRO 1-3), but this run's {role} (ZeRO-{stage}) keeps it whole: the ZeRO stage "
                        f"changed since it was written, or the checkpoint was altered\n  fix: {fix}")
    if expected and not found:
        raise UserError(f"{where} holds no optimizer shard ({OPTIM_SHARDS}), but this run's {role} (ZeRO-{stage}) "
                        f"saves its optimizer state one shard per rank: it was written at ZeRO-0 (the optimizer "
                        f"whole in mp_rank_00_model_states.pt) or lost its shard files\n  fix: {fix}")
    if found and len(found) != saved_world:
        raise UserError(f"{where} holds {len(found)} optimizer shard(s) ({OPTIM_SHARDS}), but it was written by "
                        f"{saved_world} rank(s), one shard each: the checkpoint is incomplete or altered\n"
                        "  fix: resume from another checkpoint, or start fresh with --resume never")
    return bool(found)


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
    LOG.info("resuming %s, written by %d rank(s), on %d: optimizer state saved one shard per rank is "
             "re-partitioned, each rank's sampling RNG starts from (seed, step, rank) (docs/scale.md)",
             path.name, saved, world)
