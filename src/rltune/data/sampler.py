"""A seeded, resumable, rank-aware prompt sampler (shuffle + drop_last)."""

from __future__ import annotations

import random


class PromptSampler:
    """Yields batches of row indices; its position is part of the run state.

    Every epoch is a permutation seeded by (seed, epoch), so a resumed run draws the same
    prompts as an uninterrupted one. With several ranks each rank takes its own slice of
    every global batch (same global order on every rank).

    Every call returns exactly `batch_size` indices on every rank (the trainer gathers equal
    rows from all ranks). At the end of an epoch, where fewer than `batch_size * world_size`
    prompts are left:
    - drop_last=True: they are skipped; the next epoch starts a fresh batch;
    - drop_last=False: they are used, topped up with the first prompts of the next epoch's
      permutation, and that epoch goes on after them: the epochs form one stream, so every
      prompt is drawn once per epoch.
    """

    def __init__(self, n_rows: int, batch_size: int, seed: int, shuffle: bool = True,
                 drop_last: bool = True, rank: int = 0, world_size: int = 1):
        if n_rows < 1:
            raise ValueError("no prompts; add rows to the data file")
        if batch_size * world_size > n_rows and drop_last:
            raise ValueError(
                f"only {n_rows} prompts but one step needs {batch_size * world_size}; "
                "add prompts, lower rollout.batch_size, or set data.drop_last: false")
        self.n, self.bs, self.seed = n_rows, batch_size, seed
        self.shuffle, self.drop_last = shuffle, drop_last
        self.rank, self.world = rank, world_size
        self.epoch, self.cursor = 0, 0
        self._order = self._permutation()
        self.last_keys: list[int] = []   # the draws of the last next_batch (this rank's share): see draw_key

    def _permutation(self) -> list[int]:
        order = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.cursor = 0
        self._order = self._permutation()

    @property
    def batch_size(self) -> int:
        """Prompts one `next_batch` call hands this rank (its share of a generation call)."""
        return self.bs

    def next_batch(self) -> list[int]:
        """The next `batch_size` indices for this rank."""
        global_bs = self.bs * self.world
        if self.drop_last and self.cursor + global_bs > self.n:
            self._next_epoch()
        chunk: list[int] = []
        keys: list[int] = []
        while len(chunk) < global_bs:
            if self.cursor >= self.n:
                self._next_epoch()
            take = self._order[self.cursor:self.cursor + global_bs - len(chunk)]
            chunk += take
            keys += [self.draw_key(self.epoch, self.cursor + i) for i in range(len(take))]
            self.cursor += len(take)
        mine = slice(self.rank * self.bs, (self.rank + 1) * self.bs)
        self.last_keys = keys[mine]
        return chunk[mine]

    def draw_key(self, epoch: int, position: int) -> int:
        """A number for one draw of the run's prompt stream (epoch, position in that epoch's
        order): the same for the same draw on any rank and world size, after a resume too. The
        server engine seeds each request from it (rollout/vllm_server.py, request_seeds)."""
        return epoch * self.n + position

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed, "n": self.n}

    def load_state_dict(self, state: dict) -> None:
        # the saved seed wins: with trainer.seed null a resumed run draws a new one
        self.seed = int(state.get("seed", self.seed))
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._permutation()
