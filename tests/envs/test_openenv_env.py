"""`rollout.env: openenv:NAME` (issue 48, item 4): an OpenEnv environment (openenv-core) driven as an
rltune turns environment, one OpenEnv WebSocket session per episode. The shipped local environment
(rltune.envs.openenv_guess, built with openenv-core's create_app) runs as a child server on
127.0.0.1 behind rltune's guard and per-run secret; a hostile server's answers (huge, malformed,
slow) end the episode with a message, never a hang or a traceback."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("openenv")
pytest.importorskip("websockets")

from rltune.agents.env import EnvError  # noqa: E402
from rltune.recipe.schema import Recipe  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GUESS = "rltune.envs.openenv_guess"
ARGS = {"action_field": "guess", "observation_field": "prompt", "reset_fields": ["target"]}


def _recipe(**rollout) -> Recipe:
    return Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:guess"},
        "algorithm": {"name": "grpo", "group_size": 4},
        "rollout": {"engine": "hf", "batch_size": 8, "max_new_tokens": 32, "max_turns": 4,
                    "env": f"openenv:{GUESS}", "env_args": ARGS, **rollout},
        "train": {"batch_size": 8, "micro_batch_size": 8}, "trainer": {"seed": 3}})


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _descendants(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    kids.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(d))
            except OSError:
                pass
    out, todo = [], [root]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _our_servers() -> list[int]:
    """This test process's descendants that run an OpenEnv child server."""
    out = []
    for pid in _descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            if b"rltune.envs.openenv_env\x00serve" in cmd and b"server_guard" not in cmd:   # not its guard
                out.append(pid)
        except OSError:
            pass
    return out


def _listeners(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} writes them) listening on `port`."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                out.append(addr)
    return out


# ---------------------------------------------------------------- validate


