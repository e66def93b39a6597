"""How a step's experience is cut into updates and micro-batches.

Four rules, none of which changes what is learned (each micro-batch loss is weighted by its
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
4. Micro-batches hold `train.micro_batch_size` rows, or, with `train.max_tokens_per_micro_batch`,
   as many rows as a token budget holds (`pack`): in the length order of rule 2, greedily, so
   that what the micro-batch's forward computes stays within the budget: rows x (longest prompt
   + longest response), or with `train.padding_free` (`packed.py`) the rows' real tokens, a
   group's prompt once where the passes share it. A group stays whole where it fits the budget;
   a row longer than the budget goes alone. The ranks then run as many micro-batches each
   (`even_out`): ZeRO's collectives run in every forward and backward.

Rows of episodes (`Experience.episode`: a prefix break makes several rows of one episode,
docs/agents.md) follow the same rules with the episode as the unit of the shuffle and of the
update (`episode_micro_batches`); since ranks may then hold different numbers of rows, every rank
runs as many micro-batches in every pass and update, a `filler` (nothing trained, nothing
written) where it has too few rows.

A layout names how a micro-batch's tokens are counted: "padded", "packed" or "packed-shared".
"""

from __future__ import annotations

import torch

from ..rollout.experience import Experience
from .collective import global_max


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


def widths(exp: Experience, rows: torch.Tensor) -> tuple[list[int], list[int]]:
    """Per row of `rows`, the prompt and response columns `Experience.trimmed` keeps for it: from
    its first prompt token to the prompt's end (prompts are left-padded) and up to its last
    response token."""
    pm, rm = exp.prompt_mask[rows].bool(), exp.response_mask[rows].bool()             # (k, P), (k, T)
    prompt = pm.shape[1] - pm.int().argmax(-1)                                         # (k,)
    response = rm.shape[1] - rm.flip(-1).int().argmax(-1)                              # (k,)
    both = torch.stack([prompt * pm.any(-1), response * rm.any(-1)]).tolist()          # (2, k), one sync
    return both[0], both[1]


def tokens(prompt: list[int], response: list[int], lo: int, hi: int, unit: int, layout: str = "padded") -> int:
    """What a micro-batch of rows lo:hi computes, in tokens: rows x (longest prompt + longest
    response) padded; the rows' prompt and response tokens packed; and packed-shared, each group's
    prompt (rows of one `unit`, the same prompt) once."""
    if layout == "padded":
        return (hi - lo) * (max(prompt[lo:hi]) + max(response[lo:hi]))
    if layout == "packed" or unit == 1:
        return sum(prompt[lo:hi]) + sum(response[lo:hi])
    starts = range(lo - lo % unit, hi, unit)                           # the groups rows lo:hi touch
    return sum(max(prompt[max(s, lo):min(s + unit, hi)]) for s in starts) + sum(response[lo:hi])


def pack(prompt: list[int], response: list[int], unit: int, budget: int, layout: str = "padded") -> list[int]:
    """Cut points of rows (in order; row i has `prompt[i]` prompt and `response[i]` response
    columns) packed greedily into micro-batches of at most `budget` tokens as `tokens` counts them
    in `layout`: [0, c1, ..., n], micro-batch j = rows cuts[j]:cuts[j+1]. Units of `unit`
    consecutive rows (groups) join whole when they fit the budget, else row by row; a row longer
    than the budget goes alone."""
    n = len(prompt)
    cuts = [0]

    def join(lo: int, hi: int) -> None:
        """Rows lo:hi join the open micro-batch, or open the next one when they would overflow it."""
        if lo > cuts[-1] and tokens(prompt, response, cuts[-1], hi, unit, layout) > budget:
            cuts.append(lo)

    for u in range(0, n, unit):
        end = min(u + unit, n)
        if tokens(prompt, response, u, end, unit, layout) <= budget:
            join(u, end)                    # the group fits a micro-batch: it stays whole
        else:
            for i in range(u, end):         # it does not: row by row
                join(i, i + 1)
    return cuts + [n] if n else cuts


