"""`validate` reports every problem in one run (issue 14, item 3): schema findings first, then
the lint rules over what the schema left, silent where a rule would judge a dropped key."""

from __future__ import annotations

import json

RECIPE = """\
model:
  policy: builtin:tiny-llama
data:
  train: builtin:arithmetic
reward:
  functions: [builtin:exact_answer]
algorithm:
  name: ppo
actor:
  lr: 2.0e-6
  warmup_steps: 5
critic:
  lr: 1.0e-6
  warmup_steps: 5
rollout:
  batch_size: 8
train:
  batch_size: 16
  micro_batch_size: 4
trainer:
  seed: 1
  max_step: 10
"""


def test_typo_lr_order_and_ratio_in_one_text_run(cli, write):
    path = write(RECIPE)
    code, out = cli("validate", path)
    assert code == 1
    lines = [ln for ln in out.splitlines() if ": error " in ln or ": warning " in ln]
    assert lines == [
        f"{path}:22:3: error schema: unknown key `trainer.max_step`",
        f"{path}:13:3: error lr-order: actor.lr 2.0e-06 is above critic.lr 1.0e-06: the critic must learn faster "
        "than the actor, else critic error becomes actor gradient noise; equal rates gave periodic reward "
        "oscillation after epoch 3",
        f"{path}:18:3: warning batch-ratio-low: train.batch_size / rollout.batch_size = 16/8 = 2, below the golden "
        "ratio 4-8: few generation calls per update means a noisy gradient; raising the ratio 2 -> 6 gave 3.2x "
        "faster reward convergence",
    ]
    assert "    fix: did you mean `trainer.max_steps`?" in out
    assert f"{path}: FAILED — 2 error(s), 1 warning(s), 0 info" in out


def test_typo_lr_order_and_ratio_in_one_json_run(cli, write):
    code, out = cli("validate", write(RECIPE), "--format", "json")
    assert code == 1
    assert [(f["rule"], f["severity"], f["path"]) for f in json.loads(out)] == [
        ("schema", "error", "trainer.max_step"),
        ("lr-order", "error", "critic.lr"),
        ("batch-ratio-low", "warning", "train.batch_size"),
    ]


def test_rules_that_read_a_dropped_key_stay_silent(cli, write):
    """`actor.lrr` (meant: actor.lr) is dropped: lr-order would compare the default actor.lr,
    which the user did not choose, so it says nothing; the ratio warning still shows."""
    code, out = cli("validate", write(RECIPE.replace("  lr: 2.0e-6", "  lrr: 2.0e-6")), "--format", "json")
    assert code == 1
    assert [(f["rule"], f["path"]) for f in json.loads(out)] == [
        ("schema", "actor.lrr"), ("schema", "trainer.max_step"), ("batch-ratio-low", "train.batch_size")]


def test_a_bad_value_is_reported_and_its_rules_skipped(cli, write):
    code, out = cli("validate", write(RECIPE.replace("  batch_size: 16", "  batch_size: many")),
                       "--format", "json")
    assert code == 1
    found = [(f["rule"], f["path"]) for f in json.loads(out)]
    assert found == [("schema", "train.batch_size"), ("schema", "trainer.max_step"), ("lr-order", "critic.lr")]


# ---------------------------------------------------------------- validate checks what train loads (issue 26, item 4)

REWARDS = """\
import math
from typing import Any as _Any

SCALE = 2.0


def score(completions, **kwargs):
    return [0.0 for _ in completions]


async def length_bonus(completions, **kwargs):
    return [0.0 for _ in completions]
"""


def _reward_recipe(write, spec: str, code: str = REWARDS) -> str:
    write(code, "rewards.py")
    return write(RECIPE.replace("  max_step: 10\n", "  max_steps: 10\n").replace(
        "[builtin:exact_answer]", f"[{spec}]"))


