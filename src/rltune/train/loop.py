"""The training loop: one readable controller, numbered steps, every rank runs it (SPMD).

Per step:
  1. generate   train.updates_per_step x train.batch_size sequences (per step, over all ranks),
                rollout.batch_size per generation call, group_size samples per prompt
  2. score      reward functions / reward model (+ overlong penalty) -> scores (B,); with
                filter_groups, groups without signal dropped and more generated (`sampling`)
  3. reference  reference log-probs (no autograd), when a KL term is used
  4. behaviour  the actor's own log-probs under the weights that sampled (pi_behaviour, no
                autograd), when something needs them before the first update: several updates
                per step (the ratio's fixed denominator) or the KL in the reward. Otherwise the
                first (and only) update's own forward is pi_behaviour and is recorded there.
  5. values     critic values (no autograd), PPO only
  6. KL         in the reward (token rewards) or kept for the loss
  7. advantages ppo = GAE, grpo / rloo = group baselines, reinforce_pp = globally whitened returns
  8. update     ppo_epochs x updates_per_step optimizer updates: actor then critic, micro-batched
                with weighted accumulation, clipping, rollout correction, entropy bonus; a
                non-finite update is skipped
  9. sync       actor weights -> rollout engine (timed: timing/sync_ms); the KL controller updates
 10. metrics    metrics.jsonl, trackers, health monitor, autotune, console

With rollout.asynchronous.max_staleness K >= 1, steps 1-2 run ahead in a producer thread (the
batches of the next K steps, `pipeline.py`) and step 9 hands the weights over on its schedule;
steps 3-8 are unchanged: the behaviour pass is the proximal policy of decoupled PPO.

Every log-prob (rollout, behaviour, reference, update) is taken at `recipe.logprob_temperature`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..algo import (
    broadcast_to_tokens,
    gae,
    grpo_advantages,
    kl as kl_estimate,
    discounted_returns,
    kl_in_reward,
    rloo_advantages,
    rollout_correction_weights,
    zero_advantage_share,
)
from ..engine.roles import current_lr, set_lr
from ..recipe.knobs import Knobs
from ..rollout.base import Sampling
from ..rollout.experience import Experience
from .collective import gather_rows, global_sum, global_whiten
from .console import LOG
from .prompts import encode_prompt, prompt_messages, prompt_text, reward_columns
from .sampling import decode, sample_step
from .setup import Components
from . import batching
from .update import (
    forward_logp,
    forward_values,
    make_actor_loss,
    make_critic_loss,
    no_region,
    run_update,
    use_shared_prompts,
    use_padding_free,
    batch_layout,
)


def needs_behavior_forward(recipe, has_reference: bool) -> bool:
    """Step 4 runs its own no-grad forward only when pi_behaviour is needed before the first
    update: several updates per step (the ratio's denominator must stay fixed while the weights
    move) or the KL folded into the reward (the advantages need it)."""
    return recipe.optimizer_updates_per_step > 1 or (has_reference and recipe.algorithm.kl.mode == "reward")


def compute_advantages(c: Components, exp: Experience, kl_coef: float) -> None:
    """Steps 6-7: the KL in the reward (when configured) and advantages; fills exp in place.
    Where a prefix break split episodes into several rows (`exp.episode`), the advantages are the
    episode's (`_episode_advantages`)."""
    if exp.episode is not None and exp.episode.numel() and int(exp.episode.max()) + 1 < exp.size:
        return _episode_advantages(c, exp, kl_coef)
    algo, mask = c.recipe.algorithm, exp.train_mask
    in_reward = algo.kl.mode == "reward" and exp.ref_logp is not None
    scores = exp.scores                                                              # (B,)
    if algo.name in ("ppo", "reinforce_pp"):
        # token rewards: the score at the last token, minus coef * KL on every token when in reward
        if in_reward:
            exp.token_rewards = kl_in_reward(scores, exp.behavior_logp, exp.ref_logp, mask, kl_coef,
                                             algo.kl.estimator)
        else:
            zero = torch.zeros_like(mask)
            exp.token_rewards = kl_in_reward(scores, zero, zero, mask, 0.0)
    if algo.name == "ppo":
        adv, ret = gae(exp.token_rewards, exp.old_values, mask, algo.gamma, algo.lam)
        exp.returns = ret
        exp.advantages = global_whiten(adv, mask) if algo.whiten_advantages else adv
    elif algo.name in ("grpo", "rloo"):
        seq = scores
        if in_reward:
            kl_tok = kl_estimate(exp.behavior_logp, exp.ref_logp, algo.kl.estimator) * mask  # (B, T)
            seq = scores - kl_coef * kl_tok.sum(-1)                                          # (B,)
        if algo.name == "grpo":
            adv = grpo_advantages(seq, algo.group_size, scale_by_std=algo.scale_by_std)
        else:
            adv = rloo_advantages(seq, algo.group_size)
        exp.advantages = broadcast_to_tokens(adv, mask)                              # (B, T)
    else:  # reinforce_pp: returns whitened over the global batch (every rank's tokens)
        exp.advantages = global_whiten(discounted_returns(exp.token_rewards, mask, algo.gamma), mask)


