"""Autotune rollback (docs/health.md, autotune; docs/training.md, "Rollback and the step count").

A hard spike restores the newest intact good checkpoint from before the trouble began, through
the resume loader, and the run goes back to that checkpoint's step k: the steps after it are
taken again, on new batches (the sampler is not rewound). So the step counter, the LR scheduler
and the optimizer always agree with the weights: step N means N steps of progress, whatever was
rolled back on the way, and `trainer.max_steps` steps of progress end the run with the LR schedule
where it was planned. The trainer side (run.py) moves the checkpoints of the discarded steps aside.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..recipe.knobs import KNOB_KEYS


def good_checkpoint(run_dir: Path, step: int) -> Path | None:
    """The newest intact checkpoint before `step` saved at a step without a warning or skipped
    update (state.json "good")."""
    from . import checkpoint as ckpt

    for path in reversed(ckpt.checkpoints(run_dir)):
        try:
            n = int(path.name[len(ckpt.PREFIX):])
        except ValueError:
            continue
        if n >= step or ckpt.verify(path) is not None:
            continue
        try:
            if json.loads((path / "state.json").read_text()).get("good"):
                return path
        except (OSError, ValueError):
            continue
    return None


def restore(c, knobs, monitor, tuner, state) -> None:
    """A resume: the checkpoint's KL controller, data position, reward moments, knobs, monitor
    and autotune state."""
    c.kl_ctl.load_state_dict(state["kl_ctl"])
    c.sampler.load_state_dict(state["sampler"])
    c.rewards.load_state_dict(state["rewards"])
    for k, v in state["knobs"].items():
        setattr(knobs, k, v)
    if monitor is not None and state.get("monitor") is not None:
        monitor.load_state_dict(state["monitor"])
    if tuner is not None and state.get("autotune") is not None:
        tuner.load_state_dict(state["autotune"])


def rollback(c, engines, gen, knobs, monitor, tuner, path: Path, step: int, reason: dict) -> tuple[int, int]:
    """Restore checkpoint `path` (weights, optimizer, LR scheduler, RNG, KL controller, reward
    moments, monitor state) through the resume path, keep the sampler where it is (past the batch
    that blew up: it is not replayed), apply the spike fix and log it. Returns (the checkpoint's
    step k: the run goes on with step k + 1, the restored non-finite streak)."""
    from . import checkpoint as ckpt
    from .loop import apply_knobs

    sampler_now = c.sampler.state_dict()
    state = ckpt.load(path, engines, gen, c.dist.rank, ckpt.sampling_rng(c.rollout))
    back_to = int(state["step"])
    c.kl_ctl.load_state_dict(state["kl_ctl"])
    # generation ahead: the checkpoint's reward moments count the batches it had generated ahead,
    # which the rollback discards (the pipeline's flush) and never trains; the moments from before
    # them are the ones to go on from, as a resume that generates them again does (run.py)
    ahead = state.get("async") or {}
    c.rewards.load_state_dict(ahead.get("rewards_before") or state["rewards"])
    if monitor is not None and state.get("monitor") is not None:
        # the detectors' running ranges and step go back to the checkpoint's (the spike does not
        # widen them); events.jsonl and the event list keep what the discarded steps reported (a
        # resume would truncate them: write off)
        events, write = list(monitor.events), monitor.write
        monitor.write = False
        try:
            monitor.load_state_dict(state["monitor"])
        finally:
            monitor.write, monitor.events = write, events
    c.sampler.load_state_dict(sampler_now)
    knobs.kl_coef = c.kl_ctl.coef
    tuner.knobs.kl_coef = knobs.kl_coef
    numbers = {"from_step": back_to, "from": str(path),
               "sampler_from": [state["sampler"].get("epoch"), state["sampler"].get("cursor")],
               "sampler_now": [sampler_now.get("epoch"), sampler_now.get("cursor")]}
    tuner.rollback(step, reason, numbers)
    # the tuner counts its cooldown (and the quiet stretch before a stage change) in step numbers
    # from the fix: the fix takes effect with step back_to + 1, as it did with step + 1 before
    # the counter went back
    tuner.last_fix = tuner.last_problem = back_to
    sync_knobs_from_tuner(tuner, knobs)
    apply_knobs(c, knobs)
    c.rollout.sync_weights(c.actor)
    return back_to, int(state.get("skipped_in_a_row", 0))


def sync_knobs_from_tuner(tuner, knobs) -> None:
    for name in KNOB_KEYS:
        setattr(knobs, name, getattr(tuner.knobs, name))
