"""What the rollouts look like: response length (collapse, runaway) and groups that give no
learning signal (zero advantage)."""

from __future__ import annotations

import math
import statistics
from typing import Optional

from .. import advice as A
from ..base import SWING_FLOOR, Detector, Event, Sustained, _finite, _rd, robust_level, step_noise


class MaskedOut(Sustained):
    """rollout.mask_truncated removing most of the batch from the loss: more than half the
    responses cut at max_new_tokens, 3 steps in a row (the grad norm is then small or 0)."""
    name = "masked_out"
    key = "rollout/masked_truncated_frac"

    def steps_needed(self, mon):
        return 3

    def condition(self, mon, x):
        return x > 0.5

    def event(self, mon, step, x, n):
        ch, lines = A.for_masked_out(mon.recipe, x)
        return Event(step, "masked_out", "warning",
                     f"{x:.0%} of the responses hit rollout.max_new_tokens {mon.recipe.rollout.max_new_tokens} and are "
                     f"masked out of the loss (rollout.mask_truncated) for {n} steps (step {step}): the update learns "
                     "from few rows or none",
                     {"masked_truncated_frac": _rd(x), "max_new_tokens": mon.recipe.rollout.max_new_tokens, "steps": n,
                      "role": "rollout"}, lines, ch)


class LengthCollapse(Sustained):
    name = "length_collapse"
    key = "response/length_mean"

    def ready(self, mon):
        return len(mon.hist.get(self.key, [])) >= mon.h.window and mon.first_mean(self.key) is not None

    def condition(self, mon, x):
        return x < mon.h.length_collapse * mon.first_mean(self.key)

    def event(self, mon, step, x, n):
        start = mon.first_mean(self.key)
        ch, lines = A.for_length_collapse(mon.recipe)
        return Event(step, "length_collapse", "warning",
                     f"Response length collapsed to {A.fmt(_rd(x, 3))} tokens, {x / start * 100:.0f}% of its start "
                     f"{A.fmt(_rd(start, 3))} (< {mon.h.length_collapse * 100:.0f}%) for {n} steps",
                     {"length": _rd(x), "start": _rd(start), "ratio": _rd(x / start, 3), "steps": n, "role": "actor"},
                     lines, ch)


class LengthRunaway(Sustained):
    """Mean response length grown well beyond its start: to `length_growth` x the start, or pinned at
    rollout.max_new_tokens after starting clearly below it. A run whose responses start at the limit
    (a short max_new_tokens) has not run away."""
    name = "length_runaway"
    key = "response/length_mean"

    def ready(self, mon):
        return len(mon.hist.get(self.key, [])) >= mon.h.window and mon.first_mean(self.key) is not None

    def condition(self, mon, x):
        start = max(mon.first_mean(self.key), 1e-9)
        cap = mon.h.length_runaway * mon.recipe.rollout.max_new_tokens
        return x > mon.h.length_growth * start or (x > cap and x > 1.25 * start)

    def event(self, mon, step, x, n):
        mnt = mon.recipe.rollout.max_new_tokens
        start = mon.first_mean(self.key)
        ch, lines = A.for_length_runaway(mon.recipe)
        return Event(step, "length_runaway", "warning",
                     f"Response length runaway: mean {A.fmt(_rd(x, 3))} tokens, {x / start:.1f}x its start "
                     f"{A.fmt(_rd(start, 3))} and {x / mnt * 100:.0f}% of rollout.max_new_tokens {mnt}, for {n} steps",
                     {"length": _rd(x), "start": _rd(start), "max_new_tokens": mnt, "steps": n, "role": "rollout"},
                     lines, ch)