def test_validate_names_each_bad_env_arg_with_its_fix_without_importing_openenv(tmp_path):
    cases = {
        "unknown key": (GUESS, {"action_feild": "guess"}, "unknown key 'action_feild'", "did you mean `action_field`"),
        "malformed url": ("echo", {"url": "http//localhost:8000"}, "is not an http://", "http://127.0.0.1:8000"),
        "bad port": ("echo", {"url": "http://127.0.0.1:99999"}, "is malformed", "http://127.0.0.1:8000"),
        "credentials": ("echo", {"url": "http://u:p@127.0.0.1:8000"}, "holds credentials", "server's address"),
        "missing package": ("no_such_env_pkg.server.app", {}, "no_such_env_pkg.server.app is not installed",
                            "pip install -e"),
        "missing submodule": ("rltune.envs.no_such_app", {}, "rltune.envs.no_such_app is not installed", "PYTHONPATH"),
        "bad reward": (GUESS, {"reward": "mean"}, "env_args.reward 'mean'", "sum (default) or last"),
    }
    code = textwrap.dedent("""
        import json, sys
        from rltune.recipe import check
        out = {}
        for name, path in json.loads(sys.argv[1]).items():
            _, findings = check(path, files=True)   # what `rltune validate` checks
            out[name] = [(f.message, f.fix) for f in findings if f.severity == "error"]
        heavy = [m for m in ("openenv", "websockets", "fastapi", "rltune.envs.openenv_guess") if m in sys.modules]
        print(json.dumps({"out": out, "heavy": heavy}))
    """)
    paths = {}
    for i, (name, (env, args, _, _)) in enumerate(cases.items()):
        p = tmp_path / f"r{i}.yaml"
        p.write_text(json.dumps({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:guess"},
                                 "reward": {"functions": ["builtin:format"]},
                                 "rollout": {"env": f"openenv:{env}", "env_args": args}}))
        paths[name] = str(p)
    res = subprocess.run([sys.executable, "-c", code, json.dumps(paths)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["heavy"] == []                                   # nothing of openenv (or the env) imported
    for name, (_, _, problem, fix) in cases.items():
        errors = got["out"][name]
        assert any(problem in m and fix in (f or "") for m, f in errors), (name, errors)
    from rltune.envs.openenv_env import env_problems

    assert env_problems(GUESS, dict(ARGS)) == []
    assert env_problems("echo", {"url": "ws://127.0.0.1:8000", **ARGS}) == []


# ---------------------------------------------------------------- the child server and rltune's rollout path


@pytest.fixture(scope="module")
def dist():
    from rltune.engine.distributed import init_distributed

    return init_distributed("cpu")


def test_episodes_through_the_real_rollout_path_against_the_child_server(dist):
    """build() starts the shipped environment's server (127.0.0.1 only, this run's secret); the hf
    engine's sampled episodes run several turns; environment tokens are attended, never trained;
    the trained log-probs are the engine's own; the server is gone once the run stops it."""
    from rltune.rollout.server import call
    from rltune.train.episodes import play
    from rltune.train.setup import build
    from rltune.train.update import forward_logp

    c = build(_recipe(), dist, Path("."))
    cls = c.env[0]
    try:
        port = int(cls.base_url.rsplit(":", 1)[1])
        assert _listeners(port) == ["0100007F"]                              # 127.0.0.1, nothing else
        with pytest.raises(Exception, match="HTTP 401"):                      # another local user: refused
            call(cls.base_url, "GET", "/schema", timeout_s=5)
        servers = _our_servers()
        assert len(servers) == 1
        torch.manual_seed(0)
        ep = play(c, c.train_set.rows[:2], "prompt", 4)
        exp = ep.exp
        assert ep.metrics["episode/turns"] >= 2                              # multi-turn episodes were played
        env_tokens = exp.response_mask - exp.loss_mask
        assert float(env_tokens.sum()) > 0 and float(env_tokens.min()) >= 0  # attended, never trained
        lp = forward_logp(c.actor.module, exp, 1.0, 8)
        assert float(((lp - exp.rollout_logp).abs() * exp.loss_mask).max()) < 1e-4
        assert ep.env_scores is not None and len(ep.env_scores) == 8
    finally:
        cls.rltune_stop()
    assert not any(_alive(p) for p in servers) and _our_servers() == []


def test_a_scripted_episode_gets_the_environments_replies_done_and_reward():
    """A scripted model's turns ("8", "12", "9" for the number 9): the OpenEnv environment answers
    Higher., Lower., then done on turn 3; the episode's reward is the environment's (0.8)."""
    sys.path.insert(0, str(ROOT / "tests" / "train"))
    try:
        from test_episodes import Scripted, TOKENIZER
    finally:
        sys.path.pop(0)
    from types import SimpleNamespace

    from rltune.models.loading import load_tokenizer
    from rltune.train.episodes import load_environment, play

    tok = load_tokenizer(TOKENIZER)
    r = _recipe(batch_size=2)
    env = load_environment(r, tok, Path("."))
    try:
        c = SimpleNamespace(recipe=r, tokenizer=tok, rollout=Scripted(tok, ["8", "12", "9", "1"]), env=env)
        ep = play(c, [{"prompt": "guess", "target": 9}], "prompt", 2)
        assert ep.env_scores == [pytest.approx(0.8)] * 2
        users = [m["content"] for m in ep.conversations[0] if m["role"] == "user"]
        assert users[0].startswith("I am thinking of a whole number from 1 to 16")
        assert users[1:] == ["Higher.", "Lower."]                        # the answer to the last turn is not appended
        assert ep.metrics["episode/turns"] == 6
        # an environment's exception: one line naming openenv, the environment and a fix
        with pytest.raises(EnvError) as err:
            play(c, [{"prompt": "guess", "target": 99}], "prompt", 1)
        first, fix = str(err.value).splitlines()
        assert first.startswith(f"openenv:{GUESS}: reset failed: the environment answered an error")
        assert "the target 99 is not between 1 and 16" in first and fix.startswith("  fix: ")
    finally:
        env[0].rltune_stop()


def test_an_action_that_cannot_be_built_from_text_is_one_line_with_the_fields():
    from rltune.envs.openenv_env import load_env

    before = _our_servers()
    with pytest.raises(EnvError) as err:
        load_env(GUESS, {"action_field": "message"})
    first, fix = str(err.value).splitlines()
    assert first == f"openenv:{GUESS}: the environment's Action has no field 'message' for the model's text " \
                    "(its fields: guess (string))"
    assert fix == "  fix: set rollout.env_args.action_field to its text field"
    assert _our_servers() == before                                   # the server it started is gone


# ---------------------------------------------------------------- a hostile server


class Hostile:
    """A WebSocket server speaking OpenEnv's protocol whose step answers are chosen by the action
    text: huge, not JSON, nested past the recursion limit, late, a non-finite reward, closed."""

    def __init__(self):
        from websockets.sync.server import serve

        self.server = serve(self.handle, "127.0.0.1", 0, process_request=self.http, max_size=None, compression=None)
        self.url = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def http(connection, request):
        if request.path == "/schema":
            return connection.respond(200, json.dumps({"action": {"properties": {"message": {"type": "string"}},
                                                                  "required": ["message"]}}))
        return None

    @staticmethod
    def handle(ws):
        ok = {"type": "observation", "data": {"observation": {"text": "hello"}, "reward": 0.5, "done": False}}
        for raw in ws:
            msg = json.loads(raw)
            what = msg["data"].get("message", "")
            if msg["type"] == "reset" or what == "ok":
                ws.send(json.dumps(ok))
            elif what == "huge":
                ws.send("x" * (20 << 20))
            elif what == "bad":
                ws.send("{not json")
            elif what == "deep":
                ws.send("[" * 50_000)                # within the size bound, past the recursion limit
            elif what == "slow":
                time.sleep(3)
                ws.send(json.dumps(ok))
            elif what == "nan":
                ws.send('{"type": "observation", "data": {"observation": {}, "reward": NaN, "done": true}}')
            elif what == "close":
                return

    def stop(self):
        self.server.shutdown()


@pytest.fixture
def hostile():
    h = Hostile()
    yield h
    h.stop()


@pytest.mark.parametrize("answer,said", [
    ("huge", "is larger than 100000 bytes (rollout.env_args.max_message_bytes): refused"),
    ("bad", "is not JSON: '{not json'"),
    ("deep", "is not JSON"),
    ("slow", "did not answer step within 1 s (rollout.env_args.timeout_s)"),
    ("nan", "has reward=nan, not a finite number"),
    ("close", "the server closed the session during step"),
])
def test_a_hostile_answer_ends_the_episode_with_a_message_in_bounded_time(hostile, answer, said, caplog):
    from rltune.envs.openenv_env import load_env

    cls = load_env("hostile", {"url": hostile.url, "timeout_s": 1, "max_message_bytes": 100_000})
    env = cls()
    assert env.reset({}) == [{"role": "user", "content": "hello"}]
    assert env.step("ok")["done"] is False
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="rltune"):
        out = env.step(answer)
    assert time.monotonic() - t0 < 2.5
    assert out["done"] is True and out["messages"] == []
    assert said in out["info"]["openenv_error"]
    assert env.reward({}) == 0.5                                     # the steps' rewards so far
    ours = [r.getMessage() for r in caplog.records if r.name == "rltune"]
    assert all(m.startswith("openenv:hostile: step failed, the episode ends: ") for m in ours)   # once per kind


def test_a_hostile_reset_or_an_unreachable_server_is_one_line_naming_openenv(hostile):
    from rltune.envs.openenv_env import load_env

    cls = load_env("hostile", {"url": hostile.url, "timeout_s": 1})
    hostile.stop()
    with pytest.raises(EnvError) as err:
        cls().reset({})
    first, fix = str(err.value).splitlines()
    assert first.startswith("openenv:hostile: reset failed: cannot open a session at ws://127.0.0.1:")
    assert fix.startswith("  fix: check the environment's server at http://127.0.0.1:")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EnvError) as err:
        load_env("echo", {"url": f"http://127.0.0.1:{port}", "timeout_s": 1})
    first, fix = str(err.value).splitlines()
    assert first.startswith(f"openenv:echo: its server at http://127.0.0.1:{port} did not answer GET /schema")
    assert "bound to 127.0.0.1" in fix


