"""A newcomer's first hour (issue 26, items 5 and 8): messages that agree with themselves,
`presets apply` that writes only what changes and drops the waivers it made stale, and the small
things a first user trips on (did-you-mean, an override without `=`, the `-o` list, what a reward
function's prompts are)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_GRPO = ROOT / "recipes" / "tiny-grpo.yaml"
MINIMAL = "model:\n  policy: builtin:tiny-llama\ndata:\n  train: builtin:arithmetic\nreward:\n  functions: [builtin:exact_answer]\n"


# -- 5b: no negative zero in the [Rollout] line -------------------------------------------------

def test_rollout_line_prints_a_kl_that_rounds_to_zero_as_zero():
    from rltune.train.progress import StepClock, step_line

    clock = StepClock(10, 0, clock=iter([0.0, 1.0]).__next__)
    clock.tick(1)
    line = step_line(1, {"reward/mean": -1e-7, "kl": -3e-9}, clock, {})
    assert line.startswith("[Rollout] step=1 avg_reward=0.0000 kl=0.0000 |"), line
    assert "-0.0000" not in line
    line = step_line(2, {"reward/mean": 0.5, "kl": -0.0012}, clock, {})
    assert "kl=-0.0012" in line                      # a real negative value keeps its sign


# -- 5c, 5d: presets apply ----------------------------------------------------------------------

def test_presets_apply_drops_the_waiver_the_preset_made_stale(cli, tmp_path):
    out_path = tmp_path / "out.yaml"
    code, out = cli("presets", "apply", "cold-start", str(TINY_GRPO), "--output", str(out_path))
    assert code == 0, out
    assert "actor.lr: 0.01 -> 1.0e-06" in out
    assert "lint.waive.actor-lr-range:" in out and "removed" in out, out
    written = out_path.read_text()
    assert "lint:" not in written and "waive" not in written, written
    assert "far above the playbook range" not in written       # the comment that pointed at the waiver
    assert "info actor-lr-range" not in out and "warning actor-lr-range" not in out   # no finding left


def test_presets_apply_keeps_a_waiver_whose_rule_still_fires(cli, tmp_path):
    out_path = tmp_path / "out.yaml"
    code, out = cli("presets", "apply", "acceleration", str(TINY_GRPO), "--output", str(out_path))
    assert code == 0, out
    assert "lint.waive" not in out
    assert "actor-lr-range:" in out_path.read_text()


def test_presets_apply_writes_only_values_that_change(cli, tmp_path):
    src = tmp_path / "r.yaml"
    src.write_text(MINIMAL, encoding="utf-8")
    out_path = tmp_path / "out.yaml"
    code, out = cli("presets", "apply", "acceleration", str(src), "--output", str(out_path))
    assert code == 0, out
    assert "clip_range" not in out and "clip_range" not in out_path.read_text(), out
    assert "clip-inactive" not in out
    assert "algorithm.kl.coef: unset (default 0.05) -> 0.02" in out


# -- 8a: did-you-mean for recipes ---------------------------------------------------------------

def test_recipes_copy_unknown_name_says_did_you_mean(cli, tmp_path):
    code, out = cli("recipes", "copy", "tiny-grp", str(tmp_path / "x.yaml"))
    assert code == 2
    assert "did you mean `tiny-grpo`?" in out, out


# -- 8b: an override without `=` ----------------------------------------------------------------

@pytest.mark.parametrize("command", ["validate", "plan", "train"])
def test_override_without_value_is_named_as_such(cli, tmp_path, command):
    src = tmp_path / "r.yaml"
    src.write_text(MINIMAL, encoding="utf-8")
    code, out = cli(command, str(src), "actor.lr")
    assert code == 2
    assert "`actor.lr` looks like an override without a value: write actor.lr=VALUE" in out, out
    assert "recipe file `actor.lr` not found" not in out


def test_a_missing_second_recipe_is_still_a_missing_file(cli, tmp_path):
    src = tmp_path / "r.yaml"
    src.write_text(MINIMAL, encoding="utf-8")
    code, out = cli("validate", str(src), str(tmp_path / "other.yaml"))
    assert code == 2 and "not found" in out and "override without a value" not in out


# -- 8c, 8d: docs -------------------------------------------------------------------------------

def test_readme_options_sentence_lists_every_command_that_takes_o():
    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    start = text.index("`-o/--set KEY=VALUE` sets a recipe key")
    sentence = text[start:text.index(";", start)]
    for cmd in ("validate", "plan", "train"):
        assert f"`{cmd}`" in sentence, sentence


def test_docs_say_reward_function_prompts_are_raw():
    text = " ".join((ROOT / "docs" / "training.md").read_text(encoding="utf-8").split())
    at = text.index("A reward function receives the prompts")
    assert "Prompts are raw, never chat-templated" in text[at:at + 1500]
