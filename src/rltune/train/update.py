"""One optimizer update of a role over micro-batches, with our own accumulation.

Each micro-batch loss is weighted by its share of the update (tokens for token-level
aggregation, sequences for sequence-level), so 1 x 8 accumulation equals 8 x 1. A
non-finite loss or gradient norm skips the whole update: the weights, the optimizer
state and the LR schedule stay untouched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..algo import (
    aggregate,
    entropy_from_logits,
    kl as kl_estimate,
    logprobs_from_logits,
    policy_loss,
    rollout_correction_weights,
    value_loss,
)
from ..recipe.knobs import Knobs
from ..rollout.experience import Experience
from .collective import global_sum, world_size

TOKEN_LEVEL = ("token-mean",)
SEQ_LEVEL = ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def micro_weight(mb_mask: torch.Tensor, total_tokens: float, total_seqs: float, agg: str) -> float:
    """Share of the update that a micro-batch's aggregated loss represents."""
    if agg in TOKEN_LEVEL:
        return float(mb_mask.sum()) / max(total_tokens, 1.0)
    if agg in SEQ_LEVEL:
        return mb_mask.shape[0] / max(total_seqs, 1)
    return 1.0  # token-sum: sums add up


@dataclass
class UpdateResult:
    loss: float = 0.0
    grad_norm: float = float("nan")
    skipped: bool = False
    reason: str = ""
    stats: dict = field(default_factory=dict)   # weighted means of per-micro-batch stats


def _grad_norm(engine, world: int) -> float | None:
    """L2 norm of the rank-averaged gradients before the step (stages 0-1 keep them in
    .grad; with several ranks they are averaged here first, on copies: DeepSpeed reduces
    the originals in `step`). None at stages 2-3: DeepSpeed reports the norm after the step."""
    if engine.zero_optimization_stage() >= 2:
        return None
    import torch.distributed as dist

    sq = torch.zeros((), dtype=torch.float64)
    for p in engine.module.parameters():
        if p.grad is None:
            continue
        g = p.grad.detach()
        if world > 1:
            g = g.clone()
            dist.all_reduce(g)
            g /= world
        sq += g.double().pow(2).sum().cpu()
    return math.sqrt(float(sq))


def _zero_loss(engine) -> torch.Tensor:
    params = [p for p in engine.module.parameters() if p.requires_grad]
    return sum(p.reshape(-1)[:1].sum() * 0.0 for p in params)


def run_update(engine, micro_batches: list[Experience], loss_fn: Callable, agg: str) -> UpdateResult:
    """Forward/backward every micro-batch, then one guarded optimizer step."""
    # DeepSpeed averages gradients over ranks, so a rank's share of the global update is its
    # micro-batch weight (over the global batch) times the world size
    world = world_size()
    total_tokens, total_seqs = global_sum([float(sum(float(mb.response_mask.sum()) for mb in micro_batches)),
                                           float(sum(mb.size for mb in micro_batches))])
    result, bad = UpdateResult(), False
    engine.train()
    for mb in micro_batches:
        w = micro_weight(mb.response_mask, total_tokens, total_seqs, agg) * world
        loss, stats = loss_fn(mb)
        if not torch.isfinite(loss):
            bad, result.reason = True, f"loss {float(loss.detach())}"
            # keep the number of backward calls equal on every rank (ZeRO-2/3 reduce in
            # backward); this zero loss adds nothing and the update is dropped below
            engine.backward(_zero_loss(engine), scale_wrt_gas=False)
            continue
        engine.backward(loss * w, scale_wrt_gas=False)
        result.loss += float(loss.detach()) * w / world
        for k, v in stats.items():
            result.stats[k] = result.stats.get(k, 0.0) + float(v) * w / world
    keys = sorted(result.stats)
    summed = global_sum([result.loss] + [result.stats[k] for k in keys])  # metrics of the global batch
    result.loss, result.stats = summed[0], dict(zip(keys, summed[1:]))
    norm = _grad_norm(engine, world)
    if norm is not None and not math.isfinite(norm):
        bad, result.reason = True, result.reason or f"grad norm {norm}"
    if global_sum([1.0 if bad else 0.0])[0] > 0:  # every rank skips together
        engine.zero_grad()
        if hasattr(engine.optimizer, "zero_grad"):
            engine.optimizer.zero_grad()
        result.skipped, result.grad_norm = True, float("nan")
        return result
    engine.step()
    ds_norm = engine.get_global_grad_norm()
    result.grad_norm = float(ds_norm) if ds_norm is not None else float(norm if norm is not None else float("nan"))
    return result


