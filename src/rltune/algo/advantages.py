"""Advantage estimators: GAE (PPO), GRPO / Dr.GRPO, RLOO, REINFORCE++.

All functions are computed without gradient (advantages and returns are
targets, never differentiated through) and return fresh tensors.
"""

from __future__ import annotations

from typing import Tuple

import torch

from .aggregate import _bool_mask, _zero_padding, masked_whiten

__all__ = [
    "broadcast_to_tokens",
    "discounted_returns",
    "gae",
    "grpo_advantages",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "zero_advantage_share",
]


@torch.no_grad()
def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Token-level Generalised Advantage Estimation.

    Schulman et al. 2016, "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation", arXiv:1506.02438::

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t

    Shapes: ``rewards``, ``values``, ``mask`` ``(B, T)`` -> ``advantages``,
    ``returns`` ``(B, T)`` (raw, not whitened; 0 at masked positions).

    Masked steps are *skipped*: their reward/value are ignored and the running
    ``A_{t+1}`` and ``V_{t+1}`` are carried through them unchanged, so the
    result for a row is the same as if its masked positions were deleted. The
    value after the last valid token is 0 (terminal).
    """
    m = _bool_mask(mask)  # (B, T)
    r = _zero_padding(rewards, m).float()  # (B, T)
    v = _zero_padding(values, m).float()  # (B, T)
    B, T = r.shape
    next_value = r.new_zeros(B)  # (B,) V_{t+1}
    last_adv = r.new_zeros(B)  # (B,) A_{t+1}
    adv = r.new_zeros(B, T)
    for t in range(T - 1, -1, -1):
        mt = m[:, t]  # (B,)
        delta = r[:, t] + gamma * next_value - v[:, t]
        a_t = delta + gamma * lam * last_adv
        last_adv = torch.where(mt, a_t, last_adv)
        next_value = torch.where(mt, v[:, t], next_value)
        adv[:, t] = torch.where(mt, a_t, torch.zeros_like(a_t))
    returns = _zero_padding(adv + v, m)
    return adv.to(rewards.dtype), returns.to(rewards.dtype)


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.is_floating_point() else torch.float32


def _check_groups(scores: torch.Tensor, group_size: int) -> None:
    if scores.dim() != 1:
        raise ValueError(f"scores must be 1-D (B,), got shape {tuple(scores.shape)}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if scores.shape[0] % group_size != 0:
        raise ValueError(
            f"batch size {scores.shape[0]} is not divisible by group_size {group_size}: "
            "scores must hold consecutive groups of group_size completions per prompt"
        )


@torch.no_grad()
def grpo_advantages(
    scores: torch.Tensor,
    group_size: int,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> torch.Tensor:
    """Group-relative outcome advantages.

    GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300)::

        A_i = (s_i - mean(s_group)) / (std(s_group) + eps)   # unbiased std

    Dr.GRPO (Liu et al. 2025, arXiv:2503.20783), ``scale_by_std=False``::

        A_i = s_i - mean(s_group)

    Shapes: ``scores`` ``(B,)`` with ``B = n_groups * group_size`` laid out as
    consecutive groups -> ``(B,)``. A group whose scores are all equal gets
    exactly 0 (also covers ``group_size == 1``).
    """
    _check_groups(scores, group_size)
    s = scores.float().view(-1, group_size)  # (G, n)
    centred = s - s.mean(dim=-1, keepdim=True)  # (G, n)
    if scale_by_std:
        std = s.std(dim=-1, unbiased=True, keepdim=True) if group_size > 1 else torch.zeros_like(s[:, :1])
        centred = centred / (std + eps)
    all_equal = (s == s[:, :1]).all(dim=-1, keepdim=True)  # (G, 1)
    adv = torch.where(all_equal, torch.zeros_like(centred), centred)
    return adv.reshape(-1).to(_out_dtype(scores))


@torch.no_grad()
def rloo_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE Leave-One-Out advantages.

    Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!";
    Ahmadian et al. 2024, arXiv:2402.14740::

        A_i = s_i - (1 / (n - 1)) * sum_{j != i} s_j

    Shapes: ``scores`` ``(B,)`` in consecutive groups of ``group_size`` ->
    ``(B,)``. Requires ``group_size >= 2``.
    """
    _check_groups(scores, group_size)
    if group_size < 2:
        raise ValueError(f"RLOO needs group_size >= 2 (a leave-one-out baseline), got {group_size}")
    s = scores.float().view(-1, group_size)  # (G, n)
    baseline = (s.sum(dim=-1, keepdim=True) - s) / (group_size - 1)  # (G, n)
    return (s - baseline).reshape(-1).to(_out_dtype(scores))


@torch.no_grad()
def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Per-token discounted returns ``G_t = r_t + gamma * G_{t+1}`` (``G`` after the last
    valid token is 0). Shapes: ``rewards``, ``mask`` ``(B, T)`` -> ``(B, T)``, 0 at masked
    positions; masked steps are skipped (``G`` is carried through them)."""
    m = _bool_mask(mask)
    r = _zero_padding(rewards, m).float()  # (B, T)
    B, T = r.shape
    running = r.new_zeros(B)  # (B,)
    ret = r.new_zeros(B, T)
    for t in range(T - 1, -1, -1):
        g_t = r[:, t] + gamma * running
        running = torch.where(m[:, t], g_t, running)
        ret[:, t] = torch.where(m[:, t], g_t, torch.zeros_like(g_t))
    return ret.to(rewards.dtype)


@torch.no_grad()
def reinforce_pp_advantages(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """REINFORCE++ advantages: discounted returns, whitened over the batch.

    Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models", arXiv:2501.03262::

        G_t = r_t + gamma * G_{t+1}       (per sequence, G after the last valid token = 0)
        A   = masked_whiten(G, mask)      (mean/std over all valid tokens of the batch)

    Shapes: ``rewards``, ``mask`` ``(B, T)`` -> ``(B, T)``, 0 at masked
    positions. With several ranks the batch is the global one: the trainer whitens
    ``discounted_returns`` with the statistics of every rank instead.
    """
    return masked_whiten(discounted_returns(rewards, mask, gamma).float(), _bool_mask(mask)).to(rewards.dtype)


@torch.no_grad()
def zero_advantage_share(scores: torch.Tensor, group_size: int) -> float:
    """Share of prompts whose ``group_size`` samples all scored alike: a group baseline gives
    them zero advantage, so they teach nothing (DAPO's dynamic sampling filters them).
    Shapes: ``scores`` ``(B,)`` in consecutive groups -> a float in [0, 1]."""
    _check_groups(scores, group_size)
    s = scores.view(-1, group_size)  # (G, n)
    return float((s == s[:, :1]).all(dim=-1).float().mean())


def broadcast_to_tokens(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Spread per-sequence (outcome) advantages over the valid tokens.

    Shapes: ``adv`` ``(B,)``, ``mask`` ``(B, T)`` -> ``(B, T)`` with
    ``out[i, t] = adv[i]`` on valid tokens and 0 elsewhere (GRPO/RLOO outcome
    supervision, Shao et al. 2024, arXiv:2402.03300, section 4.1.2).
    """
    if adv.dim() != 1 or adv.shape[0] != mask.shape[0]:
        raise ValueError(f"adv must have shape (B,)=({mask.shape[0]},), got {tuple(adv.shape)}")
    return _zero_padding(adv[:, None].expand(mask.shape), mask)
