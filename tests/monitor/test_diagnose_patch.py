"""`diagnose --patch` writes the user's recipe with only the changed keys edited (issue 14, item 4)."""

from __future__ import annotations

import yaml

from rltune.commands.diagnose import run
from rltune.recipe.yamlio import edit_yaml_text
from synth import RECIPE, fault, write_run

USER = """\
# my PPO run
model:
  policy: builtin:tiny-llama   # tiny, offline
data:
  train: builtin:arithmetic
reward:
  functions: [builtin:exact_answer]
algorithm:
  name: ppo
actor:
  lr: 1.0e-5   # first try
critic:
  lr: 3.0e-5
"""


def test_edit_keeps_comments_replaces_in_place_and_adds_missing_keys():
    out = edit_yaml_text(USER, {"actor.lr": 5e-7, "actor.grad_clip": 1.0, "algorithm.kl.coef": 0.05,
                                "trainer.seed": 3})
    assert out == USER.replace("lr: 1.0e-5   # first try", "lr: 5.0e-07   # first try\n  grad_clip: 1.0").replace(
        "  name: ppo\n", "  name: ppo\n  kl:\n    coef: 0.05\n") + "trainer:\n  seed: 3\n"


def _ppo_run_from(tmp_path, header: str = ""):
    """A reward-swing PPO run started from my.yaml (USER): (run dir, my.yaml); `header` lines go
    below the run recipe's `# source:` line."""
    src = tmp_path / "my.yaml"
    src.write_text(USER)
    trace, _ = fault("reward_swing")
    d = write_run(tmp_path / "run", trace, {**RECIPE, "actor": {"lr": 1e-5}, "critic": {"lr": 3e-5},
                                            "algorithm": {"name": "ppo"}})
    resolved = (d / "recipe.yaml").read_text()
    (d / "recipe.yaml").write_text(f"# source: {src}\n{header}" + resolved)
    return d, src


def test_patch_writes_the_source_file_with_the_changes(tmp_path, capsys):
    d, src = _ppo_run_from(tmp_path)
    out = tmp_path / "fixed.yaml"
    assert run(d, patch=out) == 1
    text = out.read_text()
    assert text == USER.replace("lr: 1.0e-5   # first try", "lr: 5.0e-07   # first try").replace(
        "lr: 3.0e-5", "lr: 1.5e-06")
    printed = capsys.readouterr().out
    assert f"wrote {out} (2 change(s); {src} with the changed keys edited in place)" in printed
    assert f"next: rltune train {out} --allow-recipe-change" in printed
    assert yaml.safe_load(text)["critic"] == {"lr": 1.5e-06}


def test_patch_carries_the_runs_command_line_overrides(tmp_path, capsys):
    # the run was `rltune train my.yaml trainer.output_dir=/x/run2 actor.lr=1e-5`: the patched file
    # must describe that run (its output_dir above all: `--allow-recipe-change` continues it),
    # with the diagnosis' changes on top (they win over an override of the same key)
    d, _ = _ppo_run_from(tmp_path, "# overrides: trainer.output_dir=/x/run2 'actor.lr=1e-5'\n")
    out = tmp_path / "fixed.yaml"
    assert run(d, patch=out) == 1
    data = yaml.safe_load(out.read_text())
    assert data["trainer"]["output_dir"] == "/x/run2"
    assert data["actor"]["lr"] == 5e-07 and data["critic"]["lr"] == 1.5e-06
    assert "# first try" in out.read_text()
    printed = capsys.readouterr().out
    assert "with the run's command-line overrides written in: trainer.output_dir=/x/run2 actor.lr=1e-5" in printed


def test_patch_lints_the_result(tmp_path, capsys):
    src = tmp_path / "my.yaml"
    src.write_text(USER.replace("  lr: 3.0e-5\n", "  lr: 3.0e-5\n  warmup_steps: 0\n"))
    trace, _ = fault("reward_swing")
    d = write_run(tmp_path / "run", trace, {**RECIPE, "actor": {"lr": 1e-5}, "critic": {"lr": 3e-5}})
    (d / "recipe.yaml").write_text(f"# source: {src}\n" + (d / "recipe.yaml").read_text())
    assert run(d, patch=tmp_path / "fixed.yaml", fmt="json") == 1
    import json

    p = json.loads(capsys.readouterr().out)["patch"]
    assert p["content"] == "source" and p["source"] == str(src)
    assert ("warmup", "critic.warmup_steps") in [(f["rule"], f["path"]) for f in p["findings"]]
