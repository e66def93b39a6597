"""Advice in the playbook's shape: recipe changes (dotted key -> new value) plus the lines that
explain them ("actor.lr 1e-05 -> 5e-07; keep critic.lr 3e-06").

Every function takes the current recipe and returns ``(changes, lines)``. Values proposed here stay
inside the lint bounds of the playbook (actor lr [1e-7, 5e-6], critic lr 1-5 x actor lr and above
it, kl coef [0.01, 0.1], clip range [0.1, 0.3], grad clip 0.5-1.0). No torch import.
"""

from __future__ import annotations

import math

# playbook / lint bounds
ACTOR_LR_MIN, ACTOR_LR_MAX = 1e-7, 5e-6
KL_MIN, KL_MAX = 0.01, 0.1
CLIP_MIN, CLIP_MAX = 0.1, 0.3
CRITIC_RATIO_MAX = 5.0
SWING_LR = 5e-7          # "lower actor lr (e.g. to 5e-7)"
ANTI_OVERFIT = {"kl": 0.08, "entropy": 0.01, "clip": 0.12}

Advice = tuple[dict, list[str]]


def fmt(x) -> str:
    """Numbers the way the playbook writes them: 1e-05, 5e-07, 0.05, 1.0."""
    if isinstance(x, bool) or x is None:
        return str(x).lower() if isinstance(x, bool) else "null"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if not math.isfinite(x):
            return "NaN" if math.isnan(x) else ("Inf" if x > 0 else "-Inf")
        if x == int(x) and abs(x) < 1e5:
            return f"{x:.1f}"
        return f"{x:.3g}"
    return str(x)


def r3(x: float) -> float:
    """Round to 3 significant digits (so advice reads 6e-07, not 6.000000000000001e-07)."""
    return float(f"{x:.3g}")


def change_line(key: str, old, new) -> str:
    return f"{key} {fmt(old)} -> {fmt(new)}"


def _merge(*parts: Advice) -> Advice:
    ch: dict = {}
    lines: list[str] = []
    for c, l in parts:
        for k, v in c.items():
            ch.setdefault(k, v)
        lines.extend(x for x in l if x not in lines)
    return ch, lines


def lower_actor_lr(r, target: float | None = None, why: str = "") -> Advice:
    """Lower actor.lr (to `target`, default half), keeping critic.lr within 1-5x of it."""
    lr = r.actor.lr
    new = r3(max(ACTOR_LR_MIN, lr * 0.5 if target is None else target))
    if new >= lr:
        return {}, [f"actor.lr {fmt(lr)} is already at the playbook floor {fmt(ACTOR_LR_MIN)}"
                    " (raise train.batch_size / rollout.batch_size toward 4-8 for less gradient noise)"]
    tail = f" ({why})" if why else ""
    if not r.has_critic:
        return {"actor.lr": new}, [change_line("actor.lr", lr, new) + tail]
    c = r.critic.lr
    if new < c <= CRITIC_RATIO_MAX * new:
        return {"actor.lr": new}, [change_line("actor.lr", lr, new) + f"; keep critic.lr {fmt(c)}" + tail]
    alt = r3(c / CRITIC_RATIO_MAX)
    if alt * CRITIC_RATIO_MAX < c:
        alt = r3(alt * 1.01)
    if new < alt <= 2 * new and alt < lr:
        # the smallest actor lr that keeps critic <= 5x actor: keep the critic as it is
        return {"actor.lr": alt}, [change_line("actor.lr", lr, alt) + f"; keep critic.lr {fmt(c)}"
                                   " (critic <= 5 x actor)" + tail]
    newc = r3(3 * new)
    return ({"actor.lr": new, "critic.lr": newc},
            [change_line("actor.lr", lr, new) + "; " + change_line("critic.lr", c, newc)
             + " (critic = 3 x actor)" + tail])


def raise_kl(r, cap: float = KL_MAX) -> Advice:
    kl = r.algorithm.kl
    if kl.target is not None:
        new_t = r3(kl.target * 0.5)
        return ({"algorithm.kl.target": new_t},
                [change_line("algorithm.kl.target", kl.target, new_t)
                 + " (adaptive KL controller: a lower target pulls KL down)"])
    new = r3(min(cap, max(kl.coef * 1.5, kl.coef + 0.01)))
    if new <= kl.coef:
        c, l = lower_actor_lr(r, why="kl coef already at the playbook cap")
        return c, [f"algorithm.kl.coef {fmt(kl.coef)} is at the playbook cap {fmt(cap)}"] + l
    return {"algorithm.kl.coef": new}, [change_line("algorithm.kl.coef", kl.coef, new)]


