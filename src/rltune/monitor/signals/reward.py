"""The reward being gamed: the train reward rising then giving back much of its rise (reward
collapse), or the held-out eval reward falling while the train reward holds or rises (reward
hacking)."""

from __future__ import annotations

import math
import statistics
from typing import Optional

from .. import advice as A
from ..base import HISTORY, SWING_FLOOR, Detector, Event, _finite, _rd, step_noise

HACK_EVALS = 2      # the eval reward below its best on every eval since, at least this many


class RewardCollapse(Detector):
    """The reward (smoothed over 2 x window steps) rose well above its noise, then gave back
    `collapse_drop` of the rise, 2 steps in a row: reward hacking / reward-model overfitting."""
    name = "reward_collapse"

    def initial(self):
        return {"armed": True, "start": None, "peak": None, "peak_step": None}

    def check(self, mon, step, v, fired):
        h = mon.h
        r = v.get("reward/mean")
        st = self.state
        w = 2 * h.window   # smoothing window: a collapse is a trend, not a noisy dip
        hist = mon.recent("reward/mean", HISTORY) + [r] if _finite(r) else []
        if len(hist) < w:
            return []
        sm = statistics.fmean(hist[-w:])
        if st["start"] is None:
            st["start"] = sm
        if st["peak"] is None or sm > st["peak"]:
            st["peak"], st["peak_step"] = sm, step
        sigma = step_noise(hist)
        rise = st["peak"] - st["start"]
        drop = st["peak"] - sm
        significant_rise = rise > max(6 * sigma, 0.05 * max(abs(st["start"]), SWING_FLOOR))
        collapsed = significant_rise and step > st["peak_step"] and \
            drop >= max(h.collapse_drop * rise, 4 * sigma / math.sqrt(w))
        n = self.sustained("collapse", collapsed)   # 2 steps in a row: not one noisy dip
        if n >= 2 and st["armed"]:
            st["armed"] = False
            ch, lines = A.for_reward_collapse(mon.recipe)
            msg = (f"Reward rose {A.fmt(_rd(st['start'], 3))} -> {A.fmt(_rd(st['peak'], 3))} "
                   f"(peak at step {st['peak_step']}) then collapsed to {A.fmt(_rd(sm, 3))} at step {step}"
                   f" (-{drop / rise * 100:.0f}% of the rise): reward hacking / reward-model overfitting")
            return [Event(step, "reward_collapse", "error", msg,
                          {"start": _rd(st["start"]), "peak": _rd(st["peak"]), "peak_step": st["peak_step"],
                           "now": _rd(sm), "drop_of_rise": _rd(drop / rise, 3), "role": "reward"}, lines, ch)]
        if rise > 0 and drop < 0.5 * h.collapse_drop * rise:
            st["armed"] = True  # recovered toward the peak: a later collapse is a new episode
        return []


def eval_falling(evals: list[list[float]], collapse_drop: float) -> Optional[list[float]]:
    """`evals`: [step, eval reward, train reward (window mean) at that step] per eval. The best
    eval before the last HACK_EVALS when every eval since it is below it by `collapse_drop` x
    its size (or x its rise from the first eval when larger; the size at least SWING_FLOOR) while
    the train reward held or rose; else None. An eval reward that falls from its first value on
    (it never rose) counts: tiny and falling to 0 is the plainest case."""
    if len(evals) <= HACK_EVALS:
        return None
    i, best = max(enumerate(evals[:-HACK_EVALS]), key=lambda ie: (ie[1][1], -ie[0]))
    rise = best[1] - evals[0][1]
    need = collapse_drop * max(rise, abs(best[1]), SWING_FLOOR)
    since = evals[i + 1:]
    if all(best[1] - e[1] >= need for e in since) and evals[-1][2] >= best[2]:
        return best
    return None


class RewardHacking(Detector):
    """The held-out eval reward (`eval/reward`, logged every `trainer.eval_every` steps) below its
    best on every eval since (at least 2) while the train reward held or rose (`eval_falling`)."""
    name = "reward_hacking"

    def initial(self):
        return {"armed": True, "eval": []}

    def check(self, mon, step, v, fired):
        ev, r = v.get("eval/reward"), v.get("reward/mean")
        if not (_finite(ev) and _finite(r)):
            return []
        st = self.state
        train_now = statistics.fmean(mon.recent("reward/mean", mon.h.window - 1) + [r])
        st["eval"] = (st["eval"] + [[step, ev, train_now]])[-HISTORY:]
        best = eval_falling(st["eval"], mon.h.collapse_drop)
        if best is None:
            if ev >= max(e[1] for e in st["eval"]):
                st["armed"] = True   # at its best (again): a later fall is a new episode
            return []
        if not st["armed"]:
            return []
        st["armed"] = False
        ch, lines = A.for_reward_collapse(mon.recipe)
        return [Event(step, "reward_hacking", "error",
                      f"Eval reward fell {A.fmt(_rd(best[1], 3))} -> {A.fmt(_rd(ev, 3))} (best at step {best[0]})"
                      f" while the train reward held or rose ({A.fmt(_rd(best[2], 3))} -> {A.fmt(_rd(train_now, 3))}):"
                      " reward hacking, the policy games the training reward",
                      {"eval_best": _rd(best[1]), "eval_now": _rd(ev), "best_step": best[0],
                       "train_at_best": _rd(best[2]), "train_reward": _rd(train_now), "role": "reward"}, lines, ch)]
