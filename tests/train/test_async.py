"""rollout.asynchronous (train/pipeline.py): generation one step ahead, through the CLI on the tiny
model with the hf engine.

- max_staleness 0 is today's synchronous run, bit for bit (metrics and weights);
- with K = 1 and K = 2 every trained token's lag (the policy version training it minus the version
  that sampled it, per token, from the versions the engine reported) is at most K, and exactly
  the schedule's: 0..K over the first K + 1 steps, K after;
- the schedule is deterministic: two K = 1 runs are equal, and a run killed and resumed equals the
  uninterrupted one (the checkpoint holds the batches generated ahead);
- a resume that cannot restore them (the file gone) generates them again: lag 0 at the first step
  back, and no prompt lost (the data position at the end is the uninterrupted run's);
- the tiny task learns with K = 1 and K = 2;
- the staleness guard: groups older than K are generated again or dropped whole.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainlib import ROOT, cli_env, read_metrics, run_cli, run_inproc, tiny_recipe

VOLATILE = ("timing/", "throughput/", "async/idle_")


def _comparable(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in metrics]


def _weights(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "final" / "model.safetensors"))


def _recipe(tmp_path: Path, sub: str, K: int | None, name: str = "tiny-grpo.yaml", **kw) -> Path:
    d = tmp_path / sub
    d.mkdir()
    extra = {} if K is None else {"rollout__asynchronous": {"max_staleness": K}}
    return tiny_recipe(d, name, trainer__eval_every=0, trainer__seed=3, **{**extra, **kw})


def test_max_staleness_zero_is_the_synchronous_run_bit_for_bit(capfd, tmp_path):
    runs = []
    for sub, K in (("plain", None), ("zero", 0)):
        res = run_inproc(capfd, "train", _recipe(tmp_path, sub, K, trainer__max_steps=3))
        assert res.returncode == 0, res.stderr[-3000:]
        runs.append(tmp_path / sub / "run")
    a, b = (read_metrics(r) for r in runs)
    assert _comparable(a) == _comparable(b)
    assert not any(k.startswith("async/") for k in a[0])
    wa, wb = _weights(runs[0]), _weights(runs[1])
    assert all(torch.equal(wa[n], wb[n]) for n in wa)


@pytest.mark.parametrize("K", [1, 2])
def test_every_trained_token_is_at_most_k_versions_old_and_the_task_learns(capfd, tmp_path, K):
    """20 steps of tiny-grpo (measured, seed 3: reward 0.10 -> 0.92 with K = 1 and 2; sync 0.95)."""
    res = run_inproc(capfd, "train", _recipe(tmp_path, "k", K, trainer__max_steps=20))
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = read_metrics(tmp_path / "k" / "run")
    lags = [(m["async/staleness_mean"], m["async/staleness_max"]) for m in metrics]
    # the first K + 1 batches are sampled with the starting weights, then every batch is K behind
    want = [float(min(i, K)) for i in range(20)]
    assert [mx for _, mx in lags] == want, lags
    assert [mean for mean, _ in lags] == want, lags    # every token of a batch: one version
    assert all(m["async/dropped"] == 0 and m["async/regenerated"] == 0 for m in metrics)
    # stale samples are corrected: tis weights pi_prox / pi_sample, off 1 once the lag is > 0
    assert "rollout correction tis" in res.stderr
    assert any(abs(m["rollout/is_weight_mean"] - 1.0) > 1e-3 for m in metrics[K:])
    rewards = [m["reward/mean"] for m in metrics]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert first < 0.2 and last > 0.6, [round(x, 3) for x in rewards]


def test_async_runs_with_recompute_and_the_chunked_head_are_equal_step_for_step(capfd, tmp_path, monkeypatch):
    """Issue 44.1: the producer samples while the trainer's recomputes (full gradient checkpointing,
    the output layer in chunks of 8 positions, each recomputed) fork, rewind and restore torch's
    global RNG. Sampling has an RNG of its own: two seeded K = 1 runs are equal step for step
    (before: different reward curves from step 2)."""
    monkeypatch.setattr("rltune.train.chunked_head.HEAD_CHUNK_ELEMS", 8 * 77)   # 8 positions of tiny-llama's vocab
    runs = []
    for sub in ("a", "b"):
        path = _recipe(tmp_path, sub, 1, trainer__max_steps=5, actor__gradient_checkpointing="full")
        res = run_inproc(capfd, "train", path)
        assert res.returncode == 0, res.stderr[-3000:]
        runs.append(read_metrics(tmp_path / sub / "run"))
    assert [m["step"] for m in runs[0]] == [1, 2, 3, 4, 5]
    assert _comparable(runs[0]) == _comparable(runs[1])


def test_a_resume_then_a_checkpoint_records_where_each_batch_ahead_began(capfd, tmp_path):
    """Issue 44.3, K = 2: a resume restores two batches generated ahead; the checkpoint after the
    next step must say where the one still ahead began, as the uninterrupted run's says. It used
    to record the current data position (past both): a resume from it that generates them again
    (here: its in-flight file gone) skipped a step's prompts."""
    import shutil

    kw = dict(trainer__max_steps=5, trainer__save_every=1, trainer__keep_checkpoints=10)
    res = run_inproc(capfd, "train", _recipe(tmp_path, "full", 2, **kw))
    assert res.returncode == 0, res.stderr[-3000:]
    full = tmp_path / "full" / "run"
    state = lambda d, n: json.loads((d / "checkpoints" / f"step-{n:08d}" / "state.json").read_text())  # noqa: E731
    assert state(full, 2)["async"]["inflight_steps"] == [3, 4]
    # resumed from the uninterrupted run's step 2: steps 3 and 4 restored, then checkpoint 3 written
    path = _recipe(tmp_path, "resumed", 2, **kw)
    run_dir = tmp_path / "resumed" / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(full / "checkpoints" / "step-00000002", run_dir / "checkpoints" / "step-00000002")
    res = run_inproc(capfd, "train", path, "--resume", "auto")
    assert res.returncode == 0, res.stderr[-3000:]
    got, want = state(run_dir, 3)["async"], state(full, 3)["async"]
    assert got["inflight_steps"] == want["inflight_steps"] == [4, 5]
    assert got["sampler_before"] == want["sampler_before"] and got["before"] == want["before"]
    # ... and a resume from it that must generate steps 4-5 again ends where the uninterrupted run ends
    ckpt = run_dir / "checkpoints" / "step-00000003"
    (ckpt / "inflight-rank0.pt").unlink()
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"].pop("inflight-rank0.pt")
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    res = run_inproc(capfd, "train", path, "--resume", str(ckpt))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "generated again (inflight-rank0.pt is missing)" in res.stderr
    assert state(run_dir, 5)["sampler"] == state(full, 5)["sampler"]