def tighten_clip(r, step: float = 0.05) -> Advice:
    cur = r.algorithm.clip_range
    new = r3(max(CLIP_MIN, cur - step))
    if new >= cur:
        return {}, []
    return {"algorithm.clip_range": new}, [change_line("algorithm.clip_range", cur, new)]


def grad_clip(r, role: str = "actor") -> Advice:
    cur = getattr(r, role).grad_clip
    if cur is not None and cur <= 1.0:
        return {}, []
    return ({f"{role}.grad_clip": 1.0},
            [change_line(f"{role}.grad_clip", cur, 1.0) + " (clip gradients at 0.5-1.0)"])


def precision_and_warmup(r) -> Advice:
    ch: dict = {}
    lines: list[str] = []
    if r.trainer.precision == "fp16":
        ch["trainer.precision"] = "bf16"
        lines.append("trainer.precision fp16 -> bf16 (fp16 overflows cause spikes)")
    if r.actor.warmup_steps == 0:
        ch["actor.warmup_steps"] = 10
        lines.append("actor.warmup_steps 0 -> 10 (add LR warmup)")
    if r.has_critic and r.critic.warmup_steps == 0:
        ch["critic.warmup_steps"] = 10
        lines.append("critic.warmup_steps 0 -> 10")
    return ch, lines


# ---- per symptom -------------------------------------------------------------------------

def for_reward_swing(r, oscillating: bool = False) -> Advice:
    """Lower actor.lr (to 5e-7, or halve it below that), keep critic.lr (the playbook's Day-1 case:
    reward swinging ±25% at actor lr 1e-5)."""
    lr = r.actor.lr
    target = min(lr * 0.5, SWING_LR) if lr > SWING_LR else lr * 0.5
    c, l = lower_actor_lr(r, target)
    why = ("each update overshoots and the next one corrects it, so the reward alternates up and down"
           if oscillating else "each update moves the policy further than the batch's reward can tell apart from noise")
    return c, l + [f"the actor lr is too high for this batch: {why}"]


def for_kl_high(r, kl_value: float, reward_creeping: bool = False, label: str = "KL") -> Advice:
    """`kl_value` and `label` are the number and its name the event message quotes (one number, one meaning)."""
    c, l = raise_kl(r)
    if kl_value > 0.8 and reward_creeping:
        l = l + [f"{label} {fmt(kl_value)} > 0.8 while reward only creeps up: if the outputs still read well,"
                 f" consider actor.lr +20% ({fmt(r.actor.lr)} -> {fmt(r3(r.actor.lr * 1.2))}) instead"]
    return c, l


def lower_critic_lr(r, why: str = "") -> Advice:
    """Halve critic.lr, not below 1.5 x actor.lr (the critic stays the faster learner); keep actor.lr."""
    lr, a = r.critic.lr, r.actor.lr
    new = r3(max(a * 1.5, lr * 0.5))
    tail = f" ({why})" if why else ""
    if new >= lr:
        return {}, [f"critic.lr {fmt(lr)} is already close to actor.lr {fmt(a)}: check the reward"
                    " normalisation (reward.normalize, reward.clip) and algorithm.value_clip" + tail]
    return {"critic.lr": new}, [change_line("critic.lr", lr, new) + f"; keep actor.lr {fmt(a)}" + tail]


def for_spike(r, role: str = "actor") -> Advice:
    if role == "critic":
        return _merge(grad_clip(r, "critic"), lower_critic_lr(r) if r.has_critic else ({}, []),
                      precision_and_warmup(r))
    return _merge(grad_clip(r, "actor"), lower_actor_lr(r), tighten_clip(r), precision_and_warmup(r))


