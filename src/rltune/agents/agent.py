"""`agent` environments: a function `run(client, row) -> reward` written against the OpenAI client.

`rollout.env: path/to/agent.py:run` names a function (not a class): rltune calls it once per
episode, in a thread of the trainer, with an `openai.OpenAI` client (an `openai.AsyncOpenAI` one
for `async def run`) whose base URL is the recording endpoint of agents/proxy.py, and the
episode's data row. Whatever it does between its `client.chat.completions.create(...)` calls
(tools, a sandbox, a simulator) is the environment; what it returns is the episode's reward.

`AgentSession` carries the counters an episode reports (the ones `Session` has, session.py);
`Clients` builds the OpenAI clients. Recognising and checking an agent function (is_agent,
check_agent, and check_agent_def for `validate`) lives in env.py, which loads every `rollout.env`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import time

from .env import EnvError

class Clients:
    """The OpenAI clients of one batch of episodes: sync ones share one HTTP connection pool
    (an httpx client costs ~20 ms to build, its TLS context mostly); async ones, each on its own
    event loop, share the TLS context. No retries (a refused request means the episode has
    ended), no proxies from the environment (the endpoint is local). `close()` when done."""

    def __init__(self, timeout_s: float):
        try:
            import httpx
            import openai
        except ImportError:
            raise EnvError("agent environments need the `openai` package, which is not installed",
                           "pip install 'rltune[agents]' (or: pip install openai)") from None
        import ssl

        self.openai, self.httpx, self.timeout_s = openai, httpx, timeout_s
        self.tls = ssl.create_default_context()
        self.http = httpx.Client(trust_env=False, verify=self.tls, timeout=timeout_s,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=4096))

    def make(self, fn, base_url: str):
        """The client an agent `fn` gets: sync or async as `fn` is."""
        kw = {"base_url": base_url, "api_key": "rltune", "max_retries": 0, "timeout": self.timeout_s}
        if inspect.iscoroutinefunction(fn):
            return self.openai.AsyncOpenAI(**kw, http_client=self.httpx.AsyncClient(
                trust_env=False, verify=self.tls, timeout=self.timeout_s))
        return self.openai.OpenAI(**kw, http_client=self.http)

    def close(self) -> None:
        self.http.close()


class AgentSession:
    """One episode of an agent: its counters (as session.Session's), its result and its timing.

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
        self.parts: dict[str, float] = {}   # per-criterion scores: run() returned {"reward", "parts"}
        self.metrics: dict[str, float] = {}  # measured, not rewarded: run() returned {"reward", "metrics"}
        self.error: BaseException | None = None
        self.waited_s = 0.0          # time spent waiting for the model

    def run(self, client, row: dict) -> None:
        """Call the agent (in its own thread); keeps what it returned or raised."""
        t0 = time.perf_counter()
        try:
            if inspect.iscoroutinefunction(self.fn):
                self.value = asyncio.run(_with_client(self.fn, client, row))
            else:
                self.value = self.fn(client, row)
        except BaseException as err:  # noqa: BLE001 - the trainer decides what it means (ended episode or crash)
            self.error = err
        finally:
            self.env_time_s = max(0.0, time.perf_counter() - t0 - self.waited_s)

    def reward(self, ended: bool) -> float:
        """The episode's reward: what run() returned; 0.0 when it raised after its episode had
        ended (a budget reached or abandoned: `ended`) or crashed. EnvError for a non-number.
        run() may also return {"reward": r, "parts": {name: score}, "metrics": {name: value}}: the
        parts are logged as `reward/env/NAME`, the metrics (measured, not rewarded: verifiers'
        `@vf.metric`) as `env/metric/NAME` (means over the step's episodes); neither is added to r."""
        if self.error is not None:
            self.crashed = not ended
            return 0.0
        value = self.value
        if isinstance(value, dict) and "reward" in value:   # {"reward": r, "parts": {name: score}}
            self.parts, self.metrics = _numbers(value.get("parts")), _numbers(value.get("metrics"))
            value = value["reward"]
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


def _numbers(d) -> dict[str, float]:
    """The finite numbers of a {name: value} mapping (anything else is left out)."""
    if not isinstance(d, dict):
        return {}
    return {str(k): float(v) for k, v in d.items()
            if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))}


async def _with_client(fn, client, row):
    async with client:
        return await fn(client, row)


__all__ = ["AgentSession", "Clients"]