ZERO_KEYS = ("rollout/zero_std_frac", "batch/zero_adv_frac")   # rltune's own first, then other tools'
JUMP_MIN = 0.2      # a jump adds at least this share of zero-advantage groups ...
JUMP_SIGNAL = 0.5   # ... leaves at most this fraction of the groups that gave a signal before ...
JUMP_P = 1e-3       # ... is this unlikely as sampling noise of the groups at the recent level ...
JUMP_SIGMAS = 4.0   # ... and beyond this many times the share's own recent spread
JUMP_STEPS = 2      # steps in a row: one odd batch is not a jump
# A storm: the share over the last health.window steps at or above STORM_LEVEL (four groups in
# five give no signal: the batch teaches a fifth of what it could), with a count of zero-advantage
# groups unlikely (p < JUMP_P) at STORM_NULL: a run that sits at 0.6 on hard or easy prompts shows
# 0.8 over a window of 8 groups x 5 steps by chance in about 3 runs of 10 (100 steps), so few groups
# need more (34 of 40, 62 of 80). Flagged however the share got there: a ramp over a few steps
# (no jump) or from the first step, which the 2 x window steps above zero_adv_max (0.95) flagged
# late or never. Not a fault when the reward rose over the storm (the groups are all right).
STORM_LEVEL = 0.8
STORM_NULL = 0.6    # ... and the storm (an episode: one event) lasts until the share falls below it
STORM_CALM = 0.4    # the reward before the storm: on the steps whose share was below this


