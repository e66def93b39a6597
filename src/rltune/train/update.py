"""One optimizer update of a role over micro-batches, with our own accumulation.

Each micro-batch loss is weighted by its share of the update (tokens for token-level
aggregation, sequences for sequence-level), so 1 x 8 accumulation equals 8 x 1. A
non-finite loss or gradient norm skips the whole update: the weights, the optimizer
state and the LR schedule stay untouched.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..algo import (
    aggregate,
    kl as kl_estimate,
    policy_loss,
    rollout_correction_weights,
    token_logprobs_entropy,
    value_loss,
)
from ..recipe.knobs import Knobs
from ..rollout.experience import Experience
from . import chunked_head, packed as padding_free, shared_prompt
from .batching import passes, scatter
from .collective import global_max, global_sum, world_size

TOKEN_LEVEL = ("token-mean",)
SEQ_LEVEL = ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def micro_weight(mb_mask: torch.Tensor, total_tokens: float, total_seqs: float, agg: str,
                 tokens: float | None = None, seqs: float | None = None) -> float:
    """Share of the update that a micro-batch's aggregated loss represents (`tokens`, `seqs`: its
    valid tokens and its sequences with at least one valid token, when already known on the
    host; a sequence masked out whole, `rollout.mask_truncated`, is not counted, as in
    `aggregate`)."""
    if agg in TOKEN_LEVEL:
        return (float(mb_mask.sum()) if tokens is None else tokens) / max(total_tokens, 1.0)
    if agg in SEQ_LEVEL:
        n = float((mb_mask.sum(-1) > 0).sum()) if seqs is None else seqs
        return n / max(total_seqs, 1)
    return 1.0  # token-sum: sums add up


def no_region(name: str):
    """The default `region` of `run_update` and the loop: measures nothing (`train --dry-run`
    passes its meter's, which records the peak memory of each named pass)."""
    return contextlib.nullcontext()


@dataclass
class UpdateResult:
    loss: float = 0.0
    grad_norm: float = float("nan")
    skipped: bool = False
    reason: str = ""
    stats: dict = field(default_factory=dict)   # weighted means of per-micro-batch stats
    lr: float = float("nan")                    # the learning rate this update stepped with
    # fp16 only: skipped because the gradients overflowed at a loss scale the dynamic scaler could
    # still lower (it did). Normal while the scale settles, not a broken run; False for a
    # non-finite loss and for an overflow at the minimum scale.
    overflow: bool = False


def _ds_checks_overflow(engine) -> bool:
    """Whether DeepSpeed's optimizer checks the gradients for inf/nan in `step` and skips the
    update itself (every ZeRO stage >= 1 and bf16/fp16 at stage 0: weights, optimizer state and
    LR schedule untouched, gradients dropped, fp16 loss scale lowered). Not a plain torch
    optimizer at stage 0 fp32: that would apply the nan."""
    return hasattr(engine.optimizer, "overflow")   # DeepSpeed's own test in `_take_model_step`


def _grad_norm(engine, world: int) -> float:
    """L2 norm of the rank-averaged gradients before the step, for a plain torch optimizer at
    stage 0 (DeepSpeed neither checks nor reports it there; the gradients are in .grad): one
    fused norm and one host sync. With several ranks the gradients are averaged here first, in
    one flat bucket (DeepSpeed reduces the originals in `step`)."""
    import torch.distributed as dist

    grads = [p.grad.detach() for p in engine.module.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    if world > 1:
        flat = torch.cat([g.reshape(-1).float() for g in grads])                      # (n_params,)
        dist.all_reduce(flat)
        return float(flat.double().norm() / world)
    norms = torch._foreach_norm([g.float() if g.dtype != torch.float32 else g for g in grads])
    return float(torch.stack(norms).double().norm())


def _acc(total: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    return x if total is None else total + x


def _zero_loss(engine) -> torch.Tensor:
    params = [p for p in engine.module.parameters() if p.requires_grad]
    return sum(p.reshape(-1)[:1].sum() * 0.0 for p in params)


def _poison_loss(engine) -> torch.Tensor:
    """A loss whose gradient is nan for every parameter: backpropagated after a non-finite
    loss, it makes DeepSpeed's overflow check skip the whole update (with nan gradients
    everywhere, not only where the bad loss happened to give them)."""
    return _zero_loss(engine) * float("nan")


def _loss_scale(engine) -> float | None:
    """fp16's current dynamic loss scale (None without fp16). DeepSpeed's ZeRO scaler raises at
    its minimum scale; we keep skipping overflowed steps there instead and report them as
    non-finite updates (run.py stops the run after health.max_skipped_steps)."""
    if not engine.fp16_enabled():
        return None
    scaler = getattr(engine.optimizer, "loss_scaler", None)
    if getattr(scaler, "raise_error_at_min_scale", False):
        scaler.raise_error_at_min_scale = False
    return float(engine.optimizer.loss_scale)


def run_update(engine, micro_batches: list[Experience], loss_fn: Callable, agg: str, region=no_region,
               role: str = "actor") -> UpdateResult:
    """Forward/backward every micro-batch, then one guarded optimizer step.

    No host sync inside the micro-batch loop: the loss, its finiteness and the stats accumulate
    as device tensors and are read once after it (GPUs keep queueing kernels). A non-finite
    loss still gets its backward like every micro-batch (ZeRO-2/3 reduce in backward); after the
    loop one extra backward of a nan-valued loss that reaches every parameter poisons all
    gradients, on every rank, so the whole update is skipped (by DeepSpeed's overflow check, or
    by ours at stage 0). `region(name)`: a context around the micro-batch passes ("{role} pass")
    and the optimizer step ("{role} step"), for `train --dry-run`."""
    # DeepSpeed averages gradients over ranks, so a rank's share of the global update is its
    # micro-batch weight (over the global batch) times the world size
    world = world_size()
    counts = torch.stack([torch.stack([mb.train_mask.sum(), (mb.train_mask.sum(-1) > 0).sum().to(
        mb.train_mask.dtype)]) for mb in micro_batches]).double().tolist()                   # one sync
    tokens, seqs = [x[0] for x in counts], [x[1] for x in counts]
    total_tokens, total_seqs = global_sum([float(sum(tokens)), float(sum(seqs))])
    result = UpdateResult(lr=float(engine.get_lr()[0]))    # the scheduler moves it on in engine.step()
    losses, loss_sum, stat_sums = [], None, {}
    engine.train()
    with region(f"{role} pass"):
        for mb, n_tok, n_seq in zip(micro_batches, tokens, seqs):
            w = micro_weight(mb.train_mask, total_tokens, total_seqs, agg, tokens=n_tok, seqs=n_seq) * world
            with shared_prompt.into_grad():      # backward() takes these gradients into .grad
                loss, stats = loss_fn(mb)
            engine.backward(loss * w, scale_wrt_gas=False)
            # stats are token-means over valid tokens: weighted by token share whatever the loss_agg,
            # so they do not depend on how the update is cut into micro-batches; a micro-batch with a
            # non-finite loss adds nothing to them (the update is skipped anyway)
            loss = loss.detach().float()
            ok, tw = torch.isfinite(loss), n_tok / max(total_tokens, 1.0)
            losses.append(loss)
            loss_sum = _acc(loss_sum, torch.where(ok, loss * (w / world), 0.0))
            for k, v in stats.items():
                v = torch.as_tensor(v, dtype=torch.float32, device=loss.device)
                if k.endswith("_max"):   # a maximum over the update, not a weighted mean
                    stat_sums[k] = v if k not in stat_sums else torch.maximum(stat_sums[k], v)
                else:
                    stat_sums[k] = _acc(stat_sums.get(k), torch.where(ok, v * tw, 0.0))
    keys = sorted(k for k in stat_sums if not k.endswith("_max"))
    max_keys = sorted(k for k in stat_sums if k.endswith("_max"))
    host = torch.stack([loss_sum.double()] + [stat_sums[k].double() for k in keys + max_keys]
                       + [x.double() for x in losses])
    host = host.tolist()                                                                        # one sync
    n_k = len(keys) + len(max_keys)
    bad = next((x for x in host[1 + n_k:] if not math.isfinite(x)), None)
    # metrics of the global batch, and whether any rank had a non-finite loss
    summed = global_sum([host[0], float(bad is not None)] + host[1:1 + len(keys)])
    result.loss, bad_loss, result.stats = summed[0], summed[1] > 0, dict(zip(keys, summed[2:]))
    if max_keys:
        result.stats.update(zip(max_keys, global_max(host[1 + len(keys):1 + n_k])))
    if bad_loss:
        result.reason = f"loss {bad}" if bad is not None else "non-finite loss on another rank"
        engine.backward(_poison_loss(engine), scale_wrt_gas=False)

    if not _ds_checks_overflow(engine):
        # plain torch optimizer (stage 0 fp32): we check the gradients and skip ourselves
        norm = _grad_norm(engine, world)          # identical on every rank: every rank skips together
        if bad_loss or not math.isfinite(norm):
            engine.zero_grad()
            result.skipped, result.reason = True, result.reason or f"grad norm {norm}"
            return result
        with region(f"{role} step"):
            engine.step()
        result.grad_norm = norm
        return result

    # DeepSpeed checks the (rank-reduced) gradients in `step` and skips a non-finite update
    # itself; under fp16 that is also how its dynamic loss scaler sees the overflow and backs off
    scale = _loss_scale(engine)
    with region(f"{role} step"):
        engine.step()
    new_scale = _loss_scale(engine)
    if new_scale is not None:
        result.stats["loss_scale"] = new_scale
    if engine.was_step_applied():
        if bad_loss:  # cannot happen: the poisoned gradients are nan
            raise RuntimeError(f"DeepSpeed applied an update with a non-finite loss ({result.reason})")
        norm = engine.get_global_grad_norm()
        result.grad_norm = float(norm) if norm is not None else float("nan")
        return result
    result.skipped, result.grad_norm = True, float("nan")
    if scale is None:
        result.reason = result.reason or "non-finite gradient"
    else:
        result.overflow = not bad_loss and new_scale < scale
        what = result.reason or "fp16 overflow"
        result.reason = f"{what}: loss scale {scale:g} -> {new_scale:g}"
    return result


def response_logits(model, mb: Experience, temperature: float = 1.0, shared: bool = False) -> torch.Tensor:
    """Logits that predict each response token: (b, T, V) in the model's dtype, divided by
    `temperature` (a view without a copy at temperature 1). `shared`: each distinct prompt of
    the micro-batch is computed once and its responses run on its cached keys/values
    (`shared_prompt`; exact)."""
    if shared and shared_prompt.pays_off(model, mb):
        logits = shared_prompt.shared_response_logits(model, mb, 1.0)                             # (b, T, V)
    else:
        T = mb.response_ids.shape[1]
        logits = shared_prompt.tied_head_call(model, **mb.model_inputs(), use_cache=False,
                                              logits_to_keep=T + 1).logits[:, :-1]               # (b, T, V)
    return logits if temperature == 1.0 else logits / temperature


def response_logp_entropy(model, mb: Experience, temperature: float, shared: bool = False,
                          packed: bool = False):
    """(b, T) log-probs of the response tokens and (b, T) entropies at `temperature`, float32.

    `packed`: the rows padding-free in one sequence (`packed.py`; `shared`: a group's prompt once
    in it). Where the micro-batch's logits would exceed one chunk (`chunked_head`), the output layer
    runs chunk by chunk inside the model call and no (b, T, V) logits exist; otherwise the
    logits of the whole micro-batch go through the fused chunked log-softmax. Both are exact."""
    if packed:
        lay = padding_free.layout(mb, shared)
        if lay is not None:
            return padding_free.logp_entropy(model, mb, lay, temperature)
        shared = False      # the plain pass instead: one call, as on the ranks that packed
    head = chunked_head.output_layer(model)
    T = mb.response_ids.shape[1]
    if not chunked_head.worth_chunking(head, mb.size * (T + 1)):
        logits = response_logits(model, mb, shared=shared)                           # (b, T, V)
        return token_logprobs_entropy(logits, mb.response_ids, temperature)
    if shared and shared_prompt.pays_off(model, mb):
        return shared_prompt.shared_response_logp_entropy(
            model, mb, temperature, lambda labels: chunked_head.logp_head(model, labels, temperature))
    labels = torch.nn.functional.pad(mb.response_ids, (0, 1))                       # (b, T+1): last predicts nothing kept
    with chunked_head.logp_head(model, labels, temperature):
        out = shared_prompt.tied_head_call(model, **mb.model_inputs(), use_cache=False,
                                           logits_to_keep=T + 1).logits[:, :-1]                  # (b, T, 2)
    return out[..., 0], out[..., 1]


def response_values(critic, mb: Experience, shared: bool = False, packed: bool = False) -> torch.Tensor:
    """(b, T) float32 critic values before each response token (`packed`: padding-free)."""
    if packed:
        lay = padding_free.layout(mb, shared)
        if lay is not None:
            return padding_free.values(critic, mb, lay)
        shared = False
    if shared and shared_prompt.pays_off(critic, mb):
        return shared_prompt.shared_response_values(critic, mb)
    T = mb.response_ids.shape[1]
    return critic(**mb.model_inputs())[:, -T - 1:-1].float()


def use_shared_prompts(recipe, model) -> bool:
    """Whether the passes compute each prompt once per group (`train.share_prompts` and a model
    whose cache we can vouch for; see `shared_prompt.shared_prompt_reason`). Not with
    train.max_tokens_per_micro_batch under ZeRO-3 on several ranks: ZeRO-3 gathers the weights
    around every forward call on all ranks together, and the ranks' micro-batches differ, so one
    rank's shared pass (two calls) would meet another's single call (a micro-batch of one
    response token, or with no prompt repeated: a group split by the budget) and hang. Nor, for
    the same reason, with episodes whose prefix breaks make rows of their own (rollout.prefix_break:
    rows): a group's rows then hold different prompts, and a rank may run a `batching.filler`."""
    if not recipe.train.share_prompts or recipe.algorithm.group_size < 2:
        return False
    if use_padding_free(recipe, model):
        return True                      # one call per micro-batch whatever it holds
    zero3 = getattr(model, "zero_optimization_stage", lambda: 0)() == 3
    uneven = recipe.train.max_tokens_per_micro_batch or (recipe.rollout.env and recipe.rollout.prefix_break == "rows")
    if uneven and zero3 and world_size() > 1:
        return False
    return shared_prompt.shared_prompt_reason(model) is None


def use_padding_free(recipe, model) -> bool:
    """Whether the passes lay each micro-batch's rows end to end without padding
    (`train.padding_free` and a model the dense packed mask is exact for: `packed.packed_reason`)."""
    return recipe.train.padding_free and padding_free.packed_reason(model) is None


def batch_layout(recipe, model) -> str:
    """How `batching` counts a micro-batch's tokens against train.max_tokens_per_micro_batch for
    `model`'s passes: "padded" (rows x longest), "packed" (real tokens) or "packed-shared" (real
    tokens, a group's prompt once)."""
    return _layout(use_padding_free(recipe, model), use_shared_prompts(recipe, model))


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
    shared, packed = use_shared_prompts(recipe, actor), use_padding_free(recipe, actor)

    def loss_fn(mb: Experience):
        mask = mb.train_mask                                           # (b, T) the model's tokens
        # log-prob + entropy at the log-prob temperature (no float32 copy of the logits; no
        # (b, T, V) logits at all where they would exceed one chunk)
        logp, entropy = response_logp_entropy(actor, mb, temperature, shared, packed)  # (b, T), (b, T)
        if knobs.entropy_coef <= 0:
            entropy = entropy.detach()                                 # logged only
        behavior = mb.behavior_logp
        if behavior is None:
            behavior = logp.detach()
            if behavior_sink is not None and not mb.filler:
                behavior_sink[mb.index, :mask.shape[1]] = behavior * mask
        weights = None
        if correction != "none" and mb.rollout_logp is not None:
            weights, _ = rollout_correction_weights(behavior, mb.rollout_logp, mask, correction,
                                                    algo.rollout_correction.cap)      # (b, T)
        loss, stats = policy_loss(logp, behavior, mb.advantages, mask, knobs.clip_range,
                                  clip_high=algo.clip_range_high, dual_clip=algo.dual_clip, agg=algo.loss_agg,
                                  weights=weights, norm_len=norm_len, ratio_level=algo.ratio_level,
                                  objective=algo.policy_loss)
        ent = aggregate(entropy, mask, algo.loss_agg, norm_len)
        if knobs.entropy_coef > 0:
            loss = loss - knobs.entropy_coef * ent
        stats = dict(stats)                                            # 0-dim tensors: no host sync
        stats["entropy"] = aggregate(entropy.detach(), mask, "token-mean")
        if algo.kl.mode == "loss" and mb.ref_logp is not None:
            kl_t = kl_estimate(logp, mb.ref_logp, algo.kl.estimator)   # (b, T)
            kl_term = aggregate(kl_t, mask, algo.loss_agg, norm_len)
            loss = loss + knobs.kl_coef * kl_term
            stats["kl_loss"] = aggregate(kl_t.detach(), mask, "token-mean")          # per token
        return loss, stats

    return loss_fn


def make_critic_loss(critic, recipe):
    algo = recipe.algorithm
    norm_len = recipe.rollout.max_new_tokens
    shared, packed = use_shared_prompts(recipe, critic), use_padding_free(recipe, critic)

    def loss_fn(mb: Experience):
        values = response_values(critic, mb, shared, packed)           # (b, T) value before each token
        loss, stats = value_loss(values, mb.old_values, mb.returns, mb.train_mask, algo.value_clip,
                                 agg=algo.loss_agg, norm_len=norm_len)
        return loss, stats

    return loss_fn


@torch.no_grad()
def forward_logp(model, exp: Experience, temperature: float, micro: int, group: int = 1,
                 shared: bool = False, max_tokens: int | None = None, packed: bool = False) -> torch.Tensor:
    """(B, T) log-probs of the response tokens, without autograd, in length-sorted, trimmed
    micro-batches of `micro` rows or `max_tokens` tokens (groups of `group` rows kept together
    for the shared-prompt pass; `packed`: padding-free, the budget counting real tokens)."""
    out = []
    for mb in passes(exp, micro, group, max_tokens, _layout(packed, shared)):
        out.append((mb, response_logp_entropy(model, mb, temperature, shared, packed)[0]))  # (b, T')
    return scatter(out, exp.response_mask) * exp.train_mask


@torch.no_grad()
def forward_values(critic, exp: Experience, micro: int, group: int = 1, shared: bool = False,
                   max_tokens: int | None = None, packed: bool = False) -> torch.Tensor:
    """(B, T) critic values before each response token, without autograd."""
    out = [(mb, response_values(critic, mb, shared, packed))
           for mb in passes(exp, micro, group, max_tokens, _layout(packed, shared))]
    return scatter(out, exp.response_mask) * exp.train_mask


def _layout(packed: bool, shared: bool) -> str:
    """`batch_layout`'s word for passes that are `packed` and `shared`."""
    return ("packed-shared" if shared else "packed") if packed else "padded"
