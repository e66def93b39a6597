"""`agent` environments: a function `run(client, row) -> reward` written against the OpenAI client.

`rollout.env: path/to/agent.py:run` names a function (not a class): rltune calls it once per
episode, in a thread of the trainer, with an `openai.OpenAI` client (an `openai.AsyncOpenAI` one
for `async def run`) whose base URL is the recording endpoint of agents/proxy.py, and the
episode's data row. Whatever it does between its `client.chat.completions.create(...)` calls
(tools, a sandbox, a simulator) is the environment; what it returns is the episode's reward.

`AgentSession` carries the counters an episode reports (the ones `Session` has, env.py), and
`check_agent_def` lets `validate` check the function's signature from the file's text.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import math
import numbers
import time

from .env import EnvError

SIGNATURE_FIX = "define it as `def run(client, row):` returning the episode's reward (a float)"


def is_agent(obj) -> bool:
    """Whether a loaded `rollout.env` object is an agent function (a class is an environment)."""
    return (inspect.isfunction(obj) or inspect.ismethod(obj)) and not isinstance(obj, type)


def check_agent(fn) -> None:
    """EnvError unless `fn` can be called as fn(client, row)."""
    try:
        inspect.signature(fn).bind(object(), object())
    except TypeError:
        raise EnvError(f"agent function {fn.__qualname__}{inspect.signature(fn)} cannot be called as "
                       "run(client, row)", SIGNATURE_FIX) from None


def check_agent_def(node: ast.FunctionDef | ast.AsyncFunctionDef, target: str) -> str | None:
    """A problem with an agent function, judged from its text (validate), or None."""
    a = node.args
    positional = a.posonlyargs + a.args
    required_kw = [k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    if (len(positional) < 2 and not a.vararg) or required_kw or (
            len(positional) - len(a.defaults) > 2):
        return (f"agent function `{node.name}` in `{target}` cannot be called as run(client, row): "
                + SIGNATURE_FIX)
    return None


def make_client(fn, base_url: str, timeout_s: float):
    """The OpenAI client an agent gets: sync or async as `fn` is; no retries (a refused request
    means the episode has ended), no proxies from the environment (the endpoint is local)."""
    try:
        import httpx
        import openai
    except ImportError:
        raise EnvError("agent environments need the `openai` package, which is not installed",
                       "pip install 'rltune[agents]' (or: pip install openai)") from None
    if inspect.iscoroutinefunction(fn):
        return openai.AsyncOpenAI(base_url=base_url, api_key="rltune", max_retries=0, timeout=timeout_s,
                                  http_client=httpx.AsyncClient(trust_env=False, timeout=timeout_s))
    return openai.OpenAI(base_url=base_url, api_key="rltune", max_retries=0, timeout=timeout_s,
                         http_client=httpx.Client(trust_env=False, timeout=timeout_s))


class AgentSession:
    """One episode of an agent: its counters (as env.Session's), its result and its timing.

    turns: model turns that ended (EOS) and went back to the agent; tool_calls: tool calls the model wrote (returned as `tool_calls`);
    parse_errors: calls it tried to write and that could not be read; env_time_s: the agent's
    own time (its run minus the time it waited for the model); timeouts: 1 when the agent ran
    on its own past rollout.tool_timeout_s and was abandoned; crashed: it raised."""

    def __init__(self, fn):
        self.fn = fn
        self.turns = self.tool_calls = self.tool_errors = self.parse_errors = self.timeouts = 0
        self.env_time_s = 0.0
        self.crashed = False
        self.value = None            # what run() returned
        self.error: BaseException | None = None
        self.waited_s = 0.0          # time spent waiting for the model

    def run(self, client, row: dict) -> None:
        """Call the agent (in its own thread); keeps what it returned or raised."""
        t0 = time.perf_counter()
        try:
            if inspect.iscoroutinefunction(self.fn):
                self.value = asyncio.run(_with_client(self.fn, client, row))
            else:
                try:
                    self.value = self.fn(client, row)
                finally:
                    client.close()
        except BaseException as err:  # noqa: BLE001 - the trainer decides what it means (ended episode or crash)
            self.error = err
        finally:
            self.env_time_s = max(0.0, time.perf_counter() - t0 - self.waited_s)

    def reward(self, ended: bool) -> float:
        """The episode's reward: what run() returned; 0.0 when it raised after its episode had
        ended (a budget reached or abandoned: `ended`) or crashed. EnvError for a non-number."""
        if self.error is not None:
            self.crashed = not ended
            return 0.0
        value = self.value
        if isinstance(value, (str, bool)) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            if ended:
                return 0.0
            raise EnvError(f"agent {self.fn.__qualname__} returned {str(repr(value))[:200]}: run(client, row) "
                           "returns the episode's reward, a finite number", "return a float")
        return float(value)

    def crash_text(self) -> str:
        """One line: what the agent raised, and where in the user's code."""
        import traceback

        err = self.error
        frames = traceback.extract_tb(err.__traceback__) if err is not None else []
        where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        return f"{type(err).__name__}: {str(err)[:300]}{where}"


async def _with_client(fn, client, row):
    async with client:
        return await fn(client, row)


__all__ = ["AgentSession", "check_agent", "check_agent_def", "is_agent", "make_client"]
