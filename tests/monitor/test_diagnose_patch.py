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
    assert f"next: rltune train {out} trainer.output_dir={d} --allow-recipe-change" in printed
    assert yaml.safe_load(text)["critic"] == {"lr": 1.5e-06}


def test_patch_shows_the_runs_overrides_and_writes_in_only_learning_knobs_when_asked(tmp_path, capsys):
    # the run directory may be someone else's: its `# overrides:` header is shown, never applied by
    # default; --apply-overrides writes in learning knobs only, never keys that load code, models or
    # data or name paths (issue 25, item 1: a received header made the patch import the sender's file)
    header = ("# overrides: trainer.output_dir=/x/run2 'actor.lr=1e-5' 'algorithm.kl.coef=0.07' "
              "'reward.functions=[/them/helper.py:score]' model.trust_remote_code=true model.policy=them/model\n")
    d, src = _ppo_run_from(tmp_path, header)
    out = tmp_path / "fixed.yaml"
    assert run(d, patch=out) == 1
    data = yaml.safe_load(out.read_text())
    assert data == yaml.safe_load(USER.replace("lr: 1.0e-5", "lr: 5.0e-07").replace("lr: 3.0e-5", "lr: 1.5e-06"))
    printed = capsys.readouterr().out
    assert "NOT written in" in printed and "algorithm.kl.coef=0.07" in printed and "--apply-overrides" in printed
    assert "never taken from a run directory" in printed and "helper.py" in printed
    assert f"next: rltune train {out} trainer.output_dir={d} --allow-recipe-change" in printed

    assert run(d, patch=out, apply_overrides=True, force=True) == 1
    text = out.read_text()
    data = yaml.safe_load(text)
    assert data["algorithm"]["kl"]["coef"] == 0.07                       # a learning knob: written in
    assert data["actor"]["lr"] == 5e-07 and data["critic"]["lr"] == 1.5e-06   # the diagnosis wins
    assert data["reward"]["functions"] == ["builtin:exact_answer"] and data["model"] == {"policy": "builtin:tiny-llama"}
    assert "trainer" not in data and "helper.py" not in text and "trust_remote_code" not in text
    assert "# first try" in text
    printed = capsys.readouterr().out
    assert "with the run's command-line overrides written in: actor.lr=1e-5 algorithm.kl.coef=0.07" in printed


def test_patch_never_overwrites_without_force(tmp_path, capsys):
    d, _ = _ppo_run_from(tmp_path)
    out = tmp_path / "fixed.yaml"
    out.write_text("mine\n")
    assert run(d, patch=out) == 2
    assert "exists; not overwriting it" in capsys.readouterr().err and out.read_text() == "mine\n"


def test_a_crafted_header_gets_a_note_not_a_traceback(tmp_path, capsys):
    d, _ = _ppo_run_from(tmp_path, "# overrides: 'unclosed\n")
    assert run(d, patch=tmp_path / "fixed.yaml") == 1
    assert "`# overrides:` header is unreadable" in capsys.readouterr().out


def test_a_source_that_is_no_recipe_is_named_in_the_error(tmp_path, capsys):
    # `# source:` naming a file that is not a recipe: the error names that file, not the output
    notes = tmp_path / "notes.txt"
    notes.write_text("just some text\n")
    d, _ = _ppo_run_from(tmp_path)
    text = (d / "recipe.yaml").read_text().split("\n", 1)[1]
    (d / "recipe.yaml").write_text(f"# source: {notes}\n" + text)
    assert run(d, patch=tmp_path / "fixed.yaml") == 2
    err = capsys.readouterr().err
    assert f"{notes}: is not a recipe" in err and "Traceback" not in err
    assert not (tmp_path / "fixed.yaml").exists()


def test_a_patch_from_a_run_without_source_flags_received_code(tmp_path, capsys):
    trace, _ = fault("reward_swing")
    d = write_run(tmp_path / "run", trace, {**RECIPE, "actor": {"lr": 1e-5}, "critic": {"lr": 3e-5},
                                            "reward": {"functions": ["helper.py:score"]}})
    out = tmp_path / "fixed.yaml"
    assert run(d, patch=out) == 1
    assert "# CHECK before training" in out.read_text() and "helper.py:score" in out.read_text()
    assert "CHECK before training" in capsys.readouterr().out


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
