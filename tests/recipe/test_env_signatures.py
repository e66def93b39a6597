"""What an environment's or agent's methods take and return (issue 46 item 8).

validate read the shapes (reset, step or documented typed tools, run(client, row) by count) but
missed: run(row, client) swapped, reset without row, wrong return annotations, a tool without self,
an Args: entry naming no parameter (it passed train too), and a tools class's reward(self,
episode) (a tools environment's reward gets nothing: it crashed at the end of the first episode).
Each is now a finding with its fix, read from the file's text (validate never runs it), and the
same check runs on the loaded class or function (train, before any model loads; a module:Class
spec validate cannot read)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from rltune.agents.env import EnvError, check_env_file, env_file_problems, load_env_class

BASE = """\
model:
  policy: builtin:tiny-llama
data:
  train: builtin:guess
reward:
  functions: [builtin:exact_answer]
rollout:
  env: {env}
"""

NOT_RUN = "raise SystemExit('validate must not run this file')\n"

SOURCE = '''
from typing import Optional


class Swapped:                 # not an environment: the agent below is
    pass


def swapped(row, client):
    return 1.0


def agent_says_str(client, row) -> str:
    return "1.0"


def agent_ok(client, row) -> float:
    return 1.0


class ResetNoRow:
    def reset(self):
        return [{"role": "user", "content": "go"}]

    def step(self, assistant_text):
        return {"done": True}


class StepNoText:
    def reset(self, row):
        return [{"role": "user", "content": "go"}]

    def step(self):
        return {"done": True}


class StepReturnsStr:
    def reset(self, row) -> list:
        return [{"role": "user", "content": "go"}]

    def step(self, assistant_text) -> str:
        return "done"


class ResetReturnsDict:
    def reset(self, row) -> dict:
        return {"role": "user", "content": "go"}

    def look(self, what: str) -> str:
        """Look.

        Args:
            what: the thing
        """
        return what


class RewardReturnsStr:
    def reset(self, row):
        return None

    def look(self, what: str) -> str:
        """Look.

        Args:
            what: the thing
        """
        return what

    def reward(self) -> "Optional[str]":
        return "1"


class ToolNoSelf:
    def reset(self, row):
        return None

    def look(what: str) -> str:
        """Look something up.

        Args:
            what: the thing
        """
        return what


class ArgsNamesNoParameter:
    def reset(self, row):
        return None

    def country(self, city: str) -> str:
        """The country a city is in.

        Args:
            town: the city's name, lower case
        """
        return "France"


class ToolsRewardWithEpisode:
    def reset(self, row):
        return None

    def look(self, what: str) -> str:
        """Look.

        Args:
            what: the thing
        """
        return what

    def reward(self, episode) -> float:
        return 1.0


class TurnsRewardWithoutEpisode:
    def reset(self, row):
        return [{"role": "user", "content": "go"}]

    def step(self, assistant_text):
        return {"done": True}

    def reward(self):
        return 1.0


class Fine:
    def reset(self, row: dict) -> Optional[str]:
        return None

    def look(self, what: str, *, deep: bool = False) -> str:
        """Look.

        Args:
            what: the thing
            deep (bool): look harder
        """
        return what

    def reward(self) -> float:
        return 1.0


class FineTurns:
    def reset(self, row) -> "list[dict]":
        return [{"role": "user", "content": "go"}]

    def step(self, assistant_text: str) -> dict:
        return {"done": True}

    def reward(self, episode: dict) -> float:
        return 1.0
'''

CASES = [
    ("swapped", "swapped: rltune calls it as run(client, row)", "def swapped(client, row)"),
    ("agent_says_str", "run() is annotated `-> str`", "annotate it `-> float`"),
    ("ResetNoRow", "reset(self) cannot be called as reset(row)", "def reset(self, row)"),
    ("StepNoText", "step(self) cannot be called as step(assistant_text)", "def step(self, assistant_text)"),
    ("StepReturnsStr", "step() is annotated `-> str`", "annotate it `-> dict`"),
    ("ResetReturnsDict", "reset() is annotated `-> dict`", "annotate it `-> str | None`"),
    ("RewardReturnsStr", "reward() is annotated `-> None | str`", "annotate it `-> float`"),
    ("ToolNoSelf", "tool `look` of", "def look(self, what)"),
    ("ArgsNamesNoParameter", "describes `town`, which is not one of its parameters (`city`)",
     "rename the entry `city:`"),
    ("ToolsRewardWithEpisode", "a tools environment's reward gets no arguments", "def reward(self) -> float"),
    ("TurnsRewardWithoutEpisode", "cannot be called as reward(episode)", "def reward(self, episode)"),
]


@pytest.fixture
def envs(tmp_path):
    (tmp_path / "envs.py").write_text(NOT_RUN + SOURCE)
    (tmp_path / "sig_envs_46.py").write_text(SOURCE)     # importable: what train loads
    return tmp_path


@pytest.mark.parametrize("name,problem,fix", CASES)
def test_validate_finds_it_with_the_fix_without_running_the_file(cli, write, envs, name, problem, fix):
    path = write(BASE.format(env=f"envs.py:{name}"))
    code, out = cli("validate", path)
    assert code == 2, out
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if problem in ln)
    assert "rollout.env" in lines[i] and "recipe.yaml:8:" in lines[i], lines[i]
    assert lines[i + 1].strip().startswith("fix:") and fix in lines[i + 1], lines[i + 1]
    assert "validate must not run this file" not in out


@pytest.mark.parametrize("name,problem,fix", CASES)
def test_train_refuses_the_loaded_class_before_any_model(envs, monkeypatch, name, problem, fix):
    """The same check on the loaded object (load_env_class: train's set-up, and an isolated
    worker's), for a module:Class spec validate cannot read and a file spec alike."""
    monkeypatch.syspath_prepend(str(envs))
    sys.modules.pop("sig_envs_46", None)
    for spec in (f"sig_envs_46:{name}", f"{envs / 'sig_envs_46.py'}:{name}"):
        with pytest.raises(EnvError) as e:
            load_env_class(spec)
        assert problem in e.value.problem and fix in e.value.fix, (e.value.problem, e.value.fix)


@pytest.mark.parametrize("name", ["agent_ok", "Fine", "FineTurns"])
def test_right_signatures_pass_both(envs, monkeypatch, name):
    assert env_file_problems(f"envs.py:{name}", envs) == []
    monkeypatch.syspath_prepend(str(envs))
    sys.modules.pop("sig_envs_46", None)
    load_env_class(f"sig_envs_46:{name}")


def test_every_problem_is_a_finding(cli, write, tmp_path):
    """Several problems in one class: each its own finding (not the first only)."""
    (tmp_path / "envs.py").write_text(NOT_RUN + textwrap.dedent('''
        class Env:
            def reset(self) -> dict:
                return {}

            def look(self, what: str) -> str:
                """Look.

                Args:
                    thing: what
                """
                return what

            def reward(self, episode) -> str:
                return "1"
    '''))
    problems = [p for p, _ in env_file_problems("envs.py:Env", tmp_path)]
    assert len(problems) == 5, problems
    code, out = cli("validate", write(BASE.format(env="envs.py:Env")))
    assert code == 2 and out.count("error input: rollout.env") == 5, out
    assert check_env_file("envs.py:Env", tmp_path) == problems[0]


def test_builtin_environments_pass():
    from rltune.agents.builtin import BUILTIN_ENVS
    from rltune.agents.env import class_signature_problems

    for cls in BUILTIN_ENVS.values():
        assert class_signature_problems(cls) == [], cls


def test_a_turns_class_public_helpers_are_not_judged_as_tools(tmp_path, monkeypatch):
    """Only a tools class's public methods are tools: a turns class's helper without self or with a
    free-form docstring is its own business."""
    body = textwrap.dedent('''
        class Env:
            def reset(self, row):
                return [{"role": "user", "content": "go"}]

            def step(self, assistant_text):
                return {"done": True}

            def helper(x):
                """Args:
                    y: not a parameter
                """
                return x
    ''')
    (tmp_path / "envs.py").write_text(NOT_RUN + body)
    (tmp_path / "sig_turns_46.py").write_text(body)
    assert env_file_problems("envs.py:Env", tmp_path) == []
    monkeypatch.syspath_prepend(str(tmp_path))
    load_env_class("sig_turns_46:Env")