def response_logits(model, mb: Experience, temperature: float) -> torch.Tensor:
    """Logits that predict each response token: (b, T, V) float32, divided by temperature."""
    T = mb.response_ids.shape[1]
    out = model(**mb.model_inputs(), use_cache=False, logits_to_keep=T + 1)
    return out.logits[:, :-1].float() / temperature


def make_actor_loss(actor, recipe, knobs: Knobs, correction: str = "none",
                    behavior_sink: torch.Tensor | None = None):
    """The actor's micro-batch loss: clipped surrogate (x rollout-correction weights) - entropy
    bonus (+ KL if in loss).

    pi_behaviour is `mb.behavior_logp` when step 4 computed it; otherwise this forward is the
    step's only update, so its own detached log-probs are pi_behaviour (ratio exactly 1) and
    are written into `behavior_sink` (B, T) at the micro-batch's rows for the step's metrics.
    `correction` is the resolved `algorithm.rollout_correction.mode` (none | tis | mis).
    """
    algo = recipe.algorithm
    temperature = recipe.logprob_temperature
    norm_len = recipe.rollout.max_new_tokens   # Dr.GRPO's constant (seq-mean-token-sum-norm)

    def loss_fn(mb: Experience):
        mask = mb.response_mask                                        # (b, T)
        logits = response_logits(actor, mb, temperature)               # (b, T, V)
        logp = logprobs_from_logits(logits, mb.response_ids)           # (b, T)
        if knobs.entropy_coef > 0:
            entropy = entropy_from_logits(logits)                      # (b, T)
        else:
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach())
        behavior = mb.behavior_logp
        if behavior is None:
            behavior = logp.detach()
            if behavior_sink is not None:
                behavior_sink[mb.index] = behavior * mask
        weights = None
        if correction != "none" and mb.rollout_logp is not None:
            weights, _ = rollout_correction_weights(behavior, mb.rollout_logp, mask, correction,
                                                    algo.rollout_correction.cap)      # (b, T)
        loss, stats = policy_loss(logp, behavior, mb.advantages, mask, knobs.clip_range,
                                  clip_high=algo.clip_range_high, dual_clip=algo.dual_clip, agg=algo.loss_agg,
                                  weights=weights, norm_len=norm_len)
        ent = aggregate(entropy, mask, algo.loss_agg, norm_len)
        if knobs.entropy_coef > 0:
            loss = loss - knobs.entropy_coef * ent
        stats = {k: float(v) for k, v in stats.items()}
        stats["entropy"] = float(aggregate(entropy.detach(), mask, "token-mean"))
        if algo.kl.mode == "loss" and mb.ref_logp is not None:
            kl_t = kl_estimate(logp, mb.ref_logp, algo.kl.estimator)   # (b, T)
            kl_term = aggregate(kl_t, mask, algo.loss_agg, norm_len)
            loss = loss + knobs.kl_coef * kl_term
            stats["kl_loss"] = float(kl_term.detach())
        return loss, stats

    return loss_fn


def make_critic_loss(critic, recipe):
    algo = recipe.algorithm
    norm_len = recipe.rollout.max_new_tokens

    def loss_fn(mb: Experience):
        T = mb.response_ids.shape[1]
        values = critic(**mb.model_inputs())[:, -T - 1:-1].float()    # (b, T) value before each token
        loss, stats = value_loss(values, mb.old_values, mb.returns, mb.response_mask, algo.value_clip,
                                 agg=algo.loss_agg, norm_len=norm_len)
        return loss, {k: float(v) for k, v in stats.items()}

    return loss_fn


@torch.no_grad()
def forward_logp(model, exp: Experience, temperature: float, micro: int) -> torch.Tensor:
    """(B, T) log-probs of the response tokens, without autograd, in micro-batches."""
    out = []
    for i in range(0, exp.size, micro):
        mb = exp.select(torch.arange(i, min(i + micro, exp.size)))
        out.append(logprobs_from_logits(response_logits(model, mb, temperature), mb.response_ids))
    return torch.cat(out) * exp.response_mask


@torch.no_grad()
def forward_values(critic, exp: Experience, micro: int) -> torch.Tensor:
    out = []
    T = exp.response_ids.shape[1]
    for i in range(0, exp.size, micro):
        mb = exp.select(torch.arange(i, min(i + micro, exp.size)))
        out.append(critic(**mb.model_inputs())[:, -T - 1:-1].float())
    return torch.cat(out) * exp.response_mask
