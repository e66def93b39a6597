"""The training loop: one readable controller, numbered steps, every rank runs it (SPMD).

Per step:
  1. generate   train.batch_size / rollout.batch_size generation calls (group_size samples per prompt)
  2. score      reward functions / reward model -> scores (B,)
  3. reference  reference log-probs (no autograd), when a KL term is used
  4. old policy actor log-probs (no autograd) when ppo_epochs > 1; with one epoch the update's
                own first forward is exactly on-policy, so it is not computed twice
  5. values     critic values (no autograd), PPO only
  6. KL         in the reward (token rewards) or kept for the loss; the KL controller updates
  7. advantages ppo = GAE, grpo / rloo = group baselines, reinforce_pp = whitened returns
  8. update     ppo_epochs passes: actor then critic, micro-batched with weighted accumulation,
                clipping, LR schedule, entropy bonus; a non-finite update is skipped
  9. sync       actor weights -> rollout engine (timed: timing/sync_ms)
 10. metrics    metrics.jsonl, trackers, health monitor, autotune, console
"""

from __future__ import annotations

import time

import torch

from ..algo import (
    broadcast_to_tokens,
    gae,
    grpo_advantages,
    kl as kl_estimate,
    kl_in_reward,
    reinforce_pp_advantages,
    rloo_advantages,
)
from ..engine.roles import current_lr, set_lr
from ..rollout.base import Sampling
from .collective import gather_rows, global_sum, global_whiten
from .console import LOG
from .experience import Experience
from .prompts import encode_prompt, prompt_text, reward_columns
from .setup import Components
from .update import (
    Knobs,
    forward_logp,
    forward_values,
    make_actor_loss,
    make_critic_loss,
    run_update,
)


def rollout_phase(c: Components) -> tuple[Experience, list[str], list[str], dict]:
    """Step 1: generation calls until the step holds train.batch_size sequences (per rank)."""
    r, tok = c.recipe, c.tokenizer
    n = r.algorithm.group_size
    parts, prompts, rows = [], [], []
    for _ in range(r.gen_calls_per_step):
        batch_rows = [c.train_set.rows[i] for i in c.sampler.next_batch()]
        ids = [encode_prompt(row, tok, r.data, c.train_set.prompt_key) for row in batch_rows]
        parts.append(c.rollout.generate(ids, Sampling.from_recipe(r.rollout, n)))
        for row in batch_rows:
            prompts += [prompt_text(row, c.train_set.prompt_key)] * n
            rows += [row] * n
    exp = parts[0] if len(parts) == 1 else Experience.concat(parts, c.rollout.pad_id)
    getattr(c.rollout, "sleep", lambda: None)()  # free rollout memory while training (GPU vLLM)
    completions = decode(tok, exp, c.rollout)
    return exp, prompts, completions, reward_columns(rows, c.train_set.prompt_key)


def decode(tokenizer, exp: Experience, rollout) -> list[str]:
    """Response texts as the reward sees them: EOS and padding dropped, every other token
    kept, special ones too (a model must not hide text from the reward in tokens that a
    `skip_special_tokens` decode would drop)."""
    drop = set(rollout.eos_ids) | {rollout.pad_id}
    out = []
    for ids, mask in zip(exp.response_ids, exp.response_mask):
        kept = [i for i in ids[mask.bool()].tolist() if i not in drop]
        out.append(tokenizer.decode(kept, skip_special_tokens=False))
    return out


def compute_advantages(c: Components, exp: Experience, kl_coef: float, logp0: torch.Tensor) -> dict:
    """Steps 6-7: KL (in reward or for the loss) and advantages; fills exp in place."""
    algo, mask = c.recipe.algorithm, exp.response_mask
    stats = {}
    kl_tok = None
    if exp.ref_logp is not None:
        kl_tok = kl_estimate(logp0, exp.ref_logp, algo.kl.estimator) * mask       # (B, T)
        kl_seq = gather_rows(kl_tok.sum(-1))                                        # (B * world,)
        n_tok = gather_rows(mask.sum(-1))
        stats["kl"] = float(kl_seq.mean())                                          # per sequence
        stats["kl/token_mean"] = float(kl_seq.sum() / n_tok.sum().clamp(min=1))
    in_reward = algo.kl.mode == "reward" and exp.ref_logp is not None
    scores = exp.scores                                                              # (B,)
    if algo.name in ("ppo", "reinforce_pp"):
        # token rewards: the score at the last token, minus coef * KL on every token when in reward
        exp.token_rewards = kl_in_reward(scores, logp0, exp.ref_logp if in_reward else logp0, mask,
                                         kl_coef if in_reward else 0.0, algo.kl.estimator)
    if algo.name == "ppo":
        adv, ret = gae(exp.token_rewards, exp.old_values, mask, algo.gamma, algo.lam)
        exp.returns = ret
        exp.advantages = global_whiten(adv, mask) if algo.whiten_advantages else adv
    elif algo.name in ("grpo", "rloo"):
        seq = scores - kl_coef * kl_tok.sum(-1) if in_reward else scores            # (B,)
        if algo.name == "grpo":
            adv = grpo_advantages(seq, algo.group_size, scale_by_std=algo.scale_by_std)
        else:
            adv = rloo_advantages(seq, algo.group_size)
        exp.advantages = broadcast_to_tokens(adv, mask)                              # (B, T)
    else:  # reinforce_pp
        exp.advantages = reinforce_pp_advantages(exp.token_rewards, mask, algo.gamma)
    return stats


