"""Two CPU ranks through a launcher (torchrun or DeepSpeed's, gloo) give the metrics of one rank.

Greedy PPO makes the rollout deterministic, so the only differences left are the split of the
global batch across ranks (gradient averaging, global advantage whitening, gathered metrics)."""

from __future__ import annotations

import pytest

from trainlib import read_metrics, run_cli

KEYS = ["reward/mean", "reward/std", "kl", "actor/loss", "actor/grad_norm", "critic/loss",
        "critic/grad_norm", "critic/explained_var", "response/length_mean", "actor/entropy"]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    from trainlib import tiny_recipe

    tmp = tmp_path_factory.mktemp("one")
    path = tiny_recipe(tmp, "tiny-ppo.yaml", rollout__do_sample=False, trainer__max_steps=3, trainer__eval_every=0)
    res = run_cli("train", path, "--quiet")
    assert res.returncode == 0, res.stderr[-3000:]
    return read_metrics(tmp / "run")


@pytest.mark.parametrize("launcher,shows", [("torchrun", "rltune.train.torchrun --nproc_per_node 2"),
                                            ("deepspeed", "deepspeed.launcher.runner --num_gpus 2")])
def test_two_ranks_match_one(one_rank, recipe_factory, tmp_path, launcher, shows):
    common = dict(rollout__do_sample=False, trainer__max_steps=3, trainer__eval_every=0)
    m1 = one_rank
    two = recipe_factory("tiny-ppo.yaml", trainer__output_dir=str(tmp_path / "run2"), **common)
    res = run_cli("train", two, "--nproc", "2", "--launcher", launcher, "--quiet")
    assert res.returncode == 0, res.stderr[-3000:]
    assert shows in res.stderr
    m2 = read_metrics(tmp_path / "run2")
    assert len(m1) == len(m2) == 3
    for a, b in zip(m1, m2):
        for k in KEYS:
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5), (a["step"], k, a[k], b[k])
    assert (tmp_path / "run2" / "final" / "config.json").exists()


@pytest.mark.slow
def test_two_ranks_with_sampling_learn_like_one(tmp_path):
    """Sampling on: the ranks draw different samples, so the runs are not identical, but a
    2-rank GRPO run must learn like a 1-rank one (per-rank statistics would show here)."""
    from trainlib import tiny_recipe

    def run(sub: str, *extra) -> list[float]:
        d = tmp_path / sub
        d.mkdir()
        path = tiny_recipe(d, "tiny-grpo.yaml", trainer__max_steps=16, trainer__eval_every=0, trainer__seed=5,
                           train__updates_per_step=2, train__batch_size=32)
        res = run_cli("train", path, *extra, "--quiet")
        assert res.returncode == 0, res.stderr[-3000:]
        return [m["reward/mean"] for m in read_metrics(d / "run")]

    one, two = run("one"), run("two", "--nproc", "2")
    rise = [sum(r[-3:]) / 3 - sum(r[:3]) / 3 for r in (one, two)]
    assert rise[0] > 0.2 and rise[1] > 0.2, (one, two)
    assert abs(rise[0] - rise[1]) < 0.35, (one, two)
