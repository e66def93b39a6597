"""Early reward swings (actor lr too high): a step far outside the batch's sampling noise around the
recent trend, or a regular up-down alternation over many steps whose single swings stay within it.

Noise: the standard error of a step's mean reward, reward/std / sqrt(sequences per step); without
reward/std, the run's own step-to-step noise.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

from .. import advice as A
from ..base import SWING_FLOOR, Detector, Event, _pct, _rd, step_noise

OSC_STEPS = 12      # an oscillation is judged over this many steps
OSC_FLIPS = 0.8     # share of successive changes that reverse direction (noise: about 2/3)
OSC_RHO = -0.8      # lag-1 autocorrelation of the changes at most this (noise: about -0.5)
OSC_SIGMAS = 4.0    # the alternating part this many standard errors of its estimate ...
OSC_SIGMAS_FIT = 7.0   # ... without reward/std (the noise then is only what the fit leaves, 9 degrees of freedom)


# -- pure helpers ------------------------------------------------------------------------------

def _line(ys: list[float]) -> tuple[float, float, float, float]:
    """Least-squares line through ys at x = 0..n-1: (x mean, y mean, slope, sum of squares of x)."""
    n = len(ys)
    xm, ym = (n - 1) / 2, statistics.fmean(ys)
    sxx = sum((x - xm) ** 2 for x in range(n))
    slope = sum((x - xm) * (y - ym) for x, y in enumerate(ys)) / sxx
    return xm, ym, slope, sxx


def forecast(hist: list[float]) -> tuple[float, float]:
    """The recent trend extrapolated one step, and the error factor of that extrapolation (a
    rising reward is not a swing)."""
    n = len(hist)
    xm, ym, slope, sxx = _line(hist)
    return ym + slope * (n - xm), math.sqrt(1 + 1 / n + (n - xm) ** 2 / sxx)


def flip_share(diffs: list[float]) -> float:
    """Share of successive changes that reverse direction (up then down, or down then up)."""
    pairs = list(zip(diffs, diffs[1:]))
    return sum(a * b < 0 for a, b in pairs) / len(pairs) if pairs else 0.0


def lag1_autocorr(xs: list[float]) -> float:
    """Lag-1 autocorrelation of xs (0 for a constant series)."""
    m = statistics.fmean(xs)
    d = [x - m for x in xs]
    den = sum(x * x for x in d)
    return sum(a * b for a, b in zip(d, d[1:])) / den if den > 0 else 0.0


def alternating_part(ys: list[float]) -> tuple[float, float]:
    """ys ~ line + c (-1)^t + noise: (c, the noise's standard deviation)."""
    n = len(ys)
    xm, ym, slope, _ = _line(ys)
    res = [y - ym - slope * (x - xm) for x, y in enumerate(ys)]
    sign = [(-1) ** x for x in range(n)]
    c = sum(s * e for s, e in zip(sign, res)) / n
    left = [e - c * s for s, e in zip(sign, res)]
    return c, math.sqrt(sum(e * e for e in left) / max(1, n - 3))


def oscillation(ys: list[float], se: Optional[float]) -> Optional[dict]:
    """A regular alternation in ys: successive changes reverse direction on >= OSC_FLIPS of the
    steps, their lag-1 autocorrelation is <= OSC_RHO (the changes of white noise give -0.5), and
    the alternating part is >= OSC_SIGMAS standard errors (noise: the larger of `se` and what the
    fit leaves; OSC_SIGMAS_FIT without `se`). The numbers, or None."""
    diffs = [b - a for a, b in zip(ys, ys[1:])]
    flips, rho = flip_share(diffs), lag1_autocorr(diffs)
    if flips < OSC_FLIPS or rho > OSC_RHO:
        return None
    c, left = alternating_part(ys)
    scale = max(abs(statistics.fmean(ys)), SWING_FLOOR)
    noise = max(se or 0.0, left, 1e-3 * scale)
    z = abs(c) * math.sqrt(len(ys)) / noise
    if z < (OSC_SIGMAS if se else OSC_SIGMAS_FIT):
        return None
    return {"amplitude": abs(c), "relative": abs(c) / scale, "flips": flips, "autocorr": rho, "sigmas": z,
            "per_swing": abs(c) / se if se else None}


# -- the detector ------------------------------------------------------------------------------

class RewardSwing(Detector):
    """In the first `swing_steps` steps: the reward deviates from its recent trend by more than
    `swing_sigmas` standard errors, up and down within `window` steps; or it alternates up and
    down regularly over `OSC_STEPS` steps (`oscillation`), each swing within the noise. One event
    per episode of either."""
    name = "reward_swing"

    def initial(self):
        return {"armed": True, "devs": []}  # [step, deviation in standard errors] of the recent window

    @staticmethod
    def _se(mon, v) -> tuple[float, bool]:
        """(standard error of a step's mean reward, whether it comes from reward/std). Without
        reward/std: the run's own step-to-step noise over the last 4 x window steps."""
        se = mon.reward_se(v)
        if se is None:
            return step_noise(mon.recent("reward/mean", 4 * mon.h.window), least=1), False
        return se, True

    def check(self, mon, step, v, fired):
        r = v.get("reward/mean")
        h = mon.h
        if r is None or not math.isfinite(r):
            return []
        hist = mon.recent("reward/mean", h.window)
        if len(hist) < max(3, h.warmup_steps) or mon.n > h.swing_steps:
            return []
        se, logged = self._se(mon, v)
        pred, extrap = forecast(hist)
        se = max(se, 1e-3 * max(abs(statistics.fmean(hist)), SWING_FLOOR))
        z = (r - pred) / (se * extrap)
        big = abs(z) > h.swing_sigmas
        devs = [d for d in self.state["devs"] if d[0] > step - h.window] + ([[step, _rd(z, 3)]] if big else [])
        self.state["devs"] = devs
        up = [d[1] for d in devs if d[1] > 0]
        down = [d[1] for d in devs if d[1] < 0]
        ys = mon.recent("reward/mean", OSC_STEPS - 1) + [r]
        osc = oscillation(ys, se if logged else None) if len(ys) >= OSC_STEPS else None
        if not devs and not osc:
            self.state["armed"] = True
            return []
        if not self.state["armed"]:
            return []
        if big and up and down:
            self.state["armed"] = False
            return [self._swing_event(mon, step, r, pred, se, up, down)]
        if osc:
            self.state["armed"] = False
            return [self._oscillation_event(mon, step, r, osc)]
        return []

    def _swing_event(self, mon, step, r, pred, se, up, down):
        h = mon.h
        ch, lines = A.for_reward_swing(mon.recipe)
        rel = (r - pred) / max(abs(pred), SWING_FLOOR)
        msg = (f"Reward swings {max(up):+.1f}/{min(down):+.1f} standard errors around its recent trend at step {step}"
               f" (now {A.fmt(_rd(r, 3))} vs {A.fmt(_rd(pred, 3))} expected, {_pct(rel)};"
               f" batch noise ±{A.fmt(_rd(se, 2))}, threshold {A.fmt(h.swing_sigmas)} standard errors): actor lr too high")
        return Event(step, "reward_swing", "warning", msg,
                     {"reward": _rd(r), "expected": _rd(pred), "swing_up": max(up), "swing_down": min(down),
                      "std_error": _rd(se), "sigmas": h.swing_sigmas, "role": "actor"}, lines, ch)

    def _oscillation_event(self, mon, step, r, osc):
        ch, lines = A.for_reward_swing(mon.recipe, oscillating=True)
        per = f", {osc['per_swing']:.1f} standard errors per swing" if osc["per_swing"] is not None else ""
        amp = A.fmt(_rd(osc["amplitude"], 2))
        msg = (f"Reward oscillates up and down over the last {OSC_STEPS} steps (step {step}): ±{amp}"
               f" (±{osc['relative'] * 100:.1f}%{per}), direction reversed on {osc['flips'] * 100:.0f}% of the steps,"
               f" lag-1 autocorrelation of its changes {osc['autocorr']:.2f} (sampling noise: about -0.5):"
               " a regular alternation, not noise: actor lr too high")
        return Event(step, "reward_swing", "warning", msg,
                     {"reward": _rd(r), "amplitude": _rd(osc["amplitude"]), "relative": _rd(osc["relative"], 3),
                      "flips": _rd(osc["flips"], 3), "autocorr": _rd(osc["autocorr"], 3),
                      "sigmas": _rd(osc["sigmas"], 3), "steps": OSC_STEPS, "role": "actor"}, lines, ch)
