"""Training-health monitor: reads the metrics of each step the way an experienced RLHF engineer
reads a run, and says what is wrong and what to change (docs/health.md lists every detector).

`HealthMonitor(recipe, run_dir).observe(metrics)` is called by the trainer after each step and by
`rltune diagnose` offline. The detectors live in monitor/signals/ (base classes and helpers in
monitor/base.py); thresholds come from `recipe.health`, scaled to the run where the playbook figure
is a large-model one (sync time by model size, length and clip fraction relative to the run's start);
the advice is computed from the current recipe (monitor/advice.py). A detector fires once per
episode of a condition and re-arms after the condition clears. No torch import.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from pathlib import Path
from typing import Optional

from .base import (HISTORY, PLAYBOOK_PARAMS_B, SWING_FLOOR, Detector, Sustained, _finite,  # noqa: F401
                   _num, _pct, _rd, model_params_b)
from .events import Event, append_events, truncate_events_after  # noqa: F401 - re-exported
from .signals import DETECTORS  # noqa: F401
from .signals import *  # noqa: F401,F403 - detector classes, re-exported

SEVERITIES = ("info", "warning", "error")
# verdict ranking (most likely root cause first); kinds not listed rank last
KIND_RANK = [
    "critic_nan", "actor_nan", "reward_nan", "skipped_step",
    "kl_spike", "grad_spike",
    "reward_collapse", "reward_hacking",
    "stale_weights", "is_weight_extreme", "logprob_drift", "async_drift",
    "kl_high",
    "reward_swing", "clipfrac_high",
    "grad_clip",
    "entropy_collapse", "zero_advantage", "length_collapse", "length_runaway",
    "sync_slow", "kl_level",
]
log = logging.getLogger("rltune")
SYNC_MS_PLAYBOOK = 200.0


def default_recipe():
    """The schema defaults, for runs without a recipe.yaml."""
    from rltune.recipe.schema import Recipe
    return Recipe.model_validate({"model": {"policy": "unknown"}, "data": {"train": "unknown"}})


# ------------------------------------------------------------------------------------------

class HealthMonitor:
    """Runs every detector on each step's metrics; appends events to RUN_DIR/events.jsonl."""

    def __init__(self, recipe=None, run_dir=None, enabled: Optional[bool] = None, write: bool = True,
                 log_events: Optional[bool] = None):
        self.recipe = recipe if recipe is not None else default_recipe()
        self.h = self.recipe.health
        self.enabled = self.h.enabled if enabled is None else enabled
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.write = write
        # live runs log each event on the "rltune" logger (users grep `Critic loss NaN at step N`)
        self.log_events = write if log_events is None else log_events
        self.detectors = [cls() for cls in DETECTORS]
        self.hist: dict[str, list[float]] = {}
        self.firsts: dict[str, list[float]] = {}   # first `window` values per metric
        self.n = 0                                   # steps observed
        self.step = 0                                # last step observed
        self.events: list[Event] = []
        r = self.recipe
        self.sequences_per_step = r.gen_calls_per_step * r.rollout.batch_size
        self.params_b = model_params_b(r)

    # -- thresholds that fit the run
    def sync_adaptive(self) -> bool:
        """Small models (< 1B, size known) judge the sync against the run's own early syncs; the
        playbook figure is for large models (and models of unknown size)."""
        return self.h.sync_ms is None and self.params_b is not None and self.params_b < 1.0

    def sync_threshold(self) -> float:
        """health.sync_ms when set; else the playbook's 200 ms (7B) scaled up with the model size
        (unknown size: 200 ms); for small models raised to 5x the run's own early syncs (steps
        2..window) when those are slower (a CPU engine reloads in place in hundreds of ms)."""
        if self.h.sync_ms is not None:
            return float(self.h.sync_ms)
        size = SYNC_MS_PLAYBOOK * max(1.0, (self.params_b or PLAYBOOK_PARAMS_B) / PLAYBOOK_PARAMS_B)
        early = self.firsts.get("timing/sync_ms", [])[1:]
        if self.sync_adaptive() and early:
            return max(size, 5 * statistics.median(early))
        return size

    def reward_se(self, v: dict) -> Optional[float]:
        """The standard error of a step's mean reward: reward/std (this step's, else the mean of the
        last `window`) / sqrt(sequences per step); None when reward/std is not logged."""
        std = v.get("reward/std")
        if not _finite(std):
            stds = self.recent("reward/std", self.h.window)
            std = statistics.fmean(stds) if stds else None
        return None if std is None else std / math.sqrt(max(1, self.sequences_per_step))

    def reward_improving(self, r_hist: list[float], v: dict) -> bool:
        """The reward of the last window is above that of the window before by more than the noise
        of a window mean (reward/std / sqrt(sequences x window), at least 1% of its scale)."""
        w = self.h.window
        if len(r_hist) < 2 * w:
            return len(r_hist) >= 2 and r_hist[-1] > r_hist[0]
        prev, cur = r_hist[-2 * w:-w], r_hist[-w:]
        noise = (self.reward_se(v) or 0.0) / math.sqrt(w)
        margin = max(2 * noise, 0.01 * max(abs(statistics.fmean(prev)), SWING_FLOOR))
        return statistics.fmean(cur) - statistics.fmean(prev) > margin

    # -- history helpers used by detectors
    def recent(self, key: str, n: int) -> list[float]:
        return list(self.hist.get(key, [])[-n:]) if n > 0 else []

    def last(self, key: str, default):
        h = self.hist.get(key)
        return h[-1] if h else default

    def first(self, key: str) -> Optional[float]:
        f = self.firsts.get(key)
        return f[0] if f else None

    def first_mean(self, key: str) -> Optional[float]:
        f = self.firsts.get(key)
        return statistics.fmean(f) if f and len(f) >= min(self.h.window, 1) else None

    # -- the per-step entry point
    def observe(self, metrics: dict) -> list[Event]:
        step = metrics.get("step")
        step = int(step) if _finite(_num(step)) else self.step + 1
        v: dict[str, float] = {}
        for k, x in metrics.items():
            if k == "step":
                continue
            f = _num(x)
            if f is not None:
                v[k] = f
        fired: list[Event] = []
        if self.enabled:
            for det in self.detectors:
                fired.extend(det.check(self, step, v, fired))
        for k, x in v.items():
            if math.isfinite(x):
                h = self.hist.setdefault(k, [])
                h.append(x)
                if len(h) > HISTORY:
                    del h[: len(h) - HISTORY]
                f = self.firsts.setdefault(k, [])
                if len(f) < self.h.window:
                    f.append(x)
        self.n += 1
        self.step = step
        self.events.extend(fired)
        if self.log_events:
            for e in fired:
                log.log(logging.ERROR if e.severity == "error" else logging.WARNING
                        if e.severity == "warning" else logging.INFO, "%s", e)
        if self.write:
            append_events(self.run_dir, fired)
        return fired

    # -- checkpoints
    def state_dict(self) -> dict:
        return {"version": 1, "n": self.n, "step": self.step,
                "hist": {k: list(v) for k, v in self.hist.items()},
                "firsts": {k: list(v) for k, v in self.firsts.items()},
                "detectors": {d.__class__.__name__: json.loads(json.dumps(d.state)) for d in self.detectors},
                "events": [e.to_dict() for e in self.events[-200:]]}

    def load_state_dict(self, state: dict) -> None:
        self.n = int(state.get("n", 0))
        self.step = int(state.get("step", 0))
        self.hist = {k: [float(x) for x in v] for k, v in state.get("hist", {}).items()}
        self.firsts = {k: [float(x) for x in v] for k, v in state.get("firsts", {}).items()}
        dets = state.get("detectors", {})
        for d in self.detectors:
            if d.__class__.__name__ in dets:
                # on top of the initial state: a checkpoint of an older version lacks newer keys
                d.state = {**d.initial(), **json.loads(json.dumps(dets[d.__class__.__name__]))}
        self.events = [Event.from_dict(e) for e in state.get("events", [])]
        if self.write:
            truncate_events_after(self.run_dir, self.step)


def rank_key(e: Event) -> tuple:
    sev = {"error": 0, "warning": 1, "info": 2}.get(e.severity, 3)
    kind = KIND_RANK.index(e.kind) if e.kind in KIND_RANK else len(KIND_RANK)
    return (kind, sev, e.step)


def verdict_event(events: list[Event]) -> Optional[Event]:
    """The most likely root cause among problem events (warning/error)."""
    probs = [e for e in events if e.severity in ("warning", "error")]
    return min(probs, key=rank_key) if probs else None
