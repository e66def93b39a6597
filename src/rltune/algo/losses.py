"""PPO-style policy and value losses over response tokens."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from .aggregate import _bool_mask, _zero_padding, aggregate, masked_mean

__all__ = ["LOG_RATIO_CLAMP", "policy_loss", "value_loss"]

#: ``log(pi / pi_old)`` is clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` before ``exp``.
LOG_RATIO_CLAMP = 20.0


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: Optional[float] = None,
    dual_clip: Optional[float] = None,
    agg: str = "token-mean",
    weights: Optional[torch.Tensor] = None,
    norm_len: Optional[int] = None,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """PPO clipped surrogate loss (to minimise).

    Schulman et al. 2017, "Proximal Policy Optimization Algorithms",
    arXiv:1707.06347; asymmetric "clip-higher" from DAPO (Yu et al. 2025,
    arXiv:2503.14476); dual clip from Ye et al. 2020, "Mastering Complex
    Control in MOBA Games with Deep RL", arXiv:1912.09729::

        ratio = exp(clamp(logp - old_logp, -20, 20))
        L_t   = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
        if dual_clip = c:  L_t = min(L_t, -A * c)   for A < 0 only
        L_t   = w_t * L_t                          with rollout-correction weights w
        loss  = aggregate(L, mask, agg)

    Shapes: ``logp``, ``old_logp``, ``advantages``, ``mask`` ``(B, T)`` ->
    0-dim loss. Gradients flow only into ``logp``. Recipe fields:
    ``algorithm.clip_range`` (``clip_low``), ``algorithm.clip_range_high``
    (``clip_high``, defaults to ``clip_low``), ``algorithm.dual_clip``,
    ``algorithm.loss_agg`` (``agg``); ``weights`` ``(B, T)`` (detached) are
    the rollout-correction importance weights (:mod:`rltune.algo.correction`);
    ``norm_len`` is the constant of ``seq-mean-token-sum-norm``.

    ``stats`` (0-dim detached tensors, token-mean over valid tokens regardless
    of ``agg``):

    * ``clipfrac``: fraction of tokens where the clipped term was strictly larger
      (i.e. was taken and the gradient is zeroed);
    * ``clipfrac_lower``: fraction where the dual-clip bound ``-A*c`` was taken;
    * ``approx_kl``: k3 estimate of KL(pi_old || pi): ``(ratio - 1) - log(ratio)``
      (Schulman 2020, "Approximating KL Divergence").
    """
    if clip_high is None:
        clip_high = clip_low
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip ranges must be >= 0, got clip_low={clip_low}, clip_high={clip_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1.0 (it bounds the loss at -A*c for A<0), got {dual_clip}")

    m = _bool_mask(mask)  # (B, T)
    # zero the padding *before* any arithmetic so garbage cannot produce nan grads
    adv = _zero_padding(advantages, m).detach()  # (B, T)
    log_ratio = _zero_padding(logp - old_logp.detach(), m).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)  # (B, T)

    pg_unclipped = -adv * ratio  # (B, T)
    pg_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    per_tok = torch.maximum(pg_unclipped, pg_clipped)  # (B, T)
    clip_taken = pg_clipped > pg_unclipped  # (B, T)

    if dual_clip is not None:
        bound = -adv * dual_clip  # (B, T)
        lower_taken = (adv < 0) & (bound < per_tok)
        per_tok = torch.where(lower_taken, bound, per_tok)
    else:
        lower_taken = torch.zeros_like(clip_taken)

    if weights is not None:
        per_tok = per_tok * _zero_padding(weights, m).detach()
    loss = aggregate(per_tok, m, agg, norm_len)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean(clip_taken.float(), m),
            "clipfrac_lower": masked_mean(lower_taken.float(), m),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, m),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: Optional[float],
    agg: str = "token-mean",
    norm_len: Optional[int] = None,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Clipped value-function loss (PPO reference implementation; Schulman et al. 2017).

    ::

        v_clip = clip(v, v_old - clip, v_old + clip)
        L_t    = 0.5 * max((v - R)**2, (v_clip - R)**2)
        loss   = aggregate(L, mask, agg)

    ``clip=None`` gives the unclipped ``0.5 * (v - R)**2``. Shapes: all
    ``(B, T)`` -> 0-dim loss; gradients flow only into ``values``. Recipe
    fields: ``algorithm.value_clip`` (``clip``), ``algorithm.loss_agg``.
    ``stats['clipfrac']``: fraction of valid tokens where the clipped term was
    strictly larger (0-dim detached tensor).
    """
    if clip is not None and clip < 0:
        raise ValueError(f"value clip must be >= 0 or None, got {clip}")
    m = _bool_mask(mask)
    v = _zero_padding(values, m)  # (B, T)
    v_old = _zero_padding(old_values, m).detach()
    ret = _zero_padding(returns, m).detach()
    loss_unclipped = (v - ret) ** 2  # (B, T)
    if clip is None:
        per_tok = 0.5 * loss_unclipped
        clip_taken = torch.zeros_like(m)
    else:
        v_clipped = v_old + (v - v_old).clamp(-clip, clip)  # (B, T)
        loss_clipped = (v_clipped - ret) ** 2
        per_tok = 0.5 * torch.maximum(loss_unclipped, loss_clipped)
        clip_taken = loss_clipped > loss_unclipped
    loss = aggregate(per_tok, m, agg, norm_len)
    with torch.no_grad():
        stats = {"clipfrac": masked_mean(clip_taken.float(), m)}
    return loss, stats
