"""The rollout engine: stale or drifting weights (log-prob mismatch with the trainer), extreme
importance ratios, slow weight sync (resharding)."""

from __future__ import annotations

import statistics

from .. import advice as A
from ..base import Event, Sustained, _rd, mean


class SyncSlow(Sustained):
    """Weight sync slower than the threshold for the model size (playbook: 200 ms at 7B, scaled up
    for larger models), 2 steps in a row; small models: 5x the run's own early syncs when those are
    slower (checked once the first window of syncs is known). The first sync (warm-up) is ignored."""
    name = "sync_slow"
    key = "timing/sync_ms"

    def steps_needed(self, mon):
        return 2

    def ready(self, mon):
        if mon.sync_adaptive():
            return len(mon.firsts.get(self.key, [])) >= mon.h.window
        return mon.n >= 1

    def condition(self, mon, x):
        return x > mon.sync_threshold()

    def event(self, mon, step, x, n):
        ch, lines = A.for_sync_slow(mon.recipe)
        thr = mon.sync_threshold()
        return Event(step, "sync_slow", "warning",
                     f"Actor resharding time: {x:.0f} ms (> {thr:.0f} ms) for {n} steps at step {step}",
                     {"sync_ms": _rd(x), "threshold_ms": _rd(thr), "steps": n, "role": "rollout"}, lines, ch)


class StaleWeights(Sustained):
    name = "stale_weights"
    key = "rollout/logprob_diff_mean"

    def steps_needed(self, mon):
        return 1  # the first step after a (missed) sync is the test

    def condition(self, mon, x):
        return x > mon.recipe.rollout.logprob_tolerance

    def event(self, mon, step, x, n):
        tol = mon.recipe.rollout.logprob_tolerance
        ch, lines = A.for_stale_weights(mon.recipe)
        return Event(step, "stale_weights", "warning",
                     f"Stale rollout weights: mean |rollout logp - actor logp| {A.fmt(_rd(x, 3))} > "
                     f"rollout.logprob_tolerance {A.fmt(tol)} for {n} steps (step {step})",
                     {"logprob_diff_mean": _rd(x), "tolerance": tol, "steps": n, "role": "rollout"}, lines, ch)


class LogprobDrift(Sustained):
    """rollout/logprob_diff_mean trending up: its window mean `logprob_drift` x its start and above
    half the tolerance, still below it (above it the stale-weight guard fires)."""
    name = "logprob_drift"
    key = "rollout/logprob_diff_mean"

    def ready(self, mon):
        return len(mon.hist.get(self.key, [])) >= 2 * mon.h.window

    def condition(self, mon, x):
        w = mon.h.window
        cur = mon.recent(self.key, w - 1) + [x]
        start = max(mon.first_mean(self.key) or 0.0, 1e-6)
        tol = mon.recipe.rollout.logprob_tolerance
        return mean(cur) > mon.h.logprob_drift * start and 0.5 * tol < x <= tol and mean(cur) > 0.5 * tol

    def event(self, mon, step, x, n):
        w = mon.h.window
        cur = mean(mon.recent(self.key, w - 1) + [x])
        start = mon.first_mean(self.key)
        ch, lines = A.for_logprob_drift(mon.recipe)
        return Event(step, "logprob_drift", "warning",
                     f"Rollout/trainer log-prob mismatch growing: mean |rollout logp - actor logp| {A.fmt(_rd(cur, 3))}"
                     f" over the last {w} steps, {cur / max(start, 1e-9):.0f}x its start {A.fmt(_rd(start, 3))}"
                     f" (step {step})",
                     {"logprob_diff_mean": _rd(cur), "start": _rd(start), "steps": n,
                      "tolerance": mon.recipe.rollout.logprob_tolerance, "role": "rollout"}, lines, ch)


class ISWeightExtreme(Sustained):
    """rollout/is_weight_max (pi_trainer / pi_rollout, max over tokens) above `is_weight_max` and 5x
    its running median, 2 steps in a row."""
    name = "is_weight_extreme"
    key = "rollout/is_weight_max"

    def steps_needed(self, mon):
        return 2

    def condition(self, mon, x):
        hist = mon.recent(self.key, 4 * mon.h.window)
        med = statistics.median(hist) if hist else 1.0
        return x > mon.h.is_weight_max and x > 5 * max(med, 1.0)

    def event(self, mon, step, x, n):
        ch, lines = A.for_is_weight(mon.recipe)
        hist = mon.recent(self.key, 4 * mon.h.window)
        nums = {"is_weight_max": _rd(x), "running_median": _rd(statistics.median(hist)) if hist else None,
                "threshold": mon.h.is_weight_max, "steps": n, "role": "rollout"}
        capped = mon.last("rollout/is_capped_frac", None)
        if capped is not None:
            nums["is_capped_frac"] = _rd(capped)
        return Event(step, "is_weight_extreme", "warning",
                     f"Importance ratio extreme: rollout/is_weight_max {A.fmt(_rd(x, 3))} > {A.fmt(mon.h.is_weight_max)}"
                     f" for {n} steps (step {step}): rollout engine and trainer disagree", nums, lines, ch)
