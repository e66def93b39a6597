"""agents.env and agents.session: loading environment classes, checking files without running them, Session."""

from __future__ import annotations

import math
import re
import textwrap
import time

import pytest

from rltune.agents.builtin import Calculator, Guess
from rltune.agents.env import (EnvError, check_env_file, env_defines_reward, env_file_problems, gives_reward,
                               kind_of, load_env_class)
from rltune.agents.session import Session
from rltune.errors import UserError

PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]


# ---------------------------------------------------------------- environments for the tests

class ToolsEnv:
    """A tools env whose reset answer is set per test through the row."""

    def __init__(self):
        self.used = []

    def reset(self, row: dict):
        if row.get("boom"):
            raise RuntimeError("bad row")
        return row.get("reset")

    def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: the first
            b: the second
        """
        self.used.append("add")
        return a + b

    def slow(self) -> str:
        """Sleeps too long."""
        time.sleep(3)
        return "late"

    def reward(self) -> float:
        return float(len(self.used))


class TurnsEnv:
    """A turns env driven by the assistant text."""

    def reset(self, row: dict) -> list[dict]:
        return row.get("start", [{"role": "user", "content": "go"}])

    def step(self, assistant_text: str):
        if assistant_text == "hang":
            time.sleep(3)
        if assistant_text == "raise":
            raise ValueError("step broke")
        if assistant_text == "nodict":
            return ["not", "a", "dict"]
        if assistant_text == "nodone":
            return {"messages": []}
        if assistant_text == "badmsg":
            return {"messages": [{"content": "no role"}], "done": False}
        if assistant_text == "end":
            return {"done": True, "info": {"score": 0.5}}
        return {"messages": [{"role": "user", "content": 7}], "done": False}

    def reward(self, episode: dict) -> float:
        return episode["info"].get("score", 0.0) + episode["turns"] / 100 + len(episode["messages"]) / 1000


# ---------------------------------------------------------------- kinds and loading

def test_kind_of_the_two_shapes_and_the_errors():
    assert kind_of(ToolsEnv) == "tools"
    assert kind_of(TurnsEnv) == "turns"
    assert kind_of(Calculator) == "tools" and kind_of(Guess) == "turns"

    class NoReset:
        def tool(self, x: int) -> int:
            """Doc."""
            return x

    class NoTools:
        def reset(self, row):
            return None

        def _hidden(self) -> str:
            return ""

    class StepAttr:
        step = 3

        def reset(self, row):
            return None

    with pytest.raises(EnvError, match="has no reset"):
        kind_of(NoReset)
    with pytest.raises(EnvError, match="neither step"):
        kind_of(NoTools)
    with pytest.raises(EnvError, match="step is not a method"):
        kind_of(StepAttr)
    assert issubclass(EnvError, UserError)


def test_gives_reward():
    assert gives_reward(ToolsEnv) and gives_reward(Guess)
    assert not gives_reward(Calculator)


def test_load_builtin_and_module_specs():
    assert load_env_class("builtin:calculator") is Calculator
    assert load_env_class("builtin:guess") is Guess
    assert load_env_class("rltune.agents.builtin:Guess") is Guess
    with pytest.raises(EnvError, match="unknown builtin environment 'builtin:nope'") as e:
        load_env_class("builtin:nope")
    assert "builtin:calculator, builtin:guess" in str(e.value) and "\n  fix: " in str(e.value)


def test_load_module_spec_errors():
    with pytest.raises(EnvError, match="importing environment module 'no_such_pkg_xyz.envs' failed .*ModuleNotFoundError"):
        load_env_class("no_such_pkg_xyz.envs:Env")
    with pytest.raises(EnvError, match="has no 'Nope'"):
        load_env_class("rltune.agents.builtin:Nope")
    with pytest.raises(EnvError, match="BUILTIN_ENVS is a dict, not a class"):
        load_env_class("rltune.agents.builtin:BUILTIN_ENVS")
    with pytest.raises(EnvError, match="is not builtin:NAME"):
        load_env_class("justaname")


def _write(tmp_path, name: str, body: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


GOOD_FILE = '''
    from __future__ import annotations

    from typing import Optional


    class Env:
        def reset(self, row: dict) -> str:
            return "use the tools"

        def lookup(self, key: str, default: Optional[int] = None) -> str:
            """Look a key up."""
            return key
'''


def test_load_from_a_file_relative_to_the_recipe_dir_with_future_annotations(tmp_path, monkeypatch):
    monkeypatch.chdir("/")
    _write(tmp_path, "envs.py", GOOD_FILE)
    cls = load_env_class("envs.py:Env", base_dir=tmp_path)
    assert cls.__name__ == "Env" and kind_of(cls) == "tools"
    session = Session(cls)
    props = session.tools[0]["function"]["parameters"]
    assert props["properties"] == {"key": {"type": "string"}, "default": {"type": "integer"}}
    assert props["required"] == ["key"]
    assert load_env_class(str(tmp_path / "envs.py") + ":Env").__name__ == "Env"


@pytest.mark.parametrize("body, spec, match", [
    (None, "missing.py:Env", "environment file missing.py does not exist"),
    ("raise RuntimeError('broken at import')\n", "f.py:Env", "environment file f.py failed .*RuntimeError: broken at import"),
    ("import sys\nsys.exit(4)\n", "f.py:Env", r"called sys.exit\(4\)"),
    ("X = 1\n", "f.py:Env", "f.py has no 'Env'"),
    ("Env = 3\n", "f.py:Env", "Env is a int, not a class"),
    ("class Env:\n    def tool(self) -> str:\n        '''d'''\n", "f.py:Env", "f.py:Env: .*has no reset"),
    ("class Env:\n    def reset(self, row): pass\n    def tool(self, x) -> str:\n        '''d'''\n",
     "f.py:Env", "f.py:Env: .*parameter 'x' of tool 'tool' has no type hint"),
    ("class Env:\n    def reset(self, row): pass\n    def tool(self, x: int) -> str:\n        return ''\n",
     "f.py:Env", "f.py:Env: .*no docstring"),
])
def test_load_file_errors(tmp_path, body, spec, match):
    if body is not None:
        _write(tmp_path, spec.split(":")[0], body)
    with pytest.raises(EnvError, match=match) as e:
        load_env_class(spec, base_dir=tmp_path)
    assert "fix: " in str(e.value)


# ---------------------------------------------------------------- validate: no code runs

NOT_RUN = "raise SystemExit('this file must not be executed')\n"


@pytest.mark.parametrize("body, problem", [
    (NOT_RUN + GOOD_FILE.replace("\n    ", "\n"), None),
    (NOT_RUN + "class Env:\n    def reset(self, row): pass\n    def step(self, text): return {}\n", None),
    (NOT_RUN + "class Base:\n    def reset(self, row): pass\n"
     "class Env(Base):\n    def go(self, x: int) -> int:\n        '''Go.'''\n", None),
    (NOT_RUN + "from elsewhere import Base\nclass Env(Base):\n    pass\n", None),     # cannot tell
    (NOT_RUN + "from elsewhere import Env\n", None),                                # cannot tell
    (NOT_RUN + "class Other:\n    pass\n", r"defines no `Env` \(it defines the class `Other`\)"),
    (NOT_RUN + "class Env:\n    def step(self, t): pass\n", "has no reset"),
    (NOT_RUN + "class Env:\n    def reset(self, row): pass\n    def _x(self): pass\n", r"neither step\(\) nor any public"),
    (NOT_RUN + "class Env:\n    def reset(self, row): pass\n    def go(self, x: int): pass\n", "`go`.*no docstring"),
    (NOT_RUN + "class Env:\n    def reset(self, row): pass\n    def go(self, x):\n        '''d'''\n", "`x`.*no type hint"),
    (NOT_RUN + "class Env(:\n", "does not parse"),
])
def test_check_env_file_reads_without_running(tmp_path, body, problem):
    _write(tmp_path, "envs.py", body)
    found = check_env_file("envs.py:Env", tmp_path)
    if problem is None:
        assert found is None
    else:
        assert found is not None and re.search(problem, found), found


def test_check_env_file_other_specs(tmp_path):
    assert check_env_file("builtin:guess", None) is None
    assert "unknown builtin environment `builtin:nope`" in check_env_file("builtin:nope", None)
    assert check_env_file("some.module:Env", None) is None            # would need an import
    assert "not found" in check_env_file("nope.py:Env", tmp_path)
    assert "is not builtin:NAME" in check_env_file("nocolon", None)
    big = tmp_path / "big.py"
    big.write_text("class Env:\n    pass\n" + "#" * 2_100_000)
    assert "over 2 MB" in check_env_file("big.py:Env", tmp_path)
    (tmp_path / "adir.py").mkdir()
    assert "not a regular file" in check_env_file("adir.py:Env", tmp_path)


@pytest.mark.parametrize("body, defines", [
    (NOT_RUN + "class Env:\n    def reset(self, row): pass\n    def reward(self): return 1.0\n", True),
    (NOT_RUN + "class Base:\n    def reward(self, episode): return 1.0\n"
     "class Env(Base):\n    def reset(self, row): pass\n", True),
    (NOT_RUN + "class Env:\n    def reset(self, row): pass\n    def step(self, t): pass\n", False),
    (NOT_RUN + "from elsewhere import Base\nclass Env(Base):\n    pass\n", None),
    (NOT_RUN + "class Other:\n    pass\n", None),
    (NOT_RUN + "class Env(:\n", None),
])
def test_env_defines_reward_reads_without_running(tmp_path, body, defines):
    _write(tmp_path, "envs.py", body)
    assert env_defines_reward("envs.py:Env", tmp_path) is defines


def test_env_defines_reward_other_specs(tmp_path):
    assert env_defines_reward("builtin:guess", None) is True
    assert env_defines_reward("builtin:calculator", None) is False
    assert env_defines_reward("builtin:nope", None) is None
    assert env_defines_reward("some.module:Env", None) is None
    assert env_defines_reward("missing.py:Env", tmp_path) is None


# ---------------------------------------------------------------- Session: tools

def test_tools_session_start_rules():
    s = Session(ToolsEnv)
    assert s.kind == "tools" and [t["function"]["name"] for t in s.tools] == ["add", "slow"]
    assert s.start({}, PROMPT) == PROMPT
    out = Session(ToolsEnv).start({"reset": "You have tools."}, PROMPT)
    assert out[1]["content"] == "What is 2+2?\n\nYou have tools."
    assert PROMPT[1]["content"] == "What is 2+2?"                      # the caller's list is untouched
    new = [{"role": "user", "content": "replaced"}]
    assert Session(ToolsEnv).start({"reset": new}, PROMPT) == new
    with pytest.raises(EnvError, match="reset returned 5"):
        Session(ToolsEnv).start({"reset": 5}, PROMPT)
    assert s.env_time_s >= 0.0


def test_reset_raising_names_the_row():
    row = {"boom": True, "text": "y" * 1000}
    with pytest.raises(EnvError, match="ToolsEnv.reset failed for the row .*RuntimeError: bad row") as e:
        Session(ToolsEnv).start(row, PROMPT)
    first = str(e.value).splitlines()[0]
    assert "{'boom': True" in first and len(first) < 350


def test_tools_session_respond_flow_and_counters():
    s = Session(ToolsEnv, tool_timeout_s=0.2)
    s.start({}, PROMPT)
    msgs, done = s.respond('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
                           '<tool_call>{"name": "sub", "arguments": {}}</tool_call>')
    assert done is False
    assert msgs[0] == {"role": "tool", "name": "add", "content": "5"}
    assert msgs[1]["name"] == "sub" and msgs[1]["content"].startswith("error: unknown tool 'sub'")
    msgs, done = s.respond("<tool_call>{not json</tool_call>")
    assert done is False and len(msgs) == 1 and msgs[0]["role"] == "tool"
    assert msgs[0]["content"].startswith("error: could not parse the tool call: ")
    assert msgs[0]["content"].endswith('Write <tool_call>{"name": ..., "arguments": {...}}</tool_call>')
    t0 = time.perf_counter()
    msgs, done = s.respond('<tool_call>{"name": "slow", "arguments": {}}</tool_call>')
    assert time.perf_counter() - t0 < 2 and not done and "did not answer" in msgs[0]["content"]
    assert s.respond("The answer is 5.") == ([], True)
    assert (s.turns, s.tool_calls, s.tool_errors, s.parse_errors, s.timeouts) == (4, 3, 2, 1, 1)
    assert s.reward([]) == 1.0                                         # one successful add
    assert s.env_time_s >= 0.2


def test_session_reward_checks_the_value():
    class Bad(ToolsEnv):
        value = float("nan")

        def reward(self):
            return self.value

    s = Session(Bad)
    s.start({}, PROMPT)
    with pytest.raises(EnvError, match="Bad.reward returned nan"):
        s.reward([])
    Bad.value = "1.0"
    with pytest.raises(EnvError, match="a finite number"):
        s.reward([])
    calc = Session(Calculator)
    calc.start({}, PROMPT)
    assert calc.reward([]) is None


# ---------------------------------------------------------------- Session: turns

def test_turns_session_flow_info_and_reward():
    s = Session(TurnsEnv, tool_timeout_s=0.2)
    assert s.kind == "turns" and s.tools is None
    start = s.start({}, PROMPT)
    assert start == [{"role": "user", "content": "go"}]
    msgs, done = s.respond("hello")
    assert msgs == [{"role": "user", "content": "7"}] and done is False     # content made a str
    assert s.respond("end") == ([], True)
    conversation = start + [{"role": "assistant", "content": "hello"}] + msgs
    assert math.isclose(s.reward(conversation), 0.5 + 2 / 100 + 3 / 1000)
    assert math.isclose(s.reward(conversation, info={}), 2 / 100 + 3 / 1000)


@pytest.mark.parametrize("start", [[], None, "text", [{"role": "user"}], [{"content": "x"}], ["hi"]])
def test_turns_reset_must_give_messages(start):
    with pytest.raises(EnvError, match="TurnsEnv.reset"):
        Session(TurnsEnv).start({"start": start}, PROMPT)


@pytest.mark.parametrize("text, match", [
    ("nodict", r"TurnsEnv.step returned \['not', 'a', 'dict'\]: it must return a dict"),
    ("nodone", "TurnsEnv.step returned .*\"done\""),
    ("badmsg", "TurnsEnv.step returned the message"),
    ("raise", "TurnsEnv.step raised ValueError: step broke"),
])
def test_turns_step_errors(text, match):
    s = Session(TurnsEnv)
    s.start({}, PROMPT)
    with pytest.raises(EnvError, match=match):
        s.respond(text)


def test_a_hanging_step_ends_the_episode():
    s = Session(TurnsEnv, tool_timeout_s=0.2)
    s.start({}, PROMPT)
    t0 = time.perf_counter()
    assert s.respond("hang") == ([], True)
    assert time.perf_counter() - t0 < 2
    assert s.timeouts == 1 and s.turns == 1


def test_a_class_that_cannot_be_created():
    class NeedsArgs(TurnsEnv):
        def __init__(self, x):
            pass

    with pytest.raises(EnvError, match=r"creating .*NeedsArgs\(\) failed: TypeError"):
        Session(NeedsArgs)


# ---------------------------------------------------------------- issue 46 item 9: a misspelt name, an agent's fixes

AGENT_FILE = NOT_RUN + "class Helper:\n    pass\n\ndef run_agent(client, row):\n    return 1.0\n"


def test_misspelt_function_is_not_called_a_missing_class(tmp_path):
    """`agent.py:run_agnet` names a misspelt function: the file defines no such name, the close
    match is offered, and nothing assumes a class (validate and train alike)."""
    _write(tmp_path, "agent.py", AGENT_FILE)
    [(problem, fix)] = env_file_problems("agent.py:run_agnet", tmp_path)
    assert "defines no `run_agnet`" in problem and "class `run_agnet`" not in problem, problem
    assert "the class `Helper` and the function `run_agent`" in problem, problem
    assert fix.startswith("did you mean `agent.py:run_agent`?"), fix
    _write(tmp_path, "agent.py", AGENT_FILE.replace(NOT_RUN, ""))
    with pytest.raises(EnvError) as e:
        load_env_class("agent.py:run_agnet", base_dir=tmp_path)
    assert "has no 'run_agnet'" in str(e.value) and "did you mean `agent.py:run_agent`?" in str(e.value)
    assert "define class" not in str(e.value), str(e.value)


@pytest.mark.parametrize("body", [None, NOT_RUN + "def run(client, row:\n", "\udcff"])
def test_file_problems_of_an_agent_spec_give_no_class_template(tmp_path, body):
    """A problem with the file itself (missing, unparseable) has its own fix, not the
    environment class template (an agent spec `agent.py:run` got that template)."""
    if body == "\udcff":
        (tmp_path / "agent.py").write_bytes(b"\xff\xfe def run")
    elif body is not None:
        _write(tmp_path, "agent.py", body)
    [(problem, fix)] = env_file_problems("agent.py:run", tmp_path)
    assert fix and "reset" not in fix and "class" not in fix, (problem, fix)
