"""Atomic, verifiable checkpoints and exact resume.

Layout: RUN_DIR/checkpoints/step-00000010/
  actor/, critic/      DeepSpeed checkpoints (weights, optimizer, LR scheduler), per rank
  state.json           step, KL controller, sampler position, reward moments, knobs,
                       health monitor and autotune state, recipe hash
  rng-rank{R}.pt       RNG states (python, numpy, torch, the update shuffler), tensors only
  manifest.json        step, recipe hash, every file with size and sha256 (written last)
RUN_DIR/final/ (the exported policy) is written the same way, with its own manifest.json.
A checkpoint is written to a temp dir, fsynced, then renamed; a directory without a valid
manifest (killed mid-write, truncated or altered file) is skipped with a warning and the
previous good one is used. Our files load with `weights_only=True` or JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import torch

from ..models.adaptation import adaptation_of
from .collective import barrier, world_size
from .manifest import verify  # noqa: F401  (checkpoint.verify: the received-data checks live there)

CKPT_DIR = "checkpoints"
PREFIX = "step-"


def recipe_hash(recipe_dict: dict) -> str:
    return hashlib.sha256(json.dumps(recipe_dict, sort_keys=True).encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sampling_rng(rollout) -> torch.Generator | None:
    """The rollout engine's own sampling RNG (hf: rollout/hf.py), None where the engine has none."""
    return getattr(rollout, "generator", None)


def rng_state(gen: torch.Generator, sampling: torch.Generator | None = None) -> dict:
    """Every RNG stream of this rank: python, numpy, torch's global CPU one and, where torch sees a
    GPU, each CUDA device's; the update shuffler; the rollout engine's sampling RNG (`sampling`)."""
    import numpy as np

    py = random.getstate()
    np_state = np.random.get_state()
    state = {
        "python": [py[0], list(py[1]), py[2]],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype("int64")), int(np_state[2]),
                  int(np_state[3]), float(np_state[4])],
        "torch": torch.get_rng_state(),
        "shuffle": gen.get_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if sampling is not None:
        state["sampling"] = sampling.get_state()
    return state


