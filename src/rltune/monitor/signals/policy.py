"""How far the policy moves: KL (level and spikes), the PPO clip fraction, entropy."""

from __future__ import annotations

import math
import statistics

from .. import advice as A
from ..base import TOKEN_KL, Detector, Event, Sustained, _finite, _rd, kl_key


RUNAWAY, RUNAWAY_GROWTH = 2.0, 1.5  # x the level, x per step: a KL this high growing this fast is a fault


class KLHigh(Detector):
    """KL above the playbook level for `window` steps. A warning (kl_high) when the reward has stopped
    improving meanwhile and the KL is still climbing (window mean >= 1.2x the window before, or too
    few steps to tell): drift that buys nothing; or when it runs away (window mean above 2x the
    level, still growing >= 1.5x per step), whatever the reward does. While the reward still improves and the KL is not running away, an info
    (kl_level); a KL that levelled off high stays quiet (it was reported when it climbed)."""
    name = "kl_high"

    def initial(self):
        return {"armed": True, "info_armed": True}

    def check(self, mon, step, v, fired):
        key = kl_key(v)
        kl = v.get(key)
        if kl is None or not math.isfinite(kl):
            return []
        h = mon.h
        lab = "KL per token" if key == TOKEN_KL else "KL"
        n = self.sustained("kl", kl > h.kl_high)
        if n == 0:
            self.state["armed"] = True
            self.state["info_armed"] = True
            return []
        if n < h.window or not self.state["armed"]:
            return []
        window = mon.recent(key, h.window - 1) + [kl]
        r_now = v.get("reward/mean")
        r_hist = mon.recent("reward/mean", 3 * h.window) + ([r_now] if _finite(r_now) else [])
        improving = mon.reward_improving(r_hist, v)
        creeping = len(r_hist) >= 2 * h.window and 0 < (
            statistics.fmean(r_hist[-h.window:]) - statistics.fmean(r_hist[:h.window]))
        kl_mean = statistics.fmean(window)
        kh = mon.recent(key, 2 * h.window - 1) + [kl]
        climbing = len(kh) < 2 * h.window or statistics.fmean(kh[h.window:]) >= 1.2 * statistics.fmean(kh[:h.window])
        # a KL at twice the level that still grows >= 1.5x per step over the window is a runaway,
        # reward gain or not (a fast but sound learner grows ~1.2x per step by then)
        first = window[0]
        growth = (kl / first) ** (1.0 / (len(window) - 1)) if first > 0 and len(window) > 1 else 1.0
        runaway = kl_mean > RUNAWAY * h.kl_high and growth >= RUNAWAY_GROWTH
        if not improving and not climbing:
            return []
        if improving and not runaway:
            if not self.state["info_armed"]:
                return []
            self.state["info_armed"] = False
            ch, lines = A.for_kl_level(mon.recipe, _rd(kl, 3), lab)
            return [Event(step, "kl_level", "info",
                          f"{lab} {A.fmt(_rd(kl, 3))} > {A.fmt(h.kl_high)} for {n} steps (since step {step - n + 1})"
                          f" while the reward still improves: the policy moves far from the reference to earn it",
                          {"kl": _rd(kl), "kl_mean": _rd(kl_mean), "threshold": h.kl_high, "steps": n,
                           "kl_key": key, "role": "actor"}, lines, ch)]
        self.state["armed"] = False
        ch, lines = A.for_kl_high(mon.recipe, _rd(kl, 3), creeping and kl_mean > 0.8, lab)
        why = (f"running away ({growth:.1f}x per step)" if runaway
               else "climbing while the reward has stopped improving")
        msg = (f"{lab} {A.fmt(_rd(kl, 3))} > {A.fmt(h.kl_high)} sustained for {n} steps (since step {step - n + 1})"
               f" and {why}: policy drifting from the reference; raise the KL coefficient")
        return [Event(step, "kl_high", "warning", msg,
                      {"kl": _rd(kl), "kl_mean": _rd(kl_mean), "threshold": h.kl_high, "steps": n,
                       "kl_coef": v.get("kl_coef", mon.recipe.algorithm.kl.coef), "kl_key": key, "role": "actor"}, lines, ch)]


