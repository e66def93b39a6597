"""A tool-using verifiers environment: add two numbers with the `calc_add` tool, then answer.

The task declares a task-scoped `vf.Toolset` (an MCP tool server: verifiers starts one per
episode, rltune runs it behind its guard, `rltune.envs.verifiers_tools`) with one tool, `add`
(exposed to the model as `calc_add`). Its rubric: `correct` (the final reply holds the sum) and
`used_tool` (weight 0.5: a tool answered without an error); a metric (measured, not
rewarded): `tool_results`, the tool results the episode received. Its harness is rltune's in-process chat
harness, which offers the toolset's tools to the model and answers its calls.
"""

from __future__ import annotations

import random

import verifiers.v1 as vf

from rltune.envs.verifiers_examples.chat import ChatHarness


class CalcTools(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers and return their sum."""
        return str(int(a) + int(b))


class CalcData(vf.TaskData):
    a: int = 0
    b: int = 0


class CalcTask(vf.Task[CalcData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        return [CalcTools(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(str(task.a + task.b) in (trace.last_reply or ""))

    @vf.metric
    async def tool_results(self, trace) -> float:
        return float(len(trace.tool_messages))

    @vf.reward(weight=0.5)
    async def used_tool(self, trace) -> float:
        return float(any(not str(m.content).startswith("error:") for m in trace.tool_messages))


class CalcTaskset(vf.Taskset[CalcTask, vf.TasksetConfig]):
    def load(self):
        rng = random.Random(3)
        for i in range(64):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            yield CalcTask(CalcData(id=f"calc-{i}", prompt=f"What is {a} + {b}? Use the calc_add tool.",
                                    answer=str(a + b), a=a, b=b), self.config.task)


if __name__ == "__main__":      # verifiers starts a task's tool server as `python -m MODULE`
    CalcTools.run()


__all__ = ["CalcTaskset", "ChatHarness"]
