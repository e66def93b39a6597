"""`rollout.env_isolate` (issue 27, item 5): the environment in a worker process. A tool that ends
its process (os._exit), a reset that hangs, a module that cannot load: the trainer outlives them,
ends the episodes the worker hosted (reward 0, counted) and starts a fresh worker."""

from __future__ import annotations

import textwrap
import time

import pytest
from test_episodes import ROW, _components, _recipe

ENV = textwrap.dedent('''
    import os, time

    class Risky:
        def reset(self, row):
            if row.get("hang"):
                time.sleep(600)
            self.pid = os.getpid()
            return None

        def act(self, how: str) -> str:
            """Do something.

            Args:
                how: "die" ends the process, anything else answers
            """
            if how == "die":
                os._exit(3)
            return f"done in {os.getpid()}"

        def reward(self):
            return 1.0
''')
CALL = '<tool_call>{"name": "act", "arguments": {"how": "%s"}}</tool_call>'


@pytest.fixture
def env_file(tmp_path):
    (tmp_path / "risky.py").write_text(ENV)
    return tmp_path


def test_a_worker_that_exits_ends_its_episodes_not_the_run(env_file):
    import os

    from rltune.agents.isolate import EnvPool
    from rltune.train.episodes import play

    c = _components(_recipe("risky.py:Risky", env_isolate=True, tool_timeout_s=2.0), [CALL % "die", "x"], env_file)
    pool = c.env[0]
    assert isinstance(pool, EnvPool) and pool.kind == "tools" and pool.gives_reward
    first = pool.proc.pid
    assert first != os.getpid()
    ep = play(c, [ROW], "prompt", 2)
    assert ep.env_scores == [0.0, 0.0] and ep.metrics["episode/env_crashes"] == 2
    assert pool.crashes == 1                                   # one worker death, two episodes ended
    # the next episodes get a fresh worker, and answer from it
    c.rollout.turns, c.rollout.calls = [CALL % "fine", "42"], 0
    ep = play(c, [ROW], "prompt", 1)
    assert pool.proc.pid != first and ep.env_scores == [1.0] and ep.metrics["episode/env_crashes"] == 0
    assert ep.conversations[0][3]["content"] == f"done in {pool.proc.pid}"


def test_a_hanging_reset_is_cut_and_named(env_file, monkeypatch):
    from rltune.agents import isolate
    from rltune.agents.env import EnvError
    from rltune.train.episodes import play

    c = _components(_recipe("risky.py:Risky", env_isolate=True, tool_timeout_s=0.1), ["x"], env_file)
    t0 = time.time()
    # the worker bounds reset() as the trainer's own process does (issue 45 item 7), and names it
    with pytest.raises(EnvError, match=r"Risky\.reset did not return within rollout\.tool_timeout_s \(0\.1 s\)"):
        play(c, [{"prompt": "p", "hang": True}], "prompt", 1)
    assert time.time() - t0 < 30


def test_an_environment_that_does_not_load_is_an_error_before_training(tmp_path):
    from rltune.agents.env import EnvError

    (tmp_path / "broken.py").write_text("raise RuntimeError('no such service')\n")
    with pytest.raises(EnvError, match="no such service"):
        _components(_recipe("broken.py:Env", env_isolate=True), ["x"], tmp_path)