def test_reward_function_missing_from_its_file_is_an_input_error(cli, write):
    path = _reward_recipe(write, "rewards.py:scroe")
    code, out = cli("validate", path, "--format", "json")
    assert code == 2, out
    [f] = [f for f in json.loads(out) if f["rule"] == "input"]
    assert f["severity"] == "error" and f["path"] == "reward.functions.0"
    assert "rewards.py" in f["message"] and "`scroe`" in f["message"]
    assert "`score`" in f["message"] and "`length_bonus`" in f["message"]   # what the file defines
    assert "did you mean `rewards.py:score`?" in f["fix"]


def test_reward_names_a_file_binds_pass(cli, write):
    for spec in ("rewards.py:score", "rewards.py:length_bonus", "rewards.py:SCALE", "rewards.py:math"):
        code, out = cli("validate", _reward_recipe(write, spec), "--format", "json")
        assert [f for f in json.loads(out) if f["rule"] == "input"] == [], (spec, out)
    # imports, try/except fallbacks and `global` bind names too
    code = ("try:\n    from fancy import grade\nexcept ImportError:\n    def grade(c, **k):\n        return [0.0] * len(c)\n"
            "from os import path as p2\n")
    for spec in ("rewards.py:grade", "rewards.py:p2"):
        _, out = cli("validate", _reward_recipe(write, spec, code), "--format", "json")
        assert [f for f in json.loads(out) if f["rule"] == "input"] == [], (spec, out)


def test_reward_file_with_module_getattr_is_not_refused(cli, write):
    code = "def __getattr__(name):\n    return lambda completions, **k: [0.0] * len(completions)\n"
    _, out = cli("validate", _reward_recipe(write, "rewards.py:anything", code), "--format", "json")
    assert [f for f in json.loads(out) if f["rule"] == "input"] == []


def test_reward_file_is_read_not_run(cli, write, tmp_path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('x')\n\ndef score(c, **k):\n    return [0.0] * len(c)\n"
    _, out = cli("validate", _reward_recipe(write, "rewards.py:nope", code), "--format", "json")
    assert [f["rule"] for f in json.loads(out)].count("input") == 1
    assert not marker.exists()


def _trainlib():
    import importlib.util
    from pathlib import Path

    p = Path(__file__).resolve().parents[1] / "train" / "trainlib.py"
    spec = importlib.util.spec_from_file_location("trainlib_for_recipe_tests", p)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_run_that_fails_before_step_one_leaves_no_run_directory(capfd, tmp_path):
    """`train` does not run the file checks: it fails loading the reward, before its first step;
    the run directory it created is gone, and a directory that was there (a run with a checkpoint) keeps
    everything it held."""
    tl = _trainlib()
    (tmp_path / "rewards.py").write_text(REWARDS)
    recipe = tl.tiny_recipe(tmp_path, reward__functions=["rewards.py:scroe"], trainer__output_dir=str(tmp_path / "runs" / "new"))
    res = tl.run_inproc(capfd, "train", recipe)
    assert res.returncode != 0 and "scroe" in res.stderr, res.stderr
    assert not (tmp_path / "runs" / "new").exists()
    assert not (tmp_path / "runs").exists()

    for resume in ("never", "auto"):
        old = tmp_path / f"old-{resume}"
        ckpt = old / "checkpoints" / "step-000002"
        ckpt.mkdir(parents=True)
        (ckpt / "state.json").write_text("{}")
        (old / "train.log").write_text("the old run's log\n")
        (old / "notes.txt").write_text("mine\n")
        had = {p.name: p.read_text() for p in old.rglob("*") if p.is_file()}
        recipe = tl.tiny_recipe(tmp_path, reward__functions=["rewards.py:scroe"], trainer__output_dir=str(old))
        res = tl.run_inproc(capfd, "train", recipe, "--resume", resume)
        assert res.returncode != 0, res.stderr
        assert old.is_dir()
        now = {}
        for p in old.rglob("*"):
            if p.is_file():
                now.setdefault(p.name, []).append(p.read_text())
        for name, text in had.items():   # everything it held is still there (perhaps moved aside, never deleted)
            assert any(t.startswith(text) for t in now.get(name, [])), (resume, name, now)
