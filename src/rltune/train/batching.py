"""How a step's experience is cut into updates and micro-batches.

Three rules, none of which changes what is learned (each micro-batch loss is weighted by its
share of the update, so order and grouping are irrelevant up to float rounding):

1. Groups stay together. The step is prompt-major: rows g*n .. g*n+n-1 are the n samples of
   one prompt. The shuffle permutes whole groups, so a micro-batch holds a prompt's samples
   side by side and the shared-prompt passes compute that prompt once.
2. Similar lengths travel together. Within an update, groups are sorted by their longest
   sequence before the update is cut into micro-batches, so short sequences are not padded to
   the step's longest one.
3. No column of padding is computed. Each micro-batch drops the prompt columns that are
   padding in all of its rows and the response columns past all of its rows' last token
   (`Experience.trimmed`).
"""

from __future__ import annotations

import torch

from ..rollout.experience import Experience


def group_rows(size: int, group: int) -> int:
    """Rows per shuffling unit: the group size when the rows are whole groups, else 1."""
    return group if group > 1 and size % group == 0 else 1


def _length_order(exp: Experience, rows: torch.Tensor, unit: int) -> torch.Tensor:
    """`rows` (k*unit,) reordered so that units (groups) of similar length are neighbours;
    the sort is stable, so equal lengths keep their (shuffled) order."""
    length = exp.prompt_mask[rows].sum(-1) + exp.response_mask[rows].sum(-1)          # (k*unit,)
    per_unit = length.view(-1, unit).amax(dim=1)                                       # (k,)
    order = torch.sort(per_unit.cpu(), stable=True).indices                           # (k,)
    return rows.view(-1, unit)[order.to(rows.device)].reshape(-1)


def cut(exp: Experience, rows: torch.Tensor, micro: int, unit: int) -> list[Experience]:
    """Micro-batches of `micro` rows out of `rows`, sorted by length and trimmed."""
    rows = _length_order(exp, rows, unit)
    return [exp.select(rows[m:m + micro]).trimmed() for m in range(0, rows.numel(), micro)]


def micro_batches(exp: Experience, micro: int, update_size: int, gen: torch.Generator,
                  group: int = 1) -> list[list[Experience]]:
    """Shuffle the step's experience by whole groups, cut it into updates of `update_size`
    sequences, each a list of length-sorted, trimmed micro-batches of `micro` sequences."""
    unit = group_rows(exp.size, group)
    if update_size % unit:
        unit = 1
    order = torch.randperm(exp.size // unit, generator=gen)                           # (groups,)
    rows = (order[:, None] * unit + torch.arange(unit)[None, :]).reshape(-1)           # (B,)
    rows = rows.to(exp.response_ids.device)
    return [cut(exp, rows[u:u + update_size], micro, unit) for u in range(0, exp.size, update_size)]


def passes(exp: Experience, micro: int, group: int = 1) -> list[Experience]:
    """The whole experience as length-sorted, trimmed micro-batches (no shuffle): for the
    no-grad passes (reference, behaviour, values), whose outputs go back by `mb.index`."""
    if exp.index is None:
        exp.index = torch.arange(exp.size, device=exp.response_ids.device)
    unit = group_rows(exp.size, group)
    return cut(exp, torch.arange(exp.size, device=exp.response_ids.device), micro, unit)


def scatter(parts: list[tuple[Experience, torch.Tensor]], like: torch.Tensor) -> torch.Tensor:
    """Per-micro-batch (b, T') results put back at their rows and first T' columns of a
    (B, T) zero tensor shaped like `like`."""
    out = torch.zeros_like(like, dtype=torch.float32)
    for mb, value in parts:
        out[mb.index, :value.shape[1]] = value.to(out.dtype)
    return out
