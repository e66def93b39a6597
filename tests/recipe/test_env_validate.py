"""`validate` on a recipe with `rollout.env` (issue 27, item 1): the class is read, never run; a
run whose environment gives the reward needs no reward.functions, one whose environment gives
none does."""

from __future__ import annotations

import textwrap

import pytest

BASE = """\
model:
  policy: builtin:tiny-llama
data:
  train: builtin:guess
rollout:
  env: {env}
"""


@pytest.mark.parametrize("env,functions,code,needle", [
    ("builtin:guess", "", 0, None),                               # Guess.reward gives the reward
    ("builtin:calculator", "", 2, "defines no reward() and reward.functions is empty"),
    ("builtin:calculator", "reward:\n  functions: [builtin:exact_answer]\n", 0, None),
    ("builtin:gues", "", 2, "unknown builtin environment `builtin:gues`"),
    ("envs.py:Missing", "", 2, "defines no `Missing`"),
    ("nope.py:Env", "", 2, "environment file `nope.py` not found"),
    ("envs.py:NoReset", "", 2, "has no reset(self, row) method"),
    ("envs.py:Undocumented", "", 2, "has no docstring"),
    ("envs.py:Scored", "", 0, None),
    ("envs.py:run", "", 0, None),                                 # an agent: its return value is the reward
    ("envs.py:arun", "", 0, None),                                # async agents too
    ("envs.py:lonely", "", 2, "cannot be called as run(client, row)"),
])
def test_environment_checked_without_running_it(cli, write, tmp_path, env, functions, code, needle):
    (tmp_path / "envs.py").write_text(textwrap.dedent('''
        raise SystemExit("validate must not run this file")

        class NoReset:
            def step(self, text):
                return {"done": True}

        class Undocumented:
            def reset(self, row):
                return None
            def look(self, what: str) -> str:
                return what

        class Scored:
            def reset(self, row):
                return [{"role": "user", "content": "go"}]
            def step(self, text):
                return {"done": True}
            def reward(self, episode):
                return 1.0

        def run(client, row, retries=2):
            return 1.0

        async def arun(client, row):
            return 1.0

        def lonely(client):
            return 1.0
    '''))
    path = write(BASE.format(env=env) + functions)
    got, out = cli("validate", path)
    assert got == code, out
    if needle:
        line = next(ln for ln in out.splitlines() if needle in ln)
        assert "rollout.env" in line and "recipe.yaml:6:" in line, line      # file, line and key
        assert "fix:" in out
    assert "validate must not run this file" not in out


def test_agent_spec_errors_give_the_agent_fix(cli, write, tmp_path):
    """Issue 46 item 9: an agent spec whose file is missing, or whose function is misspelt, is
    not told to "write the class as docs/agents.md shows"."""
    (tmp_path / "agent.py").write_text("def run_agent(client, row):\n    return 1.0\n")
    for env, needle in (("agent.py:run_agnet", "did you mean `agent.py:run_agent`?"), ("gone.py:run", "check the path")):
        got, out = cli("validate", write(BASE.format(env=env)))
        assert got == 2, out
        fix = next(ln for ln in out.splitlines()[1:] if ln.strip().startswith("fix:")
                   and "rollout.env" in out.splitlines()[out.splitlines().index(ln) - 1])
        assert needle in fix and "write the class" not in fix, out
