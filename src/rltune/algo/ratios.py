"""Importance ratios pi / pi_old at token or sequence level (PPO, GSPO, GSPO-token).

Shapes: ``logp``, ``old_logp``, ``mask`` ``(B, T)`` over response tokens. Every function
returns a *log*-ratio, 0 at masked positions (so the ratio there is exactly 1), clamped to
``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` before any ``exp``. ``old_logp`` is always detached:
gradients flow only into ``logp``. Padding values are never read (``torch.where``), so
``nan``/``inf`` there cannot reach a value or a gradient.

Levels (``algorithm.ratio_level``):

* ``token``: ``log r_t = logp_t - old_logp_t`` (PPO, Schulman et al. 2017, arXiv:1707.06347);
* ``sequence``: ``log s_i = (1/|y_i|) sum_t (logp_t - old_logp_t)`` over the row's valid tokens,
  broadcast to them (GSPO, Zheng et al. 2025, arXiv:2507.18071, eq. 7): the length-normalised
  sequence likelihood ratio. Its gradient reaches every token: ``d log s_i / d logp_t = 1/|y_i|``;
* ``sequence-token``: ``log s_it = sg(log s_i) + logp_t - sg(logp_t)`` (GSPO-token,
  arXiv:2507.18071 eq. 13-14): the value is exactly ``log s_i``, the gradient of token ``t`` is
  ``d logp_t`` alone, so ``d s_it = s_i * d logp_t`` and per-token advantages can be used.
"""

from __future__ import annotations

import torch

from .aggregate import _bool_mask, _zero_padding, masked_mean

__all__ = [
    "LOG_RATIO_CLAMP",
    "RATIO_LEVELS",
    "level_log_ratio",
    "sequence_log_ratio",
    "token_log_ratio",
]

#: ``log(pi / pi_old)`` is clamped to ``[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP]`` before ``exp``
#: (for the sequence levels: the per-sequence mean log-ratio).
LOG_RATIO_CLAMP = 20.0

#: Valid values of ``algorithm.ratio_level`` / the ``ratio_level`` of ``policy_loss``.
RATIO_LEVELS = ("token", "sequence", "sequence-token")


def token_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``clamp(logp - sg(old_logp), -20, 20)`` per token, 0 on padding. ``(B, T) -> (B, T)``."""
    m = _bool_mask(mask)
    return _zero_padding(logp - old_logp.detach(), m).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's ``log s_i = clamp(mean_t (logp_t - sg(old_logp_t)), -20, 20)`` over valid tokens.

    Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071, eq. 7:
    ``s_i = (pi(y_i|x) / pi_old(y_i|x)) ** (1/|y_i|)``. Shapes: ``(B, T) -> (B,)``. A row with
    no valid token gets 0 (ratio 1) and no gradient.
    """
    m = _bool_mask(mask)
    return masked_mean(logp - old_logp.detach(), m, dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def level_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                    level: str = "token") -> torch.Tensor:
    """Log importance ratio at ``level`` (one of :data:`RATIO_LEVELS`), broadcast to ``(B, T)``.

    ``token``: :func:`token_log_ratio`; ``sequence``: :func:`sequence_log_ratio` on every valid
    token of its row (gradient through the mean); ``sequence-token``: the same value with the
    GSPO-token gradient ``sg(log s_i) + logp_t - sg(logp_t)`` (arXiv:2507.18071 eq. 14).
    0 on padding. Shapes: ``(B, T) -> (B, T)``.
    """
    if level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio level {level!r}; valid: {', '.join(RATIO_LEVELS)}")
    m = _bool_mask(mask)
    if level == "token":
        return token_log_ratio(logp, old_logp, m)
    seq = sequence_log_ratio(logp, old_logp, m)[:, None]  # (B, 1)
    if level == "sequence":
        lr = seq.expand(m.shape)  # (B, T)
    else:
        # logp - sg(logp) is exactly 0 in value, 1 in gradient: the value stays log s_i bit for bit
        own = _zero_padding(logp - logp.detach(), m)  # (B, T)
        lr = seq.detach() + own
    return _zero_padding(lr, m)
