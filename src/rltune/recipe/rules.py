"""Lint rules: the tuning playbook (docs/DESIGN.md §4) as small named functions.

Each rule has an id, a default severity, the condition it checks and why (the field evidence).
A rule function takes the validated Recipe and a Ctx and yields Hits: the dotted key, the
message with the numbers it saw, and a fix that names the new value.

This module holds the core rules and gathers the others (rules_algo, rules_lora, rules_memory):
importing it registers every rule in RULES; `run_rules` runs them. The registry, the bounds and
the shared helpers are in rules_base.py, which the rule modules import (never this module).
"""

from __future__ import annotations

from typing import Iterator, Optional

# the registry, bounds and helpers live in rules_base (the rule modules share them); imported here
# for the rules below and re-exported for callers of rltune.recipe.rules
from rltune.recipe.rules_base import (  # noqa: F401
    ACTOR_LR_RANGE,
    ACTOR_LR_START,
    BATCH_RATIO,
    BATCH_RATIO_ERROR,
    CLIP_RANGE,
    CLIP_START,
    CRITIC_LR_FACTOR,
    CRITIC_LR_MAX_FACTOR,
    GRAD_CLIP_MAX,
    GRAD_CLIP_START,
    KL_RANGE,
    KL_START,
    LORA_LR_FACTOR,
    LORA_LR_RANGE,
    LORA_LR_START,
    RULES,
    WARMUP_START,
    Ctx,
    Hit,
    Rule,
    num,
    rule,
    token_ppo,
    world,
)
from rltune.recipe.schema import CRITIC_ALGOS, GROUP_ALGOS, Recipe


# ---------------------------------------------------------------- learning rates

@rule("lr-order", "error", "PPO: actor.lr >= critic.lr",
      "critic error becomes actor gradient noise; equal rates gave periodic reward oscillation after epoch 3")