def binom_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p) (terms in logs: no overflow for thousands of groups)."""
    if k <= 0 or p >= 1.0:
        return 1.0
    if p <= 0.0 or k > n:
        return 0.0
    lp, lq, lfn = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    logs = (lfn - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq for i in range(k, n + 1))
    return min(1.0, sum(math.exp(t) for t in logs))


def zero_jump(hist: list[float], x: float, groups: int) -> tuple[bool, float, float]:
    """(jumped, recent level, its spread): the share `x` far above its recent level (the median of
    `hist`): by JUMP_MIN at least, leaving at most JUMP_SIGNAL of the groups that gave a signal,
    beyond JUMP_SIGMAS x the recent spread, and with a chance below JUMP_P of coming from `groups`
    groups sampled at the recent level."""
    base, spread = robust_level(hist)
    jumped = (x - base >= JUMP_MIN and 1.0 - x <= JUMP_SIGNAL * (1.0 - base)
              and x - base > JUMP_SIGMAS * spread
              and binom_tail(round(x * groups), groups, base) < JUMP_P)
    return jumped, base, spread


def zero_storm(shares: list[float], groups: int) -> bool:
    """The share of zero-advantage groups over `shares` (the last health.window steps', `groups`
    groups each) at or above STORM_LEVEL, by more than the noise of so few groups: that many
    zero-advantage groups is unlikely (p < JUMP_P) at STORM_NULL."""
    n = groups * len(shares)
    level = statistics.fmean(shares)
    return level >= STORM_LEVEL and binom_tail(round(level * n), n, STORM_NULL) < JUMP_P


def reward_rose(before: list[float], now: list[float], se: float) -> Optional[tuple[float, float]]:
    """(level before, mean now) when the mean of `now` is above the median of `before` by more
    than 4 standard errors of that mean (`se`: one step's) and 5% of the scale; else None."""
    if not before or not now:
        return None
    base, cur = statistics.median(before), statistics.fmean(now)
    margin = max(4 * se / math.sqrt(len(now)), 0.05 * max(abs(base), SWING_FLOOR))
    return (base, cur) if cur - base > margin else None


class ZeroAdvantage(Detector):
    """The share of groups whose samples all scored the same: rollout/zero_std_frac (every generated
    group, before dynamic sampling drops any) where logged, else batch/zero_adv_frac (other tools'
    logs); skipped when neither is logged. A warning when it jumps (`zero_jump`, `JUMP_STEPS`
    steps in a row: something changed in the run) while the reward did not jump up with it (then
    the groups score alike because the policy now solves their prompts: an info), when it stays
    above `zero_adv_max` for 2 x window steps (the batch teaches almost nothing), or in a storm
    (`zero_storm`: at or above STORM_LEVEL over the last window steps, however it got there) while
    the reward did not rise since the share was last below STORM_CALM (then: no event). One event
    per episode: none again until, for window steps, the share is below STORM_NULL and neither
    jumps nor stays high."""
    name = "zero_advantage"

    def initial(self):
        # calm: the reward on the last 2 x window steps whose share was below STORM_CALM;
        # since: steps since the last of them (or since the first step)
        return {"armed": True, "calm": [], "since": 0}

    def check(self, mon, step, v, fired):
        key = next((k for k in ZERO_KEYS if k in v), None)
        x = v.get(key) if key else None
        if x is None or not math.isfinite(x):
            return []
        h = mon.h
        hist = mon.recent(key, 2 * h.window)
        ready = len(hist) >= max(h.window, h.warmup_steps)
        groups = self._groups(mon, v)
        jumped, base, spread = zero_jump(hist, x, groups) if ready else (False, x, 0.0)
        shares = hist[-(h.window - 1):] + [x]          # the last window steps, this one included
        level = statistics.fmean(shares)
        self._track_calm(v, level, 2 * h.window)
        n_jump = self.sustained("jump", jumped)
        n_high = self.sustained("high", x > h.zero_adv_max)
        n_storm = self.sustained("storm", ready and zero_storm(shares, groups))
        if not (n_jump or n_high or level >= STORM_NULL):
            # the episode ends after window quiet steps: a jump's share still climbing (its window
            # mean below STORM_NULL for a step or two) is the same episode as the storm it becomes
            if self.sustained("quiet", True) >= h.window:
                self.state["armed"] = True
            return []
        self.sustained("quiet", False)
        if not self.state["armed"]:
            return []
        if n_jump >= JUMP_STEPS:
            self.state["armed"] = False
            rose = self._reward_rose(mon, v, n_jump)
            if rose:
                return [self._solved_event(mon, step, x, base, rose, n_jump, key)]
            return [self._jump_event(mon, step, x, base, spread, n_jump, key)]
        if n_high >= 2 * h.window:
            self.state["armed"] = False
            return [self._high_event(mon, step, x, n_high)]
        if n_storm:
            self.state["armed"] = False
            before, now = self._storm_rewards(mon, v)
            se = mon.reward_se(v)
            se = step_noise(mon.recent("reward/mean", 2 * h.window)) if se is None else se
            if reward_rose(before, now, se):
                return []      # the policy solves its prompts: the groups score alike, all right
            return [self._storm_event(mon, step, x, level, before, now, key)]
        return []

    def _track_calm(self, v, level: float, keep: int) -> None:
        """Note this step's reward when the share (`level`: over the last window steps) is below
        STORM_CALM: the reward a storm is compared with."""
        r = v.get("reward/mean")
        if level < STORM_CALM:
            self.state["since"] = 0
            if _finite(r):
                self.state["calm"] = (self.state["calm"] + [float(r)])[-keep:]
        else:
            self.state["since"] += 1

    def _storm_rewards(self, mon, v) -> tuple[list[float], list[float]]:
        """(before, now): the reward on the last calm steps (in a run stormy from its first step:
        on the steps before `now`), and on the last window steps since then, this one included."""
        r = v.get("reward/mean")
        if not _finite(r):
            return [], []
        since = self.state["since"]
        n = max(1, min(mon.h.window, since))
        now = mon.recent("reward/mean", n - 1) + [r]
        earlier = mon.recent("reward/mean", since - 1)
        return self.state["calm"] or earlier[:len(earlier) - (n - 1)], now

    @staticmethod
    def _groups(mon, v) -> int:
        """Groups generated per step: logged with dynamic sampling, else from the recipe."""
        g = v.get("rollout/groups_generated")
        r = mon.recipe
        return round(g) if g is not None and math.isfinite(g) and g >= 1 else r.gen_calls_per_step * r.prompts_per_call

    @staticmethod
    def _reward_rose(mon, v, n: int) -> Optional[tuple[float, float]]:
        """The reward of the last `n` steps above its level over the 2 x window steps before."""
        r = v.get("reward/mean")
        if not _finite(r):
            return None
        w = 2 * mon.h.window
        hist = mon.recent("reward/mean", w + n - 1)
        se = mon.reward_se(v)
        se = step_noise(hist) if se is None else se
        k = len(hist) - (n - 1)   # the jump's earlier steps are "now" too
        return reward_rose(hist[:k], hist[k:] + [r], se)

    def _solved_event(self, mon, step, x, base, rose, n, key):
        ch, lines = A.for_zero_adv_solved(mon.recipe)
        return Event(step, "zero_advantage", "info",
                     f"Groups with zero advantage jumped from {base * 100:.0f}% to {x * 100:.0f}% of the batch"
                     f" (since step {step - n + 1}) while the reward rose {A.fmt(_rd(rose[0], 3))} ->"
                     f" {A.fmt(_rd(rose[1], 3))}: the policy now solves most of its prompts, the batch teaches"
                     " little from here",
                     {"zero_adv_frac": _rd(x), "recent_level": _rd(base), "reward_before": _rd(rose[0]),
                      "reward_now": _rd(rose[1]), "steps": n, "key": key, "role": "data"}, lines, ch)

    def _jump_event(self, mon, step, x, base, spread, n, key):
        ch, lines = A.for_zero_adv_jump(mon.recipe)
        return Event(step, "zero_advantage", "warning",
                     f"Groups with zero advantage jumped from {base * 100:.0f}% to {x * 100:.0f}% of the batch"
                     f" (since step {step - n + 1}; recent spread ±{spread * 100:.0f}%): most groups"
                     " suddenly stopped giving any learning signal",
                     {"zero_adv_frac": _rd(x), "recent_level": _rd(base), "spread": _rd(spread), "steps": n,
                      "key": key, "role": "data"}, lines, ch)

    @staticmethod
    def _high_advice(mon, x):
        ch, lines = A.for_zero_adv(mon.recipe)
        if getattr(mon.recipe.algorithm, "filter_groups", None) is not None and x < 1:
            lines.append(f"dynamic sampling (algorithm.filter_groups) generates ~{1 / (1 - x):.1f}x the "
                         "sequences it trains on at this share")
        return ch, lines

    def _storm_event(self, mon, step, x, level, before, now, key):
        ch, lines = self._high_advice(mon, x)
        w, since = mon.h.window, self.state["since"]
        reward = (f"the reward did not rise ({A.fmt(_rd(statistics.median(before), 3))} ->"
                  f" {A.fmt(_rd(statistics.fmean(now), 3))})" if before and now else "the reward did not rise")
        return Event(step, "zero_advantage", "warning",
                     f"{level * 100:.0f}% of the groups have zero advantage over the last {w} steps (>= "
                     f"{STORM_LEVEL * 100:.0f}%; {x * 100:.0f}% at this step, above {STORM_CALM * 100:.0f}% since"
                     f" step {step - since + 1}) while {reward}: the batch teaches almost nothing",
                     {"zero_adv_frac": _rd(x), "window_frac": _rd(level), "storm_level": STORM_LEVEL, "steps": w,
                      "key": key, "role": "data"}, lines, ch)

    def _high_event(self, mon, step, x, n):
        ch, lines = self._high_advice(mon, x)
        return Event(step, "zero_advantage", "warning",
                     f"{x * 100:.0f}% of the groups have zero advantage (> {mon.h.zero_adv_max * 100:.0f}%) for {n} steps"
                     f" (since step {step - n + 1}): the batch teaches almost nothing",
                     {"zero_adv_frac": _rd(x), "threshold": mon.h.zero_adv_max, "steps": n, "role": "data"}, lines, ch)