def set_rng_state(state: dict, gen: torch.Generator, sampling: torch.Generator | None = None) -> None:
    import numpy as np

    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n[0], n[1].numpy().astype("uint32"), n[2], n[3], n[4]))
    torch.set_rng_state(state["torch"])
    gen.set_state(state["shuffle"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    if sampling is not None and state.get("sampling") is not None:
        sampling.set_state(state["sampling"])


def save(run_dir: Path, step: int, engines: dict, state: dict, gen: torch.Generator, rank: int,
         keep: int, pause=None, inflight: dict | None = None, sampling: torch.Generator | None = None) -> Path:
    """Write checkpoint `step` atomically (every rank calls this). Whatever stops it (an
    exception, a full disk, a second Ctrl-C) removes the partial temp dir; the checkpoints
    already there are never touched until the new one is complete. `pause(step)`: a test hook.
    `inflight`: rollout.asynchronous's batches generated ahead (tensors and plain data), saved as
    inflight-rank{R}.pt. `sampling`: the rollout engine's own sampling RNG, saved with the others."""
    root = run_dir / CKPT_DIR
    final = root / f"{PREFIX}{step:08d}"
    tmp = root / f".tmp-{PREFIX}{step:08d}"
    try:
        if rank == 0:
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir(parents=True)
        barrier()
        for name, engine in engines.items():
            if engine is not None:
                # LoRA: the adapter (and its optimizer state) only, and the frozen base's fingerprint
                adaptation = adaptation_of(engine)
                frozen = adaptation.checkpoint_frozen(engine)
                with _frozen_aliases_excluded(engine, frozen):
                    engine.save_checkpoint(str(tmp / name), tag="ds", save_latest=False,
                                           exclude_frozen_parameters=frozen)
                adaptation.save_base(engine, tmp / name, rank, name)
        torch.save(rng_state(gen, sampling), tmp / f"rng-rank{rank}.pt")
        if inflight:
            torch.save(inflight, tmp / f"inflight-rank{rank}.pt")
        if pause is not None:  # tests: a window in which the save is half done (faults.py)
            pause(step)
        barrier()
        if rank == 0:
            state = {**state, "world_size": world_size()}     # a resume on another world size reads it
            (tmp / "state.json").write_text(json.dumps(state, indent=1, allow_nan=True))
            write_manifest(tmp, {"step": step, "recipe_hash": state.get("recipe_hash")})
            _swap_in(tmp, final)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if rank == 0:
        _prune(root, keep)
    barrier()
    return final


def write_manifest(root: Path, header: dict) -> None:
    """manifest.json (written last): every file with its size and sha256; then fsync."""
    files = {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(root.rglob("*")) if p.is_file() and p != root / "manifest.json"}
    (root / "manifest.json").write_text(json.dumps({**header, "files": files}, indent=1))
    _fsync_tree(root)


def _swap_in(tmp: Path, final: Path) -> None:
    """Rename a complete temp dir into place; an older dir of that name is renamed away first
    and removed last, so a kill at any point leaves either the old or the new one whole."""
    old = final.with_name(final.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(root: Path, keep: int) -> None:
    ckpts = checkpoints(root.parent)
    for old in ckpts[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def checkpoints(run_dir: Path) -> list[Path]:
    """RUN_DIR/checkpoints/step-N directories, oldest first (complete or not)."""
    return sorted(p for p in (run_dir / CKPT_DIR).glob(f"{PREFIX}*") if p.is_dir() and not p.name.endswith(".old"))


def find_resumable(run_dir: Path, log) -> Path | None:
    """The newest valid checkpoint; broken ones are reported and skipped."""
    for path in reversed(checkpoints(run_dir)):
        problem = verify(path)
        if problem is None:
            return path
        log.warning("checkpoint %s is not usable: %s; trying the previous one", path, problem)
    return None


def load_tensors_only(path, map_location=None):
    """torch.load with `weights_only=True`; a file that needs more (pickled code) is refused
    with its name, never with torch's hint to pass `weights_only=False`."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError as err:
        from ..errors import UserError

        raise UserError(f"checkpoint file {path} is missing: the checkpoint does not hold what this run's engines "
                        "load (another ZeRO stage or world size, or an altered checkpoint)\n  fix: resume from "
                        "another checkpoint, or start fresh with --resume never") from err
    except Exception as err:  # noqa: BLE001
        from ..errors import UserError

        first = next((ln for ln in str(err).splitlines() if ln.strip() and "weights_only" not in ln
                      and "probably" not in ln.lower()), type(err).__name__)
        raise UserError(f"checkpoint file {path} holds more than tensors and plain data; refused to unpickle it "
                        f"(it could run code): {first.strip()[:200]}\n  fix: resume from a checkpoint you wrote "
                        "yourself, or start fresh with --resume never") from err


class _WeightsOnlyLoads:
    """Make DeepSpeed's checkpoint loader unpickle with `weights_only=True` (tensors and plain
    containers only, no code) while we restore engines. A file that needs more is refused."""

    def __enter__(self):
        from deepspeed.runtime.checkpoint_engine import torch_checkpoint_engine as tce

        self.cls, self.orig = tce.TorchCheckpointEngine, tce.TorchCheckpointEngine.load

        from deepspeed.runtime.fp16 import loss_scaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        # DeepSpeed's own plain-data types that its ZeRO optimizer states contain (an enum, a
        # named tuple, the loss-scaler records); nothing else is allowed to unpickle
        allowed = [ZeroStageEnum, fragment_address] + [
            getattr(loss_scaler, n) for n in ("LossScaler", "DynamicLossScaler") if hasattr(loss_scaler, n)]

        def safe_load(engine_self, path, map_location=None):
            with torch.serialization.safe_globals(allowed):
                return load_tensors_only(path, map_location)

        self.cls.load = safe_load
        self.allowed = allowed
        return self

    def __exit__(self, *exc):
        self.cls.load = self.orig
        return False


def saved_world_size(path: Path, state: dict) -> int:
    """The world size checkpoint `path` was written with: its state.json's `world_size`, or (written
    before rltune recorded it) the number of per-rank RNG files."""
    world = state.get("world_size")
    if isinstance(world, int) and not isinstance(world, bool) and world >= 1:
        return world
    return max(1, len(list(path.glob("rng-rank*.pt"))))


def load(path: Path, engines: dict, gen: torch.Generator, rank: int,
         sampling: torch.Generator | None = None) -> dict:
    """Restore engines and RNG from `path`; returns state.json's content. On another world size than
    the checkpoint's (docs/scale.md, "Resume on another world size"): optimizer state saved one
    shard per rank goes through DeepSpeed's universal checkpoint, a whole one (ZeRO-0, any
    precision) loads as it is (world.py); the update shuffler continues
    rank 0's stream on every rank; each rank's sampling RNG starts afresh from (seed, step, rank)."""
    from . import world as ws

    state = json.loads((path / "state.json").read_text())
    saved, world = saved_world_size(path, state), world_size()
    other = saved != world
    if other and rank == 0:
        ws.announce(path, saved, world)
    with _WeightsOnlyLoads() as loads:
        for name, engine in engines.items():
            if engine is not None:
                adaptation = adaptation_of(engine)
                adaptation.check_base(engine, path / name, name)   # LoRA: the base it was trained on
                frozen = adaptation.checkpoint_frozen(engine)      # LoRA: the trainable parameters only
                # what the checkpoint holds decides (world.py): a whole optimizer (ZeRO-0, bf16 too)
                # loads on any world size; shards written by other ranks are re-partitioned
                if ws.sharded(path / name, engine, name, saved) and other:
                    ws.load_universal(engine, path / name, rank, loads.allowed, frozen)
                else:
                    engine.load_checkpoint(str(path / name), tag="ds", load_optimizer_states=True,
                                           load_lr_scheduler_states=True, load_module_strict=not frozen)
                if frozen:
                    _check_trainable_loaded(path / name, engine, loads.allowed)
    if other:   # rank 0's update shuffler on every rank, each rank's own sampling seed
        _restore_rng(path / "rng-rank0.pt", gen)
        ws.reseed(state, rank)
        if sampling is not None:   # the engine's sampling RNG from the same (seed, step, rank)
            sampling.manual_seed(torch.initial_seed())
    elif (path / f"rng-rank{rank}.pt").exists():
        _restore_rng(path / f"rng-rank{rank}.pt", gen, sampling)
    return state


def _restore_rng(rng_file: Path, gen: torch.Generator, sampling: torch.Generator | None = None) -> None:
    try:
        set_rng_state(load_tensors_only(rng_file), gen, sampling)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, RuntimeError) as err:
        from ..errors import UserError

        raise UserError(f"checkpoint file {rng_file} is not an rltune RNG state ({type(err).__name__}: "
                        f"{str(err)[:120]})\n  fix: resume from another checkpoint, or start fresh with "
                        "--resume never") from err


@contextlib.contextmanager
def _frozen_aliases_excluded(engine, active: bool):
    """DeepSpeed's `exclude_frozen_parameters` drops frozen parameters by `named_parameters()`,
    which names a tied weight once: its alias (a tied LM head: vocab x hidden, 113 MB for SmolLM2)
    stayed in every LoRA checkpoint. While saving, every name of a frozen tensor is dropped."""
    if not active:
        yield
        return
    original = engine.module_state_dict

    def module_state_dict(*args, exclude_frozen_parameters=False, **kw):
        sd = original(*args, exclude_frozen_parameters=exclude_frozen_parameters, **kw)
        if exclude_frozen_parameters:
            for n, p in engine.module.named_parameters(remove_duplicate=False):
                if not p.requires_grad:
                    sd.pop(n, None)
        return sd

    engine.module_state_dict = module_state_dict
    try:
        yield
    finally:
        del engine.module_state_dict   # the class's method again


def _check_trainable_loaded(ckpt_dir: Path, engine, allowed: list) -> None:
    """A non-strict load (LoRA) must still have found every trainable parameter: a checkpoint
    of another adapter layout would otherwise leave fresh adapter weights in place unnoticed."""
    files = sorted((ckpt_dir / "ds").glob("mp_rank_*_model_states.pt"))
    if not files:
        return
    with torch.serialization.safe_globals(allowed):
        saved = torch.load(files[0], map_location="cpu", weights_only=True, mmap=True).get("module") or {}
    if not saved:   # ZeRO-3 keeps the weights in its optimizer shards
        return
    missing = [n for n, p in engine.module.named_parameters() if p.requires_grad and n not in saved]
    if missing:
        from ..errors import UserError

        raise UserError(f"checkpoint {ckpt_dir} has no weights for {len(missing)} trainable parameter(s) "
                        f"(e.g. {missing[0]}): it was saved with other model.lora settings")


def export_hf(actor_engine, tokenizer, out_dir: Path, rank: int, step: int | None = None,
              save_merged: bool = False) -> None:
    """The final policy as a `from_pretrained` directory (gathered from ZeRO-3 shards), written
    like a checkpoint: into final.tmp/, with a manifest.json (step, sizes, sha256), then
    renamed. A run killed meanwhile has no (or its old) final/; `--resume auto` exports again.
    What is written is the actor's adaptation's (`write_final`): the full model, or a LoRA
    adapter in PEFT format (with `save_merged` the merged model in final/merged/ too)."""
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    try:
        if rank == 0 and tmp.exists():
            shutil.rmtree(tmp)
        header = adaptation_of(actor_engine).write_final(actor_engine, tokenizer, tmp, rank, save_merged)
        if rank == 0:
            write_manifest(tmp, {"step": step, "kind": "final", **header})
            _swap_in(tmp, out_dir)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def final_problem(out_dir: Path, step: int) -> str | None:
    """None when final/ holds a complete export of step `step`, else what is wrong."""
    if not out_dir.exists():
        old = out_dir.with_name(out_dir.name + ".tmp")
        return "it is missing" + (" (final.tmp/ shows an export that did not finish)" if old.exists() else "")
    problem = verify(out_dir)
    if problem:
        return problem.replace("the save did not finish", "the export did not finish")
    try:
        saved = json.loads((out_dir / "manifest.json").read_text()).get("step")
    except (OSError, ValueError):
        return "manifest.json unreadable"
    if saved is not None and int(saved) != step:
        return f"it holds step {saved}, the run is at step {step}"
    return None
