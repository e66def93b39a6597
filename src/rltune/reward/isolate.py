"""`reward.isolate: true`: a user reward function runs in a worker process of its own.

An in-process reward function can end the trainer in ways no `except` sees: `os._exit(1)`, a
segfault in native code, an endless loop. In a worker, the trainer outlives all three: a worker that
dies or exceeds `reward.timeout` seconds on a call becomes a `RewardWorkerError` (the caller,
RewardComputer, names the function and the sample and honours `reward.on_error`); the next call
starts a fresh worker.

The worker is a `spawn` process (no fork of a trainer holding threads or CUDA state); it loads the
function itself from its spec (`module:function` or `file.py:function`), so nothing is pickled but
the batch and the scores. Protocol over a Pipe, parent -> worker: (prompts, completions, columns);
worker -> parent: ("ready",) once, then ("ok", values) | ("raise", type name, message) |
("exit", code) per call; ("load_error", message) instead of "ready" when the function cannot be
loaded.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from multiprocessing.util import Finalize
from pathlib import Path
from typing import Optional


class RewardWorkerError(Exception):
    """The worker died or timed out: `what` completes "reward function X ...", e.g. "exited with
    code 1", "timed out after 60 s"; `fix` is the line a user reads (both user-facing)."""

    def __init__(self, what: str, fix: str):
        super().__init__(what)
        self.what = what
        self.fix = fix


class RemoteRewardError(Exception):
    """The function raised in the worker; `remote_type` is its exception's class name."""

    def __init__(self, remote_type: str, message: str):
        super().__init__(message)
        self.remote_type = remote_type


def _worker_main(conn, spec: str, base_dir: Optional[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the trainer's to handle; it stops us
    from rltune.reward.functions import RewardError, load_reward_function

    try:
        fn = load_reward_function(spec, Path(base_dir) if base_dir else None)
    except RewardError as err:
        conn.send(("load_error", str(err)))
        return
    conn.send(("ready",))
    while True:
        try:
            prompts, completions, columns = conn.recv()
        except (EOFError, OSError):   # the trainer went away
            return
        try:
            values = fn(prompts, completions, **columns)
            msg = ("ok", values if isinstance(values, list) else _sendable(values))
        except SystemExit as err:
            msg = ("exit", err.code)
        except Exception as err:  # noqa: BLE001 - reported to the trainer, which names the sample
            msg = ("raise", type(err).__name__, str(err))
        try:
            conn.send(msg)
        except Exception as err:  # noqa: BLE001 - e.g. an unpicklable return value
            conn.send(("raise", "TypeError", f"its return value cannot be sent back from the reward worker"
                       f" ({type(err).__name__}: {err}); return a list of floats"))


def _sendable(values):
    """A non-list return value (tuple, numpy array, generator) as a list; as is when that fails,
    so the caller reports the type it got."""
    try:
        return list(values)
    except TypeError:
        return values


def _describe_exit(code: Optional[int]) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class IsolatedReward:
    """A callable with the reward-function signature that runs `spec` in a worker process."""

    def __init__(self, spec: str, base_dir: Optional[Path], timeout: float):
        self.spec = spec
        self.base_dir = str(base_dir) if base_dir is not None else None
        self.timeout = float(timeout)
        self._proc = None
        self._conn = None
        self._finalizer = None
        self._start()   # load errors surface now, like an in-process import

    # -- worker lifecycle
    def _start(self) -> None:
        from rltune.reward.functions import RewardError

        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(child, self.spec, self.base_dir),
                           name=f"rltune-reward:{self.spec}", daemon=False)
        proc.start()
        child.close()
        self._proc, self._conn = proc, parent
        # stop the worker at exit, before multiprocessing joins its children
        self._finalizer = Finalize(self, _stop, args=(proc, parent), exitpriority=10)
        try:
            msg = self._receive()
        except RewardWorkerError as err:
            raise RewardError(f"reward function {self.spec} (reward.isolate) {err.what} while its worker"
                              f" loaded it\n  fix: {err.fix}") from None
        if msg[0] == "load_error":
            self.close()
            raise RewardError(msg[1])

    def close(self, kill: bool = False) -> None:
        """Stop the worker: let it finish (it returns when the pipe closes), or kill it now (a
        timeout, Ctrl-C: it is busy and its state is unknown)."""
        if kill and self._proc is not None and self._proc.is_alive():
            self._proc.kill()
        if self._finalizer is not None:
            self._finalizer()   # runs _stop once
        self._proc = self._conn = self._finalizer = None

    def _receive(self):
        """The worker's next message; RewardWorkerError (worker stopped) when it dies or times out."""
        try:
            ready = self._conn.poll(self.timeout)
        except BaseException:   # Ctrl-C while waiting: the worker's state is unknown, stop it
            self.close(kill=True)
            raise
        if not ready:
            self.close(kill=True)
            raise RewardWorkerError(
                f"timed out after {self.timeout:g} s (reward.timeout)",
                "make the function faster, raise reward.timeout, or set reward.on_error: zero to score"
                " such samples 0")
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            proc = self._proc
            proc.join(5)
            code = proc.exitcode
            self.close()
            raise RewardWorkerError(
                _describe_exit(code),
                "a reward function must return scores, not end its process (os._exit, sys.exit in a"
                " thread, a crash in native code): fix it, or set reward.on_error: zero to score such"
                " samples 0") from None

    # -- the reward-function signature
    def __call__(self, prompts, completions, **columns):
        if self._proc is None:
            self._start()
        try:
            self._conn.send((list(prompts), list(completions), {k: list(v) for k, v in columns.items()}))
        except (BrokenPipeError, EOFError, OSError):
            pass   # the worker is gone: _receive says how
        msg = self._receive()
        kind = msg[0]
        if kind == "ok":
            return msg[1]
        if kind == "exit":
            raise SystemExit(msg[1])
        raise RemoteRewardError(msg[1], msg[2])


def _stop(proc, conn) -> None:
    try:
        conn.close()   # the worker's recv() ends: it returns
    except OSError:
        pass
    proc.join(2)
    if proc.is_alive():
        proc.kill()
        proc.join(2)
