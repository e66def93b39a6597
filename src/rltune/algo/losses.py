"""Policy losses (PPO clipped surrogate, CISPO) at token or sequence ratio level; value loss."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

from .aggregate import _bool_mask, _zero_padding, aggregate, masked_mean
from .ratios import LOG_RATIO_CLAMP, RATIO_LEVELS, level_log_ratio, token_log_ratio

__all__ = ["LOG_RATIO_CLAMP", "POLICY_OBJECTIVES", "policy_loss", "value_loss"]

#: Valid values of ``algorithm.policy_loss`` / the ``objective`` of :func:`policy_loss`.
POLICY_OBJECTIVES = ("ppo", "cispo")


def _ppo_terms(
    ratio: torch.Tensor, adv: torch.Tensor, lo: float, hi: float, dual_clip: Optional[float]
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Clipped surrogate per token: ``(L, clip_taken, lower_taken)``, all ``(B, T)``.

    ``L = max(-A*r, -A*clip(r, lo, hi))``, then ``min(L, -A*c)`` for ``A < 0`` with dual clip
    (Schulman et al. 2017, arXiv:1707.06347; Ye et al. 2020, arXiv:1912.09729).
    """
    pg_unclipped = -adv * ratio  # (B, T)
    pg_clipped = -adv * ratio.clamp(lo, hi)  # (B, T)
    per_tok = torch.maximum(pg_unclipped, pg_clipped)  # (B, T)
    clip_taken = pg_clipped > pg_unclipped  # (B, T)
    if dual_clip is not None:
        bound = -adv * dual_clip  # (B, T)
        lower_taken = (adv < 0) & (bound < per_tok)
        per_tok = torch.where(lower_taken, bound, per_tok)
    else:
        lower_taken = torch.zeros_like(clip_taken)
    return per_tok, clip_taken, lower_taken


