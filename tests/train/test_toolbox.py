"""The 2026 toolbox end to end through the CLI on the tiny model: GSPO, CISPO and the DAPO preset
learn, and each reports the metrics that say what it did."""

from __future__ import annotations

import json
import math

import pytest

from trainlib import read_metrics, run_inproc

STEPS = 16


def _mean(xs):
    return sum(xs) / len(xs)


CASES = {
    "gspo": dict(algorithm__ratio_level="sequence", algorithm__clip_range=3e-4, algorithm__clip_range_high=4e-4,
                 algorithm__loss_agg="seq-mean-token-mean"),
    "gspo-token": dict(algorithm__ratio_level="sequence-token", algorithm__clip_range=3e-4,
                       algorithm__clip_range_high=4e-4, algorithm__loss_agg="seq-mean-token-mean"),
    "cispo": dict(algorithm__policy_loss="cispo", algorithm__clip_range=1.0, algorithm__clip_range_high=0.28),
    # the preset, with an overlong buffer that fits the tiny recipe's 6 new tokens
    "dapo": dict(preset="dapo", reward__overlong={"buffer": 2, "penalty": 0.5}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_toolbox_learns_through_the_cli(capfd, recipe_factory, tmp_path, case):
    path = recipe_factory("tiny-grpo.yaml", trainer__seed=1, trainer__max_steps=STEPS,
                          trainer__eval_every=STEPS, **CASES[case])
    res = run_inproc(capfd, "train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "Traceback" not in res.stderr
    metrics = read_metrics(tmp_path / "run")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for m in metrics:
        for k in ("actor/ratio_mean", "actor/ratio_max", "rollout/zero_std_frac"):
            assert math.isfinite(m[k]), (m["step"], k)
        # one update per step: the update's own forward is pi_old, every ratio is exactly 1
        assert m["actor/ratio_mean"] == pytest.approx(1.0, abs=1e-6)
        assert m["actor/ratio_max"] == pytest.approx(1.0, abs=1e-6)
    if case.startswith("gspo"):
        assert all(m["actor/clipfrac_seq"] == 0.0 for m in metrics)
    if case == "dapo":
        for m in metrics:
            gen = m["rollout/groups_generated"]
            assert gen == sum(m[f"rollout/groups_{k}"] for k in ("kept", "dropped", "topped_up", "surplus"))
            assert m["rollout/groups_kept"] + m["rollout/groups_topped_up"] == 16     # the batch is full
            assert m["rollout/gen_calls"] >= 4
            assert "reward/overlong" in m
    ev = json.loads((tmp_path / "run" / "eval.json").read_text())
    # learning: held-out greedy reward rises (the sampled mean is biased upward by filtering)
    assert ev["after"] > ev["before"] + 0.1, ev
    if case != "dapo":
        rewards = [m["reward/mean"] for m in metrics]
        assert _mean(rewards[-3:]) > _mean(rewards[:3]) + 0.2, rewards