def _episode_advantages(c: Components, exp: Experience, kl_coef: float) -> None:
    """Steps 6-7 on R rows of E episodes (algo/episodes.py): the score lands on the episode's last
    model token; GRPO and RLOO take one advantage per episode (the KL in the reward summed over all
    its rows) onto every row; GAE and REINFORCE++'s returns run over the episode's model tokens in
    sampling order, across its rows."""
    from ..algo.episodes import chain, episode_sums, last_rows, unchain

    algo, mask, ep = c.recipe.algorithm, exp.train_mask, exp.episode                # (R, T), (R,)
    E = int(ep.max()) + 1
    in_reward = algo.kl.mode == "reward" and exp.ref_logp is not None
    last = last_rows(ep)                                                             # (R,)
    # (E,) each episode's score (every row carries it: taken from the last)
    scores = episode_sums(torch.where(last, exp.scores, torch.zeros_like(exp.scores)).float(), ep, E)
    if algo.name in ("ppo", "reinforce_pp"):
        # token rewards over the episode's rows end to end: the score at its last model token
        behavior = exp.behavior_logp if in_reward else torch.zeros_like(mask)
        reference = exp.ref_logp if in_reward else torch.zeros_like(mask)
        mask_e = chain(mask, ep, E)                                                  # (E, K*T)
        rewards = kl_in_reward(scores, chain(behavior, ep, E), chain(reference, ep, E), mask_e,
                               kl_coef if in_reward else 0.0, algo.kl.estimator)     # (E, K*T)
        exp.token_rewards = unchain(rewards, ep)                                     # (R, T)
    if algo.name == "ppo":
        adv, ret = gae(rewards, chain(exp.old_values, ep, E), mask_e, algo.gamma, algo.lam)
        adv, exp.returns = unchain(adv, ep), unchain(ret, ep)                        # (R, T)
        exp.advantages = global_whiten(adv, mask) if algo.whiten_advantages else adv
    elif algo.name in ("grpo", "rloo"):
        seq = scores                                                                 # (E,)
        if in_reward:
            kl_tok = kl_estimate(exp.behavior_logp, exp.ref_logp, algo.kl.estimator) * mask  # (R, T)
            seq = seq - kl_coef * episode_sums(kl_tok.sum(-1).float(), ep, E)
        if algo.name == "grpo":
            adv = grpo_advantages(seq, algo.group_size, scale_by_std=algo.scale_by_std)
        else:
            adv = rloo_advantages(seq, algo.group_size)
        exp.advantages = broadcast_to_tokens(adv[ep].to(mask.dtype), mask)           # (R, T)
    else:
        exp.advantages = global_whiten(unchain(discounted_returns(rewards, mask_e, algo.gamma), ep), mask)


def micro_batches(exp: Experience, micro: int, update_size: int, gen: torch.Generator,
                  group: int = 1, max_tokens: int | None = None, layout: str = "padded") -> list[list[Experience]]:
    """Shuffle the step's experience by whole groups, cut it into updates of `update_size`
    sequences, each a list of length-sorted, trimmed micro-batches of `micro` sequences or of at
    most `max_tokens` tokens as `layout` counts them (`batching`: exact, the accumulation weights
    make order and grouping irrelevant)."""
    return batching.micro_batches(exp, micro, update_size, gen, group, max_tokens, layout)


@dataclass
class Learned:
    """What steps 3-8 produce besides the filled-in experience."""
    actor: list = field(default_factory=list)     # UpdateResult per actor update
    critic: list = field(default_factory=list)    # UpdateResult per critic update
    timings: dict = field(default_factory=dict)   # timing/* and batch/micro_batches: step metrics


