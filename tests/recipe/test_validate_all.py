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
