"""A single-turn verifiers environment: answer with a short number.

Its rubric has two criteria (verifiers `@vf.reward` methods, logged by rltune as reward parts
`reward/env/digits` and `reward/env/short`): the share of the reply's characters that are digits,
and whether the reply is 1 to 3 characters long. A tiny random model learns both in ~20 steps
(recipes/verifiers-tiny.yaml). Its harness is rltune's in-process chat harness (`chat` here).
"""

from __future__ import annotations

import random

import verifiers.v1 as vf

from rltune.envs.verifiers_examples.chat import ChatHarness


class DigitsData(vf.TaskData):
    answer: str = ""


class DigitsTask(vf.Task[DigitsData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=0.5)
    async def digits(self, trace) -> float:
        reply = trace.last_reply
        return sum(ch.isdigit() for ch in reply) / len(reply) if reply else 0.0

    @vf.reward(weight=0.5)
    async def short(self, trace) -> float:
        return 1.0 if 1 <= len(trace.last_reply) <= 3 else 0.0


class DigitsTaskset(vf.Taskset[DigitsTask, vf.TasksetConfig]):
    def load(self):
        rng = random.Random(0)
        for i in range(64):
            n = rng.randint(1, 99)
            yield DigitsTask(DigitsData(id=f"digits-{i}", prompt=f"Write a number near {n}.", answer=str(n)),
                             self.config.task)


__all__ = ["DigitsTaskset", "ChatHarness"]
