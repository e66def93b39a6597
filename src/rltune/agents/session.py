"""One episode of an environment class (`rollout.env`): `Session` creates the instance, starts the
conversation, answers each assistant turn (a tools environment's tool calls, a turns
environment's step()) and scores the episode, each call bounded in time. env.py loads and checks
the class."""

from __future__ import annotations

import math
import numbers
import time

from .env import PARSE_HELP, EnvError, _short, gives_reward, kind_of
from .tools import call_tool, parse_tool_calls, run_with_timeout, tool_schemas


class Session:
    """One episode of an environment: a fresh instance (`cls()`), the conversation it starts,
    its answer to each assistant turn, and its reward. Counters say how the episode went.

    A tool call or a step() that runs past `tool_timeout_s` is abandoned in its worker thread
    (see tools.run_with_timeout): the episode goes on (tools) or ends (turns). Creating the
    instance, reset() and reward() are bounded the same way; one that runs past the bound is an
    EnvError naming the class and the method (the run stops: no episode can go on without them).
    The caller waits in Thread.join, so a Ctrl-C still reaches it.
    """

    def __init__(self, cls: type, tool_timeout_s: float = 10.0):
        self.cls = cls
        self.kind = kind_of(cls)
        self.tool_timeout_s = tool_timeout_s
        self.tool_calls = self.tool_errors = self.parse_errors = self.timeouts = self.turns = 0
        self.env_time_s = 0.0
        self.info: dict = {}
        self.tools: list[dict] | None = None
        if self.kind == "tools":
            try:
                self.tools = tool_schemas(cls)
            except ValueError as err:
                raise EnvError(f"environment class {cls.__qualname__}: {err}", "fix the tool method named above") from None
        try:
            self.env = self._bounded(f"creating {cls.__qualname__}()", "__init__", cls)
        except EnvError:
            raise
        except Exception as err:  # noqa: BLE001
            raise EnvError(f"creating {cls.__qualname__}() failed: {type(err).__name__}: {err}",
                           "an environment class is created with no arguments, once per episode") from err

    def _timed(self, fn, *args):
        """fn(*args), its time added to env_time_s."""
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.env_time_s += time.perf_counter() - t0

    def _bounded(self, what: str, method: str, fn, *args, where: str = ""):
        """fn(*args) in a worker thread bounded by tool_timeout_s (tools.run_with_timeout): its
        value, or its exception raised here. Past the bound, an EnvError naming `what` (the call
        is abandoned and may go on in its thread)."""
        finished, value, err = self._timed(run_with_timeout, fn, self.tool_timeout_s, *args)
        if not finished:
            self.timeouts += 1
            raise EnvError(f"{what} did not return within rollout.tool_timeout_s ({self.tool_timeout_s:g} s)"
                           f"{where}: abandoned",
                           f"fix {method}() so that it returns; if it needs longer, raise rollout.tool_timeout_s")
        if err is not None and not isinstance(err, Exception):   # SystemExit in user code: named, not obeyed
            raise EnvError(f"{what} raised {type(err).__name__}: {err}", f"fix {method}()")
        if err is not None:
            raise err
        return value

    def start(self, row: dict, prompt_messages: list[dict]) -> list[dict]:
        """Reset the environment for `row`; return the episode's first conversation.

        tools: reset() returning None keeps `prompt_messages`, a str is added (after a blank
        line) to the last user message, a list of messages replaces them. turns: reset()
        returns the conversation, a non-empty list of {"role", "content"} messages.
        """
        try:
            out = self._bounded(f"{self.cls.__qualname__}.reset", "reset", self.env.reset, row,
                                where=f" for the row {_short(row)}")
        except EnvError:
            raise
        except Exception as err:  # noqa: BLE001
            raise EnvError(f"{self.cls.__qualname__}.reset failed for the row {_short(row)}: "
                           f"{type(err).__name__}: {err}", "fix reset(), or the row it cannot handle") from err
        if self.kind == "turns" or isinstance(out, list):
            if not isinstance(out, list) or not out:
                raise EnvError(f"{self.cls.__qualname__}.reset returned {_short(out)}: it must return the first "
                               "messages, a non-empty list", 'return [{"role": "user", "content": "..."}]')
            return self._messages(out, "reset")
        conversation = [dict(m) for m in prompt_messages]
        if out is None:
            return conversation
        if not isinstance(out, str):
            raise EnvError(f"{self.cls.__qualname__}.reset returned {_short(out)}",
                           "return None (keep the prompt), a str (added to the prompt) or a list of messages")
        return _add_to_prompt(conversation, out)

    def respond(self, assistant_text: str) -> tuple[list[dict], bool]:
        """The environment's answer to one assistant turn: (new messages, done)."""
        self.turns += 1
        return (self._respond_tools if self.kind == "tools" else self._respond_turns)(assistant_text)

    def _respond_tools(self, assistant_text: str) -> tuple[list[dict], bool]:
        calls, why = parse_tool_calls(assistant_text)
        if why is not None:
            self.parse_errors += 1
            return [{"role": "tool", "content": f"error: could not parse the tool call: {why}. {PARSE_HELP}"}], False
        if not calls:
            return [], True
        out = []
        for call in calls:
            self.tool_calls += 1
            text, error = self._timed(call_tool, self.env, call, self.tool_timeout_s)
            self.tool_errors += error is not None
            self.timeouts += error == "timeout"
            out.append({"role": "tool", "name": call.name, "content": text})
        return out, False

    def _respond_turns(self, assistant_text: str) -> tuple[list[dict], bool]:
        finished, result, err = self._timed(run_with_timeout, self.env.step, self.tool_timeout_s, assistant_text)
        if not finished:
            self.timeouts += 1
            return [], True
        name = self.cls.__qualname__
        if err is not None:
            raise EnvError(f"{name}.step raised {type(err).__name__}: {err}", "fix step()") from err
        if not isinstance(result, dict) or "done" not in result:
            raise EnvError(f"{name}.step returned {_short(result)}: it must return a dict with \"done\"",
                           'return {"messages": [...], "done": False, "info": {}}')
        done, info = result["done"], result.get("info") or {}
        if done is None or isinstance(done, str) or not isinstance(info, dict):
            raise EnvError(f"{name}.step returned done={done!r}, info={_short(info)}",
                           "set \"done\" to True or False, and \"info\" (if any) to a dict")
        self.info = info
        return self._messages(result.get("messages") or [], "step"), bool(done)

    def _messages(self, messages, method: str) -> list[dict]:
        """Copies of the messages reset/step returned, checked: a list of dicts with a str
        role and a content (made a str when it is not)."""
        where = f"{self.cls.__qualname__}.{method}"
        if not isinstance(messages, list):
            raise EnvError(f"{where} returned messages {_short(messages)}: not a list",
                           'return a list of {"role": ..., "content": ...} dicts')
        out = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
                raise EnvError(f"{where} returned the message {_short(m)}: a message is a dict with a str "
                               "\"role\" and a \"content\"", 'e.g. {"role": "user", "content": "Higher."}')
            m = dict(m)
            if not isinstance(m["content"], str):
                m["content"] = str(m["content"])
            out.append(m)
        return out

    def reward(self, messages: list[dict], info: dict | None = None) -> float | None:
        """The environment's own reward for the finished episode, or None when it has none.

        tools: reward(); turns: reward(episode) with episode = {"messages", "info" (the last
        step's, unless given), "turns"}. A non-number or non-finite value is an EnvError.
        """
        if not gives_reward(self.cls):
            return None
        name = f"{self.cls.__qualname__}.reward"
        args = () if self.kind == "tools" else (
            {"messages": messages, "info": self.info if info is None else info, "turns": self.turns},)
        try:
            value = self._bounded(name, "reward", self.env.reward, *args)
        except EnvError:
            raise
        except Exception as err:  # noqa: BLE001
            raise EnvError(f"{name} raised {type(err).__name__}: {err}", "fix reward()") from err
        if isinstance(value, str) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise EnvError(f"{name} returned {_short(value)}: a reward is a finite number", "return a float")
        return float(value)


def _add_to_prompt(conversation: list[dict], text: str) -> list[dict]:
    """The conversation with `text` added, after a blank line, to its last user message (a new
    user message when there is none, or when that message's content is not text)."""
    users = [m for m in conversation if m.get("role") == "user"]
    if users and isinstance(users[-1].get("content"), str):
        users[-1]["content"] = f"{users[-1]['content']}\n\n{text}" if users[-1]["content"] else text
    else:
        conversation.append({"role": "user", "content": text})
    return conversation