def for_grad_clip(r, role: str, warn: bool, why: str = "") -> Advice:
    """Pre-clip gradient norms above `role`.grad_clip on most steps. Info: the clip sets the step
    size (effective lr lower than set). Warning (with rising loss/KL, or for very long): lower that
    role's lr."""
    clip, lr = getattr(r, role).grad_clip, getattr(r, role).lr
    note = (f"{role} gradients are clipped at {role}.grad_clip {fmt(clip)} on most steps: the clip, not"
            f" {role}.lr {fmt(lr)}, sets the step size (the effective {role} lr is lower than set)")
    if not warn:
        if clip is not None and clip < 1.0:
            return {}, [note, f"fine while the {role} loss and KL are stable; if the run learns too slowly,"
                              f" raise {role}.grad_clip (up to 1.0) rather than {role}.lr"]
        return {}, [note, f"fine while the {role} loss and KL are stable ({role}.grad_clip {fmt(clip)} is the"
                          f" playbook's ceiling: leave it, and do not raise {role}.lr to make up for it)"]
    c, l = lower_critic_lr(r, why) if role == "critic" else lower_actor_lr(r, why=why)
    return c, l + [note]


def for_critic_nan(r) -> Advice:
    ch: dict = {}
    lines: list[str] = []
    if r.has_critic:
        c, a = r.critic.lr, r.actor.lr
        newc = r3(c / 2)
        if newc > a:
            ch["critic.lr"] = newc
            lines.append(change_line("critic.lr", c, newc) + f"; keep actor.lr {fmt(a)} (critic lr too high)")
        else:
            newa = r3(max(ACTOR_LR_MIN, newc / 3))
            ch.update({"critic.lr": newc, "actor.lr": newa})
            lines.append(change_line("critic.lr", c, newc) + "; " + change_line("actor.lr", a, newa)
                         + " (critic lr too high; actor stays below critic)")
    if not r.reward.normalize:
        ch["reward.normalize"] = True
        lines.append("reward.normalize false -> true (unnormalised rewards blow up value targets)")
    if r.reward.clip is None:
        ch["reward.clip"] = 5.0
        lines.append("reward.clip null -> 5.0 (bound the normalised rewards)")
    elif r.reward.normalize:
        lines.append("check the reward normalisation: a running std near 0 divides by ~0")
    if r.has_critic:
        c2, l2 = grad_clip(r, "critic")
        ch.update({k: v for k, v in c2.items() if k not in ch})
        lines += l2
        if r.algorithm.value_clip is None:
            ch["algorithm.value_clip"] = 0.2
            lines.append("algorithm.value_clip null -> 0.2")
    c3, l3 = precision_and_warmup(r)
    ch.update({k: v for k, v in c3.items() if k not in ch})
    lines += l3
    lines.append("the step was skipped: the weights were not touched")
    return ch, lines


def for_actor_nan(r) -> Advice:
    c, l = _merge(grad_clip(r, "actor"), lower_actor_lr(r), precision_and_warmup(r))
    return c, l + ["the step was skipped: the weights were not touched"]


def for_reward_nan(r) -> Advice:
    ch: dict = {}
    lines = ["a reward function returned NaN/Inf (or raised): fix it"]
    if r.reward.on_error == "raise":
        lines.append("reward.on_error raise -> zero scores such samples 0 and warns (only while you fix it)")
    return ch, lines


def for_reward_collapse(r) -> Advice:
    a = r.algorithm
    ch: dict = {}
    lines: list[str] = ["enter the anti-overfit stage (preset anti-overfit):"]
    kl = max(ANTI_OVERFIT["kl"], a.kl.coef)
    if kl != a.kl.coef:
        ch["algorithm.kl.coef"] = kl
        lines.append(change_line("algorithm.kl.coef", a.kl.coef, kl))
    ent = max(ANTI_OVERFIT["entropy"], a.entropy_coef)
    if ent != a.entropy_coef:
        ch["algorithm.entropy_coef"] = ent
        lines.append(change_line("algorithm.entropy_coef", a.entropy_coef, ent) + " (entropy bonus)")
    clip = ANTI_OVERFIT["clip"] if a.clip_range > ANTI_OVERFIT["clip"] else max(a.clip_range, CLIP_MIN)
    if clip != a.clip_range:
        ch["algorithm.clip_range"] = clip
        lines.append(change_line("algorithm.clip_range", a.clip_range, clip))
    if r.reward.model:
        lines.append("the reward model is being exploited: freeze it / retrain it on the new outputs,"
                     " and read samples from the peak and after it")
    else:
        lines.append("the reward is being gamed (reward hacking): read samples from the peak and after it")
    lines.append("resume from the checkpoint nearest the reward peak")
    return ch, lines