# ---------------------------------------------------------------- learning


def _trainlib():
    sys.path.insert(0, str(ROOT / "tests" / "train"))
    try:
        import trainlib
    finally:
        sys.path.pop(0)
    return trainlib


@pytest.mark.slow
def test_the_shipped_recipe_learns_and_its_server_is_gone_after_the_run(capfd, tmp_path):
    """recipes/openenv-tiny.yaml through the CLI: the reward rises over its 30 steps (measured on 2
    loaded CPU cores, 2026-11-27: reward/mean 0.002 -> 0.198 and reward/env 0.002 -> 0.036, first 5
    vs last 5 steps; turns per episode 0.08 -> 3.9; 10.5 min), and the child server is gone after."""
    tl = _trainlib()
    run = tmp_path / "run"
    res = tl.run_inproc(capfd, "train", str(ROOT / "recipes" / "openenv-tiny.yaml"), f"trainer.output_dir={run}",
                        "trainer.eval_every=30", "--resume", "never")
    assert res.returncode == 0, res.stderr[-3000:]
    assert _our_servers() == []                                        # stopped with the run
    m = tl.read_metrics(run)
    assert len(m) == 30
    mean = lambda rows, k: statistics.fmean(x[k] for x in rows)  # noqa: E731
    assert mean(m[:5], "reward/mean") < 0.02 and mean(m[-5:], "reward/mean") > 0.1, [x["reward/mean"] for x in m]
    assert mean(m[:5], "reward/env") < 0.01 < mean(m[-5:], "reward/env"), [x["reward/env"] for x in m]
    assert mean(m[:5], "episode/turns_mean") < 0.5 < 2.0 < mean(m[-5:], "episode/turns_mean")
    assert 0 < m[-1]["episode/env_token_frac"] < 1 and all(x["episode/timeouts"] == 0 for x in m)


