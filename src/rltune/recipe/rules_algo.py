"""Lint rules for the 2026 RL toolbox: clip-higher and dynamic sampling (DAPO), sequence-level
ratios (GSPO), clipped importance weights (CISPO) and the soft overlong penalty.

Same shape as rules.py (id, severity, condition, why; a fix that names the new value). The rules
register in RULES (rules_base.py) when rules.py imports this module, before its waiver rules.

Papers: DAPO, Yu et al. 2025, arXiv:2503.14476; GSPO, Zheng et al. 2025, arXiv:2507.18071;
CISPO, MiniMax-M1, arXiv:2506.13585.
"""

from __future__ import annotations

from typing import Iterator, Optional

from rltune.recipe.rules_base import RULES, Ctx, Hit, num, rule, token_ppo, world
from rltune.recipe.schema import GROUP_ALGOS, Recipe

GSPO_CLIP = (3e-4, 4e-4)       # GSPO sec. 5.1: left and right clip ranges of the sequence ratio
GSPO_CLIP_MAX = 0.01           # above this a length-normalised sequence ratio is never clipped
CISPO_CLIP_LOW_MIN = 0.5       # below this clip_range is a PPO-sized lower bound on the IS weight
CISPO_CLIP_LOW = 1.0           # MiniMax-M1: epsilon_low large = no lower bound
FILTER_GROUP_MIN = 4           # dynamic sampling with fewer samples drops most groups
FILTER_GROUP_START = 8
OVERLONG_FRACTION = 5          # DAPO sec. 3.4/4: a 4096-token buffer of 20480 = 1/5 of the response budget
OVERLONG_SMALL = 20            # a buffer under 1/20 of max_new_tokens is nearly a hard cliff

SEQ_LEVELS = ("sequence", "sequence-token")


def _all_alike(p: float, g: int) -> float:
    """Chance that all g samples of a group score alike at accuracy p (a dropped group)."""
    return p ** g + (1 - p) ** g