def for_entropy_collapse(r) -> Advice:
    a = r.algorithm
    ch: dict = {}
    lines: list[str] = []
    if a.entropy_coef < 0.01:
        ch["algorithm.entropy_coef"] = 0.01
        lines.append(change_line("algorithm.entropy_coef", a.entropy_coef, 0.01) + " (entropy bonus)")
    c, l = raise_kl(r)
    ch.update(c)
    lines += l
    if r.rollout.temperature < 1.0:
        ch["rollout.temperature"] = 1.0
        lines.append(change_line("rollout.temperature", r.rollout.temperature, 1.0))
    lines.append("the policy became near-deterministic: samples of a group look alike, advantages vanish")
    return ch, lines


def for_length_collapse(r) -> Advice:
    c, l = raise_kl(r)
    return c, l + ["check the reward for a length bias (short or empty answers scoring higher)",
                   "read samples: EOS-only or truncated outputs point at the reward, not the optimiser"]


def for_masked_out(r, frac: float) -> Advice:
    """Most responses cut at max_new_tokens and masked out of the loss (rollout.mask_truncated)."""
    mnt = r.rollout.max_new_tokens
    new = min(131072, mnt * 2)
    ch = {"rollout.max_new_tokens": new} if new > mnt else {}
    lines = ([change_line("rollout.max_new_tokens", mnt, new) + f" ({frac:.0%} of responses hit the limit and, "
              "with rollout.mask_truncated, teach nothing: the step trains on the rest, or on nothing)"] if ch else [])
    lines.append("or set rollout.mask_truncated: false and shape length with reward.overlong (a soft penalty keeps "
                 "cut responses in the loss)")
    return ch, lines


def for_length_runaway(r) -> Advice:
    ch: dict = {}
    lines: list[str] = []
    mnt = r.rollout.max_new_tokens
    new = min(131072, mnt * 2)
    if new > mnt:
        ch["rollout.max_new_tokens"] = new
        lines.append(change_line("rollout.max_new_tokens", mnt, new)
                     + " (responses hit the limit: truncated answers are being scored)")
        need = r.data.max_prompt_length + new
        if r.reward.model and r.reward.max_length < need:
            ch["reward.max_length"] = need
            lines.append(change_line("reward.max_length", r.reward.max_length, need)
                         + " (reward model must see prompt + response)")
    if r.algorithm.loss_agg == "seq-mean-token-mean":
        ch["algorithm.loss_agg"] = "token-mean"
        lines.append("algorithm.loss_agg seq-mean-token-mean -> token-mean (per-sequence length"
                     " normalisation favours long responses)")
    lines.append("or add rollout.stop strings / a length penalty to the reward")
    return ch, lines


def for_sync_slow(r) -> Advice:
    lines = ["actor -> rollout weight sync (resharding) is slow: device mesh / engine placement is wrong",
             "colocate the rollout engine with the actor ranks; actor.device_mesh must be a list of"
             " device ids (a 'cuda:0' typo puts a whole role on one card)"]
    if r.actor.device_mesh is not None:
        lines.append(f"actor.device_mesh is {r.actor.device_mesh}: check it matches the rollout engine's devices")
    if r.rollout.tensor_parallel_size > 1:
        lines.append(f"rollout.tensor_parallel_size {r.rollout.tensor_parallel_size}: resharding across TP"
                     " ranks costs a gather per step")
    return {}, lines


def for_stale_weights(r) -> Advice:
    lines = ["rollout log-probs disagree with the actor's: the rollout engine generates with stale weights",
             "check that the weight sync runs after every update (and that it succeeded)"]
    if r.trainer.precision != "fp32":
        lines.append(f"a precision mismatch (actor {r.trainer.precision} vs rollout engine) also shows up here;"
                     " raise rollout.logprob_tolerance only if it is that")
    return {}, lines


def for_skipped_step(r) -> Advice:
    return for_actor_nan(r)


def for_kl_level(r, kl_value: float, label: str = "KL") -> Advice:
    """`kl_value` and `label` are the number and its name the event message quotes (one number, one meaning)."""
    return {}, [f"{label} {fmt(kl_value)} is above the playbook level while the reward still improves: the policy"
                " is moving far from the reference to earn it; fine while eval/samples improve too",
                f"if samples degrade, raise algorithm.kl.coef ({fmt(r.algorithm.kl.coef)})"]


