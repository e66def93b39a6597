"""Issue 49 item 6 end to end: recipes/check-agent.yaml, an agent that checks its answer in a fresh
conversation holding a note of it, so every episode whose first turn ended has a prefix break. With
rollout.prefix_break: rows both samples train as rows of their own (SmolLM2-135M, hf engine, the
CLI)."""

from __future__ import annotations

import pytest

from trainlib import ROOT, read_metrics, run_cli, run_inproc

RECIPE = str(ROOT / "recipes" / "check-agent.yaml")
SMALL = ["trainer.max_steps=1", "rollout.batch_size=8", "train.batch_size=8", "algorithm.group_size=2",
         "train.micro_batch_size=4", "--resume", "never"]


def test_the_samples_before_a_break_train_as_rows_sampled_from_their_own_prompts(capfd, tmp_path):
    """Every trained token of every row, the first answers' included, was sampled from exactly that
    row's prompt and tokens: the actor's recomputed log-probs equal the engine's (fp32, hf)."""
    run = tmp_path / "run"
    res = run_inproc(capfd, "train", RECIPE, f"trainer.output_dir={run}", *SMALL)
    assert res.returncode == 0, res.stderr[-3000:]
    m = read_metrics(run)
    assert len(m) == 1
    assert sum(x["episode/prefix_breaks"] for x in m) > 0
    for x in m:
        # rows per episode: 1 + its break; the first answers are rows, not context
        assert x["episode/samples_mean"] == pytest.approx(1 + x["episode/prefix_breaks"] / 8)
        assert x["episode/untrained_tokens"] == 0
        assert x["rollout/logprob_diff_max"] < 1e-3, x
        assert x["actor/grad_norm"] > 0


@pytest.mark.slow
def test_two_ranks_with_prefix_breaks_match_one_rank(tmp_path):
    """Greedy REINFORCE++ (one episode per prompt; returns whitened over every rank's tokens): the
    ranks' episodes break differently, so they hold different numbers of rows, and the run's
    figures are the 1-rank run's."""
    common = ["rollout.do_sample=false", "algorithm.name=reinforce_pp", "algorithm.group_size=1",
              "trainer.max_steps=2", "rollout.batch_size=4", "train.batch_size=8", "train.micro_batch_size=2",
              "--resume", "never", "--quiet"]
    runs = {}
    for n in (1, 2):
        run = tmp_path / f"r{n}"
        res = run_cli("train", RECIPE, f"trainer.output_dir={run}", *common, *(["--nproc", "2"] if n == 2 else []),
                      timeout=900)
        assert res.returncode == 0, res.stderr[-3000:]
        runs[n] = read_metrics(run)
    assert sum(x["episode/prefix_breaks"] for x in runs[1]) > 0
    assert any(0 < x["episode/prefix_breaks"] < 8 for x in runs[1])          # some episodes broke, some did not
    for a, b in zip(runs[1], runs[2], strict=True):
        for k in ("reward/mean", "kl", "actor/loss", "actor/grad_norm", "episode/samples_mean", "response/length_mean",
                  "rollout/logprob_diff_max"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5), (a["step"], k, a[k], b[k])


@pytest.mark.slow
def test_generation_ahead_carries_the_rows_before_a_break_through_a_checkpoint(tmp_path):
    """max_staleness 1: the batch of step 3, generated ahead, is saved at step 2 with its samples
    before a break (inflight-rank0.pt, `earlier`); a resume from that checkpoint trains it and ends
    with the uninterrupted run's figures."""
    import json
    import shutil

    import torch

    common = ["rollout.asynchronous.max_staleness=1", "trainer.max_steps=3", "trainer.save_every=2",
              "rollout.batch_size=8", "train.batch_size=8", "algorithm.group_size=2", "train.micro_batch_size=4",
              "--quiet"]
    full = tmp_path / "full"
    res = run_cli("train", RECIPE, f"trainer.output_dir={full}", *common, "--resume", "never", timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    ckpt = full / "checkpoints" / "step-00000002"
    saved = torch.load(ckpt / "inflight-rank0.pt", weights_only=True)
    assert "earlier" in saved["3"] and saved["3"]["earlier"]["owner"].numel() > 0
    assert json.loads((ckpt / "state.json").read_text())["async"]["inflight_steps"] == [3]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(ckpt, resumed / "checkpoints" / ckpt.name)
    res = run_cli("train", RECIPE, f"trainer.output_dir={resumed}", *common, "--resume", "auto", timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "generated again" not in res.stderr
    want, got = read_metrics(full)[-1], read_metrics(resumed)[-1]
    assert got["step"] == want["step"] == 3
    for k in ("reward/mean", "kl", "actor/loss", "episode/samples_mean", "async/staleness_max"):
        assert got[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), (k, got[k], want[k])
