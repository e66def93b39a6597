"""Two nodes through torchrun's c10d rendezvous (issue 29, item 1), proven on one machine: two
node agents on 127.0.0.1, one rank each (`rltune train R --nnodes 2 --nproc 1 --rdzv-endpoint
127.0.0.1:PORT`, started twice, as on two hosts), give the metrics of one node with the same
world size (`--nproc 2`). Greedy PPO: the rollout is deterministic, so only the split of the
global batch could differ, and it must not."""

from __future__ import annotations

import subprocess
import sys

from trainlib import ROOT, cli_env, free_port, read_metrics, run_cli, tiny_recipe

KEYS = ["reward/mean", "reward/std", "kl", "actor/loss", "actor/grad_norm", "critic/loss", "critic/grad_norm",
        "critic/explained_var", "response/length_mean", "actor/entropy"]




def test_two_node_agents_on_localhost_equal_one_node_of_two_ranks(tmp_path):
    common = dict(rollout__do_sample=False, trainer__max_steps=3, trainer__eval_every=0)
    (tmp_path / "one").mkdir()
    one = tiny_recipe(tmp_path / "one", "tiny-ppo.yaml", **common)
    res = run_cli("train", one, "--nproc", "2", "--quiet")
    assert res.returncode == 0, res.stderr[-3000:]

    (tmp_path / "two").mkdir()
    two = tiny_recipe(tmp_path / "two", "tiny-ppo.yaml", **common)
    endpoint = f"127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "rltune", "train", str(two), "--nnodes", "2", "--nproc", "1",
           "--rdzv-endpoint", endpoint, "--quiet"]
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
                              cwd=ROOT) for _ in range(2)]
    outs = [n.communicate(timeout=600) for n in nodes]
    for n, (_, err) in zip(nodes, outs):
        assert n.returncode == 0, err[-3000:]
    assert any("--rdzv-endpoint " + endpoint in err for _, err in outs)
    m1, m2 = read_metrics(tmp_path / "one" / "run"), read_metrics(tmp_path / "two" / "run")
    assert len(m1) == len(m2) == 3
    for a, b in zip(m1, m2):
        for k in KEYS:
            assert abs(a[k] - b[k]) <= 1e-6 * max(1.0, abs(a[k])), (a["step"], k, a[k], b[k])


def test_nodes_with_different_recipes_are_refused_at_start(tmp_path):
    """One node started with another override: every rank refuses before building a model,
    naming the rank that differs; nothing is trained."""
    path = tiny_recipe(tmp_path, "tiny-ppo.yaml", trainer__max_steps=2, trainer__eval_every=0)
    endpoint = f"127.0.0.1:{free_port()}"
    base = [sys.executable, "-m", "rltune", "train", str(path), "--nnodes", "2", "--nproc", "1",
            "--rdzv-endpoint", endpoint, "--quiet"]
    nodes = [subprocess.Popen(base + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(),
                              cwd=ROOT) for extra in ([], ["trainer.seed=7"])]
    outs = [n.communicate(timeout=600) for n in nodes]
    assert all(n.returncode != 0 for n in nodes)
    err = "\n".join(e for _, e in outs)
    assert "run a different recipe (file or overrides) or rltune version than rank 0" in err, err[-3000:]
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or read_metrics(tmp_path / "run") == []


def test_a_node_that_never_joins_stops_the_job_with_the_fix(tmp_path):
    """--nnodes 2 but only one node started: the rendezvous gives up after
    trainer.rendezvous_timeout_s, with one line saying so and what to do, not a traceback."""
    import time

    path = tiny_recipe(tmp_path, "tiny-ppo.yaml", trainer__rendezvous_timeout_s=10)
    t0 = time.monotonic()
    res = run_cli("train", path, "--nnodes", "2", "--nproc", "1", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                  "--quiet", timeout=300)
    assert res.returncode == 3, res.stderr[-3000:]
    assert time.monotonic() - t0 < 120
    assert "not every node joined the rendezvous" in res.stderr and "fix:" in res.stderr
    assert "Traceback" not in res.stderr


def test_node_rank_fixes_the_node_ranks(tmp_path):
    """`--node-rank K` (issue 45, 11c): torchrun's c10d rendezvous, which the CLI used to add
    whatever the node rank, ignores it and numbers the nodes as they join; rltune now takes the
    static rendezvous for it. The node started first asks for rank 1 and gets it (under c10d it got
    rank 0: it joined first), the other serves the rendezvous as rank 0 and is the one that logs."""
    import time

    path = tiny_recipe(tmp_path, "tiny-ppo.yaml", rollout__do_sample=False, trainer__max_steps=1,
                       trainer__eval_every=0)
    endpoint = f"127.0.0.1:{free_port()}"
    base = [sys.executable, "-m", "rltune", "train", str(path), "--nnodes", "2", "--nproc", "1",
            "--rdzv-endpoint", endpoint]
    env = cli_env(LOGLEVEL="INFO")      # torch's agent logs the rendezvous it got
    one = subprocess.Popen(base + ["--node-rank", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env, cwd=ROOT)
    time.sleep(3)
    zero = subprocess.Popen(base + ["--node-rank", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    (_, err1), (_, err0) = one.communicate(timeout=600), zero.communicate(timeout=600)
    assert one.returncode == 0 and zero.returncode == 0, (err1[-3000:], err0[-3000:])
    assert "group_rank=1" in err1 and "global_ranks=[1]" in err1, err1[-3000:]
    assert "group_rank=0" in err0 and "global_ranks=[0]" in err0, err0[-3000:]
    assert "batch plan" in err0 and "batch plan" not in err1        # rank 0 logs
    assert [m["step"] for m in read_metrics(tmp_path / "run")] == [1]


def test_a_static_rendezvous_that_never_forms_is_one_message(tmp_path):
    """With --node-rank: node rank 0 alone waits trainer.rendezvous_timeout_s for the others, a
    node rank 1 alone for node rank 0; each ends with one line and the fix (exit 3), not the TCP
    store's traceback and a resume hint."""
    path = tiny_recipe(tmp_path, "tiny-ppo.yaml", trainer__rendezvous_timeout_s=5)
    for rank, says in (("0", "not every node joined the rendezvous"), ("1", "could not reach the rendezvous")):
        res = run_cli("train", path, "--nnodes", "2", "--nproc", "1", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                      "--node-rank", rank, "--quiet", timeout=300)
        assert res.returncode == 3, res.stderr[-3000:]
        assert says in res.stderr and "--node-rank" in res.stderr and "fix:" in res.stderr, res.stderr[-3000:]
        assert "Traceback" not in res.stderr and "resume from the last checkpoint" not in res.stderr
