"""Test hooks that inject faults at chosen steps (RLTUNE_FAULTS="actor_inf@3,reward_nan@5").

Used by the tests to prove that a NaN/Inf never reaches the weights; inert when unset.
"""

from __future__ import annotations

import os


class Faults:
    def __init__(self, spec: str):
        self.at: dict[str, set[int]] = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            kind, _, step = item.partition("@")
            self.at.setdefault(kind, set()).add(int(step))

    @classmethod
    def from_env(cls) -> "Faults | None":
        spec = os.environ.get("RLTUNE_FAULTS", "")
        return cls(spec) if spec else None

    def _on(self, kind: str, step: int) -> bool:
        return step in self.at.get(kind, ())

    def actor_inf(self, step: int) -> bool:
        return self._on("actor_inf", step)

    def critic_nan(self, step: int) -> bool:
        return self._on("critic_nan", step)

    def skip_sync(self, step: int) -> bool:
        return self._on("skip_sync", step)

    def maybe_corrupt_rewards(self, step: int, scores: list[float]) -> None:
        if self._on("reward_nan", step) and scores:
            scores[0] = float("nan")
