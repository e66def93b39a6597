"""Checkpoints: SIGKILL + --resume auto equals the uninterrupted run; SIGINT saves and exits
130; a truncated checkpoint falls back to the previous one; a changed recipe is refused."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainlib import ROOT, cli_env, read_metrics, run_cli, tiny_recipe

STEPS = 8
VOLATILE = ("timing/", "throughput/", "episode/env_time")  # wall-clock figures differ between any two runs


def _recipe(tmp_path: Path, sub: str) -> Path:
    d = tmp_path / sub
    d.mkdir()
    return tiny_recipe(d, "tiny-ppo.yaml", trainer__max_steps=STEPS, trainer__save_every=2,
                       trainer__keep_checkpoints=3, trainer__seed=7, trainer__eval_every=0)


def _comparable(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in metrics]


def _start(path: Path, *extra) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rltune", "train", str(path), *extra], env=cli_env(),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_steps(run_dir: Path, n: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    path = run_dir / "metrics.jsonl"
    t0 = time.time()
    while time.time() - t0 < timeout:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError("timed out waiting for steps")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    path = _recipe(tmp, "a")
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    return tmp / "a" / "run"


def test_sigkill_then_resume_auto_matches_uninterrupted(uninterrupted, tmp_path):
    kill_after = random.Random().randint(3, 6)   # a random step, past the first checkpoint
    path = _recipe(tmp_path, "b")
    run_dir = tmp_path / "b" / "run"
    proc = _start(path)
    _wait_for_steps(run_dir, kill_after, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(read_metrics(run_dir)) >= kill_after
    res = run_cli("train", path, "--resume", "auto")
    assert res.returncode == 0, res.stderr[-4000:]
    assert "resumed from" in res.stderr
    got, want = _comparable(read_metrics(run_dir)), _comparable(read_metrics(uninterrupted))
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))  # replaced, not duplicated
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in g:
            assert g[k] == pytest.approx(w[k], rel=1e-5, abs=1e-7), (g["step"], k, g[k], w[k])


def test_sigint_saves_and_exits_130(tmp_path):
    path = _recipe(tmp_path, "c")
    run_dir = tmp_path / "c" / "run"
    proc = _start(path)
    _wait_for_steps(run_dir, 1, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    assert "--resume auto" in err
    ckpts = sorted((run_dir / "checkpoints").glob("step-*"))
    assert ckpts and (ckpts[-1] / "manifest.json").exists()
    step = json.loads((ckpts[-1] / "manifest.json").read_text())["step"]
    assert step == len(read_metrics(run_dir))


def test_truncated_checkpoint_falls_back_to_previous(uninterrupted, tmp_path, caplog):
    import logging
    import shutil

    from rltune.train import checkpoint as ckpt

    run_dir = tmp_path / "copy"
    shutil.copytree(uninterrupted, run_dir)
    ckpts = sorted((run_dir / "checkpoints").glob("step-*"))
    assert [p.name for p in ckpts][-1] == f"step-{STEPS:08d}"
    victim = max((p for p in ckpts[-1].rglob("*.pt")), key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    log = logging.getLogger("test")
    with caplog.at_level(logging.WARNING, logger="test"):
        chosen = ckpt.find_resumable(run_dir, log)
    assert chosen == ckpts[-2]
    assert "truncated" in caplog.text
    # a checkpoint whose save never finished (no manifest) is skipped too
    (ckpts[-2] / "manifest.json").unlink()
    assert ckpt.find_resumable(run_dir, log) == ckpts[-3]


def test_resume_with_changed_recipe_is_refused(uninterrupted, tmp_path):
    import shutil

    import yaml

    d = tmp_path / "d"
    shutil.copytree(uninterrupted, d / "run")
    data = yaml.safe_load((uninterrupted / "recipe.yaml").read_text())
    data["trainer"]["output_dir"] = str(d / "run")
    data["trainer"]["max_steps"] = STEPS + 1
    data["actor"]["lr"] = 7e-3
    path = d / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    res = run_cli("train", path, "--resume", "auto")
    assert res.returncode == 1
    assert "actor.lr: 0.01 -> 0.007" in res.stderr and "--allow-recipe-change" in res.stderr
    assert "Traceback" not in res.stderr
    res = run_cli("train", path, "--resume", "auto", "--allow-recipe-change")
    assert res.returncode == 0, res.stderr[-3000:]
    assert [m["step"] for m in read_metrics(d / "run")] == list(range(1, STEPS + 2))


def _killed_and_resumed(recipe) -> list[dict]:
    """Runs recipe("full") to its end, and recipe("killed") SIGKILLed after step 3 then resumed with
    --resume auto; asserts both logged the same metrics (wall-clock figures apart), returns them."""
    full = recipe("full")
    res = run_cli("train", full)
    assert res.returncode == 0, res.stderr[-4000:]
    path = recipe("killed")
    run_dir = path.parent / "run"
    proc = _start(path)
    _wait_for_steps(run_dir, 3, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = run_cli("train", path, "--resume", "auto")
    assert res.returncode == 0 and "resumed from" in res.stderr, res.stderr[-4000:]
    got, want = _comparable(read_metrics(run_dir)), _comparable(read_metrics(full.parent / "run"))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in g:
            assert g[k] == pytest.approx(w[k], rel=1e-5, abs=1e-7), (path, g["step"], k, g[k], w[k])
    return got


@pytest.mark.parametrize("algo,extra", [
    ("grpo", {"train__updates_per_step": 2, "reward__normalize": True}),
    pytest.param("rloo", {"algorithm__kl": {"coef": 0.02, "mode": "loss", "estimator": "k3"}}, marks=pytest.mark.slow),
    pytest.param("reinforce_pp", {"train__ppo_epochs": 2}, marks=pytest.mark.slow),
])
def test_sigkill_then_resume_matches_uninterrupted_for_every_algorithm(tmp_path, algo, extra):
    """PPO is covered above; the other algorithms (sampling on, several updates, the reward
    normaliser, KL in the loss) resume into the same run too."""
    def recipe(sub: str) -> Path:
        d = tmp_path / sub
        d.mkdir()
        return tiny_recipe(d, "tiny-grpo.yaml", algorithm__name=algo, trainer__max_steps=4, trainer__save_every=2,
                           trainer__keep_checkpoints=3, trainer__seed=3, trainer__eval_every=0,
                           train__batch_size=32, train__micro_batch_size=16, **extra)

    got = _killed_and_resumed(recipe)
    assert [m["step"] for m in got] == [1, 2, 3, 4]


def test_sigkill_then_resume_matches_uninterrupted_with_episodes(tmp_path):
    """rollout.env (recipes/tiny-guess.yaml, 4 steps): the episodes after a resume are the ones the
    uninterrupted run played, step for step (the environment's reward and the episode metrics too)."""
    def recipe(sub: str) -> Path:
        d = tmp_path / sub
        d.mkdir()
        return tiny_recipe(d, "tiny-guess.yaml", trainer__max_steps=4, trainer__save_every=2, trainer__keep_checkpoints=3,
                           trainer__seed=3, trainer__eval_every=0)

    got = _killed_and_resumed(recipe)
    assert [m["step"] for m in got] == [1, 2, 3, 4] and "episode/turns_mean" in got[-1]


def test_seed_null_is_kept_across_resume(tmp_path):
    """trainer.seed: null draws a seed once; the checkpoint keeps it, so a resumed run builds
    the same builtin data and sampler order instead of drawing another."""
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", trainer__seed=None, trainer__max_steps=1, trainer__eval_every=0)
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = tmp_path / "run"
    first = json.loads((run_dir / "checkpoints" / "step-00000001" / "state.json").read_text())
    assert isinstance(first["seed"], int)
    res = run_cli("train", path, "trainer.max_steps=2", "--resume", "auto")
    assert res.returncode == 0, res.stderr[-3000:]
    second = json.loads((run_dir / "checkpoints" / "step-00000002" / "state.json").read_text())
    assert second["seed"] == first["seed"]