def even_out(cuts: list[int], count: int) -> list[int]:
    """`cuts` with micro-batches split until there are `count` (down to one row each): the one of
    most rows, in halves."""
    cuts = list(cuts)
    while len(cuts) - 1 < count:
        sizes = [b - a for a, b in zip(cuts, cuts[1:])]
        j = max(range(len(sizes)), key=sizes.__getitem__)
        if sizes[j] < 2:
            break
        cuts.insert(j + 1, cuts[j] + sizes[j] // 2)
    return cuts


def cut(exp: Experience, rows: torch.Tensor, micro: int, unit: int,
        max_tokens: int | None = None, layout: str = "padded", groups: torch.Tensor | None = None) -> list[Experience]:
    """Micro-batches out of `rows`, sorted by length and trimmed: of `micro` rows, or packed
    into `max_tokens` tokens of `layout` (`pack`) and as many on every rank (`even_out`).

    `groups` (n,), each row's group, for rows of episodes (`episode_micro_batches`, `passes`): the
    ranks may then hold different numbers of rows (a prefix break makes several rows of one
    episode), so every rank runs as many micro-batches, with `filler`s where it has too few rows.
    Where a group is not `unit` rows, groups are length-ordered as wholes and packed row by row."""
    if groups is None or _even_groups(groups, unit):
        rows = _length_order(exp, rows, unit)
    else:
        rows, unit = _group_length_order(exp, rows, groups), 1
    n = rows.numel()
    cuts = list(range(0, n, micro)) + [n] if max_tokens is None else pack(*widths(exp, rows), unit, max_tokens, layout)
    count = len(cuts) - 1
    if max_tokens is not None or groups is not None:
        count = int(global_max([float(count)])[0])
        cuts = even_out(cuts, count)
    out = [exp.select(rows[a:b]).trimmed() for a, b in zip(cuts, cuts[1:])]
    return out + [filler(exp, rows) for _ in range(count - len(out))]


def _even_groups(groups: torch.Tensor, unit: int) -> bool:
    """Whether `groups` (n,) are runs of exactly `unit` rows, one run per group."""
    n = groups.numel()
    if n == 0 or unit == 1:
        return n == 0 or groups.unique().numel() == n
    if n % unit:
        return False
    runs = groups.view(-1, unit)
    return bool((runs == runs[:, :1]).all()) and groups.unique().numel() == n // unit


def _group_length_order(exp: Experience, rows: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """`rows` (n,) reordered so that groups (of any number of rows, `groups` (n,) each row's) of
    similar longest length are neighbours; a group's rows keep their order."""
    n = rows.numel()
    if n == 0:
        return rows
    length = (exp.prompt_mask[rows].sum(-1) + exp.response_mask[rows].sum(-1)).cpu()  # (n,)
    ids, inverse = torch.unique(groups.cpu(), return_inverse=True)                    # (g,), (n,)
    longest = torch.zeros(ids.numel(), dtype=length.dtype).scatter_reduce(0, inverse, length, "amax")
    # groups in order of first appearance, then stably by length
    first = torch.full((ids.numel(),), n, dtype=torch.long).scatter_reduce(0, inverse, torch.arange(n), "amin")
    appear = torch.sort(first, stable=True).indices                                   # (g,)
    by_length = appear[torch.sort(longest[appear], stable=True).indices]             # (g,)
    place = torch.empty_like(by_length)
    place[by_length] = torch.arange(by_length.numel())                                # group -> its place
    order = torch.sort(place[inverse] * n + torch.arange(n), stable=True).indices     # (n,)
    return rows[order.to(rows.device)]


def filler(exp: Experience, rows: torch.Tensor) -> Experience:
    """A micro-batch that only keeps this rank in step with the others (ZeRO's collectives run in
    every forward and backward): one of its rows, nothing in it trained (a zero loss mask: no
    weight in the update, no token in any count), its outputs put nowhere (`filler`)."""
    mb = exp.select(rows[:1]).trimmed()
    mb.loss_mask = torch.zeros_like(mb.train_mask)
    mb.filler = True
    return mb


def episode_micro_batches(exp: Experience, micro: int, update_size: int, gen: torch.Generator, group: int = 1,
                          max_tokens: int | None = None, layout: str = "padded") -> list[list[Experience]]:
    """`micro_batches` for rows of episodes (`exp.episode`; a prefix break makes several rows of
    one episode): the shuffle permutes whole groups of episodes as it permutes groups of rows (the
    same draw), an update holds `update_size` episodes (every row of each), and each update's
    micro-batches are as many on every rank. Where every episode is one row, the micro-batches are
    `micro_batches`' exactly."""
    episode = exp.episode
    E = int(episode.max()) + 1 if episode.numel() else 0
    unit = group_rows(E, group)
    if update_size % unit:
        unit = 1
    order = torch.randperm(E // unit, generator=gen)                                  # (groups,)
    chosen = (order[:, None] * unit + torch.arange(unit)[None, :]).reshape(-1)        # (E,) episodes, shuffled
    counts = torch.bincount(episode.cpu(), minlength=E)                               # (E,) rows per episode
    starts = torch.cumsum(counts, 0) - counts                                         # (E,)
    out = []
    for u in range(0, E, update_size):
        eps = chosen[u:u + update_size].tolist()
        rows = torch.cat([torch.arange(int(starts[e]), int(starts[e] + counts[e])) for e in eps])
        groups = torch.cat([torch.full((int(counts[e]),), k // unit) for k, e in enumerate(eps)])
        out.append(cut(exp, rows.to(exp.response_ids.device), micro, unit, max_tokens, layout, groups))
    return out


def micro_batches(exp: Experience, micro: int, update_size: int, gen: torch.Generator,
                  group: int = 1, max_tokens: int | None = None, layout: str = "padded") -> list[list[Experience]]:
    """Shuffle the step's experience by whole groups, cut it into updates of `update_size`
    sequences, each a list of length-sorted, trimmed micro-batches of `micro` sequences (or of
    at most `max_tokens` tokens of `layout`)."""
    if exp.episode is not None:
        return episode_micro_batches(exp, micro, update_size, gen, group, max_tokens, layout)
    unit = group_rows(exp.size, group)
    if update_size % unit:
        unit = 1
    order = torch.randperm(exp.size // unit, generator=gen)                           # (groups,)
    rows = (order[:, None] * unit + torch.arange(unit)[None, :]).reshape(-1)           # (B,)
    rows = rows.to(exp.response_ids.device)
    return [cut(exp, rows[u:u + update_size], micro, unit, max_tokens, layout)
            for u in range(0, exp.size, update_size)]


def passes(exp: Experience, micro: int, group: int = 1, max_tokens: int | None = None,
           layout: str = "padded") -> list[Experience]:
    """The whole experience as length-sorted, trimmed micro-batches (no shuffle): for the
    no-grad passes (reference, behaviour, values), whose outputs go back by `mb.index`."""
    if exp.index is None:
        exp.index = torch.arange(exp.size, device=exp.response_ids.device)
    rows = torch.arange(exp.size, device=exp.response_ids.device)
    if exp.episode is not None:   # rows of episodes: as many micro-batches on every rank
        E = int(exp.episode.max()) + 1 if exp.size else 0
        unit = group_rows(E, group)
        return cut(exp, rows, micro, unit, max_tokens, layout, exp.episode.cpu() // unit)
    unit = group_rows(exp.size, group)
    return cut(exp, rows, micro, unit, max_tokens, layout)


def scatter(parts: list[tuple[Experience, torch.Tensor]], like: torch.Tensor) -> torch.Tensor:
    """Per-micro-batch (b, T') results put back at their rows and first T' columns of a
    (B, T) zero tensor shaped like `like`."""
    out = torch.zeros_like(like, dtype=torch.float32)
    for mb, value in parts:
        if mb.filler:
            continue
        out[mb.index, :value.shape[1]] = value.to(out.dtype)
    return out
