"""docs/agents.md's example environments are real: each loads, passes `validate`'s file check,
and plays an episode through a Session as the page says."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _examples(tmp_path) -> Path:
    text = (ROOT / "docs" / "agents.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 3, blocks
    path = tmp_path / "envs.py"
    path.write_text("\n\n".join(blocks))
    return path


def test_the_documented_environments_work(tmp_path):
    from rltune.agents.env import check_env_file, env_defines_reward, load_env_class
    from rltune.agents.session import Session

    path = _examples(tmp_path)
    for name in ("Lookup", "Guess"):
        spec = f"{path}:{name}"
        assert check_env_file(spec, None) is None
        assert env_defines_reward(spec, None) is True
    lookup = Session(load_env_class(f"{path}:Lookup"))
    conv = lookup.start({"prompt": "Where is Lima?"}, [{"role": "user", "content": "Where is Lima?"}])
    assert conv[-1]["content"] == "Where is Lima?\n\nYou may look cities up."
    assert lookup.tools[0]["function"]["parameters"]["properties"]["city"]["description"] == "the city's name, lower case"
    new, done = lookup.respond('<tool_call>{"name": "country", "arguments": {"city": "lima"}}</tool_call>')
    assert not done and new[0]["content"] == "Peru"
    assert lookup.respond("Peru.") == ([], True) and lookup.reward(conv) == 1.0
    guess = Session(load_env_class(f"{path}:Guess"))
    guess.start({"target": 7}, [])
    assert guess.respond("3")[1] is False and guess.respond("7") == ([], True)
    assert guess.reward([]) == 1.0


def test_the_documented_agent_plays_through_the_endpoint(tmp_path):
    """The agent example: validate's file check passes, and played through rltune's endpoint (a
    scripted engine writes the `add` call, then the answer) it uses the tool and scores 1."""
    import sys

    import pytest

    pytest.importorskip("openai")
    sys.path.insert(0, str(ROOT / "tests" / "train"))
    from test_agent_episodes import _play

    from rltune.agents.env import check_env_file, env_defines_reward, kind_of, load_env_class

    spec = f"{_examples(tmp_path)}:run"
    assert check_env_file(spec, None) is None and env_defines_reward(spec, None) is True
    run = load_env_class(spec)
    assert kind_of(run) == "agent"
    c, ep = _play(run, [{"prompt": "What is 1+2?", "answer": "3"}])
    assert ep.env_scores == [1.0] and ep.metrics["episode/tool_calls"] == 1