def _start(path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rltune", "train", str(path)], env=cli_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_after(path: Path, run_dir: Path, n: int) -> None:
    proc = _start(path)
    t0 = time.time()
    while time.time() - t0 < 300:
        done = run_dir / "metrics.jsonl"
        if done.exists() and len(done.read_text().splitlines()) >= n:
            break
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read()[-3000:])
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


STEPS = 8


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("async-full")
    path = _recipe(tmp, "a", 1, trainer__max_steps=STEPS, trainer__save_every=2, trainer__keep_checkpoints=4)
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-3000:]
    return tmp / "a" / "run"


def test_async_runs_are_deterministic_and_a_killed_run_resumes_to_the_same_result(uninterrupted, tmp_path):
    path = _recipe(tmp_path, "b", 1, trainer__max_steps=STEPS, trainer__save_every=2, trainer__keep_checkpoints=4)
    run_dir = tmp_path / "b" / "run"
    _kill_after(path, run_dir, 5)
    ckpts = sorted((run_dir / "checkpoints").glob("step-*"))
    assert ckpts and (ckpts[-1] / "inflight-rank0.pt").is_file()     # the batch generated ahead, saved
    state = json.loads((ckpts[-1] / "state.json").read_text())
    assert state["async"]["inflight_steps"] == [state["step"] + 1]
    res = run_cli("train", path, "--resume", "auto")
    assert res.returncode == 0, res.stderr[-3000:]
    got, want = _comparable(read_metrics(run_dir)), _comparable(read_metrics(uninterrupted))
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))
    assert got == want
    wa, wb = _weights(run_dir), _weights(uninterrupted)
    assert all(torch.equal(wa[n], wb[n]) for n in wa)