def micro_batches(exp: Experience, micro: int, update_size: int, gen: torch.Generator) -> list[list[Experience]]:
    """Shuffle the step's experience, cut it into updates of `update_size` sequences, each
    a list of micro-batches of `micro` sequences."""
    order = torch.randperm(exp.size, generator=gen)
    updates = []
    for u in range(0, exp.size, update_size):
        idx = order[u:u + update_size]
        updates.append([exp.select(idx[m:m + micro]) for m in range(0, len(idx), micro)])
    return updates


def train_step(c: Components, step: int, knobs: Knobs, gen: torch.Generator, faults=None) -> dict:
    """One RL step; returns its metrics."""
    r = c.recipe
    algo = r.algorithm
    micro = r.train.micro_batch_size
    temp = r.rollout.temperature
    t_start = time.perf_counter()
    timings = {}

    # 1. generate
    t0 = time.perf_counter()
    exp, prompts, completions, columns = rollout_phase(c)
    timings["timing/rollout_s"] = time.perf_counter() - t0

    # 2. score
    t0 = time.perf_counter()
    result = c.rewards(prompts, completions, columns)
    if r.logging.sample_every and step % r.logging.sample_every == 0 and c.dist.is_main:
        LOG.info("[Sample] step=%d reward=%.3f prompt=%r completion=%r", step, result.scores[0],
                 prompts[0][-80:], completions[0][:200])
    if faults is not None:
        faults.maybe_corrupt_rewards(step, result.scores)
    exp.scores = torch.tensor(result.scores, dtype=torch.float32)                     # (B,)
    exp = exp.to(c.dist.device)  # the rollout hands back CPU tensors; the models may be on a GPU
    if not torch.isfinite(exp.scores).all():
        bad = int((~torch.isfinite(exp.scores)).nonzero()[0])
        from ..reward import RewardError

        raise RewardError(f"reward for sample {bad} (prompt {prompts[bad][:60]!r}) is {float(exp.scores[bad])}: "
                          "check the reward model / normalisation")
    timings["timing/reward_s"] = time.perf_counter() - t0

    # 3. reference log-probs
    t0 = time.perf_counter()
    if c.reference is not None:
        exp.ref_logp = forward_logp(c.reference.module, exp, temp, micro)           # (B, T)
    timings["timing/reference_s"] = time.perf_counter() - t0

    # 4. old policy log-probs (only when the experience is reused over several epochs)
    t0 = time.perf_counter()
    if r.train.ppo_epochs > 1 or exp.rollout_logp is None:
        c.actor.eval()
        exp.old_logp = forward_logp(c.actor.module, exp, temp, micro)               # (B, T)
    logp0 = exp.old_logp if exp.old_logp is not None else exp.rollout_logp           # (B, T)

    # 5. values
    if c.critic is not None:
        c.critic.eval()
        exp.old_values = forward_values(c.critic.module, exp, micro)                 # (B, T)
    timings["timing/old_s"] = time.perf_counter() - t0

    # 6-7. KL and advantages
    kl_stats = compute_advantages(c, exp, knobs.kl_coef, logp0)

    # 8. updates
    t0 = time.perf_counter()
    probe: dict = {}  # the first pass compares the actor's log-probs with the rollout's
    critic_loss = make_critic_loss(c.critic, r) if c.critic is not None else None
    update_size = max(1, r.train.batch_size // c.dist.world_size)
    actor_results, critic_results = [], []
    for epoch in range(r.train.ppo_epochs):
        actor_loss = make_actor_loss(c.actor, r, knobs, temp, algo.kl.mode == "loss",
                                     probe if epoch == 0 else None)
        for mbs in micro_batches(exp, micro, update_size, gen):
            actor_results.append(run_update(c.actor, mbs, actor_loss, algo.loss_agg,
                                            force_nonfinite=bool(faults and faults.actor_inf(step))))
            if critic_loss is not None:
                critic_results.append(run_update(c.critic, mbs, critic_loss, algo.loss_agg,
                                                 force_nonfinite=bool(faults and faults.critic_nan(step))))
    timings["timing/train_s"] = time.perf_counter() - t0

    # 9. weight sync actor -> rollout engine
    getattr(c.rollout, "wake_up", lambda: None)()
    sync_ms = 0.0 if (faults and faults.skip_sync(step)) else c.rollout.sync_weights(c.actor)
    timings["timing/sync_ms"] = sync_ms
    LOG.debug("Actor resharding time: %d ms", round(sync_ms))

    # KL controller (adaptive when algorithm.kl.target is set)
    if "kl" in kl_stats:
        c.kl_ctl.update(kl_stats["kl"], exp.size * c.dist.world_size)
        knobs.kl_coef = c.kl_ctl.coef

    # 10. metrics (over the global batch: every rank's sequences)
    mask = exp.response_mask
    step_s = time.perf_counter() - t_start
    scores = gather_rows(exp.scores)                                                 # (B * world,)
    lengths = gather_rows(mask.sum(-1))
    n_tokens = global_sum([float(mask.sum() + exp.prompt_mask.sum())])[0]
    m = {
        "step": step,
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if scores.numel() > 1 else 0.0,
        "kl": kl_stats.get("kl", 0.0),
        "kl/token_mean": kl_stats.get("kl/token_mean", 0.0),
        "kl_coef": knobs.kl_coef,
        "response/length_mean": float(lengths.mean()),
        "response/clip_ratio": float((lengths >= r.rollout.max_new_tokens).float().mean()),
        "timing/step_s": step_s,
        "throughput/tokens_per_s": n_tokens / max(step_s, 1e-9),
    }
    for spec, values in result.raw.items():
        m[f"reward/{spec}"] = float(gather_rows(torch.tensor(values, dtype=torch.float64)).mean())
    m.update(_role_metrics("actor", actor_results, c.actor))
    if c.critic is not None:
        m.update(_role_metrics("critic", critic_results, c.critic))
        m["critic/explained_var"] = explained_variance(exp.old_values, exp.returns, mask)
    if probe.get("n"):
        total, n = global_sum([probe["sum"], probe["n"]])
        m["rollout/logprob_diff_mean"] = total / max(n, 1.0)
        m["rollout/logprob_diff_max"] = float(gather_rows(torch.tensor([probe["max"]])).max())
    m.update(timings)
    return m


def _role_metrics(role: str, results, engine) -> dict:
    done = [x for x in results if not x.skipped]
    out = {
        f"{role}/loss": sum(x.loss for x in done) / len(done) if done else float("nan"),
        f"{role}/grad_norm": sum(x.grad_norm for x in done) / len(done) if done else float("nan"),
        f"{role}/lr": current_lr(engine),
        f"{role}/skipped_updates": len(results) - len(done),
    }
    keys = {k for x in done for k in x.stats}
    for k in sorted(keys):
        out[f"{role}/{k}"] = sum(x.stats.get(k, 0.0) for x in done) / len(done)
    return out


def explained_variance(values, returns, mask) -> float:
    """1 - Var[R - V] / Var[R] over valid tokens (1 = perfect critic, <= 0 = useless)."""
    if values is None or returns is None:
        return float("nan")
    def var(x):  # unbiased variance over the valid tokens of every rank
        xs = x[mask.bool()].double()
        s, sq, n = global_sum([float(xs.sum()), float((xs * xs).sum()), float(xs.numel())])
        return (sq - s * s / max(n, 1.0)) / max(n - 1.0, 1.0)

    var_r = var(returns)
    if var_r < 1e-12:
        return float("nan")
    return 1.0 - var(returns - values) / var_r


@torch.no_grad()
def evaluate(c: Components) -> float:
    """Mean reward of greedy answers on the held-out prompts (no training state touched)."""
    if c.eval_set is None:
        return float("nan")
    r, tok = c.recipe, c.tokenizer
    rows = c.eval_set.rows
    scores = []
    for i in range(0, len(rows), 32):
        chunk = rows[i:i + 32]
        ids = [encode_prompt(row, tok, r.data, c.eval_set.prompt_key) for row in chunk]
        exp = c.rollout.generate(ids, Sampling.from_recipe(r.rollout, 1, greedy=True))
        prompts = [prompt_text(row, c.eval_set.prompt_key) for row in chunk]
        res = c.rewards(prompts, decode(tok, exp, c.rollout), reward_columns(chunk, c.eval_set.prompt_key))
        scores += res.scores
    return sum(scores) / max(len(scores), 1)


def apply_knobs(c: Components, knobs: Knobs) -> None:
    """Push autotune's knob values into the engines and the KL controller."""
    set_lr(c.actor, knobs.actor_lr)
    if c.critic is not None:
        set_lr(c.critic, knobs.critic_lr)
    c.kl_ctl.coef = knobs.kl_coef


def initial_knobs(c: Components) -> Knobs:
    r = c.recipe
    return Knobs(actor_lr=r.actor.lr, critic_lr=r.critic.lr, kl_coef=c.kl_ctl.coef,
                 clip_range=r.algorithm.clip_range, entropy_coef=r.algorithm.entropy_coef)
