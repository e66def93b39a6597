"""`rollout.env_isolate: true`: the environment runs in a worker process, not in the trainer.

In the trainer's process an environment can end the run in ways no `except` sees: `os._exit`, a
segfault in native code, a `reset` that never returns. In a worker the trainer outlives them: a
worker that dies, or does not answer within its bound, ends the episodes it hosted (counted in
`episode/env_crashes`; their reward is 0), and the next episode starts a fresh worker. The
environment's module is imported only in the worker; the trainer learns what it needs (the kind,
the tool schemas, whether it gives a reward) from the worker's first message.

One `spawn` worker per trainer process hosts every session (`Session`, env.py) by id, so the
per-episode cost is a message, not a process. Protocol over a Pipe, parent -> worker:
(op, sid, args) with op in new | respond | reward | close; worker -> parent: ("ok", value,
counters) | ("env_error", problem, fix) | ("raise", type name, message). The first message is
("ready", kind, tools, gives_reward) or ("load_error", problem, fix).
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from multiprocessing.util import Finalize
from pathlib import Path
from typing import Any

from .env import EnvError

COUNTERS = ("tool_calls", "tool_errors", "parse_errors", "timeouts", "turns", "env_time_s")
START_S = 120.0          # the worker's start (python, the environment's imports)


def _worker_main(conn, spec: str, base_dir: str | None, tool_timeout_s: float) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the trainer's; it stops us
    from .env import gives_reward, kind_of, load_env_class
    from .session import Session
    from .tools import tool_schemas

    try:
        cls = load_env_class(spec, Path(base_dir) if base_dir else None)
        kind = kind_of(cls)
        conn.send(("ready", kind, tool_schemas(cls) if kind == "tools" else None, gives_reward(cls)))
    except EnvError as err:
        conn.send(("load_error", err.problem, err.fix))
        return
    sessions: dict[int, Session] = {}
    while True:
        try:
            op, sid, args = conn.recv()
        except (EOFError, OSError):   # the trainer went away
            return
        try:
            if op == "new":
                sessions[sid] = Session(cls, tool_timeout_s)
                value = sessions[sid].start(*args)
            elif op == "close":
                sessions.pop(sid, None)
                continue
            else:
                value = getattr(sessions[sid], op)(*args)
            s = sessions[sid]
            conn.send(("ok", value, {k: getattr(s, k) for k in COUNTERS}))
        except EnvError as err:
            conn.send(("env_error", err.problem, err.fix))
        except Exception as err:  # noqa: BLE001 - reported to the trainer, which names the environment
            conn.send(("raise", type(err).__name__, str(err)))


class WorkerGone(Exception):
    """The worker died or did not answer in time (`what` says which)."""


class EnvPool:
    """The worker of one trainer process; `session()` gives an IsolatedSession on it."""

    def __init__(self, spec: str, base_dir: Path | None, tool_timeout_s: float):
        self.spec, self.base_dir, self.tool_timeout_s = spec, base_dir, tool_timeout_s
        self.proc = self.conn = None
        self.next_sid = 0
        self.generation = 0       # bumped at each new worker: sessions of an older one are gone
        self.crashes = 0
        self.dead = 0             # the generation of the last worker found gone
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, self.spec, str(self.base_dir or ""),
                                                         self.tool_timeout_s), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        self.generation += 1
        Finalize(self, EnvPool._stop, args=(self.proc, self.conn), exitpriority=10)
        msg = self._recv(START_S, "starting")
        if msg[0] == "load_error":
            self.close()
            raise EnvError(msg[1], msg[2])
        _, self.kind, self.tools, self.gives_reward = msg

    @staticmethod
    def _stop(proc, conn) -> None:
        try:
            conn.close()
        except OSError:
            pass
        if proc.is_alive():
            proc.kill()
            proc.join(5)

    def close(self) -> None:
        self._stop(self.proc, self.conn)

    def _recv(self, timeout: float, doing: str):
        if not self.conn.poll(timeout):
            alive = self.proc.is_alive()
            self.close()
            raise WorkerGone(f"did not answer within {timeout:g} s while {doing}" if alive else
                             f"exited with code {self.proc.exitcode} while {doing}")
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.close()
            raise WorkerGone(f"exited with code {self.proc.exitcode} while {doing}") from None

    def call(self, op: str, sid: int, args: tuple, doing: str) -> tuple[Any, dict]:
        """(value, counters) of one operation on session `sid`; WorkerGone if the worker died."""
        try:
            self.conn.send((op, sid, args))
        except (OSError, ValueError):
            self.close()
            raise WorkerGone(f"exited with code {self.proc.exitcode} before {doing}") from None
        # a turn may run several tool calls, each bounded in the worker by tool_timeout_s
        msg = self._recv(8 * self.tool_timeout_s + 10.0, doing)
        if msg[0] == "env_error":
            raise EnvError(msg[1], msg[2])
        if msg[0] == "raise":
            raise EnvError(f"environment {self.spec} raised {msg[1]} while {doing}: {msg[2]}",
                           "fix the environment class")
        return msg[1], msg[2]

    def restart_if_gone(self) -> None:
        if not self.proc.is_alive():
            self._start()

    def session(self) -> "IsolatedSession":
        self.restart_if_gone()
        self.next_sid += 1
        return IsolatedSession(self, self.next_sid)


class IsolatedSession:
    """A Session (env.py) living in the pool's worker: the same methods and counters. After the
    worker is gone, the episode is over: `respond` ends it, `reward` is 0."""

    def __init__(self, pool: EnvPool, sid: int):
        self.pool, self.sid, self.generation = pool, sid, pool.generation
        self.kind, self.tools = pool.kind, pool.tools
        self.crashed = False
        for k in COUNTERS:
            setattr(self, k, 0)

    def _call(self, op: str, args: tuple, doing: str):
        if self.crashed or self.generation != self.pool.generation or self.pool.dead == self.generation:
            self.crashed = True        # its worker is gone (reported once, by the first session to see it)
            return None
        try:
            value, counters = self.pool.call(op, self.sid, args, doing)
        except WorkerGone as gone:
            self.crashed = True
            self.pool.crashes += 1
            self.pool.dead = self.generation
            from logging import getLogger

            getLogger("rltune").warning("environment worker (%s) %s: its episodes end here (reward 0); a fresh "
                                        "worker starts for the next ones", self.pool.spec, gone)
            return None
        for k, v in counters.items():
            setattr(self, k, v)
        return value

    def start(self, row: dict, prompt_messages: list[dict]) -> list[dict]:
        out = self._call("new", (row, prompt_messages), "resetting for a row")
        if out is None:
            raise EnvError(f"the environment worker for {self.pool.spec} died or stopped answering in reset() for the row "
                           f"{str(row)[:200]}", "fix reset(), or the row it cannot handle")
        return out

    def respond(self, assistant_text: str) -> tuple[list[dict], bool]:
        out = self._call("respond", (assistant_text,), "answering a turn")
        return ([], True) if out is None else out

    def reward(self, messages: list[dict], info: dict | None = None) -> float | None:
        out = self._call("reward", (messages, info), "computing the reward")
        return 0.0 if self.crashed else out

    def close(self) -> None:
        """The episode is over: the worker drops the session (no answer awaited)."""
        if not self.crashed and self.generation == self.pool.generation:
            try:
                self.pool.conn.send(("close", self.sid, ()))
            except (OSError, ValueError):
                pass


__all__ = ["EnvPool", "IsolatedSession", "WorkerGone"]
