"""Rollout/trainer mismatch correction: importance weights pi_behaviour / pi_rollout per token.

The rollout engine samples with its own kernels (vLLM: other matmul order, fused ops, maybe
another precision; both engines report log-probs of the full distribution, before top-k/top-p,
like the trainer: docs/training.md), so the tokens come from pi_rollout, not from the trainer's pi_behaviour (the
actor's own log-probs under the same weights). The policy-gradient estimate is then off-policy
by the ratio w_t = pi_behaviour(y_t) / pi_rollout(y_t). Following truncated importance sampling
(TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL
training") and its masked variant (IcePop, MIS), each token's policy loss is multiplied by

    tis:  min(w_t, C)                          (bias traded for bounded variance)
    mis:  w_t if 1/C <= w_t <= C else 0        (tokens with an extreme mismatch are dropped)

The weights are constants (no gradient). Shapes: log-probs and mask (B, T) -> weights (B, T).
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from .aggregate import _bool_mask, _zero_padding

__all__ = ["CORRECTION_MODES", "rollout_correction_weights"]

CORRECTION_MODES = ("none", "tis", "mis")

#: log w is clamped before exp so that a garbage rollout log-prob cannot overflow
_LOG_W_CLAMP = 20.0


@torch.no_grad()
def rollout_correction_weights(
    behavior_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    cap: float,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Per-token weights (B, T), 0 on padding, and stats over the valid tokens.

    ``stats`` (0-dim sums, so callers can add them over micro-batches and ranks):
    ``w_sum`` (raw weights), ``w_max``, ``capped`` (tokens truncated or masked), ``n`` (tokens).
    ``mode="none"`` returns weights of 1 (stats still describe the raw mismatch).
    """
    if mode not in CORRECTION_MODES:
        raise ValueError(f"unknown rollout correction mode {mode!r}; valid: {', '.join(CORRECTION_MODES)}")
    if not cap > 1.0:
        raise ValueError(f"the importance-weight cap must be > 1, got {cap}")
    m = _bool_mask(mask)                                                   # (B, T)
    log_w = _zero_padding(behavior_logp.float() - rollout_logp.float(), m)
    w = torch.exp(log_w.clamp(-_LOG_W_CLAMP, _LOG_W_CLAMP))                # (B, T), 1 on padding
    if mode == "tis":
        out, capped = w.clamp(max=cap), w > cap
    elif mode == "mis":
        inside = (w >= 1.0 / cap) & (w <= cap)
        out, capped = torch.where(inside, w, torch.zeros_like(w)), ~inside
    else:
        out, capped = torch.ones_like(w), torch.zeros_like(m)
    stats = {
        "w_sum": _zero_padding(w, m).sum(),
        "w_max": torch.where(m, w, torch.zeros_like(w)).max() if m.any() else w.new_zeros(()),
        "capped": (capped & m).sum().float(),
        "n": m.sum().float(),
    }
    return _zero_padding(out, m), stats
