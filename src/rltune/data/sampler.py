"""A seeded, resumable, rank-aware prompt sampler (shuffle + drop_last)."""

from __future__ import annotations

import random


class PromptSampler:
    """Yields batches of row indices; its position is part of the run state.

    Every epoch is a permutation seeded by (seed, epoch), so a resumed run draws the same
    prompts as an uninterrupted one. With several ranks each rank takes its own slice of
    every global batch (same global order on every rank).
    """

    def __init__(self, n_rows: int, batch_size: int, seed: int, shuffle: bool = True,
                 drop_last: bool = True, rank: int = 0, world_size: int = 1):
        if batch_size * world_size > n_rows and drop_last:
            raise ValueError(
                f"only {n_rows} prompts but one step needs {batch_size * world_size}; "
                "add prompts or lower rollout.batch_size")
        self.n, self.bs, self.seed = n_rows, batch_size, seed
        self.shuffle, self.drop_last = shuffle, drop_last
        self.rank, self.world = rank, world_size
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation()

    def _permutation(self) -> list[int]:
        order = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next_batch(self) -> list[int]:
        """The next `batch_size` indices for this rank."""
        global_bs = self.bs * self.world
        if self.cursor + global_bs > self.n and (self.drop_last or self.cursor >= self.n):
            self.epoch += 1
            self.cursor = 0
            self._order = self._permutation()
        chunk = self._order[self.cursor:self.cursor + global_bs]
        self.cursor += global_bs
        return chunk[self.rank * self.bs:(self.rank + 1) * self.bs]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed, "n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation()
