"""Tool-using verifiers environments (issue 48, item 3): a task's `vf.Toolset` (an MCP tool server)
offered to the model by rltune's chat harness, its calls answered, its results environment turns
(attended, never trained), and the server reachable only with the run's secret
(rltune/envs/verifiers_tools.py). Episodes are played by the scripted engine of
test_verifiers_env.py through the path training takes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from types import SimpleNamespace

import pytest

pytest.importorskip("verifiers")
pytest.importorskip("openai")

from test_verifiers_env import ROOT, _play, _trained_runs  # noqa: E402

CALC = "rltune.envs.verifiers_examples.calc"
MCP_ACCEPT = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
LIST_TOOLS = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()


def _rows(n=2):
    from rltune.data.datasets import load_prompts

    return load_prompts(f"verifiers:{CALC}").rows[:n]


def _question(prompt: str) -> tuple[int, int]:
    a, b = re.findall(r"What is (\d+) \+ (\d+)", prompt)[-1]
    return int(a), int(b)


def _call(name: str, args) -> str:
    return '<tool_call>\n{"name": "%s", "arguments": %s}\n</tool_call>' % (name, args)


def _post(url: str, headers: dict) -> int:
    req = urllib.request.Request(url, data=LIST_TOOLS, headers={**MCP_ACCEPT, **headers}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError as err:        # not listening (any more)
        return repr(err)


def test_a_tool_call_is_answered_by_the_toolset_and_its_result_is_an_environment_turn(monkeypatch):
    from rltune.envs.verifiers_examples.chat import ChatHarness

    urls, statuses = [], []
    tools = ChatHarness._tools

    async def recording(self, mcp_urls, stack):
        urls.extend(mcp_urls.values())
        return await tools(self, mcp_urls, stack)

    monkeypatch.setattr(ChatHarness, "_tools", recording)

    def reply(prompt):
        a, b = _question(prompt)
        turn = prompt.rsplit("What is", 1)[-1]
        if "tool\n" in turn:                 # the tool answered: say the sum
            return "The sum is %s." % re.findall(r"tool\n(\d+)", turn)[-1]
        # the episode's tool server is up now: without the run's secret it answers nobody
        statuses.append(_post(urls[-1], {}))
        statuses.append(_post(urls[-1], {"Authorization": "Bearer not-the-secret"}))
        return _call("calc_add", json.dumps({"a": a, "b": b}))

    rows = _rows()
    c, ep = _play(CALC, rows, reply, max_turns=4, tool_timeout_s=120)
    assert statuses == [401, 401, 401, 401], (statuses, urls, ep.metrics, ep.completions)
    for b, row in enumerate(rows):
        ids, trained = _trained_runs(c, ep, b)
        env_text = c.tokenizer.decode([t for t, m in zip(ids, trained) if m == 0])
        model_text = c.tokenizer.decode([t for t, m in zip(ids, trained) if m == 1])
        total = str(row["vf_task"]["a"] + row["vf_task"]["b"])
        assert total in env_text                     # the tool's answer: an environment turn
        assert f"The sum is {total}." in model_text  # the model's answer: trained
        assert ep.env_scores[b] == pytest.approx(1.0 + 0.5)   # correct + used_tool
    m = ep.metrics
    assert m["episode/tool_calls"] == 2 and m["reward/env/correct"] == 2 and m["reward/env/used_tool"] == 2
    assert m["env/metric/tool_results"] == 2              # @vf.metric: logged, not rewarded


def test_a_bad_tool_call_is_told_to_the_model_and_the_episode_goes_on():
    def reply(prompt):
        turn = prompt.rsplit("What is", 1)[-1]
        if "error:" in turn:
            return "I give up."
        return _call("calc_multiply", json.dumps({"a": 1, "b": 2})) if "no tool" not in turn else ""

    rows = _rows(1)
    c, ep = _play(CALC, rows, reply, max_turns=4, tool_timeout_s=120)
    ids, trained = _trained_runs(c, ep, 0)
    env_text = c.tokenizer.decode([t for t, m in zip(ids, trained) if m == 0])
    assert "error: there is no tool named 'calc_multiply'; the tools are: calc_add" in env_text
    assert ep.env_scores[0] == 0.0 and ep.metrics["episode/env_crashes"] == 0


def test_arguments_that_are_not_an_object_and_a_slow_tool_are_answered_as_errors(monkeypatch):
    import verifiers.v1.harnesses.utils.mcp as vf_mcp
    from rltune.envs.verifiers_examples.chat import ChatHarness, ChatHarnessConfig

    h = ChatHarness(ChatHarnessConfig(tool_timeout_s=0.2))
    call = lambda args: SimpleNamespace(function=SimpleNamespace(name="calc_add", arguments=args))  # noqa: E731
    dispatch = {"calc_add": ("calc", "add")}

    async def hangs(*a, **k):
        await asyncio.sleep(5)

    monkeypatch.setattr(vf_mcp, "call_mcp", hangs)
    assert asyncio.run(h._answer(call("[1, 2]"), dispatch, {})) == "error: the arguments of calc_add are not a JSON object"
    assert asyncio.run(h._answer(call("{not json"), dispatch, {})) == "error: the arguments of calc_add are not a JSON object"
    t = time.monotonic()
    assert asyncio.run(h._answer(call('{"a": 1, "b": 2}'), dispatch, {})) == "error: calc_add did not answer in 0.2 s"
    assert time.monotonic() - t < 2


def test_the_guarded_server_answers_only_the_secret(tmp_path):
    """The child as rltune starts it: `python -m rltune.envs.verifiers_tools MODULE CLASS`, the secret
    in its environment, verifiers' own port-file protocol."""
    import verifiers.v1 as vf

    port_file = tmp_path / "port"
    env = {**os.environ, "RLTUNE_VF_TOOL_SECRET": "s3cret", "MCP_PORT_FILE": str(port_file),
           "VF_CONFIG": vf.ToolsetConfig().model_dump_json(), "VF_STATE_URL": "", "VF_STATE_SECRET": ""}
    proc = subprocess.Popen([sys.executable, "-m", "rltune.envs.verifiers_tools", CALC, "CalcTools", ""],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not (port_file.exists() and port_file.read_text().strip().isdigit()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() is not None else "no port"
            time.sleep(0.2)
        url = f"http://127.0.0.1:{port_file.read_text().strip()}/mcp"
        while _post(url, {}) not in (401,):                   # up: it refuses a request without the secret
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert _post(url, {"Authorization": "Bearer s3cre"}) == 401
        assert _post(url, {"Authorization": "Bearer s3cret"}) == 200
        req = urllib.request.Request(url, data=LIST_TOOLS, method="POST",
                                     headers={**MCP_ACCEPT, "Authorization": "Bearer s3cret"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read().decode()
        assert '"add"' in body and "Add two integers" in body
    finally:
        proc.kill()
        proc.wait()


def test_a_tool_server_in_another_runtime_is_refused_with_the_fix():
    from verifiers.v1.errors import ToolsetError
    from verifiers.v1.mcp import launch

    from rltune.envs.verifiers_examples.calc import CalcTools
    from rltune.envs.verifiers_tools import install

    import verifiers.v1 as vf

    install()
    install()                                  # idempotent: wrapped once
    assert getattr(launch.serve_in_runtime, "_rltune_guard", False)
    runtime = SimpleNamespace(type="docker")
    with pytest.raises(ToolsetError) as err:
        asyncio.run(launch.serve_in_runtime(CalcTools(vf.ToolsetConfig()), runtime, exposed=True))
    assert "'docker' runtime" in str(err.value) and "fix:" in str(err.value)
