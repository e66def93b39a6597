"""A multi-turn verifiers environment: guess a number from 1 to 8, told "Higher." or "Lower.".

The environment (a verifiers `Env`, its `run` the game's control flow) answers each assistant
turn until the number is found or 4 turns have passed. Its rubric: `found` (1 when the number
was said), `number` (weight 0.5: the share of assistant turns that were a bare number) and `brief`
(weight 0.25: the share that were at most 3 characters). Its harness is
rltune's in-process chat harness, resumed with the conversation at each turn.
"""

from __future__ import annotations

import random

import verifiers.v1 as vf

from rltune.envs.verifiers_examples.chat import ChatHarness

TURNS = 4


class GuessData(vf.TaskData):
    target: int = 1


def _number(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() and len(text) <= 3 else None


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def found(self, task, trace) -> float:
        return float(any(_number(m.content or "") == task.target for m in trace.assistant_messages))

    @vf.reward(weight=0.5)
    async def number(self, trace) -> float:
        turns = trace.assistant_messages
        return sum(_number(m.content or "") is not None for m in turns) / len(turns) if turns else 0.0

    @vf.reward(weight=0.25)
    async def brief(self, trace) -> float:
        """The share of the assistant turns played that were at most 3 characters (a guess is a
        bare number): the shaping that gets a random model to its first finished guesses."""
        turns = trace.assistant_messages
        return sum(len((m.content or "").strip()) <= 3 for m in turns) / len(turns) if turns else 0.0


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        rng = random.Random(1)
        for i in range(64):
            yield GuessTask(GuessData(id=f"guess-{i}", prompt="Guess my number from 1 to 8.",
                                      target=rng.randint(1, 8)), self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as play:
            segment = await play.turn()
            for _ in range(TURNS - 1):
                if segment.terminated:
                    return
                guess = _number(segment.last_reply)
                if guess == task.data.target:
                    return
                hint = "Say a number." if guess is None else ("Higher." if guess < task.data.target else "Lower.")
                segment = await play.turn(hint)


__all__ = ["GuessTaskset", "GuessEnv", "ChatHarness"]