def test_a_resume_without_the_inflight_batches_generates_them_again_and_loses_no_prompt(uninterrupted, tmp_path):
    path = _recipe(tmp_path, "c", 1, trainer__max_steps=STEPS, trainer__save_every=2, trainer__keep_checkpoints=4)
    run_dir = tmp_path / "c" / "run"
    res = run_cli("train", path, "trainer.max_steps=4")      # ends at step 4 with its checkpoint
    assert res.returncode == 0, res.stderr[-3000:]
    last = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    state = json.loads((last / "state.json").read_text())
    assert state["step"] == 4 and state["async"]["inflight_steps"] == []   # nothing past max_steps generated
    # a checkpoint of a longer run (step 4 of 8: the batch of step 5 generated ahead), its file gone
    mid = sorted((uninterrupted / "checkpoints").glob("step-*"))
    src = next(p for p in mid if p.name.endswith("00004"))
    import shutil

    shutil.rmtree(run_dir)
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(src, run_dir / "checkpoints" / src.name)
    (run_dir / "checkpoints" / src.name / "inflight-rank0.pt").unlink()
    manifest = json.loads((run_dir / "checkpoints" / src.name / "manifest.json").read_text())
    manifest["files"].pop("inflight-rank0.pt")
    (run_dir / "checkpoints" / src.name / "manifest.json").write_text(json.dumps(manifest))
    res = run_cli("train", path, "--resume", "auto")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "generated again (inflight-rank0.pt is missing)" in res.stderr
    got = read_metrics(run_dir)
    assert [m["step"] for m in got] == [5, 6, 7, 8]
    assert [m["async/staleness_max"] for m in got] == [0.0, 1.0, 1.0, 1.0]   # regenerated with step 4's weights
    # no prompt lost or repeated: the data position at the end is the uninterrupted run's
    end = lambda d: json.loads((sorted((d / "checkpoints").glob("step-*"))[-1] / "state.json").read_text())["sampler"]  # noqa: E731
    assert end(run_dir) == end(uninterrupted)


