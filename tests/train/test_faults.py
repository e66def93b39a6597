"""Injected faults: a NaN/Inf never reaches the weights; repeated skips stop the run."""

from __future__ import annotations

from trainlib import read_metrics, run_inproc


def test_injected_inf_loss_is_skipped_and_reported(capfd, recipe_factory, tmp_path):
    path = recipe_factory("tiny-ppo.yaml", trainer__max_steps=3, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path, env=dict(RLTUNE_FAULTS="actor_inf@2,critic_nan@2"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Critic loss NaN at step 2" in res.stderr
    assert "actor update was skipped" in res.stderr
    m = read_metrics(tmp_path / "run")
    assert m[1]["health/skipped_steps"] == 1 and m[2]["health/skipped_steps"] == 0
    assert m[1]["actor/skipped_updates"] == 1 and m[0]["actor/skipped_updates"] == 0


def test_consecutive_skips_stop_the_run_with_a_checkpoint(capfd, recipe_factory, tmp_path):
    path = recipe_factory("tiny-grpo.yaml", trainer__max_steps=10, trainer__eval_every=0,
                          health={"max_skipped_steps": 2})
    res = run_inproc(capfd, "train", path, env=dict(RLTUNE_FAULTS="actor_inf@2,actor_inf@3"))
    assert res.returncode == 1
    assert "2 steps in a row" in res.stderr and "Traceback" not in res.stderr
    assert len(read_metrics(tmp_path / "run")) == 3


def test_reward_nan_injected_names_the_sample(capfd, recipe_factory, tmp_path):
    path = recipe_factory("tiny-grpo.yaml", trainer__max_steps=3, trainer__save_every=1, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path, env=dict(RLTUNE_FAULTS="reward_nan@2"))
    assert res.returncode == 1
    assert "reward for sample 0" in res.stderr and "nan" in res.stderr
    assert (tmp_path / "run" / "checkpoints" / "step-00000001" / "manifest.json").exists()  # intact


def test_skipped_sync_trips_the_stale_weight_guard_hf(capfd, recipe_factory, tmp_path):
    import json

    path = recipe_factory("tiny-grpo.yaml", trainer__max_steps=3, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path, env=dict(RLTUNE_FAULTS="skip_sync@1"))
    assert res.returncode == 0, res.stderr[-3000:]
    m = read_metrics(tmp_path / "run")
    assert m[0]["rollout/logprob_diff_mean"] < 1e-3          # hf engine: same weights, same numbers
    assert m[1]["rollout/logprob_diff_mean"] > 0.05          # sampled from the pre-update weights
    assert "Stale rollout weights" in res.stderr
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "stale_weights" and e["step"] == 2 for e in events)
