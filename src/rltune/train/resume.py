"""What a resume continues from, and what a changed recipe may change.

`choose_checkpoint`: `--resume auto` takes the newest checkpoint whose manifest checks out and
refuses (never starts over) when every one is broken; `--resume PATH` names what is wrong with
PATH. `recipe_changes` / `check_changes` / `apply_changes`: every key that differs from the
checkpoint's recipe is either free (bookkeeping: no flag needed), live (allowed with
`--allow-recipe-change` and applied to the restored state: the LR schedule's base lr, the KL
controller, the knobs, the optimizer's hyper-parameters) or fixed for the life of a run
(refused with the reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..recipe.knobs import KNOB_KEYS
from . import checkpoint as ckpt
from .rundir import check_path
from .setup import TrainError

# bookkeeping that never changes what is trained: not a change at all (a copied or moved run
# dir has another output_dir; raising max_steps continues a finished run)
FREE = ("trainer.max_steps", "trainer.save_every", "trainer.keep_checkpoints", "trainer.output_dir",
        "trainer.eval_every", "trainer.threads", "trainer.save_merged", "rollout.lora_sync", "logging.", "preset",
        "lint.", "trainer.nproc", "trainer.nnodes")   # world size: a resume re-partitions (checkpoint.load)

_WEIGHTS = "the checkpoint holds this model's weights (and its token ids)"
_STEP = "a step's size and update count are fixed for a run: the data position and the LR schedule count in them"
_DATA = "the saved data position indexes this data set in this order"
_ZERO = "the optimizer state is saved in this ZeRO layout"
# cannot change in the middle of a run, --allow-recipe-change or not
FIXED = {
    "model.policy": _WEIGHTS, "model.critic": _WEIGHTS, "model.reference": "the KL anchor of the run",
    "model.tokenizer": _WEIGHTS, "model.trust_remote_code": _WEIGHTS,
    "model.lora": "the checkpoint holds this adapter layout (or, without LoRA, full weights) and its optimizer state",
    "algorithm.name": "the optimizer state, critic and advantages belong to the algorithm the run started with",
    "algorithm.group_size": _STEP, "rollout.batch_size": _STEP, "train.batch_size": _STEP,
    "train.updates_per_step": _STEP, "train.ppo_epochs": _STEP,
    "data.train": _DATA, "data.prompt_key": _DATA, "data.shuffle": _DATA, "data.drop_last": _DATA,
    "data.builtin_size": _DATA, "data.builtin_digits": _DATA,
    "actor.zero_stage": _ZERO, "critic.zero_stage": _ZERO,
    "actor.offload_optimizer": _ZERO, "critic.offload_optimizer": _ZERO,
    "trainer.precision": "weights, optimizer state and loss scale are saved in this precision",
    "trainer.seed": "the data order and RNG streams come from it (a resume restores them)",
}
# optimizer hyper-parameters a checkpoint's optimizer state would otherwise bring back
_OPT_KEYS = ("weight_decay", "betas", "eps")
_MISSING = object()


class ResumeInputError(TrainError):
    """`--resume PATH` names no checkpoint: input that cannot be used (exit code 2)."""

    exit_code = 2


@dataclass
class Change:
    key: str
    old: object
    new: object

    def __str__(self) -> str:
        old = "(not in the checkpoint's recipe)" if self.old is _MISSING else repr(self.old)
        return f"{self.key}: {old} -> {self.new!r}"


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _is_free(key: str) -> bool:
    return any(key == f or (f.endswith(".") and key.startswith(f)) for f in FREE)


def recipe_changes(old: dict, new: dict) -> list[Change]:
    """Every key whose value differs between the checkpoint's recipe and this one, free keys
    left out (`model.lora` compared as a whole)."""
    out = []
    # model.lora as one key: turning LoRA on or off, or changing its layout, is one fixed change
    old_model, new_model = old.get("model") or {}, new.get("model") or {}
    if "lora" in old_model and old_model.get("lora") != new_model.get("lora"):
        out.append(Change("model.lora", old_model.get("lora"), new_model.get("lora")))
    a, b = _flatten(old), _flatten(new)
    for key in sorted(set(a) | set(b)):
        if _is_free(key) or key == "model.lora" or key.startswith("model.lora."):
            continue
        va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
        if vb is _MISSING or (va is _MISSING and vb is None):
            continue  # a key this rltune no longer has, or a new one left at its null default
        if va != vb:
            out.append(Change(key, va, vb))
    return out


def check_changes(changes: list[Change], allow: bool, checkpoint: Path, run_dir: Path) -> None:
    """Refuse keys that cannot change mid-run; refuse the rest without --allow-recipe-change."""
    fixed = [c for c in changes if c.key in FIXED and c.old is not _MISSING]
    if fixed:
        lines = [f"cannot change on resume (checkpoint {checkpoint.name}):"]
        lines += [f"  {c}  ({FIXED[c.key]})" for c in fixed]
        lines.append(f"  fix: put the checkpoint's value back, or --resume never to start a new run (the old one "
                     f"is moved to {run_dir / 'previous'}/)")
        raise TrainError("\n".join(lines))
    if changes and not allow:
        raise TrainError(
            f"the recipe changed since checkpoint {checkpoint.name}: {', '.join(map(str, changes))}\n"
            "  fix: pass --allow-recipe-change to continue this run with the new values,\n"
            f"   or: --resume never to start a new run here (the old one is moved to {run_dir / 'previous'}/),\n"
            "   or: set a new trainer.output_dir to start a new run elsewhere and keep this one as it is")


def apply_changes(changes: list[Change], c, knobs, tuner) -> list[str]:
    """After the checkpoint is restored: make the changed live keys take effect (the
    checkpoint brought back the old values). Returns one note per change."""
    r, notes = c.recipe, []
    keys = {ch.key for ch in changes}
    for knob, key in KNOB_KEYS.items():  # lr, KL coef, clip range, entropy: the knobs apply them
        if key in keys:
            value = _get(r, key)
            setattr(knobs, knob, value)
            if tuner is not None:  # the tuner hands its knobs to the trainer every step
                setattr(tuner.knobs, knob, value)
    kl = r.algorithm.kl
    for name in ("target", "horizon"):
        if f"algorithm.kl.{name}" in keys and hasattr(c.kl_ctl, name) and getattr(kl, name) is not None:
            setattr(c.kl_ctl, name, float(getattr(kl, name)))
    for role in ("actor", "critic"):
        engine, cfg = getattr(c, role), getattr(r, role)
        hp = {k: (tuple(getattr(cfg, k)) if k == "betas" else getattr(cfg, k))
              for k in _OPT_KEYS if f"{role}.{k}" in keys}
        if engine is not None and hp:
            for group in engine.optimizer.param_groups:
                group.update(hp)
    for ch in changes:
        notes.append(str(ch))
    return notes


def _get(recipe, key: str):
    obj = recipe
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def choose_checkpoint(run_dir: Path, resume: str, log) -> Path | None:
    """The checkpoint to continue from (None: a new run), or a TrainError that says why not."""
    if resume == "never":
        return None
    if resume == "auto":
        path = ckpt.find_resumable(run_dir, log)
        broken = ckpt.checkpoints(run_dir)
        if path is None and broken:
            names = ", ".join(p.name for p in reversed(broken))
            raise TrainError(
                f"no usable checkpoint in {run_dir / ckpt.CKPT_DIR} ({names}: each is reported above); "
                "refusing to start over on top of this run's history (nothing was changed)\n"
                f"  fix: --resume never starts a new run (the old one's files are moved to {run_dir / 'previous'}/), "
                "or --resume PATH continues from a checkpoint you have elsewhere")
        return path
    return _explicit(Path(resume), run_dir, log)


def _explicit(path: Path, run_dir: Path, log) -> Path:
    check_path(path, "--resume")
    fix = _available(run_dir)
    if not path.exists():
        raise ResumeInputError(f"--resume {path}: no such checkpoint: {path} does not exist; "
                               f"{_listing(run_dir)}{_did_you_mean(str(path))}\n  fix: {fix}")
    if not path.is_dir():
        raise ResumeInputError(f"--resume {path} is a file; a checkpoint is a directory "
                         f"({ckpt.CKPT_DIR}/{ckpt.PREFIX}NNNNNNNN)\n  fix: {fix}")
    inside = path if path.name == ckpt.CKPT_DIR else path / ckpt.CKPT_DIR
    if inside.is_dir() and not (path / "manifest.json").exists():  # a run dir or its checkpoints/
        found = ckpt.find_resumable(inside.parent, log)
        if found is None:
            raise TrainError(f"--resume {path}: no usable checkpoint in {inside}\n  fix: {fix}")
        log.info("--resume %s: using its newest complete checkpoint, %s", path, found.name)
        return found
    if not (path / "manifest.json").exists() and not path.name.startswith((ckpt.PREFIX, ".tmp-")):
        raise ResumeInputError(f"--resume {path}: not a checkpoint ({path} is a directory without manifest.json; "
                               f"a checkpoint is RUN_DIR/{ckpt.CKPT_DIR}/{ckpt.PREFIX}NNNNNNNN); {_listing(run_dir)}"
                               f"\n  fix: {fix}")
    problem = ckpt.verify(path)
    if problem:
        raise TrainError(f"checkpoint {path} is not usable: {problem}\n  fix: {fix}")
    return path


def _listing(run_dir: Path) -> str:
    """"checkpoints in RUN_DIR/checkpoints: a, b (incomplete)" or "RUN_DIR has no checkpoint"."""
    found = ckpt.checkpoints(run_dir)
    if not found:
        return f"{run_dir / ckpt.CKPT_DIR} holds no checkpoint"
    names = [p.name + ("" if (p / "manifest.json").exists() else " (incomplete)") for p in found]
    return f"checkpoints in {run_dir / ckpt.CKPT_DIR}: {', '.join(names)}"


def _did_you_mean(value: str) -> str:
    import difflib

    close = difflib.get_close_matches(value, ["auto", "never"], n=1, cutoff=0.6) if "/" not in value else []
    return f" (did you mean `--resume {close[0]}`?)" if close else ""


def _available(run_dir: Path) -> str:
    good = [p for p in ckpt.checkpoints(run_dir) if (p / "manifest.json").exists()]
    if good:
        return (f"--resume auto (newest complete checkpoint in {run_dir}), or --resume with one of: "
                + ", ".join(str(p) for p in good[-3:]))
    return f"--resume auto or --resume never ({run_dir} has no checkpoint)"


__all__ = ["choose_checkpoint", "ResumeInputError", "recipe_changes", "check_changes", "apply_changes", "Change", "FREE", "FIXED"]