def for_is_weight(r) -> Advice:
    rc = r.algorithm.rollout_correction
    lines = ["importance ratios pi_trainer / pi_rollout are extreme: the rollout engine and the trainer"
             " disagree on some tokens (precision, stale weights, sampling settings)"]
    ch: dict = {}
    if rc.mode == "none":
        ch["algorithm.rollout_correction.mode"] = "tis"
        lines.append("algorithm.rollout_correction.mode none -> tis (truncate the weights at the cap)")
    elif rc.cap > 2.0:
        ch["algorithm.rollout_correction.cap"] = 2.0
        lines.append(change_line("algorithm.rollout_correction.cap", rc.cap, 2.0))
    lines.append("check the weight sync and the rollout engine's dtype against trainer.precision"
                 f" ({r.trainer.precision})")
    return ch, lines


def for_async_drift(r) -> Advice:
    """rollout.asynchronous: the stale samples' importance weights drift from 1."""
    K, rc = r.rollout.asynchronous.max_staleness, r.algorithm.rollout_correction
    old = f"up to {K} weight versions old" if K else "from older weights"
    lines = [f"samples {old}: the policy moves so far per update that their importance"
             " weights pi_prox / pi_sample hit the cap, and the truncated weights bias the gradient"]
    ch: dict = {}
    if K > 1:
        ch["rollout.asynchronous.max_staleness"] = K - 1
        lines.append(change_line("rollout.asynchronous.max_staleness", K, K - 1))
    elif rc.mode == "tis":
        ch["algorithm.rollout_correction.mode"] = "mis"
        lines.append("algorithm.rollout_correction.mode tis -> mis (drop the tokens outside [1/C, C] instead of"
                     " keeping them with a truncated weight)")
    lines.append(f"or a lower actor.lr ({fmt(r.actor.lr)}): each version then moves the policy less")
    lines.append("or rollout.asynchronous.max_staleness 0 (synchronous: no staleness at all)")
    return ch, lines


def for_logprob_drift(r) -> Advice:
    lines = ["the rollout engine's log-probs drift away from the trainer's step by step: a sync that"
             " silently fails or lags, or a numerics mismatch that grows as the weights move"]
    if r.trainer.precision != "fp32":
        lines.append(f"compare the rollout engine's dtype with trainer.precision {r.trainer.precision}")
    lines.append("check the weight sync after every update (timing/sync_ms, rollout/is_weight_max)")
    return {}, lines


def for_zero_adv(r) -> Advice:
    g = r.algorithm.group_size
    ch: dict = {}
    lines = ["most groups score all samples the same (all right or all wrong): zero advantage,"
             " the batch teaches (almost) nothing"]
    if g < 16:
        ch["algorithm.group_size"] = g * 2
        lines.append(change_line("algorithm.group_size", g, g * 2) + " (more samples per prompt: more groups with a spread)")
    lines.append("filter prompts the policy always or never solves (too easy / too hard), or use a graded reward")
    return ch, lines


def for_zero_adv_jump(r) -> Advice:
    lines = ["most groups suddenly score all their samples the same: something changed in the run (the"
             " prompts' difficulty drifts slowly); no recipe change until the cause is known",
             "read this step's samples and rewards: a reward function that returns one score for everything"
             " (an exception scored 0, a changed answer format), a policy that stopped exploring"
             " (actor/entropy falling), or a block of prompts all too easy or too hard",
             "if the train reward is at its maximum, the task is solved for these prompts: use harder"
             " prompts or stop"]
    if r.reward.on_error != "raise":
        lines.append(f"reward.on_error is {r.reward.on_error}: look for reward errors in the log")
    return {}, lines


def for_zero_adv_solved(r) -> Advice:
    return {}, ["most groups now score all their samples the same because the policy solves their prompts:"
                " fine, but the batch teaches little from here",
                "to keep learning: harder prompts (data.train), or a graded reward instead of pass/fail;"
                " or stop: the task is learned for these prompts"]


def for_clipfrac(r) -> Advice:
    c, l = lower_actor_lr(r, why="the update leaves the PPO trust region")
    if r.train.ppo_epochs > 1:
        c["train.ppo_epochs"] = r.train.ppo_epochs - 1
        l.append(change_line("train.ppo_epochs", r.train.ppo_epochs, r.train.ppo_epochs - 1))
    return c, l + ["actor clip fraction rising: most tokens hit the clip range, the ratio runs away"
                   " from the rollout policy"]