def _group_fix(r: Recipe) -> tuple:
    """(group size, fix text): a group size >= 4 for dynamic sampling that keeps the batch
    divisibility rules, changing rollout.batch_size (and train.batch_size) only when it must."""
    rb, tb, mb, w = r.rollout.batch_size, r.train.batch_size, r.train.micro_batch_size, world(r)
    grouped = r.algorithm.name in GROUP_ALGOS
    for g in (FILTER_GROUP_START, 16, FILTER_GROUP_MIN):
        if rb % g == 0 and (not grouped or (rb // g) % w == 0):
            return g, f"set algorithm.group_size: {g}"
    g = FILTER_GROUP_START
    step = g * w
    new_rb = step * max(1, round(rb / step))
    fix = f"set algorithm.group_size: {g} and rollout.batch_size: {new_rb}"
    if tb % new_rb == 0:
        return g, fix
    ratio = max(1, round(tb / rb))
    for k in sorted(range(4, 9), key=lambda k: (abs(k - ratio), k)):
        t = new_rb * k
        if (t // w) % mb == 0:
            return g, fix + f" and train.batch_size: {t} ({k} x rollout.batch_size)"
    return g, fix


# ---------------------------------------------------------------- clipping

@rule("clip-high-below-low", "error",
      "PPO surrogate with algorithm.clip_range_high < algorithm.clip_range",
      "clip-higher widens the upper side (DAPO sec. 3.1: low-probability tokens may grow); an upper bound below "
      "the lower one narrows it instead and speeds up entropy collapse")
def clip_high_below_low(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    # CISPO is exempt: its clip_range is often 1.0 (no lower bound) with a smaller clip_range_high
    a = r.algorithm
    if a.policy_loss != "ppo" or a.clip_range_high is None or a.clip_range_high >= a.clip_range:
        return
    lo, hi = a.clip_range, a.clip_range_high
    yield Hit("algorithm.clip_range_high",
              f"algorithm.clip_range_high {num(hi)} is below algorithm.clip_range {num(lo)}: the ratio is clipped to "
              f"[{num(1 - lo)}, {num(1 + hi)}]; {RULES['clip-high-below-low'].why}",
              f"set algorithm.clip_range_high: {num(lo)} (= clip_range), or swap them: "
              f"algorithm.clip_range: {num(hi)} and algorithm.clip_range_high: {num(lo)}")


@rule("clip-higher-without-filter", "info",
      "GRPO/RLOO with algorithm.clip_range_high > algorithm.clip_range (token ratios) and no algorithm.filter_groups",
      "DAPO pairs clip-higher (sec. 3.1) with dynamic sampling (sec. 3.2): the kept entropy only pays when groups "
      "whose samples all score alike (zero advantage, no gradient) are replaced by ones that teach")
def clip_higher_without_filter(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    a = r.algorithm
    if (not token_ppo(r) or a.name not in GROUP_ALGOS or a.filter_groups is not None
            or a.clip_range_high is None or a.clip_range_high <= a.clip_range):
        return
    yield Hit("algorithm.clip_range_high",
              f"algorithm.clip_range_high {num(a.clip_range_high)} > clip_range {num(a.clip_range)} (clip-higher) without "
              f"algorithm.filter_groups: {RULES['clip-higher-without-filter'].why}",
              "set algorithm.filter_groups: {metric: acc} (DAPO dynamic sampling; or `preset: dapo`), "
              "or nothing to do if you want clip-higher alone")


# ---------------------------------------------------------------- GSPO (sequence-level ratios)

@rule("gspo-token-mean", "warning",
      "algorithm.ratio_level sequence / sequence-token with algorithm.loss_agg token-mean",
      "GSPO's objective is sequence-level (arXiv:2507.18071 sec. 4): each response weighs 1/G whatever its length; "
      "token-mean weighs a response by its token count, so long responses dominate the sequence ratio's gradient")
def gspo_token_mean(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    a = r.algorithm
    if a.ratio_level in SEQ_LEVELS and a.loss_agg == "token-mean":
        yield Hit("algorithm.loss_agg",
                  f"algorithm.ratio_level {a.ratio_level} with algorithm.loss_agg token-mean: {RULES['gspo-token-mean'].why}",
                  "set algorithm.loss_agg: seq-mean-token-mean (the GSPO objective)")


@rule("gspo-clip-size", "warning",
      "PPO surrogate, algorithm.ratio_level sequence / sequence-token, clip_range or clip_range_high > 0.01",
      "GSPO's ratio is length-normalised (the geometric mean of the token ratios), so it stays within a hair of 1: "
      "a PPO-sized clip never binds and the update is unclipped; the paper clips at 3e-4 / 4e-4 (sec. 5.1)")
def gspo_clip_size(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    a = r.algorithm
    if a.ratio_level not in SEQ_LEVELS or a.policy_loss != "ppo":
        return
    for path, v, new in (("algorithm.clip_range", a.clip_range, GSPO_CLIP[0]),
                         ("algorithm.clip_range_high", a.clip_range_high, GSPO_CLIP[1])):
        if v is not None and v > GSPO_CLIP_MAX:
            yield Hit(path, f"{path} {num(v)} with algorithm.ratio_level {a.ratio_level} (max {num(GSPO_CLIP_MAX)}): "
                            f"{RULES['gspo-clip-size'].why}",
                      f"set {path}: {num(new)} (GSPO: clip_range {num(GSPO_CLIP[0])}, clip_range_high {num(GSPO_CLIP[1])}; "
                      "or `preset: gspo`)")


# ---------------------------------------------------------------- CISPO (clipped IS weights)

@rule("cispo-ppo-clip", "warning",
      "algorithm.policy_loss cispo with algorithm.clip_range < 0.5",
      "CISPO clips the importance weight, not the update: MiniMax-M1 (arXiv:2506.13585 sec. 3.1) sets epsilon_low "
      "large (no lower bound) and tunes only epsilon_high; a PPO-sized lower bound overweights every token whose "
      "probability has fallen (its weight is raised to 1 - clip_range): a bias the paper avoids")
def cispo_ppo_clip(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    a = r.algorithm
    if a.policy_loss == "cispo" and a.clip_range < CISPO_CLIP_LOW_MIN:
        yield Hit("algorithm.clip_range",
                  f"algorithm.policy_loss cispo with algorithm.clip_range {num(a.clip_range)} (weights below "
                  f"{num(1 - a.clip_range)} are raised to it): {RULES['cispo-ppo-clip'].why}",
                  f"set algorithm.clip_range: {num(CISPO_CLIP_LOW)} (no lower bound) and tune algorithm.clip_range_high")


@rule("cispo-dual-clip", "error",
      "algorithm.policy_loss cispo with algorithm.dual_clip set",
      "dual clip bounds the PPO surrogate for negative advantages; CISPO has no surrogate to bound, so the setting "
      "would be ignored, and a setting that silently does nothing is an error")
def cispo_dual_clip(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    a = r.algorithm
    if a.policy_loss == "cispo" and a.dual_clip is not None:
        yield Hit("algorithm.dual_clip",
                  f"algorithm.dual_clip {num(a.dual_clip)} with algorithm.policy_loss cispo: {RULES['cispo-dual-clip'].why}",
                  "remove algorithm.dual_clip (CISPO's weight is already capped at 1 + clip_range_high), "
                  "or set algorithm.policy_loss: ppo")


# ---------------------------------------------------------------- DAPO dynamic sampling

@rule("filter-needs-groups", "error",
      "algorithm.filter_groups with algorithm.group_size < 2",
      "a group of one always scores alike, so dynamic sampling drops every group: each step generates until "
      "max_gen_calls and then trains on the dropped groups anyway")
def filter_needs_groups(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if r.algorithm.filter_groups is not None and r.algorithm.group_size < 2:
        yield Hit("algorithm.group_size",
                  f"algorithm.filter_groups with algorithm.group_size {r.algorithm.group_size}: {RULES['filter-needs-groups'].why}",
                  _group_fix(r)[1] + " (or remove algorithm.filter_groups)")


@rule("filter-small-groups", "warning",
      "algorithm.filter_groups with 2 <= algorithm.group_size < 4",
      "a group is kept only when its samples disagree; with few samples most groups agree at low or high accuracy, "
      "are dropped, and each step pays for many extra generation calls")
def filter_small_groups(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    g = r.algorithm.group_size
    if r.algorithm.filter_groups is None or not (2 <= g < FILTER_GROUP_MIN):
        return
    new, fix = _group_fix(r)
    yield Hit("algorithm.group_size",
              f"algorithm.filter_groups with algorithm.group_size {g}: at 10% accuracy {_all_alike(0.1, g):.0%} of the "
              f"groups score alike and are dropped ({_all_alike(0.1, new):.0%} with {new} samples); "
              f"{RULES['filter-small-groups'].why}", fix)


@rule("filter-max-calls", "error",
      "algorithm.filter_groups.max_gen_calls < the step's generation calls (train.updates_per_step x train.batch_size "
      "/ rollout.batch_size); a warning when equal",
      "max_gen_calls counts every generation call of a step, the first round included: below one step's calls the "
      "first round cannot even be generated; equal, no dropped group can be replaced")
def filter_max_calls(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    fg = r.algorithm.filter_groups
    if fg is None:
        return
    calls, m = r.gen_calls_per_step, fg.max_gen_calls
    if m > calls:
        return
    sev: Optional[str] = None if m < calls else "warning"
    if m < calls:
        what = "the first round cannot even be generated"
    else:
        what = ("no call is left to replace a dropped group: every one comes back as a top-up (with a warning), "
                "so filtering only costs")
    yield Hit("algorithm.filter_groups.max_gen_calls",
              f"algorithm.filter_groups.max_gen_calls {m} {'<' if m < calls else '='} the {calls} generation calls one step "
              f"needs (train.updates_per_step {r.train.updates_per_step} x train.batch_size {r.train.batch_size} / "
              f"rollout.batch_size {r.rollout.batch_size}): {what}",
              f"set algorithm.filter_groups.max_gen_calls: {3 * calls} (3 x one step's calls: room to replace dropped groups)",
              severity=sev)


# ---------------------------------------------------------------- DAPO soft overlong penalty

def _buffer_for(max_new: int) -> int:
    return max(1, max_new // OVERLONG_FRACTION)


@rule("overlong-buffer", "error",
      "reward.overlong.buffer >= rollout.max_new_tokens",
      "the penalty starts max_new_tokens - buffer tokens in, at or before the first token: every response, even "
      "a one-token answer, is penalised, and the penalty at the first token is no longer 0")
def overlong_buffer(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    ov = r.reward.overlong
    if ov is None:
        return
    b, m = ov.buffer, r.rollout.max_new_tokens
    if b < m:
        return
    if m >= 2:
        fix = (f"set reward.overlong.buffer: {_buffer_for(m)} (rollout.max_new_tokens // {OVERLONG_FRACTION}, "
               "DAPO's 4096 of 20480)")
    else:
        fix = "raise rollout.max_new_tokens, or remove reward.overlong"
    yield Hit("reward.overlong.buffer",
              f"reward.overlong.buffer {b} >= rollout.max_new_tokens {m}: {RULES['overlong-buffer'].why}", fix)


@rule("overlong-buffer-small", "warning",
      "reward.overlong.buffer < rollout.max_new_tokens / 20",
      "the soft penalty ramps from 0 to -penalty within a few tokens: close to the hard truncation penalty that DAPO "
      "(sec. 3.4) found to be reward noise; the paper's buffer is 4096 of 20480 tokens (1/5)")
def overlong_buffer_small(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    ov = r.reward.overlong
    if ov is None:
        return
    b, m = ov.buffer, r.rollout.max_new_tokens
    if b * OVERLONG_SMALL < m:
        yield Hit("reward.overlong.buffer",
                  f"reward.overlong.buffer {b} is {b / m:.1%} of rollout.max_new_tokens {m}: "
                  f"{RULES['overlong-buffer-small'].why}",
                  f"set reward.overlong.buffer: {_buffer_for(m)} (rollout.max_new_tokens // {OVERLONG_FRACTION})")
