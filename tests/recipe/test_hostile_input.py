"""Hostile but realistic recipe input (issue 11): alias bombs, huge files, values of the wrong
type, presets that name presets, and files a recipe names that are not there. Every case ends in
a message with the file, the line, the key and a fix; never a traceback, never a hang."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from recipe_testlib import MINIMAL

from rltune.errors import RecipeInputError
from rltune.recipe import check, list_presets, load_recipe, load_recipe_text


ROOT = Path(__file__).resolve().parents[2]


def _errors(findings):
    return [f for f in findings if f.severity == "error"]


# -- item 10: alias bombs and huge files ------------------------------------------------------

BILLION_LAUGHS = MINIMAL + "".join(
    ["l0: &l0 [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)]
)


def test_billion_laughs_is_refused_quickly(write, cli):
    path = write(BILLION_LAUGHS)
    t0 = time.monotonic()
    with pytest.raises(RecipeInputError) as ei:
        load_recipe(path)
    assert time.monotonic() - t0 < 5
    msg = str(ei.value)
    assert path in msg and "alias" in msg and "fix:" in msg
    assert any(f"{path}:{n}:" in msg for n in range(7, 17))  # the anchor where the expansion blows up
    code, out = cli("validate", path)
    assert code == 2 and "Traceback" not in out and "alias" in out


def test_alias_bomb_in_an_override_is_refused(write):
    bomb = "[" + ", ".join(["&a0 [1, 1, 1, 1, 1, 1, 1, 1]"] + [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 8) + "]"
                                                                  for i in range(1, 9)]) + "]"
    t0 = time.monotonic()
    with pytest.raises(RecipeInputError, match="alias"):
        load_recipe(write(MINIMAL), [f"reward.functions={bomb}"])
    assert time.monotonic() - t0 < 5


def test_modest_aliases_still_work(write):
    text = MINIMAL + "actor:\n  <<: &opt {lr: 2.0e-6, warmup_steps: 5}\ncritic:\n  <<: *opt\n  lr: 6.0e-6\n"
    res = load_recipe(write(text))
    assert res.data["actor"] == {"lr": 2e-6, "warmup_steps": 5}
    assert res.data["critic"] == {"lr": 6e-6, "warmup_steps": 5}


def test_huge_recipe_is_refused_before_parsing(write, cli):
    path = write(MINIMAL + "# padding\n" * 250_000)  # ~2.5 MB
    t0 = time.monotonic()
    with pytest.raises(RecipeInputError) as ei:
        load_recipe(path)
    assert time.monotonic() - t0 < 2
    msg = str(ei.value)
    assert path in msg and "2.5 MB" in msg and "1 MB" in msg and "fix:" in msg
    with pytest.raises(RecipeInputError, match="1 MB"):
        load_recipe_text(MINIMAL + "# padding\n" * 250_000)
    code, out = cli("validate", path)
    assert code == 2 and "Traceback" not in out


def test_huge_preset_file_is_refused(write):
    write("actor:\n  lr: 2.0e-6\n" + "# padding\n" * 250_000, name="big.yaml")
    with pytest.raises(RecipeInputError, match="1 MB"):
        load_recipe(write(MINIMAL + "preset: big.yaml\n"))


# -- item 11a: strict types -----------------------------------------------------------------------

@pytest.mark.parametrize("section,key,raw,needle,fix", [
    ("rollout", "do_sample", '"yes"', 'expected true or false, got the string "yes"', "do_sample: true"),
    ("rollout", "do_sample", "1", "expected true or false, got the number 1", "do_sample: true"),
    ("train", "batch_size", '"16"', 'expected a whole number, got the string "16"', "write the number without quotes: `batch_size: 16`"),
    ("trainer", "save_every", "true", "expected a whole number, got the boolean true", "write a whole number in [0, 10000000], e.g. `save_every: 0` (the default)"),
    ("trainer", "max_steps", "100.0", "expected a whole number, got the number 100.0", "`max_steps: 100`"),
    ("actor", "lr", '"1e-6"', 'expected a number, got the string "1e-6"', "`lr: 1.0e-06`"),
    ("algorithm", "clip_range", "yes", "got the boolean true (YAML reads unquoted yes/no", "write a number in (0, 1], e.g. `clip_range: 0.2`"),
    ("logging", "wandb_project", "3", "expected text, got the number 3", 'quote it to make it text: `wandb_project: "3"`'),
])
def test_wrong_types_are_not_coerced(write, section, key, raw, needle, fix):
    path = write(MINIMAL + f"{section}:\n  {key}: {raw}\n")
    recipe, findings = check(path)
    assert recipe is None
    [f] = _errors(findings)
    assert f.path == f"{section}.{key}" and (f.line, f.column) == (8, 3)
    assert needle in f.message, f.message
    assert fix in f.fix, f.fix


def test_strict_types_from_overrides_are_still_yaml(write):
    path = write(MINIMAL)
    r = load_recipe(path, ["train.batch_size=64", "rollout.do_sample=true", "actor.lr=2e-6",
                           "trainer.save_every=5"]).recipe
    assert r.train.batch_size == 64 and r.rollout.do_sample is True and r.trainer.save_every == 5
    res = load_recipe(path, ["train.batch_size='16'"])
    [f] = res.findings
    assert f.path == "train.batch_size" and "from the override `train.batch_size='16'`" in f.message


def test_ints_for_floats_still_work(write):
    res = load_recipe(write(MINIMAL + "actor:\n  lr: 1\n  betas: [0, 1]\nalgorithm:\n  kl:\n    coef: 0\n"))
    r = res.recipe
    assert res.findings == []
    assert r.actor.lr == 1.0 and isinstance(r.actor.lr, float)
    assert r.algorithm.kl.coef == 0.0 and isinstance(r.algorithm.kl.coef, float)
    assert r.actor.betas == (0.0, 1.0)
    text = MINIMAL.replace("functions: [builtin:exact_answer]", "functions: [builtin:exact_answer]\n  weights: [2]")
    assert load_recipe_text(text).recipe.reward.weights == [2.0]
    assert load_recipe_text(MINIMAL, overrides=["actor.lr=1", "algorithm.kl.coef=0"]).recipe.actor.lr == 1.0


def test_betas_still_read_from_a_list_and_json(write):
    r = load_recipe(write(MINIMAL + "actor:\n  betas: [0.9, 0.95]\n")).recipe
    assert r.actor.betas == (0.9, 0.95)
    from rltune.recipe.schema import Recipe

    again = Recipe.model_validate(json.loads(json.dumps(r.model_dump(mode="json"))))
    assert again == r
    res = load_recipe(write(MINIMAL + "actor:\n  betas: [\"0.9\", 0.95]\n"))
    assert [f.path for f in res.findings] == ["actor.betas.0"]


SHIPPED = sorted((ROOT / "recipes").glob("*.yaml")) + sorted((ROOT / "recipes" / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_recipes_pass_strict_types(path):
    recipe, findings = check(path)
    assert recipe is not None and _errors(findings) == []


@pytest.mark.parametrize("name", list_presets())
def test_shipped_presets_pass_strict_types(write, name):
    recipe, findings = check(write(MINIMAL + f"preset: {name}\n"))
    assert recipe is not None
    assert [f for f in findings if f.rule == "schema"] == []


# -- item 11b: a preset that names presets --------------------------------------------------------

def test_preset_inside_a_preset_is_refused(write):
    mine = write("# my stage\npreset: cold-start\nactor:\n  lr: 2.0e-6\n", name="mine.yaml")
    with pytest.raises(RecipeInputError) as ei:
        load_recipe(write(MINIMAL + "preset: mine.yaml\n"))
    msg = str(ei.value)
    assert f"{mine}:2:1" in msg and "`preset: cold-start`" in msg
    assert "fix:" in msg and "preset: [cold-start, mine.yaml]" in msg


def test_preset_cycle_is_refused_not_looped(write):
    write("preset: b.yaml\nactor:\n  lr: 2.0e-6\n", name="a.yaml")
    write("preset: a.yaml\n", name="b.yaml")
    with pytest.raises(RecipeInputError, match="a preset cannot name other presets"):
        load_recipe(write(MINIMAL + "preset: a.yaml\n"))


def test_presets_apply_refuses_a_preset_with_presets(cli, write):
    mine = write("preset: cold-start\nactor:\n  lr: 2.0e-6\n", name="mine.yaml")
    code, out = cli("presets", "apply", mine, write(MINIMAL))
    assert code == 2 and "a preset cannot name other presets" in out and "Traceback" not in out


# -- item 11d: files the recipe names -------------------------------------------------------------

def _validate_json(cli, *args):
    code, out = cli("validate", "--format", "json", *args)
    return code, json.loads(out)


def test_missing_data_file_is_caught_by_validate(cli, write, tmp_path):
    path = write(MINIMAL.replace("builtin:arithmetic", "prompts.jsonl"))
    code, out = cli("validate", path)
    assert code == 2, out
    assert f"{path}:4:3: error input: data.train: data file `prompts.jsonl` not found" in out
    assert str(tmp_path) in out and "fix:" in out and "Traceback" not in out
    # the same file next to the recipe: found (train looks there too)
    (tmp_path / "prompts.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    code, out = cli("validate", path)
    assert code == 0, out


def test_missing_eval_reward_and_model_files(cli, write, tmp_path):
    text = (MINIMAL.replace("builtin:tiny-llama", "./models/sft")
            .replace("builtin:arithmetic", "builtin:arithmetic\n  eval: held-out.jsonl")
            .replace("[builtin:exact_answer]", "[builtin:exact_answr, rewards.py:score, my_pkg.rewards:score]"))
    code, found = _validate_json(cli, write(text))
    assert code == 2
    by_path = {f["path"]: f for f in found if f["rule"] == "input"}
    assert set(by_path) == {"model.policy", "data.eval", "reward.functions.0", "reward.functions.1"}
    assert by_path["model.policy"]["line"] == 2 and "./models/sft" in by_path["model.policy"]["message"]
    assert "save_pretrained" in by_path["model.policy"]["fix"]
    assert "did you mean `builtin:exact_answer`" in by_path["reward.functions.0"]["fix"]
    assert "rewards.py" in by_path["reward.functions.1"]["message"]
    assert by_path["reward.functions.1"]["line"] == 7
    assert all(f["file"].endswith("recipe.yaml") for f in found)


def test_model_dir_without_config_and_hub_ids(cli, write, tmp_path):
    (tmp_path / "sft").mkdir()
    code, out = cli("validate", write(MINIMAL.replace("builtin:tiny-llama", str(tmp_path / "sft"))))
    assert code == 2 and "no config.json" in out
    code, out = cli("validate", write(MINIMAL.replace("builtin:tiny-llama", "Qwen/Qwen2.5-0.5B-Instruct")))
    assert code == 0, out  # a hub id: train fetches it; validate does not go online
    code, out = cli("validate", write(MINIMAL.replace("builtin:tiny-llama", "builtin:tiny-lama")))
    assert code == 2 and "did you mean `builtin:tiny-llama`" in out


def test_skip_files_lints_a_template(cli, write):
    path = write(MINIMAL.replace("builtin:arithmetic", "data/prompts.jsonl"))
    code, out = cli("validate", "--skip-files", path)
    assert code == 0, out


def test_shipped_templates_name_their_data(cli):
    code, out = cli("validate", str(ROOT / "recipes" / "gsm8k-grpo-qwen.yaml"))
    assert code == 2 and "data/gsm8k.jsonl" in out and "not found" in out
    code, out = cli("validate", "--skip-files", str(ROOT / "recipes" / "gsm8k-grpo-qwen.yaml"),
                    str(ROOT / "recipes" / "ppo-rm-8gpu.yaml"))
    assert code == 0, out


@pytest.mark.parametrize("name,content,needles", [
    ("d.jsonl", b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "caf\xe9", "answer": "2"}\n',
     ["d.jsonl, line 2", "not UTF-8", "save the file as UTF-8"]),
    ("d.jsonl", b'{"prompt": "a"}\n{"prompt": "b"\n', ["d.jsonl, line 2", "not valid JSON", "one complete JSON object"]),
    ("d.jsonl", b'{"prompt": 12}\n{"prompt": 13}\n', ["d.jsonl, line 1", "'prompt' is a number (12)", '"prompt": "12"']),
    ("d.csv", b"prompt;answer\n1+1=;2\n", ["d.csv, line 1", "separated by `;`", "save it comma-separated"]),
])
def test_validate_reads_the_data(cli, write, tmp_path, name, content, needles):
    (tmp_path / name).write_bytes(content)
    path = write(MINIMAL.replace("builtin:arithmetic", name))
    code, out = cli("validate", path)
    assert code == 2, out
    assert f"{path}:4:3: error input: data.train" in out
    for n in needles:
        assert n in out, (n, out)
    assert "Traceback" not in out


def test_check_api_skips_files_unless_asked(write):
    path = write(MINIMAL.replace("builtin:arithmetic", "nope.jsonl"))
    recipe, findings = check(path)
    assert recipe is not None and findings == []
    recipe, findings = check(path, files=True)
    [f] = findings
    assert f.rule == "input" and f.path == "data.train" and f.severity == "error"


# -- item 13: small messages --------------------------------------------------------------------

def test_symlink_loop_is_not_reported_as_missing(tmp_path):
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(tmp_path / "loop.yaml")
    with pytest.raises(RecipeInputError) as ei:
        load_recipe(loop)
    assert "symbolic link" in str(ei.value) and "not found" not in str(ei.value)
    dangling = tmp_path / "dangling.yaml"
    dangling.symlink_to(tmp_path / "gone.yaml")
    with pytest.raises(RecipeInputError, match="symbolic link to .*gone.yaml.*which does not exist"):
        load_recipe(dangling)


def test_non_utf8_recipe_names_line_and_byte(write, tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes(MINIMAL.encode() + b"trainer:\n  output_dir: runs/caf\xe9\n")
    with pytest.raises(RecipeInputError) as ei:
        load_recipe(path)
    assert f"{path}:8:23: the recipe is not UTF-8 text (byte 0xe9)" in str(ei.value)


def test_missing_preset_file_points_at_the_recipe_line(write, tmp_path):
    path = write(MINIMAL + "preset: [cold-start, mine.yaml]\n")
    with pytest.raises(RecipeInputError) as ei:
        load_recipe(path)
    msg = str(ei.value)
    assert f"{path}:7:22: preset file `mine.yaml` not found (looked for {tmp_path / 'mine.yaml'})" in msg
    assert "fix:" in msg
    write("preset: x\n", name="bad.yaml")
    (tmp_path / "bad.yaml").write_bytes(b"actor:\n  lr: 1.0e-6 # caf\xe9\n")
    with pytest.raises(RecipeInputError, match=r"bad.yaml:2:19: the preset is not UTF-8 text"):
        load_recipe(write(MINIMAL + "preset: bad.yaml\n"))


@pytest.mark.parametrize("text,what", [("---\n", "an empty document"), ("- a\n", "a list"), ("just text\n", "a plain string")])
def test_top_level_kind_in_words(write, text, what):
    with pytest.raises(RecipeInputError, match=f"must be a mapping of sections, not {what}"):
        load_recipe(write(text))
