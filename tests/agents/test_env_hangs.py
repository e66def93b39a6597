"""An in-process environment whose reset(), reward() or creation never returns (issue 45 item 7):
each is bounded by rollout.tool_timeout_s, as a tool call and step() are, and ends the run with
a message naming the environment and the method; a Ctrl-C during such a call stops the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rltune.agents.env import EnvError
from rltune.agents.session import Session

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [{"role": "user", "content": "What is 2+2?"}]


def forever():
    threading.Event().wait()   # never set


class HangsInReset:
    """Like builtin:calculator, but reset() never returns."""

    def reset(self, row: dict):
        forever()

    def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: the first
            b: the second
        """
        return a + b


class HangsInReward:
    """A turns environment whose reward() never returns."""

    def reset(self, row: dict):
        return [{"role": "user", "content": "Say hi."}]

    def step(self, assistant_text: str) -> dict:
        return {"messages": [], "done": True, "info": {}}

    def reward(self, episode: dict) -> float:
        forever()


class HangsInInit(HangsInReward):
    def __init__(self):
        forever()


def bounded(fn, limit_s: float = 10.0):
    """fn()'s exception (or None), failing the test when fn is still running after limit_s."""
    box = {}

    def work():
        try:
            fn()
        except BaseException as err:  # noqa: BLE001
            box["error"] = err

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"still running after {limit_s:g} s: the call is not bounded"
    return box.get("error")


def test_a_reset_that_never_returns_is_abandoned_and_named():
    t0 = time.monotonic()
    err = bounded(lambda: Session(HangsInReset, tool_timeout_s=0.3).start({"q": 1}, PROMPT))
    assert isinstance(err, EnvError), err
    assert time.monotonic() - t0 < 5
    text = f"{err.problem}\n{err.fix}"
    assert "HangsInReset.reset" in text and "0.3 s" in text and "rollout.tool_timeout_s" in text, text
    assert "{'q': 1}" in text, text


def test_a_reward_that_never_returns_is_abandoned_and_named():
    s = Session(HangsInReward, tool_timeout_s=0.3)
    messages = s.start({}, PROMPT)
    err = bounded(lambda: s.reward(messages))
    assert isinstance(err, EnvError), err
    text = f"{err.problem}\n{err.fix}"
    assert "HangsInReward.reward" in text and "rollout.tool_timeout_s" in text, text


def test_creating_an_environment_that_never_returns_is_abandoned_and_named():
    err = bounded(lambda: Session(HangsInInit, tool_timeout_s=0.3))
    assert isinstance(err, EnvError), err
    assert "HangsInInit()" in err.problem and "rollout.tool_timeout_s" in f"{err.problem}\n{err.fix}", err.problem


SCRIPT = textwrap.dedent("""
    import signal, sys, threading
    from rltune.agents.env import EnvError
    from rltune.agents.session import Session
    from rltune.train.session import Stop

    class Hangs:
        def reset(self, row):
            threading.Event().wait()
        def step(self, text):
            return {"done": True}

    signal.signal(signal.SIGINT, Stop())
    print("ready", flush=True)
    try:
        Session(Hangs, tool_timeout_s=float(sys.argv[1])).start({}, [])
    except EnvError as err:
        print("stopped:", err.problem, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
""")


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_during_a_reset_that_never_returns_stops(tmp_path, presses):
    # one Ctrl-C asks the run to stop after the current step: the bound ends the call; a second
    # one stops at once, however long the bound
    (tmp_path / "hang.py").write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    bound = "1" if presses == 1 else "3600"
    proc = subprocess.Popen([sys.executable, str(tmp_path / "hang.py"), bound], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        for _ in range(presses):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
        out, errs = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if presses == 1:
        assert proc.returncode == 1 and "Hangs.reset" in out, (proc.returncode, out, errs[-2000:])
    else:
        assert proc.returncode == 130 and "interrupted" in out, (proc.returncode, out, errs[-2000:])
