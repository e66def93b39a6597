"""Generation ahead on several ranks (issue 49, item 4): `rollout.asynchronous.max_staleness: 1` with
`--nproc 2`, real ranks through torchrun (gloo) and the real sampler, the hf engine.

- 2 ranks == 1 rank: greedy PPO makes the samples deterministic, so the split of the global batch is
  the only difference; every step's lags are the schedule's on both (0, then 1, per token);
- rank 1 SIGKILLed mid-run: the job restarts from the last checkpoint, which holds each rank's batch
  generated ahead, and ends as the uninterrupted 2-rank run ends (sampling on);
- a resume on another world size cannot use those batches: they are generated again from where
  they began (lag 0 at the first step back) and no prompt is lost or repeated (the data position
  at the end is the uninterrupted run's).
"""

from __future__ import annotations

import json

import pytest

from trainlib import cli_env, read_metrics, run_cli, tiny_recipe

AHEAD = {"max_staleness": 1}
KEYS = ["reward/mean", "kl", "actor/loss", "actor/grad_norm", "critic/loss", "response/length_mean",
        "async/staleness_mean", "async/staleness_max", "async/regenerated"]


def _run(tmp_path, sub, name="tiny-ppo.yaml", *args, env=None, **kw):
    d = tmp_path / sub
    d.mkdir()
    path = tiny_recipe(d, name, trainer__eval_every=0, rollout__asynchronous=AHEAD, **kw)
    res = run_cli("train", path, "--quiet", *args, env=env, timeout=900)
    return d / "run", path, res


def test_two_ranks_generating_ahead_match_one_rank(tmp_path):
    one, _, res = _run(tmp_path, "one", rollout__do_sample=False, trainer__max_steps=4)
    assert res.returncode == 0, res.stderr[-3000:]
    two, _, res = _run(tmp_path, "two", "tiny-ppo.yaml", "--nproc", "2", rollout__do_sample=False,
                       trainer__max_steps=4)
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = read_metrics(one), read_metrics(two)
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        for k in KEYS:
            assert y[k] == pytest.approx(x[k], rel=1e-4, abs=1e-5), (x["step"], k, x[k], y[k])
    # the schedule's lags, per token over both ranks' batches: the first batch from the starting
    # weights, then every one a version behind
    assert [m["async/staleness_max"] for m in b] == [0.0, 1.0, 1.0, 1.0]
    assert [m["async/staleness_mean"] for m in b] == [0.0, 1.0, 1.0, 1.0]


def test_a_rank_killed_mid_run_restarts_to_the_uninterrupted_result(tmp_path):
    """Sampling on (tiny-grpo): rank 1 SIGKILLed as step 3 begins, trainer.max_restarts 1: the job
    restarts from checkpoint 2, restoring each rank's batch generated ahead (inflight-rank{R}.pt),
    and every step's figures are the uninterrupted run's."""
    common = dict(trainer__max_steps=4, trainer__save_every=1, trainer__seed=4, trainer__keep_checkpoints=5)
    whole, _, res = _run(tmp_path, "whole", "tiny-grpo.yaml", "--nproc", "2", **common)
    assert res.returncode == 0, res.stderr[-3000:]
    env = cli_env(RLTUNE_FAULTS="sigkill@3", RLTUNE_FAULT_RANK="1")
    killed, _, res = _run(tmp_path, "killed", "tiny-grpo.yaml", "--nproc", "2", env=env, trainer__max_restarts=1,
                          **common)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "was killed by SIGKILL" in res.stderr and "restart 1/1" in res.stderr
    assert "generated again" not in res.stderr            # the restored batches were used, not regenerated
    ckpt = killed / "checkpoints" / "step-00000002"
    assert (ckpt / "inflight-rank0.pt").is_file() and (ckpt / "inflight-rank1.pt").is_file()
    a, b = read_metrics(whole), read_metrics(killed)
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        for k in ("reward/mean", "kl", "actor/loss", "response/length_mean", "async/staleness_mean"):
            assert abs(x[k] - y[k]) <= 1e-6 * max(1.0, abs(x[k])), (x["step"], k, x[k], y[k])


def test_a_resume_on_one_rank_generates_the_batches_ahead_again_and_loses_no_prompt(tmp_path):
    common = dict(trainer__save_every=1, trainer__seed=4)
    whole, _, res = _run(tmp_path, "whole", "tiny-grpo.yaml", "--nproc", "2", trainer__max_steps=4, **common)
    assert res.returncode == 0, res.stderr[-3000:]
    parts, path, res = _run(tmp_path, "parts", "tiny-grpo.yaml", "--nproc", "2", trainer__max_steps=2, **common)
    assert res.returncode == 0, res.stderr[-3000:]
    res = run_cli("train", path, "--quiet", "--resume", "auto", "trainer.max_steps=4", timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "generated again (the world size changed)" in res.stderr, res.stderr[-3000:]
    m = read_metrics(parts)
    assert [x["step"] for x in m] == [1, 2, 3, 4]
    assert [x["async/staleness_max"] for x in m] == [0.0, 1.0, 0.0, 1.0]   # step 3's batch: the resumed weights

    def state(run):
        last = sorted((run / "checkpoints").glob("step-*"))[-1]
        return json.loads((last / "state.json").read_text())

    assert state(parts)["sampler"] == state(whole)["sampler"]
    assert state(parts)["async"]["sampler_before"] == state(whole)["async"]["sampler_before"]


def test_a_rollback_on_two_ranks_discards_every_ranks_batches_ahead(tmp_path):
    """autotune's rollback under K = 1 on 2 ranks (the single-rank case: test_async.py): a hard spike
    at step 6 restores checkpoint 4. Every rank's producer first makes the batch it was allowed (its
    partner in the producers' group waits for it), then both are discarded; the steps taken again
    start from batches sampled with the restored weights (lag 0, then 1), none past the bound."""
    rollback = {"enabled": True, "mode": "act", "rollback": True, "rollback_every": 2, "max_rollbacks": 1}
    env = cli_env(RLTUNE_FAULTS="actor_inf@5,actor_inf@6")
    run, _, res = _run(tmp_path, "rb", "tiny-grpo.yaml", "--nproc", "2", env=env, trainer__max_steps=8,
                       trainer__keep_checkpoints=10, trainer__seed=3, autotune=rollback, reward__normalize=True)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "goes back to step 4" in res.stderr
    m = read_metrics(run)
    assert [x["step"] for x in m] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    assert [x["async/staleness_max"] for x in m] == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert all(x["async/dropped"] == 0 and x["async/regenerated"] == 0 for x in m)
    # the normaliser counted the kept steps' batches only, both ranks' rows (8 steps x 64 sequences)
    last = sorted((run / "checkpoints").glob("step-*"))[-1]
    assert json.loads((last / "state.json").read_text())["rewards"]["count"] == 8 * 64