def lr_order(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if not r.has_critic:
        return
    a, c = r.actor.lr, r.critic.lr
    if a >= c:
        rel = "equals" if a == c else "is above"
        yield Hit("critic.lr",
                  f"actor.lr {num(a)} {rel} critic.lr {num(c)}: the critic must learn faster than the actor, "
                  f"else {RULES['lr-order'].why}",
                  f"set critic.lr: {num(a * CRITIC_LR_FACTOR)} ({CRITIC_LR_FACTOR:g} x actor.lr)")


@rule("lr-ratio", "error", "PPO: critic.lr > 5 x actor.lr",
      "the critic may be faster than the actor, not more than 5x: a racing value model overfits each batch and its error feeds the advantages")
def lr_ratio(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if not r.has_critic:
        return
    a, c = r.actor.lr, r.critic.lr
    if c > CRITIC_LR_MAX_FACTOR * a * (1 + 1e-9):
        yield Hit("critic.lr",
                  f"critic.lr {num(c)} is {c / a:.3g} x actor.lr {num(a)} (max {CRITIC_LR_MAX_FACTOR:g} x): "
                  f"{RULES['lr-ratio'].why}",
                  f"set critic.lr: {num(a * CRITIC_LR_FACTOR)} ({CRITIC_LR_FACTOR:g} x actor.lr)")


@rule("actor-lr-range", "warning", "actor.lr outside [1e-7, 5e-6]; with model.lora above 5e-5 (the range x10; lora-lr reports the low side)",
      "actor lr 1e-5 made reward swing ±25% and KL climb 0.3 -> 1.2; 5e-7..1e-6 kept swings at ±8%")
def actor_lr_range(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    a = r.actor.lr
    lora = r.model.lora is not None
    lo, hi = LORA_LR_RANGE if lora else ACTOR_LR_RANGE
    start = LORA_LR_START if lora else ACTOR_LR_START
    if lora and a <= hi:
        return  # too low for an adapter is lora-lr's (rules_lora.py): one finding, one fix
    if a < lo or a > hi:
        side = "above" if a > hi else "below"
        effect = ("reward oscillates and KL runs away" if a > hi
                  else "the policy barely moves: reward stays flat for many steps")
        where = (f"the LoRA range [{num(lo)}, {num(hi)}] (the playbook's [{num(ACTOR_LR_RANGE[0])}, "
                 f"{num(ACTOR_LR_RANGE[1])}] x {LORA_LR_FACTOR:g}: an adapter needs ~10x full fine-tuning's lr)"
                 if lora else f"the playbook range [{num(lo)}, {num(hi)}]")
        fix = (f"set actor.lr: {num(start)} (the playbook's start x {LORA_LR_FACTOR:g} for LoRA)" if lora
               else f"set actor.lr: {num(start)} (the playbook's start)")
        if r.has_critic:
            fix += f" and critic.lr: {num(start * CRITIC_LR_FACTOR)}"
        yield Hit("actor.lr",
                  f"actor.lr {num(a)} is {side} {where}: {effect} "
                  f"(field case: {RULES['actor-lr-range'].why})", fix)


# ---------------------------------------------------------------- batches

def _divisors_of(n: int) -> list[int]:
    """The divisors of n, ascending (sqrt time: n may be a large train.batch_size)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def _lcm(a: int, b: int) -> int:
    from math import gcd
    return a * b // gcd(a, b)


def _ratio_waived(r: Recipe) -> bool:
    return any(rid in r.lint.waive for rid in ("batch-ratio-low", "batch-ratio-high"))


def _rows_cut_micro_batches(r: Recipe) -> bool:
    """Whether train.micro_batch_size cuts the micro-batches (not train.max_tokens_per_micro_batch)."""
    return r.train.max_tokens_per_micro_batch is None


def _batch_ok(r: Recipe, rb: int, tb: int, mb: int, ratio: bool) -> bool:
    """Every divisibility rule holds for (rollout, train, micro) batch sizes (and the golden ratio, with `ratio`)."""
    g, w = r.algorithm.group_size, world(r)
    if rb % g or rb % w or (r.algorithm.name in GROUP_ALGOS and (rb // g) % w):
        return False
    if tb % rb or tb % w or (_rows_cut_micro_batches(r) and (tb // w) % mb):
        return False
    return not ratio or BATCH_RATIO[0] <= tb // rb <= BATCH_RATIO[1]


def joint_batch_sizes(r: Recipe, ratio: Optional[bool] = None) -> Optional[tuple]:
    """One consistent (rollout.batch_size, train.batch_size, train.micro_batch_size) that keeps every
    divisibility rule (group_size, world size) and the golden ratio 4-8 (`ratio`; by default unless a
    batch-ratio rule is waived), as close to the recipe's as it gets; None when the recipe's already do.

    The batch rules all print this one proposal: fixes computed one at a time from the original values
    contradict each other (rollout 40, train 192 and micro 10 for train 200 / rollout 16 / micro 16).
    Closest: fewest of rollout/train changed, then the smallest relative change; on a tie the playbook's
    direction (a low ratio raises train.batch_size, a high one changes rollout.batch_size); the micro
    batch is the largest divisor of the per-rank share not above the recipe's (memory)."""
    from math import log
    if ratio is None:
        ratio = not _ratio_waived(r)
    rb0, tb0, mb0 = r.rollout.batch_size, r.train.batch_size, r.train.micro_batch_size
    if _batch_ok(r, rb0, tb0, mb0, ratio):
        return None
    g, w = r.algorithm.group_size, world(r)
    step = g * w if r.algorithm.name in GROUP_ALGOS else _lcm(g, w)
    r0 = tb0 / rb0
    ks = range(BATCH_RATIO[0], BATCH_RATIO[1] + 1) if ratio else range(1, max(BATCH_RATIO[1], round(r0)) + 1)
    rbs = {step}
    for target in [rb0] + [tb0 / k for k in ks]:
        lo = int(target // step) * step
        rbs.update(x for x in (lo, lo + step) if x >= step)
    best = None
    for rb in sorted(rbs):
        for k in ks:
            tb = rb * k
            share = tb // w
            mb = max(d for d in _divisors_of(share) if d <= mb0) if mb0 < share else share
            if not _rows_cut_micro_batches(r):
                mb = mb0                    # the token budget cuts the micro-batches, not the rows
            if not _batch_ok(r, rb, tb, mb, ratio):
                continue
            changed = (rb != rb0) + (tb != tb0)
            dist = abs(log(rb / rb0)) + abs(log(tb / tb0))
            against = (rb != rb0) if r0 < BATCH_RATIO[0] else (tb != tb0)
            cost = (changed, round(dist, 9), against, abs(log(mb / mb0)), rb, tb)
            if best is None or cost < best[0]:
                best = (cost, (rb, tb, mb))
    return best[1] if best else None


def joint_batch_fix(r: Recipe, ratio: Optional[bool] = None) -> Optional[str]:
    """The fix text of joint_batch_sizes: `set KEY: VALUE and KEY: VALUE (...)`, changed keys only."""
    new = joint_batch_sizes(r, ratio)
    if new is None:
        return None
    rb, tb, mb = new
    old = (r.rollout.batch_size, r.train.batch_size, r.train.micro_batch_size)
    keys = ("rollout.batch_size", "train.batch_size", "train.micro_batch_size")
    parts = [f"{k}: {v}" for k, v, o in zip(keys, new, old) if v != o]
    w = world(r)
    why = (f"ratio {tb}/{rb} = {tb // rb}, whole groups of {r.algorithm.group_size}, world size {w}: "
           f"{tb // w // mb} micro-batch(es) of {mb} per rank; the batch sizes fixed together")
    return "set " + " and ".join(parts) + f" ({why})"


@rule("batch-ratio-low", "warning", "train.batch_size / rollout.batch_size < 4",
      "few generation calls per update means a noisy gradient; raising the ratio 2 -> 6 gave 3.2x faster reward convergence")
def batch_ratio_low(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    ratio = r.train.batch_size / r.rollout.batch_size
    if ratio < BATCH_RATIO[0]:
        fix = joint_batch_fix(r, ratio=True) or f"set train.batch_size: {r.rollout.batch_size * BATCH_RATIO[0]}"
        yield Hit("train.batch_size",
                  f"train.batch_size / rollout.batch_size = {r.train.batch_size}/{r.rollout.batch_size} = {ratio:.3g}, "
                  f"below the golden ratio 4-8: {RULES['batch-ratio-low'].why}", fix)


@rule("batch-ratio-high", "warning", "train.batch_size / rollout.batch_size > 8 (error > 10)",
      "one update waits for many generation calls: stale rollouts and a lagging reward signal (rollout 16 -> 32 with train 128 lifted a stalled reward 2.1 -> 2.7)")
def batch_ratio_high(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    ratio = r.train.batch_size / r.rollout.batch_size
    if ratio > BATCH_RATIO[1]:
        sev = "error" if ratio > BATCH_RATIO_ERROR else None
        fix = joint_batch_fix(r, ratio=True) or f"set train.batch_size: {r.rollout.batch_size * BATCH_RATIO[1]}"
        yield Hit("train.batch_size",
                  f"train.batch_size / rollout.batch_size = {r.train.batch_size}/{r.rollout.batch_size} = {ratio:.3g}, "
                  f"above the golden ratio 4-8{' (error above 10)' if sev else ''}: {RULES['batch-ratio-high'].why}",
                  fix, severity=sev)


@rule("divisibility", "error",
      "train.batch_size not divisible by rollout.batch_size or by micro_batch_size x world size (by the world "
      "size with train.max_tokens_per_micro_batch); "
      "rollout.batch_size not divisible by group_size or world size",
      "a remainder is silently dropped or padded: uneven ranks hang collectives and partial groups get wrong advantages")
def divisibility(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    tb, rb, mb, g, w = (r.train.batch_size, r.rollout.batch_size, r.train.micro_batch_size,
                        r.algorithm.group_size, world(r))
    wtxt = f"world size {w} (trainer.nproc {r.trainer.nproc} x nnodes {r.trainer.nnodes})"
    # every hit prints the one joint proposal (rollout, train and micro batch sizes together)
    fix = joint_batch_fix(r) or "set the batch sizes to multiples as the message says"
    if rb % g:
        yield Hit("rollout.batch_size",
                  f"rollout.batch_size {rb} is not a multiple of algorithm.group_size {g}: batches must hold whole groups "
                  f"(each prompt gets {g} samples)", fix)
    if rb % w:
        yield Hit("rollout.batch_size", f"rollout.batch_size {rb} is not divisible by the {wtxt}: ranks would generate unequal shares",
                  fix)
    elif r.algorithm.name in GROUP_ALGOS and rb % g == 0 and (rb // g) % w:
        yield Hit("rollout.batch_size",
                  f"rollout.batch_size {rb} holds {rb // g} prompts x {g} samples; {rb // g} prompts do not split over the {wtxt}, "
                  "so a group would straddle two ranks", fix)
    if tb % rb:
        yield Hit("train.batch_size",
                  f"train.batch_size {tb} is not a multiple of rollout.batch_size {rb}: one step gathers whole generation calls",
                  fix)
    if not _rows_cut_micro_batches(r):
        if tb % w:                          # the token budget cuts micro-batches: any row count per rank
            yield Hit("train.batch_size", f"train.batch_size {tb} is not divisible by the {wtxt}", fix)
    elif tb % mb:
        yield Hit("train.micro_batch_size",
                  f"train.batch_size {tb} is not divisible by train.micro_batch_size {mb}: gradient accumulation needs whole micro-batches",
                  fix)
    elif tb % w:
        yield Hit("train.batch_size", f"train.batch_size {tb} is not divisible by the {wtxt}", fix)
    elif (tb // w) % mb:
        share = tb // w
        yield Hit("train.micro_batch_size",
                  f"each of {w} ranks trains on train.batch_size/{w} = {share} sequences per update, not a multiple of "
                  f"train.micro_batch_size {mb} (micro batches are per rank)", fix)


@rule("group-size", "error", "GRPO/RLOO with algorithm.group_size < 2",
      "a group of one has zero advantage (its reward minus its own mean): the policy never moves")
def group_size(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if r.algorithm.name in GROUP_ALGOS and r.algorithm.group_size < 2:
        yield Hit("algorithm.group_size",
                  f"{r.algorithm.name} with algorithm.group_size {r.algorithm.group_size}: {RULES['group-size'].why}",
                  "set algorithm.group_size: 4 (and keep rollout.batch_size a multiple of it)")


@rule("greedy-groups", "error", "GRPO/RLOO with rollout.do_sample false",
      "greedy decoding gives every sample of a group the same answer and reward, so every advantage is 0")
def greedy_groups(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if r.algorithm.name in GROUP_ALGOS and not r.rollout.do_sample:
        yield Hit("rollout.do_sample",
                  f"{r.algorithm.name} with rollout.do_sample false: {RULES['greedy-groups'].why}",
                  "set rollout.do_sample: true (greedy rollouts only make sense for ppo or reinforce_pp)")


# ---------------------------------------------------------------- regularisation

@rule("kl-range", "warning",
      "algorithm.kl.coef outside [0.01, 0.1]; 0 is an info when the reward comes only from reward functions (verifiable rewards)",
      "too high and the policy collapses onto safe stock phrases (the \"I understand\" parrot); too low and it drifts from the reference into reward hacking")
def kl_range(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    c = r.algorithm.kl.coef
    lo, hi = KL_RANGE
    sev = None
    fix = f"set algorithm.kl.coef: {num(KL_START)}"
    if c > hi:
        why = "too high: the policy collapses onto safe stock phrases (the \"I understand\" parrot); field case: kl 0.1 -> 0.03 steadied KL at 0.45"
    elif c == 0 and r.reward.model is None:
        # a deliberate "no KL" (the default is 0.05): DAPO (arXiv:2503.14476 sec. 2.3) drops the KL
        # for rule-based rewards, which a drifting policy cannot game the way it games a reward model
        sev = "info"
        why = ("fine for rule-based (verifiable) rewards, as in DAPO (arXiv:2503.14476 sec. 2.3), "
               "where drifting from the reference is the point; watch for reward-function hacking")
        fix = f"nothing to do for verifiable rewards; set algorithm.kl.coef: {num(KL_START)} to hold the policy near the reference"
    elif c == 0:
        why = ("with a reward model (reward.model) nothing holds the policy near the reference, "
               "it drifts into reward hacking")
    elif c < lo:
        why = "too low: the policy drifts from the reference into reward hacking"
    else:
        return
    where = "turns the KL penalty off" if c == 0 else f"is outside [{num(lo)}, {num(hi)}]"
    yield Hit("algorithm.kl.coef", f"algorithm.kl.coef {num(c)} {where}: {why}", fix, severity=sev)


@rule("clip-range", "warning",
      "PPO surrogate with token ratios: algorithm.clip_range / clip_range_high outside [0.1, 0.3] (error if >= 1)",
      "a wide clip lets one batch move the policy far (spikes); a narrow one makes it too conservative (clip 0.1 -> 0.15 lifted the human score 3.9 -> 4.2)")
def clip_range(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    # the playbook's range is for per-token ratios in the PPO surrogate; GSPO's sequence ratios
    # (gspo-clip-size) and CISPO's clipped weights (cispo-ppo-clip) have their own scales
    if not token_ppo(r):
        return
    lo, hi = CLIP_RANGE
    for path in ("algorithm.clip_range", "algorithm.clip_range_high"):
        v = getattr(r.algorithm, path.rsplit(".", 1)[1])
        if v is None:
            continue
        if v <= 0 or v >= 1:
            yield Hit(path, f"{path} {num(v)} must be in (0, 1) for the PPO surrogate with token ratios "
                            f"(the ratio is clipped to [1 - clip_range, 1 + clip_range_high])",
                      f"set {path}: {num(CLIP_START)}", severity="error")
        elif v < lo:
            yield Hit(path, f"{path} {num(v)} is below [{num(lo)}, {num(hi)}]: updates become so small the policy is over-conservative "
                            "(field case: clip 0.1 -> 0.15 lifted the human score 3.9 -> 4.2)", f"set {path}: 0.15")
        elif v > hi:
            yield Hit(path, f"{path} {num(v)} is above [{num(lo)}, {num(hi)}]: one batch can move the policy far, KL and grad-norm spikes follow",
                      f"set {path}: {num(CLIP_START)}")


# ---------------------------------------------------------------- stability

def _roles(r: Recipe):
    yield "actor", r.actor
    if r.has_critic:
        yield "critic", r.critic


@rule("grad-clip", "warning", "actor/critic grad_clip unset (None) or > 5",
      "without clipping, one bad batch gives a grad-norm spike that the reward curve only shows later")
def grad_clip(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    for role, cfg in _roles(r):
        g = cfg.grad_clip
        if g is None:
            yield Hit(f"{role}.grad_clip", f"{role}.grad_clip is off: {RULES['grad-clip'].why}",
                      f"set {role}.grad_clip: {num(GRAD_CLIP_START)} (0.5-1.0)")
        elif g > GRAD_CLIP_MAX:
            yield Hit(f"{role}.grad_clip", f"{role}.grad_clip {num(g)} > {num(GRAD_CLIP_MAX)} clips almost nothing: {RULES['grad-clip'].why}",
                      f"set {role}.grad_clip: {num(GRAD_CLIP_START)} (0.5-1.0)")


@rule("warmup", "warning", "actor/critic warmup_steps == 0",
      "the first updates at full lr hit a fresh value head and unnormalised advantages: early KL and grad-norm spikes")
def warmup(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    for role, cfg in _roles(r):
        if cfg.warmup_steps == 0:
            yield Hit(f"{role}.warmup_steps", f"{role}.warmup_steps is 0 (no lr warmup): {RULES['warmup'].why}",
                      f"set {role}.warmup_steps: {min(WARMUP_START, max(1, r.trainer.max_steps // 10))}")


@rule("precision", "warning", "trainer.precision == fp16",
      "fp16's narrow range overflows in the ratio and KL terms: loss and KL spikes; bf16 keeps fp32's range")
def precision(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if r.trainer.precision == "fp16":
        yield Hit("trainer.precision", f"trainer.precision fp16: {RULES['precision'].why}",
                  "set trainer.precision: bf16 (Ampere or newer GPUs) or fp32")


@rule("seed", "warning", "trainer.seed unset (None)",
      "a run you cannot repeat cannot be debugged: the seed drives python, numpy, torch and the prompt sampler (shuffle, drop_last)")
def seed(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if r.trainer.seed is None:
        yield Hit("trainer.seed", f"trainer.seed is unset: {RULES['seed'].why}", "set trainer.seed: 42")


# ---------------------------------------------------------------- placement

@rule("device-mesh", "error",
      "device_mesh not a list of device ids, empty, ids out of range of the world size, or duplicated",
      "a wrong mesh silently piles a role onto one card (the \"cuda:0\" typo put the whole critic on one GPU and halved throughput)")
def device_mesh(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    w = world(r)
    meshes = {}
    for role, cfg in (("actor", r.actor), ("critic", r.critic)):
        mesh = cfg.device_mesh
        if mesh is None or (role == "critic" and not r.has_critic):
            continue
        path = f"{role}.device_mesh"
        meshes[role] = mesh
        if len(mesh) == 0:
            yield Hit(path, f"{path} is an empty list: the {role} would run nowhere",
                      f"remove {path} (= all ranks) or list ids, e.g. {list(range(w))}")
            continue
        bad = [d for d in mesh if d < 0 or d >= w]
        if bad:
            yield Hit(path, f"{path} has ids {bad} outside 0..{w - 1} (world size {w} = trainer.nproc x trainer.nnodes)",
                      f"use ids in 0..{w - 1}, e.g. {path}: {list(range(w))}, or raise trainer.nproc")
        dup = sorted({d for d in mesh if mesh.count(d) > 1})
        if dup:
            yield Hit(path, f"{path} lists ids {dup} more than once: one rank would host two copies of the {role}",
                      f"set {path}: {sorted(set(d for d in mesh if 0 <= d < w))}")
    if "actor" in meshes and "critic" in meshes and meshes["actor"] and meshes["critic"]:
        shared = sorted(set(meshes["actor"]) & set(meshes["critic"]))
        if shared:
            yield Hit("critic.device_mesh",
                      f"actor and critic share devices {shared}: fine here, rltune colocates roles and offloads between phases",
                      "nothing to do; give them disjoint meshes only if memory runs out", severity="info")


# ---------------------------------------------------------------- lengths and rewards

@rule("reward-length", "error", "reward.model set and reward.max_length < data.max_prompt_length + rollout.max_new_tokens",
      "the reward model silently truncates the sequence and scores a response it never saw the end of")
def reward_length(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if r.reward.model is None:
        return
    need = r.data.max_prompt_length + r.response_tokens
    if r.reward.max_length < need:
        yield Hit("reward.max_length",
                  f"reward.max_length {r.reward.max_length} < data.max_prompt_length {r.data.max_prompt_length} + "
                  f"{r.response_label} = {need}: {RULES['reward-length'].why}",
                  f"set reward.max_length: {need} (or lower rollout.max_new_tokens)")


@rule("max-model-len", "error", "rollout.max_model_len < data.max_prompt_length + rollout.max_new_tokens",
      "the generation engine refuses or truncates sequences longer than its context")
def max_model_len(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    m = r.rollout.max_model_len
    need = r.data.max_prompt_length + r.response_tokens
    if m is not None and m < need:
        yield Hit("rollout.max_model_len",
                  f"rollout.max_model_len {m} < data.max_prompt_length {r.data.max_prompt_length} + "
                  f"{r.response_label} = {need}: {RULES['max-model-len'].why}",
                  f"set rollout.max_model_len: {need} (or remove it: the default is exactly that)")


@rule("no-reward", "error", "reward.functions empty and reward.model unset (and no rollout.env, whose reward() "
      "`validate` checks with the files)",
      "with no reward every advantage is zero: the run burns compute and the policy never moves")
def no_reward(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if not r.reward.functions and r.reward.model is None and not r.rollout.env:
        yield Hit("reward", f"no reward: reward.functions is empty and reward.model is unset; {RULES['no-reward'].why}",
                  "set reward.functions: [builtin:exact_answer] (or a module:function of your own), or reward.model")


_CRITIC_KEYS = ("model.critic", "algorithm.lam", "algorithm.value_clip", "algorithm.whiten_advantages")


@rule("unused-critic", "info", "critic settings given with an algorithm that has no critic (grpo, rloo, reinforce_pp)",
      "only PPO trains a value model; these settings are ignored")
def unused_critic(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if r.algorithm.name in CRITIC_ALGOS:
        return
    paths = [f"critic.{k}" for k in sorted(r.critic.model_fields_set)]
    paths += [p for p in _CRITIC_KEYS if ctx.user_set(r, p)]
    paths = [p for p in paths if ctx.user_set(r, p)]
    if paths:
        yield Hit(paths[0], f"{', '.join(paths)} set, but algorithm.name is {r.algorithm.name}, which has no critic: "
                            f"{RULES['unused-critic'].why}",
                  "remove them, or set algorithm.name: ppo if you meant to train a critic")


@rule("clip-inactive", "info",
      "clip_range / clip_range_high / dual_clip set, or autotune on, with one update per step (ppo_epochs x train.updates_per_step = 1)",
      "with one update per step every update starts at the behaviour policy, the PPO ratio is exactly 1 and "
      "clipping never engages; autotune's clip fix changes nothing")
def clip_inactive(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if r.optimizer_updates_per_step > 1:
        return
    keys = [p for p in ("algorithm.clip_range", "algorithm.clip_range_high", "algorithm.dual_clip")
            if ctx.user_set(r, p)]
    if r.autotune.enabled:
        keys.append("autotune.enabled")
    if keys:
        yield Hit(keys[0], f"{', '.join(keys)} set, but train.ppo_epochs x train.updates_per_step = 1: "
                           f"{RULES['clip-inactive'].why}",
                  "set train.updates_per_step: 2 (or train.ppo_epochs: 2) for clipping to act; otherwise nothing to do")


# the 2026 toolbox rules (DAPO, GSPO, CISPO): rules_algo.py, registered here, before the waiver rules
from rltune.recipe import rules_algo  # noqa: E402,F401  (registers its rules in RULES)
# LoRA (model.lora): rules_lora.py, registered the same way
from rltune.recipe import rules_lora  # noqa: E402,F401  (registers its rules in RULES)
# the memory budget (rltune.plan) against known hardware: rules_memory.py, registered the same way
from rltune.recipe import rules_memory  # noqa: E402,F401  (registers its rules in RULES)
# settings that do nothing where they are, rollback's preconditions, the truncation mask: rules_settings.py
from rltune.recipe import rules_settings  # noqa: E402,F401  (registers its rules in RULES)
# generation one step ahead (rollout.asynchronous): rules_async.py
from rltune.recipe import rules_async  # noqa: E402,F401  (registers its rules in RULES)


@rule("unknown-waiver", "warning", "lint.waive names a rule that does not exist",
      "a misspelt waiver waives nothing")
def unknown_waiver(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    import difflib
    for rid in r.lint.waive:
        if rid not in RULES and rid != "schema":
            close = difflib.get_close_matches(rid, list(RULES), n=1, cutoff=0.6)
            yield Hit(f"lint.waive.{rid}", f"lint.waive names unknown rule `{rid}`: {RULES['unknown-waiver'].why}",
                      f"did you mean `{close[0]}`?" if close else "rule ids: " + ", ".join(sorted(RULES)))


@rule("waived-error", "error", "lint.waive names a rule that reports an error on this recipe",
      "only warnings and infos can be waived: an error is a recipe that trains wrongly or not at all, "
      "so the error stays")
def waived_error(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    for rid in r.lint.waive:
        rl = RULES.get(rid)
        if rl is None or rid == "waived-error":
            continue
        errors = [h for h in rl.fn(r, ctx) or () if (h.severity or rl.severity) == "error"]
        if errors:
            h = errors[0]
            yield Hit(f"lint.waive.{rid}", f"lint.waive.{rid} waives an error (`{rid}` at {h.path}): "
                                           f"{RULES['waived-error'].why}",
                      f"fix the recipe as `{rid}` says ({h.fix}), then remove lint.waive.{rid}")


def run_rules(r: Recipe, ctx: Optional[Ctx] = None) -> Iterator[tuple]:
    """Yield (Rule, Hit) for every rule that fires."""
    ctx = ctx or Ctx()
    for rl in RULES.values():
        for h in rl.fn(r, ctx) or ():
            yield rl, h
