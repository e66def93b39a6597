"""The rollout engine: stale or drifting weights (log-prob mismatch with the trainer), extreme
importance ratios, slow weight sync (resharding); with generation ahead (rollout.asynchronous)
the mismatch is staleness by design, and the importance weights' drift with it is watched instead."""

from __future__ import annotations

import statistics

from .. import advice as A
from ..base import Event, Sustained, _rd, mean


def _asynchronous(mon) -> bool:
    """Samples generated ahead (rollout.asynchronous): their log-probs differ from the trainer's by the
    policy's own progress, which the sync-only guards below would take for a broken sync."""
    return mon.recipe.rollout.asynchronous.max_staleness > 0


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
        return x > mon.recipe.rollout.logprob_tolerance and not _asynchronous(mon)

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
        return len(mon.hist.get(self.key, [])) >= 2 * mon.h.window and not _asynchronous(mon)

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
        return x > mon.h.is_weight_max and x > 5 * max(med, 1.0) and not _asynchronous(mon)

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


class AsyncDrift(Sustained):
    """rollout.asynchronous: the importance weights pi_prox / pi_sample of the stale samples drift
    from 1 (rollout/is_capped_frac above health.async_capped_frac: the cap truncates or masks that
    share of the tokens, or rollout/is_weight_mean off 1 by more than async_weight_drift), 2 steps in
    a row, with async/staleness_mean above 0: the policy moves too far per version for the lag."""
    name = "async_drift"
    key = "rollout/is_capped_frac"

    def steps_needed(self, mon):
        return 2

    def check(self, mon, step, v, fired):
        self.v = v
        return super().check(mon, step, v, fired)

    def condition(self, mon, x):
        lag, w = self.v.get("async/staleness_mean", 0.0), self.v.get("rollout/is_weight_mean", 1.0)
        return lag > 0 and (x > mon.h.async_capped_frac or abs(w - 1.0) > mon.h.async_weight_drift)

    def event(self, mon, step, x, n):
        ch, lines = A.for_async_drift(mon.recipe)
        lag, w = self.v.get("async/staleness_mean", 0.0), self.v.get("rollout/is_weight_mean", 1.0)
        return Event(step, "async_drift", "warning",
                     f"Stale samples drift from the policy: rollout/is_capped_frac {A.fmt(_rd(x, 3))}, "
                     f"rollout/is_weight_mean {A.fmt(_rd(w, 3))} at a mean lag of {A.fmt(_rd(lag, 3))} versions for "
                     f"{n} steps (step {step}): the importance weights stop correcting",
                     {"is_capped_frac": _rd(x), "is_weight_mean": _rd(w), "staleness_mean": _rd(lag),
                      "threshold": mon.h.async_capped_frac, "steps": n, "role": "rollout"}, lines, ch)
