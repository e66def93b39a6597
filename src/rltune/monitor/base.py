"""Shared pieces of the health monitor: number helpers, the Detector base classes and the
run-scale estimates (model size) that the adaptive thresholds use. No torch import."""

from __future__ import annotations

import math
import re
import statistics
from typing import Optional

from .events import Event  # noqa: F401 - re-exported for the detector modules

HISTORY = 64         # values kept per metric (enough for every running statistic here)
SWING_FLOOR = 0.05   # smallest reward scale for relative comparisons (rewards near 0)
PLAYBOOK_PARAMS_B = 7.0   # the playbook's figures come from 7B-8B models
# builtin models of the project (docs/models.md), in billions of parameters
BUILTIN_PARAMS_B = {"builtin:tiny-llama": 0.001, "builtin:tiny-qwen2": 0.001,
                    "builtin:smollm2-135m-instruct": 0.135}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _num(x) -> Optional[float]:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    try:  # numpy / torch scalars
        return float(x)
    except (TypeError, ValueError):
        return None


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _rd(x: float, n: int = 4) -> float:
    return float(f"{x:.{n}g}") if _finite(x) else x


def model_params_b(recipe) -> Optional[float]:
    """Policy size in billions of parameters, from a builtin name or a size in the model id
    (`Qwen2.5-7B`, `SmolLM2-135M-Instruct`, `Llama-3.1-8b`); None when the name does not say."""
    name = str(getattr(getattr(recipe, "model", None), "policy", "") or "")
    if name in BUILTIN_PARAMS_B:
        return BUILTIN_PARAMS_B[name]
    base = name.rstrip("/").split("/")[-1]
    m = re.findall(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)\s*([BbMm])(?![A-Za-z])", base.replace("_", "-"))
    if not m:
        return None
    x, unit = m[-1]
    return float(x) * (1.0 if unit in "Bb" else 1e-3)


TOKEN_KL = "kl/token_mean"


def kl_key(v: dict) -> str:
    """The KL compared with the playbook level: per token when logged (`kl` is summed over a
    response's tokens, so it grows with the response length; the playbook's 0.6 is a per-token
    figure, as verl and OpenRLHF log it); other tools' logs give `kl` only."""
    return TOKEN_KL if _finite(v.get(TOKEN_KL)) else "kl"


def mean(xs) -> float:
    return statistics.fmean(xs) if xs else 0.0


def step_noise(xs: list[float], least: int = 3) -> float:
    """The step-to-step noise (one standard deviation) of a series, from the median absolute
    difference of successive values: robust to a trend and to a few jumps; 0 for fewer than
    `least` differences."""
    diffs = [abs(b - a) for a, b in zip(xs, xs[1:])]
    return statistics.median(diffs) / (0.6745 * math.sqrt(2)) if diffs and len(diffs) >= least else 0.0


def robust_level(xs: list[float]) -> tuple[float, float]:
    """(median, standard deviation from the median absolute deviation) of `xs`."""
    if not xs:
        return 0.0, 0.0
    med = statistics.median(xs)
    return med, 1.4826 * statistics.median(abs(x - med) for x in xs)


FALL_SIGMAS = 4.0    # a fall beyond this many standard errors of the difference of two window means
FALL_MIN = 0.02      # ... and at least this fraction of the reward's scale


def reward_falling(hist: list[float], w: int) -> Optional[tuple[float, float]]:
    """(mean of the `w` values before, mean of the last `w`) when the last are lower by more than
    their noise (the series' step-to-step noise, `step_noise`) and `FALL_MIN` of the scale; else None."""
    if len(hist) < 2 * w:
        return None
    prev, cur = statistics.fmean(hist[-2 * w:-w]), statistics.fmean(hist[-w:])
    noise = step_noise(hist) * math.sqrt(2 / w)
    if prev - cur > max(FALL_SIGMAS * noise, FALL_MIN * max(abs(prev), SWING_FLOOR)):
        return prev, cur
    return None


def rising(prev: list[float], cur: list[float], factor: float, floor: float) -> bool:
    """The mean of `cur` is more than `factor` x the mean of `prev` and above `floor`."""
    if len(prev) < 2 or len(cur) < 2:
        return False
    a, b = mean(prev), mean(cur)
    return b > floor and b > factor * max(a, 0.0)


class Detector:
    """One symptom. `state` is a JSON-able dict (checkpointed); `check` sees the values of this
    step before they enter the monitor's history, so running statistics exclude the current step."""

    name = ""

    def __init__(self):
        self.state: dict = self.initial()

    def initial(self) -> dict:
        return {"armed": True}

    def check(self, mon, step: int, v: dict, fired: list) -> list[Event]:
        raise NotImplementedError

    # helpers
    def sustained(self, key: str, cond: bool) -> int:
        """Consecutive steps `cond` has held (0 when it does not hold now)."""
        runs = self.state.setdefault("runs", {})
        runs[key] = runs.get(key, 0) + 1 if cond else 0
        return runs[key]


class Sustained(Detector):
    """A condition on one metric held for `n` consecutive steps; skipped when the metric is absent."""
    name = ""
    key = ""
    severity = "warning"

    def steps_needed(self, mon) -> int:
        return mon.h.window

    def condition(self, mon, x: float) -> bool:
        raise NotImplementedError

    def event(self, mon, step, x, n) -> Event:
        raise NotImplementedError

    def ready(self, mon) -> bool:
        return True

    def check(self, mon, step, v, fired):
        x = v.get(self.key)
        if x is None or not math.isfinite(x) or not self.ready(mon):
            return []
        n = self.sustained(self.key, self.condition(mon, x))
        if n == 0:
            self.state["armed"] = True
            return []
        if n >= self.steps_needed(mon) and self.state["armed"]:
            self.state["armed"] = False
            return [self.event(mon, step, x, n)]
        return []