@pytest.mark.slow
def test_the_openenv_game_trains_step_for_step_like_builtin_guess(capfd, tmp_path):
    """rltune.envs.openenv_guess is builtin:guess served by openenv-core: through the OpenEnv
    session its episodes are the builtin class's token for token (same prompts, replies, done and
    rewards), so recipes/openenv-tiny.yaml and recipes/tiny-guess.yaml log the same numbers."""
    tl = _trainlib()
    runs = {}
    for name in ("tiny-guess", "openenv-tiny"):
        run = tmp_path / name
        res = tl.run_inproc(capfd, "train", str(ROOT / "recipes" / f"{name}.yaml"), f"trainer.output_dir={run}",
                            "trainer.max_steps=2", "trainer.eval_every=0", "--resume", "never")
        assert res.returncode == 0, res.stderr[-3000:]
        runs[name] = tl.read_metrics(run)
    timing = ("timing/", "throughput/", "episode/env_time_s")
    for a, b in zip(runs["tiny-guess"], runs["openenv-tiny"], strict=True):
        same = {k: v for k, v in a.items() if not k.startswith(timing)}
        assert same == {k: b[k] for k in same}


def test_a_module_without_a_server_app_is_one_line_naming_openenv_and_leaves_no_server():
    from rltune.envs.openenv_env import load_env

    with pytest.raises(EnvError) as err:
        load_env("json", {"startup_timeout_s": 60})          # a module, but no `app` in it
    text = str(err.value)
    assert text.startswith("openenv:json: its server did not start: the environment's server exited with code")
    assert "AttributeError" in text and "module 'json' has no attribute 'app'" in text   # its log's last lines
    assert "  fix: the server's log lines above say why; json must define an app made with openenv's create_app" in text
    assert _our_servers() == []