def _cispo_terms(
    logp: torch.Tensor, ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, lo: float, hi: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    """CISPO per token: ``(L, clip_taken)``, both ``(B, T)``.

    MiniMax-M1 (MiniMax 2025, arXiv:2506.13585, sec. 3.1, eq. 4-5):
    ``L_t = -sg(clip(r_t, lo, hi)) * A_t * logp_t``; the clipped importance weight is a
    constant, so every token keeps its gradient ``-clip(r_t) * A_t * d logp_t``.
    ``clip_taken``: the clip changed the weight (``r_t < lo`` or ``r_t > hi``).
    """
    w = ratio.detach().clamp(lo, hi)  # (B, T) stop-gradient IS weight
    per_tok = -w * adv * _zero_padding(logp, mask)  # (B, T)
    clip_taken = w != ratio.detach()  # (B, T)
    return per_tok, clip_taken


@torch.no_grad()
def _ratio_stats(
    ratio: torch.Tensor, tok_log_ratio: torch.Tensor, clip_taken: torch.Tensor,
    lower_taken: torch.Tensor, m: torch.Tensor, per_sequence: bool,
) -> Dict[str, torch.Tensor]:
    """The 0-dim detached stats of :func:`policy_loss` (token means over valid tokens)."""
    ratio = ratio.detach()
    tok_ratio = torch.exp(tok_log_ratio.detach())  # (B, T)
    any_valid = m.any()  # () no host sync
    r_mean = torch.where(any_valid, masked_mean(ratio, m), ratio.new_ones(()))  # 1.0 when empty
    if ratio.numel() == 0:
        r_max = ratio.new_ones(())
    else:
        r_max = torch.where(m, ratio, torch.full_like(ratio, -float("inf"))).amax()
        r_max = torch.where(any_valid, r_max, torch.ones_like(r_max))  # 1.0, not -inf, when empty
    stats = {
        "clipfrac": masked_mean(clip_taken.float(), m),
        "clipfrac_lower": masked_mean(lower_taken.float(), m),
        "approx_kl": masked_mean((tok_ratio - 1.0) - tok_log_ratio.detach(), m),
        "ratio_mean": r_mean,
        "ratio_max": r_max,
    }
    if per_sequence:
        rows = m.any(dim=-1)  # (B,) sequences with at least one valid token
        seq_clipped = (clip_taken & m).any(dim=-1)  # (B,)
        stats["clipfrac_seq"] = seq_clipped.float().sum() / rows.sum().clamp(min=1).float()
    return stats


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
    *,
    ratio_level: str = "token",
    objective: str = "ppo",
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Policy-gradient loss (to minimise): PPO clipped surrogate or CISPO, at a ratio level.

    Schulman et al. 2017, "Proximal Policy Optimization Algorithms",
    arXiv:1707.06347; asymmetric "clip-higher" from DAPO (Yu et al. 2025,
    arXiv:2503.14476, sec. 3.1); dual clip from Ye et al. 2020, "Mastering Complex
    Control in MOBA Games with Deep RL", arXiv:1912.09729; sequence ratios from GSPO
    (Zheng et al. 2025, arXiv:2507.18071); CISPO from MiniMax-M1 (arXiv:2506.13585)::

        r     = exp(clamp(logp - old_logp, -20, 20))             ratio_level="token"
              = exp(clamp(mean_t(logp - old_logp), -20, 20))      "sequence" (GSPO), per row
              = sg(s_i) * exp(logp_t - sg(logp_t))               "sequence-token" (GSPO-token)
        ppo:   L_t = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))
               if dual_clip = c:  L_t = min(L_t, -A * c)   for A < 0 only
        cispo: L_t = -sg(clip(r, 1 - clip_low, 1 + clip_high)) * A * logp_t
        L_t   = w_t * L_t                          with rollout-correction weights w
        loss  = aggregate(L, mask, agg)

    Shapes: ``logp``, ``old_logp``, ``advantages``, ``mask`` ``(B, T)`` ->
    0-dim loss. Gradients flow only into ``logp``. Recipe fields:
    ``algorithm.clip_range`` (``clip_low``, in ``[0, 1]``; ``1.0`` = no lower bound, useful
    for cispo), ``algorithm.clip_range_high`` (``clip_high``, defaults to ``clip_low``),
    ``algorithm.dual_clip`` (ppo only: ``ValueError`` with cispo), ``algorithm.loss_agg``
    (``agg``), ``algorithm.ratio_level`` (``ratio_level``), ``algorithm.policy_loss``
    (``objective``); ``weights`` ``(B, T)`` (detached) are the rollout-correction importance
    weights (:mod:`rltune.algo.correction`); ``norm_len`` is the constant of
    ``seq-mean-token-sum-norm``. The defaults (``ratio_level="token"``, ``objective="ppo"``)
    compute exactly the PPO loss above, bit for bit.

    Sequence levels: the clip acts on ``s_i``, so it keeps or drops a whole sequence (with
    per-sequence advantages): a clipped sequence has zero gradient on all its tokens. In
    ``sequence`` the gradient of an unclipped row is ``-A_i * s_i / |y_i| * d logp_t`` per token
    (through the mean); in ``sequence-token`` it is ``-A_it * s_i * d logp_t``, identical to
    ``sequence`` under ``token-mean`` over a single row, or ``seq-mean-token-mean``, when
    ``A_it = A_i``. If the mean log-ratio hits the +-20 clamp, ``sequence`` gets no gradient
    from the ratio while ``sequence-token`` keeps ``s_i * d logp_t``. A row with no valid token
    contributes nothing and never produces ``nan`` (values or gradients).

    ``stats`` (0-dim detached tensors, over valid tokens regardless of ``agg``):

    * ``clipfrac``: share of valid tokens where the clip acted: ppo, the clipped term was
      strictly larger (it was taken and the gradient is zeroed); cispo, the importance
      weight was changed by the clip (``r < 1 - clip_low`` or ``r > 1 + clip_high``);
    * ``clipfrac_lower``: share where the dual-clip bound ``-A*c`` was taken (0 for cispo);
    * ``approx_kl``: k3 estimate of KL(pi_old || pi) from the *token* ratios whatever
      ``ratio_level`` is: ``(r_t - 1) - log r_t`` (Schulman 2020, "Approximating KL Divergence");
    * ``ratio_mean``: token mean of the ratio ``r`` used (at ``ratio_level``; for the
      sequence levels each sequence weighs by its token count); 1.0 when there is no valid token;
    * ``ratio_max``: its maximum over valid tokens (1.0 when there is none, not ``-inf``);
    * ``clipfrac_seq`` (``ratio_level`` ``sequence``/``sequence-token`` only): among the rows
      with at least one valid token, the share with at least one valid token counted in
      ``clipfrac``. With per-sequence advantages (``A_it = A_i != 0``) every token of a row
      has the same ``r`` and ``A``, so this is the share of sequences whose ratio ``s_i`` was
      clipped (ppo: the clipped term was taken for the sequence; cispo: ``s_i`` was outside
      the bounds).
    """
    if clip_high is None:
        clip_high = clip_low
    if not 0.0 <= clip_low <= 1.0 or clip_high < 0:
        raise ValueError(
            f"clip ranges must satisfy 0 <= clip_low <= 1 and clip_high >= 0, got clip_low={clip_low}, "
            f"clip_high={clip_high}"
        )
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio_level {ratio_level!r}; valid: {', '.join(RATIO_LEVELS)}")
    if objective not in POLICY_OBJECTIVES:
        raise ValueError(f"unknown policy objective {objective!r}; valid: {', '.join(POLICY_OBJECTIVES)}")
    if dual_clip is not None and objective == "cispo":
        raise ValueError("dual_clip applies to the ppo clipped surrogate only; cispo has no min/max to bound")
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1.0 (it bounds the loss at -A*c for A<0), got {dual_clip}")

    m = _bool_mask(mask)  # (B, T)
    # zero the padding *before* any arithmetic so garbage cannot produce nan grads
    adv = _zero_padding(advantages, m).detach()  # (B, T)
    tok_log_ratio = token_log_ratio(logp, old_logp, m)  # (B, T)
    log_ratio = tok_log_ratio if ratio_level == "token" else level_log_ratio(logp, old_logp, m, ratio_level)
    ratio = torch.exp(log_ratio)  # (B, T)

    lo, hi = 1.0 - clip_low, 1.0 + clip_high
    if objective == "ppo":
        per_tok, clip_taken, lower_taken = _ppo_terms(ratio, adv, lo, hi, dual_clip)
    else:
        per_tok, clip_taken = _cispo_terms(logp, ratio, adv, m, lo, hi)
        lower_taken = torch.zeros_like(clip_taken)

    if weights is not None:
        per_tok = per_tok * _zero_padding(weights, m).detach()
    loss = aggregate(per_tok, m, agg, norm_len)
    stats = _ratio_stats(ratio, tok_log_ratio, clip_taken, lower_taken, m, ratio_level != "token")
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
