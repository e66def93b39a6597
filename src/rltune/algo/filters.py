"""Group filters for DAPO dynamic sampling (``algorithm.filter_groups``).

Yu et al. 2025, "DAPO", arXiv:2503.14476, sec. 3.2 ("Dynamic Sampling"): a prompt whose
``group_size`` samples all score alike (all right or all wrong) gets zero group-relative
advantage and so no gradient; DAPO drops such groups and samples more until the batch is full.
Groups sit in consecutive rows (``G`` rows each), as everywhere in :mod:`rltune.algo`.
"""

from __future__ import annotations

import torch

__all__ = ["SIGNAL_EPS", "group_row_mask", "groups_with_signal"]

#: A group has signal when ``max - min`` of its metric exceeds this.
SIGNAL_EPS = 1e-9


def _check_group_size(n: int, group_size: int, what: str) -> None:
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if n % group_size != 0:
        raise ValueError(f"{what} {n} is not divisible by group_size {group_size}")


@torch.no_grad()
def groups_with_signal(metric: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which groups teach something: their metric is not constant (DAPO sec. 3.2).

    DAPO keeps a group when ``0 < |{correct}| < G``; for any metric (accuracy, reward) that is
    ``max - min > 1e-9`` within the group. A group with a ``nan`` or ``inf`` value has no
    signal. Shapes: ``metric`` ``(B,)`` -> ``(B // G,)`` bool. ``ValueError`` if ``metric`` is
    not 1-D or ``B % G != 0``. ``group_size = 1`` gives no signal anywhere.
    """
    if metric.dim() != 1:
        raise ValueError(f"metric must be 1-D (B,), got shape {tuple(metric.shape)}")
    _check_group_size(metric.shape[0], group_size, "batch size")
    g = metric.double().view(-1, group_size)  # (N, G)
    finite = torch.isfinite(g).all(dim=-1)  # (N,)
    g = torch.where(torch.isfinite(g), g, torch.zeros_like(g))  # keep amax/amin finite
    spread = g.amax(dim=-1) - g.amin(dim=-1) if g.numel() else g.new_zeros(g.shape[0])
    return finite & (spread > SIGNAL_EPS)


def group_row_mask(keep_groups: torch.Tensor, group_size: int) -> torch.Tensor:
    """Expand a per-group keep flag to its rows: ``out[i * G + j] = keep_groups[i]``.

    Shapes: ``keep_groups`` ``(N,)`` bool -> ``(N * G,)`` bool; ``out.nonzero().squeeze(-1)``
    gives the kept row indices in order (groups stay contiguous).
    """
    if keep_groups.dim() != 1:
        raise ValueError(f"keep_groups must be 1-D (N,), got shape {tuple(keep_groups.shape)}")
    _check_group_size(0, group_size, "rows")
    return keep_groups.bool().repeat_interleave(group_size)
