"""Length shaping of rewards and truncation detection (DAPO overlong handling).

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
arXiv:2503.14476, sec. 3.4 ("Overlong Reward Shaping"): responses cut at the generation
budget carry a reward that says nothing about their reasoning. DAPO either masks them out of
the loss ("overlong filtering": :func:`truncated_rows` finds them) or adds a soft length
penalty in the last tokens before the budget (:func:`overlong_penalty`, eq. 13).
"""

from __future__ import annotations

from typing import Iterable

import torch

from .aggregate import _bool_mask, last_token_index

__all__ = ["overlong_penalty", "truncated_rows"]


@torch.no_grad()
def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO's soft overlong punishment (arXiv:2503.14476 sec. 3.4, eq. 13), scaled by ``penalty``.

    With ``L_max = max_new_tokens``, ``L_cache = buffer`` and ``start = L_max - L_cache``::

        R(y) = 0                                         |y| <= start
             = -penalty * (|y| - start) / L_cache        start < |y| < L_max
             = -penalty                                  |y| >= L_max

    (eq. 13 with ``penalty = 1``; it is linear and continuous, so ``|y| = L_max`` gives
    ``-penalty`` either way). Added to the training reward. Shapes: ``lengths`` ``(B,)``
    (response token counts, any numeric dtype) -> ``(B,)`` float32 on the same device.
    Recipe: ``reward.overlong.buffer``, ``reward.overlong.penalty``,
    ``rollout.max_new_tokens``. ``buffer > max_new_tokens`` is allowed (the penalty then
    starts below length 0; the recipe lint warns about it); ``buffer < 1``, ``penalty < 0``
    or ``max_new_tokens < 1`` raise ``ValueError``.
    """
    if not isinstance(buffer, int) or buffer < 1:
        raise ValueError(f"overlong buffer must be an int >= 1, got {buffer!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if penalty < 0:
        raise ValueError(f"overlong penalty must be >= 0, got {penalty}")
    start = max_new_tokens - buffer
    frac = ((lengths.double() - start) / buffer).clamp(0.0, 1.0)  # (B,) 0 before the buffer, 1 at L_max
    return (-penalty * frac).float()


@torch.no_grad()
def truncated_rows(
    response_ids: torch.Tensor, mask: torch.Tensor, eos_ids: Iterable[int], max_new_tokens: int
) -> torch.Tensor:
    """Rows cut at the generation budget: ``max_new_tokens`` valid tokens and no EOS at the end.

    A response that stopped by itself is shorter than the budget (EOS or a stop string before
    it) or ends in an EOS id exactly at it. Token ids cannot tell a stop string completed at
    exactly the last allowed token from a cut, so such a row counts as truncated. Used by
    ``rollout.mask_truncated`` (DAPO's overlong filtering, arXiv:2503.14476 sec. 3.4): the
    trainer zeroes these rows' loss mask. Shapes: ``response_ids`` ``(B, T)`` long, ``mask``
    ``(B, T)`` -> ``(B,)`` bool. A row with no valid token is not truncated. ``eos_ids`` may be
    empty (then every full-length row is truncated).
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    m = _bool_mask(mask)  # (B, T)
    n = m.sum(dim=-1)  # (B,)
    last = response_ids.gather(1, last_token_index(m)[:, None]).squeeze(1)  # (B,) last valid id
    eos = torch.tensor(sorted(set(int(e) for e in eos_ids)), dtype=response_ids.dtype,
                       device=response_ids.device)
    ends_in_eos = torch.isin(last, eos)  # (B,)
    return (n >= max_new_tokens) & ~ends_in_eos