def learn(c: Components, exp: Experience, knobs: Knobs, gen: torch.Generator, mark=None,
          region=no_region) -> Learned:
    """Steps 3-8 on one step's scored experience (on the training device). `mark(phase)`, when
    given, is called as steps 3-7 ("experience") and step 8 ("update") end; `region(name)` is a
    context around each pass, named as `rltune plan` groups its items ("reference pass", "actor
    step", ...) (both for `train --dry-run`)."""
    r = c.recipe
    micro, temp, n = r.train.micro_batch_size, r.logprob_temperature, r.algorithm.group_size
    budget = r.train.max_tokens_per_micro_batch          # None: micro-batches of `micro` rows
    out = Learned()
    exp.index = torch.arange(exp.size, device=exp.response_ids.device)

    # 3. reference log-probs
    t0 = time.perf_counter()
    if c.reference is not None:
        with region("reference pass"):
            exp.ref_logp = forward_logp(c.reference.module, exp, temp, micro, n, use_shared_prompts(r, c.reference),
                                        budget, use_padding_free(r, c.reference))      # (B, T)
    out.timings["timing/reference_s"] = time.perf_counter() - t0

    # 4. behaviour log-probs (an extra forward only when needed before the first update)
    t0 = time.perf_counter()
    if needs_behavior_forward(r, exp.ref_logp is not None):
        c.actor.eval()
        with region("behaviour pass"):
            exp.behavior_logp = forward_logp(c.actor.module, exp, temp, micro, n, use_shared_prompts(r, c.actor),
                                             budget, use_padding_free(r, c.actor))     # (B, T)

    # 5. values
    if c.critic is not None:
        c.critic.eval()
        with region("value pass"):
            exp.old_values = forward_values(c.critic.module, exp, micro, n, use_shared_prompts(r, c.critic),
                                            budget, use_padding_free(r, c.critic))     # (B, T)
    out.timings["timing/old_s"] = time.perf_counter() - t0

    # 6-7. KL and advantages
    compute_advantages(c, exp, knobs.kl_coef)
    if mark is not None:
        mark("experience")

    # 8. updates: ppo_epochs passes, each train.updates_per_step optimizer updates
    t0 = time.perf_counter()
    sink = torch.zeros_like(exp.train_mask) if exp.behavior_logp is None else None
    actor_loss = make_actor_loss(c.actor, r, knobs, c.correction, behavior_sink=sink)
    critic_loss = make_critic_loss(c.critic, r) if c.critic is not None else None
    update_size = max(1, r.train.batch_size // c.dist.world_size)
    counts = []                                           # micro-batches per update, on this rank
    for _epoch in range(r.train.ppo_epochs):
        for mbs in micro_batches(exp, micro, update_size, gen, n, budget, batch_layout(r, c.actor)):
            counts.append(len(mbs))
            out.actor.append(run_update(c.actor, mbs, actor_loss, r.algorithm.loss_agg, region, "actor"))
            if critic_loss is not None:
                out.critic.append(run_update(c.critic, mbs, critic_loss, r.algorithm.loss_agg, region, "critic"))
    if sink is not None:  # pi_behaviour as the single update's forward saw it
        exp.behavior_logp = sink
    out.timings["timing/train_s"] = time.perf_counter() - t0
    out.timings["batch/micro_batches"] = sum(counts) / max(1, len(counts))
    if mark is not None:
        mark("update")
    return out


def policy_metrics(c: Components, exp: Experience) -> dict:
    """KL to the reference and the rollout/trainer mismatch, over the global batch."""
    algo, mask = c.recipe.algorithm, exp.train_mask
    m: dict = {}
    if exp.ref_logp is not None:
        # sums over every rank's rows (ranks may hold different numbers of rows: prefix breaks)
        kl_sum, n_seq, n_tok = global_sum([float((kl_estimate(exp.behavior_logp, exp.ref_logp, algo.kl.estimator)
                                                  * mask).sum()), float(exp.size), float(mask.sum())])
        m["kl"] = kl_sum / max(n_seq, 1.0)                                           # per sequence
        m["kl/token_mean"] = kl_sum / max(n_tok, 1.0)
    if exp.rollout_logp is not None:
        # the share capped is reported in the configured mode (tis semantics when correction is off)
        mode = c.correction if c.correction != "none" else "tis"
        diff = (exp.behavior_logp - exp.rollout_logp).abs() * mask                     # (B, T)
        _, st = rollout_correction_weights(exp.behavior_logp, exp.rollout_logp, mask, mode,
                                           algo.rollout_correction.cap)
        d_sum, n, w_sum, capped = global_sum([float(diff.sum()), float(st["n"]), float(st["w_sum"]),
                                              float(st["capped"])])
        local_max = torch.stack([diff.max() if diff.numel() else diff.new_zeros(()), st["w_max"].to(diff.dtype)])
        maxes = gather_rows(local_max[None, :])                                        # (world, 2)
        m["rollout/logprob_diff_mean"] = d_sum / max(n, 1.0)
        m["rollout/logprob_diff_max"] = float(maxes[:, 0].max())
        m["rollout/is_weight_mean"] = w_sum / max(n, 1.0)
        m["rollout/is_weight_max"] = float(maxes[:, 1].max())
        m["rollout/is_capped_frac"] = capped / max(n, 1.0)
    return m


def train_step(c: Components, step: int, knobs: Knobs, gen: torch.Generator, mark=None,
               region=no_region) -> dict:
    """One RL step; returns its metrics. `mark(phase)`, when given, is called as each phase ends:
    "rollout" (steps 1-2), "experience" (3-7), "update" (8); `region(name)` wraps the passes of
    steps 3-8 (`learn`) (`train --dry-run` measures memory)."""
    r = c.recipe
    t_start = time.perf_counter()
    timings = {}

    # 1-2. generate and score (dynamic sampling, overlong penalty, truncation mask: `sampling`);
    #      with rollout.asynchronous, the batch the producer generated ahead (`pipeline`)
    async_m: dict = {}
    if c.pipeline is None:
        drawn = sample_step(c)
    else:
        drawn, async_m = c.pipeline.take(step)
    b = drawn.batch
    timings["timing/rollout_s"], timings["timing/reward_s"] = drawn.rollout_s, drawn.reward_s
    if mark is not None:
        mark("rollout")
    if r.logging.sample_every and step % r.logging.sample_every == 0 and c.dist.is_main:
        LOG.info("[Sample] step=%d reward=%.3f prompt=%r completion=%r", step, float(b.exp.scores[0]),
                 b.prompts[0][-80:], b.completions[0][:200])
    exp = b.exp.to(c.dist.device)  # the rollout hands back CPU tensors; the models may be on a GPU
    # episodes: one row per sample (a prefix break's samples before it are rows of their own)
    rows = exp.rows(c.rollout.pad_id) if c.env is not None else exp

    # 3-8. reference, behaviour, values, KL, advantages, updates
    learned = learn(c, rows, knobs, gen, mark, region)
    timings.update(learned.timings)

    # 9. weight sync actor -> rollout engine; the KL controller (adaptive with algorithm.kl.target)
    c.rollout.wake_up()
    if c.pipeline is None:
        sync_ms = c.rollout.sync_weights(c.actor)
    else:   # without partial rollouts, once the batch of step + K is generated
        sync_ms, waited = c.pipeline.sync(c.actor, step)
        async_m["async/idle_trainer_s"] += waited
    timings["timing/sync_ms"] = sync_ms
    if hasattr(c.rollout, "stale_samples") and c.pipeline is None:   # vllm-server: should be 0
        timings["rollout/stale_samples"], c.rollout.stale_samples = float(c.rollout.stale_samples), 0
    LOG.debug("Actor resharding time: %d ms", round(sync_ms))
    pm = policy_metrics(c, rows)
    if "kl" in pm:
        c.kl_ctl.update(pm["kl"], exp.size * c.dist.world_size)
        knobs.kl_coef = c.kl_ctl.coef

    # 10. metrics (over the global batch: every rank's sequences; rewards and lengths per episode)
    mask = exp.response_mask
    step_s = time.perf_counter() - t_start
    scores = gather_rows(exp.scores)                                                 # (B * world,)
    lengths = gather_rows(drawn.lengths.to(mask.device))                             # before masking
    n_tokens = global_sum([float(rows.response_mask.sum() + rows.prompt_mask.sum())])[0]
    m = {
        "step": step,
        # prompts whose samples all scored alike: a group baseline gives them zero advantage
        "batch/zero_adv_frac": zero_advantage_share(scores, r.algorithm.group_size),
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if scores.numel() > 1 else 0.0,
        "kl": pm.pop("kl", 0.0),
        "kl/token_mean": pm.pop("kl/token_mean", 0.0),
        "kl_coef": knobs.kl_coef,
        "response/length_mean": float(lengths.mean()),
        # rows with a turn that reached rollout.max_new_tokens (an episode: any of its turns; set before
        # rollout.mask_truncated zeroed those rows' masks: sampling.mask_truncated)
        "response/clip_ratio": float((gather_rows(exp.turn_lengths.to(mask.device)) >= r.rollout.max_new_tokens).float().mean()),
        "timing/step_s": step_s,
        "throughput/tokens_per_s": n_tokens / max(step_s, 1e-9),
    }
    m.update(drawn.metrics)
    for spec, values in b.raw.items():
        m[f"reward/{spec}"] = float(gather_rows(torch.tensor(values, dtype=torch.float64)).mean())
    m.update(_role_metrics("actor", learned.actor, c.actor))
    if c.critic is not None:
        m.update(_role_metrics("critic", learned.critic, c.critic))
        m["critic/explained_var"] = explained_variance(rows.old_values, rows.returns, rows.response_mask)
    m.update(pm)
    m.update(timings)
    m.update(async_m)
    return m


def _role_metrics(role: str, results, engine) -> dict:
    """Means over the applied updates; skipped ones counted (fp16 loss-scale back-offs apart)."""
    done = [x for x in results if not x.skipped]
    overflow = sum(x.overflow for x in results)
    out = {
        f"{role}/loss": sum(x.loss for x in done) / len(done) if done else float("nan"),
        f"{role}/grad_norm": sum(x.grad_norm for x in done) / len(done) if done else float("nan"),
        # the lr the applied updates stepped with (warmup's first update: a fraction of the peak),
        # not the scheduler's value for the next one
        f"{role}/lr": sum(x.lr for x in done) / len(done) if done else current_lr(engine),
        f"{role}/skipped_updates": len(results) - len(done) - overflow,
        f"{role}/overflow_skips": overflow,
    }
    keys = {k for x in done for k in x.stats} - {"loss_scale"}
    for k in sorted(keys):
        out[f"{role}/{k}"] = sum(x.stats.get(k, 0.0) for x in done) / len(done)
    if results and "loss_scale" in results[-1].stats:  # fp16: the scale after the last update
        out[f"{role}/loss_scale"] = results[-1].stats["loss_scale"]
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
def evaluate(c: Components):
    """Mean reward of greedy answers on the held-out prompts, and the mean of each reward source
    before weighting (an EvalScore; no training state touched); with rollout.env, the episodes'
    turns and tool calls, and the environment's own reward parts (`reward/env/NAME` means)."""
    from .progress import EvalScore, env_parts

    if c.eval_set is None:
        return EvalScore(float("nan"))
    r, tok = c.recipe, c.tokenizer
    rows = c.eval_set.rows
    scores: list[float] = []
    parts: dict[str, list[float]] = {}
    sums: dict[str, float] = {}                      # episode metrics (rollout.env), summed over chunks
    for i in range(0, len(rows), 32):
        chunk = rows[i:i + 32]
        columns = reward_columns(chunk, c.eval_set.prompt_key)
        if c.env is not None:   # rollout.env: greedy episodes, scored as in training
            from .episodes import play

            ep = play(c, chunk, c.eval_set.prompt_key, 1, greedy=True)
            res = c.rewards(ep.prompts, ep.completions, columns, conversations=ep.conversations, training=False,
                            env_scores=ep.env_scores)
            for k, v in ep.metrics.items():
                sums[k] = sums.get(k, 0.0) + v
        else:
            ids = [encode_prompt(row, tok, r.data, c.eval_set.prompt_key) for row in chunk]
            exp = c.rollout.generate(ids, Sampling.from_recipe(r.rollout, 1, greedy=True))
            prompts = [prompt_text(row, c.eval_set.prompt_key) for row in chunk]
            conversations = [prompt_messages(row, c.eval_set.prompt_key, r.data) for row in chunk]
            res = c.rewards(prompts, decode(tok, exp, c.rollout), columns, conversations=conversations,
                            training=False)
        scores += res.scores
        for spec, values in res.raw.items():
            parts.setdefault(spec, []).extend(values)
    mean = lambda xs: sum(xs) / max(len(xs), 1)  # noqa: E731
    episode, env = {}, {}
    if sums:   # every rank plays every eval row: this rank's sums are the eval's
        from .episodes import finish_metrics

        done = finish_metrics(sums, lambda xs: xs)
        episode = {k: done[f"episode/{k}"] for k in ("turns_mean", "tool_calls_mean")}
        env = env_parts(done)
    return EvalScore(mean(scores), {spec: mean(v) for spec, v in parts.items()}, len(scores), episode, env)


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