class KLSpike(Detector):
    """KL at or above `kl_spike_min` and more than `kl_spike_factor` x the run's recent KL scale: the
    largest |KL| of the last 4 x window steps, at least `kl_spike_min / (10 x kl_spike_factor)`. The k1
    estimator (and other tools' logged KL) can be negative: a noisy estimate around 0. Its recent
    max is then a floor reached through negative values (0.0 -> 0.767 read as '7668x its recent max
    0.0001', an error with async partial rollouts while synchronous runs with larger jumps stayed
    quiet); the magnitude of those values is the run's real scale, and a ratio against a near-zero
    max says nothing beyond `kl >= kl_spike_min` (issue 46 item 5)."""
    name = "kl_spike"

    def check(self, mon, step, v, fired):
        kl = v.get("kl")
        h = mon.h
        if kl is None or not math.isfinite(kl):
            return []
        hist = mon.recent("kl", 4 * h.window)
        if len(hist) < max(2, h.warmup_steps):
            return []
        scale = max(abs(x) for x in hist)          # not max(hist): k1 values below 0 have a size too
        floor = h.kl_spike_min / (10 * h.kl_spike_factor)   # below it a ratio is noise over noise (0.003 by default)
        ref = max(scale, floor)
        spike = kl >= h.kl_spike_min and kl > h.kl_spike_factor * ref
        if not spike:
            self.state["armed"] = True
            return []
        if not self.state["armed"]:
            return []
        self.state["armed"] = False
        ch, lines = A.for_spike(mon.recipe)
        if scale >= floor:
            against = f"{kl / ref:.0f}x its recent max |KL| {A.fmt(_rd(ref, 3))}"
        else:   # a ratio against ~0 means nothing: say what the spike is measured against
            against = (f"at least health.kl_spike_min {A.fmt(h.kl_spike_min)}, its recent |KL| at most "
                       f"{A.fmt(_rd(scale, 3))}")
        msg = (f"KL spike at step {step}: {A.fmt(_rd(hist[-1], 3))} -> {A.fmt(_rd(kl, 3))} "
               f"({against}); reward can still look fine: the spike is the warning")
        return [Event(step, "kl_spike", "error", msg,
                      {"kl": _rd(kl), "recent_max": _rd(scale), "scale": _rd(ref), "factor": _rd(kl / ref, 3),
                       "role": "actor"}, lines, ch)]


class ClipfracHigh(Sustained):
    """actor/clipfrac above `clipfrac_max` and 3x its start, for window steps."""
    name = "clipfrac_high"
    key = "actor/clipfrac"

    def ready(self, mon):
        return mon.first_mean(self.key) is not None and len(mon.hist.get(self.key, [])) >= mon.h.window

    def condition(self, mon, x):
        return x > mon.h.clipfrac_max and x > 3 * mon.first_mean(self.key)

    def event(self, mon, step, x, n):
        ch, lines = A.for_clipfrac(mon.recipe)
        start = mon.first_mean(self.key)
        return Event(step, "clipfrac_high", "warning",
                     f"Actor clip fraction {A.fmt(_rd(x, 3))} > {A.fmt(mon.h.clipfrac_max)} for {n} steps (started at"
                     f" {A.fmt(_rd(start, 3))}): actor updates run away from the rollout policy; actor lr too high",
                     {"clipfrac": _rd(x), "start": _rd(start), "threshold": mon.h.clipfrac_max, "steps": n,
                      "role": "actor"}, lines, ch)


class EntropyCollapse(Sustained):
    name = "entropy_collapse"
    key = "actor/entropy"

    def condition(self, mon, x):
        return x < mon.h.entropy_floor

    def event(self, mon, step, x, n):
        ch, lines = A.for_entropy_collapse(mon.recipe)
        start = mon.first("actor/entropy")
        return Event(step, "entropy_collapse", "warning",
                     f"Policy entropy collapsed to {A.fmt(_rd(x, 3))} < {A.fmt(mon.h.entropy_floor)} nats/token for {n} steps"
                     f" (since step {step - n + 1}; started at {A.fmt(_rd(start, 3)) if start is not None else '?'})",
                     {"entropy": _rd(x), "floor": mon.h.entropy_floor, "start": start, "steps": n, "role": "actor"},
                     lines, ch)


