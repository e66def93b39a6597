"""Masked reductions and loss aggregation over response tokens.

Conventions used throughout :mod:`rltune.algo`:

* per-token tensors are ``(B, T)`` over response tokens;
* ``mask`` is a 0/1 float (or bool) ``(B, T)`` tensor, 1 on valid tokens;
* values at masked positions are *never* read: they are replaced with 0 via
  ``torch.where`` (not multiplication) so that garbage, including ``inf`` or
  ``nan``, in padding cannot leak into results or gradients.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = [
    "AGG_MODES",
    "aggregate",
    "last_token_index",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]

#: Valid values of ``algorithm.loss_agg`` / the ``mode`` of :func:`aggregate`.
AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def _bool_mask(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask > 0


def _zero_padding(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x`` with masked positions replaced by 0 (gradient-safe for nan/inf padding)."""
    return torch.where(_bool_mask(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Sum of ``x`` over valid positions.

    Shapes: ``x`` and ``mask`` broadcastable, e.g. ``(B, T)``; returns a 0-dim
    tensor (``dim=None``) or the tensor reduced along ``dim``.
    """
    xz = _zero_padding(x, mask)
    return xz.sum() if dim is None else xz.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """Mean of ``x`` over valid positions: ``sum(x * m) / sum(m)``.

    Shapes: ``x``, ``mask`` ``(B, T)``; returns 0-dim (``dim=None``) or reduced
    along ``dim`` (e.g. ``(B,)`` for ``dim=-1``). An empty mask (or empty row)
    gives 0 (still attached to the graph), never a division by zero.
    """
    m = _bool_mask(mask)
    n = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(x, m, dim) / n.clamp(min=1).to(x.dtype)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all valid positions (0-dim).

    ``unbiased=True`` applies Bessel's correction ``n / (n - 1)``. With fewer
    than two valid elements the (unbiased) variance is undefined and 0 is
    returned instead.
    """
    m = _bool_mask(mask)
    mean = masked_mean(x, m)
    centred = _zero_padding(x - mean, m)
    n = m.sum().to(x.dtype)
    if unbiased:
        denom = (n - 1).clamp(min=1)
        var = (centred**2).sum() / denom
        return torch.where(n > 1, var, torch.zeros_like(var))
    return (centred**2).sum() / n.clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Whiten ``x`` using statistics of the valid positions only.

    ``y = (x - mean) * rsqrt(var + 1e-8)`` with the unbiased masked variance;
    with ``shift_mean=False`` the mean is added back (scale only). Output is 0
    at masked positions. Shapes: ``x``, ``mask`` ``(B, T)`` -> ``(B, T)``.
    Used e.g. for PPO advantage normalisation (Schulman et al. 2017 reference
    implementation) and REINFORCE++ (Hu 2025, arXiv:2501.03262).
    """
    m = _bool_mask(mask)
    mean = masked_mean(x, m)  # ()
    var = masked_var(x, m, unbiased=True)  # ()
    y = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        y = y + mean
    return _zero_padding(y, m)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last valid token of each row.

    Shapes: ``mask`` ``(B, T)`` -> ``(B,)`` long. A row with no valid token
    gets index 0 (callers that care must check ``mask.any(-1)``).
    """
    m = _bool_mask(mask)
    T = m.shape[-1]
    pos = torch.arange(1, T + 1, device=m.device).expand_as(m)  # (B, T), 1-based
    # the largest 1-based position among valid tokens; 0 for empty rows
    last = torch.where(m, pos, torch.zeros_like(pos)).amax(dim=-1)  # (B,)
    return (last - 1).clamp(min=0).long()


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
              norm_len: Optional[int] = None) -> torch.Tensor:
    """Reduce a per-token loss ``x`` ``(B, T)`` to a scalar (selected by ``algorithm.loss_agg``).

    Modes (``m`` the mask, ``T`` the mask width, ``B'`` the number of rows with
    at least one valid token):

    * ``token-mean``: ``sum(x*m) / sum(m)`` (PPO/DAPO; Yu et al. 2025,
      arXiv:2503.14476, "token-level policy gradient loss");
    * ``token-sum``: ``sum(x*m)``;
    * ``seq-mean-token-sum``: ``(1/B') sum_i sum_t x_it m_it``;
    * ``seq-mean-token-mean``: ``(1/B') sum_i (sum_t x_it m_it / sum_t m_it)``
      (original GRPO, Shao et al. 2024, arXiv:2402.03300);
    * ``seq-mean-token-sum-norm``: ``(1/B') sum_i (sum_t x_it m_it / L)``
      with ``L = norm_len``, a constant (Dr.GRPO, Liu et al. 2025,
      arXiv:2503.20783: the generation budget, so there is no length bias).
      The trainer passes ``rollout.max_new_tokens``; without ``norm_len`` the
      mask width ``T`` is used, which depends on the widest response in the
      batch and so differs between micro-batches and ranks.

    Empty masks give 0 (attached to the graph, so ``backward`` works).
    Rows with no valid token are not counted as sequences.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid modes: {', '.join(AGG_MODES)}")
    m = _bool_mask(mask)
    if mode == "token-mean":
        return masked_mean(x, m)
    if mode == "token-sum":
        return masked_sum(x, m)
    row_n = m.sum(dim=-1)  # (B,)
    n_rows = (row_n > 0).sum().clamp(min=1).to(x.dtype)  # B'
    row_sum = masked_sum(x, m, dim=-1)  # (B,)
    if mode == "seq-mean-token-sum":
        per_seq = row_sum
    elif mode == "seq-mean-token-mean":
        per_seq = row_sum / row_n.clamp(min=1).to(x.dtype)
    else:  # seq-mean-token-sum-norm
        per_seq = row_sum / float(max(norm_len if norm_len is not None else m.shape[-1], 1))
    return per_seq.sum() / n_rows