def test_a_crafted_inflight_batch_is_generated_again_not_trained(uninterrupted, tmp_path):
    """Issue 45.11: an in-flight batch is data read back from a file; one with a token id outside the
    vocabulary crashed the resume (IndexError in the embedding). It is checked and generated again."""
    import hashlib
    import shutil

    path = _recipe(tmp_path, "d", 1, trainer__max_steps=STEPS, trainer__save_every=2, trainer__keep_checkpoints=4)
    run_dir = tmp_path / "d" / "run"
    src = next(p for p in sorted((uninterrupted / "checkpoints").glob("step-*")) if p.name.endswith("00004"))
    ckpt = run_dir / "checkpoints" / src.name
    shutil.copytree(src, ckpt)
    f = ckpt / "inflight-rank0.pt"
    batches = torch.load(f, weights_only=True)
    batches["5"]["exp"]["response_ids"][0, 0] = 10 ** 6
    torch.save(batches, f)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"][f.name] = {"size": f.stat().st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    res = run_cli("train", path, "--resume", "auto")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "generated again (inflight-rank0.pt is not readable (ValueError: response_ids holds token ids " \
           "outside the vocabulary" in res.stderr
    assert [m["step"] for m in read_metrics(run_dir)] == [5, 6, 7, 8]


# ---------------------------------------------------------------------- the staleness guard (unit)
def _batch(versions: list[int], G: int = 2, T: int = 3):
    from rltune.rollout.experience import Experience
    from rltune.train.sampling import Scored, StepBatch

    B = len(versions)
    exp = Experience(prompt_ids=torch.ones(B, 2, dtype=torch.long), prompt_mask=torch.ones(B, 2, dtype=torch.long),
                     response_ids=torch.arange(B * T).reshape(B, T), response_mask=torch.ones(B, T),
                     rollout_logp=torch.zeros(B, T), versions=torch.tensor(versions)[:, None].repeat(1, T))
    exp.scores = torch.arange(B, dtype=torch.float32)
    rows = [{"prompt": f"p{i // G}"} for i in range(B)]
    s = Scored(exp, [r["prompt"] for r in rows], [f"c{i}" for i in range(B)], rows, [[]] * B)
    return StepBatch(s, torch.full((B,), T), {})


def _guard(on_stale: str, policy: int, K: int = 1):
    from rltune.train.pipeline import Pipeline

    p = Pipeline.__new__(Pipeline)    # the bound check alone: no producer thread
    p.K, p.group, p.policy, p.on_stale, p.world = K, 2, policy, on_stale, 1
    return p


def test_groups_past_the_bound_are_dropped_whole():
    p = _guard("drop", policy=5)
    # groups of 2: versions 4 (lag 1: kept), 3 (lag 2: too old), one token of 2 (lag 3: the whole group goes)
    drawn, m = p._enforce_bound(_batch([4, 4, 3, 3, 4, 2]))
    assert drawn.batch.prompts == ["p0", "p0"] and drawn.batch.exp.size == 2
    assert m["async/dropped"] == 2 and m["async/staleness_max"] == 1 and m["async/regenerated"] == 0


def test_on_stale_drop_with_every_group_stale_generates_them_again_and_says_why(monkeypatch, caplog):
    """Issue 45.11: dropping every group would leave the step no batch; they are generated again,
    and the warning says so (it used to claim on_stale: regenerate)."""
    import logging
    import threading

    from rltune.train import pipeline

    p = _guard("drop", policy=5)
    p.cv, p.busy, p.error, p.next, p.allowed = threading.Condition(), False, None, 9, 9
    p.policy_of, p._producer_c = {7: 5}, None
    p.engine = type("E", (), {"pad_id": 0, "version": 7})()
    monkeypatch.setattr(pipeline, "rescore", lambda c, rows, **kw: (_batch([7] * (2 * len(rows))).batch,
                                                               torch.full((2 * len(rows),), 3)))
    with caplog.at_level(logging.WARNING, logger="rltune"):
        drawn, m = p._enforce_bound(_batch([3, 3, 2, 2]))
    assert drawn.batch.exp.size == 4 and m["async/regenerated"] == 2 and m["async/dropped"] == 0
    assert "every group was stale and on_stale: drop would leave the step no batch" in caplog.text


def test_groups_past_the_bound_are_generated_again(monkeypatch):
    from rltune.train import pipeline

    p = _guard("regenerate", policy=5)
    import threading

    p.cv, p.busy, p.error, p.next, p.allowed = threading.Condition(), False, None, 9, 9
    p.policy_of = {7: 5}
    p.engine = type("E", (), {"pad_id": 0, "version": 7})()
    p._producer_c = None
    asked = []

    def fresh(c, rows, **kw):
        asked.extend(r["prompt"] for r in rows)
        b = _batch([7] * (2 * len(rows)))       # the engine's label of the weights of step 5
        return b.batch, b.lengths

    monkeypatch.setattr(pipeline, "rescore", fresh)
    drawn, m = p._enforce_bound(_batch([4, 4, 3, 3]))
    assert asked == ["p1"]                        # only the stale group's prompt, once
    assert drawn.batch.exp.size == 4 and m["async/regenerated"] == 1
    assert m["async/staleness_max"] == 1          # the kept group; the new one has lag 0
    assert drawn.batch.exp.versions[2:].eq(5).all()
    assert p.allowed == 9                         # the producer is let go again


def test_a_rollback_discards_the_batches_generated_with_the_rolled_back_weights(capfd, tmp_path):
    """autotune's rollback under K = 1: a hard spike at step 6 restores checkpoint 4; the batch
    generated ahead with the spiking weights is discarded, and the steps taken again start from
    batches sampled with the restored weights (lag 0, then the schedule's 1), none past the bound."""
    rollback = {"enabled": True, "mode": "act", "rollback": True, "rollback_every": 2, "max_rollbacks": 1}
    path = _recipe(tmp_path, "rb", 1, trainer__max_steps=8, trainer__keep_checkpoints=10, autotune=rollback,
                   reward__normalize=True)
    res = run_inproc(capfd, "train", path, env=dict(RLTUNE_FAULTS="actor_inf@5,actor_inf@6"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "goes back to step 4" in res.stderr
    m = read_metrics(tmp_path / "rb" / "run")
    assert [x["step"] for x in m] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    assert [x["async/staleness_max"] for x in m] == [0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert all(x["async/dropped"] == 0 and x["async/regenerated"] == 0 for x in m)
    assert all(x["actor/skipped_updates"] == 0 for x in m[6:])
    # issue 44.5: the reward normaliser counts the batches of the steps kept, 4 before the rollback and
    # 4 after (as a synchronous run with the same rollback), not the batch checkpoint 4 had generated ahead
    last = sorted((tmp_path / "rb" / "run" / "checkpoints").glob("step-*"))[-1]
    assert json.loads((last / "state.json").read_text())["rewards"]["count"] == 8 * 64
