"""Episodes in the trainer's process (issue 45 item 7): an environment whose reset() or reward()
never returns stops the rollout within rollout.tool_timeout_s, naming the class and the method
(play() used to wait forever)."""

from __future__ import annotations

import textwrap
import threading
import time

import pytest
from test_episodes import ROW, _components, _recipe

ENV = textwrap.dedent('''
    import threading

    class Stuck:
        """Like builtin:guess: a turns environment; row["stuck"] says where it never returns."""

        def reset(self, row):
            if row.get("stuck") == "reset":
                threading.Event().wait()
            self.row = row
            return [{"role": "user", "content": "Guess a number."}]

        def step(self, assistant_text):
            return {"messages": [], "done": True, "info": {}}

        def reward(self, episode):
            if self.row.get("stuck") == "reward":
                threading.Event().wait()
            return 1.0
''')


@pytest.mark.parametrize("where", ["reset", "reward"])
def test_an_environment_method_that_never_returns_stops_play_and_is_named(tmp_path, where):
    from rltune.agents.env import EnvError
    from rltune.train.episodes import play

    (tmp_path / "stuck.py").write_text(ENV)
    c = _components(_recipe("stuck.py:Stuck", tool_timeout_s=0.5), ["7"], tmp_path)
    box = {}

    def run():
        try:
            box["played"] = play(c, [dict(ROW, stuck=where)], "prompt", 1)
        except BaseException as err:  # noqa: BLE001
            box["error"] = err

    t0 = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), f"play() still waits on {where}() after 60 s"
    err = box.get("error")
    assert isinstance(err, EnvError), box
    assert f"Stuck.{where} did not return within rollout.tool_timeout_s (0.5 s)" in err.problem, err.problem
    assert time.monotonic() - t0 < 60
