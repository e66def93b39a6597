from __future__ import annotations

import pytest
from recipe_testlib import MINIMAL

from rltune.errors import RecipeInputError
from rltune.recipe import check, load_recipe, load_recipe_text


def errors(findings):
    return [f for f in findings if f.severity == "error"]


def test_minimal_is_clean(write):
    recipe, findings = check(write(MINIMAL))
    assert recipe is not None
    assert findings == []


def test_locations_of_every_key(write):
    res = load_recipe(write(MINIMAL + "actor:\n  lr: 2.0e-6\n"))
    assert res.locate("model") == (1, 1)
    assert res.locate("model.policy") == (2, 3)
    assert res.locate("actor.lr") == (8, 3)
    assert res.locate("reward.functions.0") == (6, 15)
    # absent key: its nearest parent
    assert res.locate("actor.grad_clip") == (7, 1)
    assert res.data["actor"]["lr"] == 2e-6


def test_yaml11_exponent_floats_are_floats(write):
    res = load_recipe(write(MINIMAL + "actor:\n  lr: 1e-6\ncritic:\n  lr: 3E-6\n"), ["algorithm.kl.coef=5e-2"])
    assert res.data["actor"]["lr"] == 1e-6 and isinstance(res.data["actor"]["lr"], float)
    assert res.data["critic"]["lr"] == 3e-6
    assert res.recipe.algorithm.kl.coef == 0.05


@pytest.mark.parametrize("text,needle,line", [
    ("model:\n  policy: x\n  policy: y\ndata:\n  train: t\n", "duplicate key `model.policy`", 3),
    ("model:\n\tpolicy: x\n", "tab character", 2),
    ("model:\n  policy: [x\ndata: 1\n", "not valid YAML", 0),
    ("- a\n- b\n", "must be a mapping", 1),
    ("just a string\n", "must be a mapping", 1),
    ("", "is empty", 0),
    ("# only a comment\n\n", "is empty", 0),
])
def test_unreadable_input(write, text, needle, line):
    path = write(text)
    with pytest.raises(RecipeInputError) as ei:
        load_recipe(path)
    msg = str(ei.value)
    assert needle in msg
    assert path in msg
    assert "fix:" in msg
    if line:
        assert f"{path}:{line}:" in msg


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(RecipeInputError, match="not found"):
        load_recipe(tmp_path / "nope.yaml")
    with pytest.raises(RecipeInputError, match="directory"):
        load_recipe(tmp_path)


def test_wrong_types_all_reported_with_lines(write):
    path = write(MINIMAL + "actor:\n  lr: fast\n  warmup_steps: -3\ntrainer:\n  precision: fp61\n")
    res = load_recipe(path)
    assert res.recipe is None
    by_path = {f.path: f for f in res.findings}
    assert set(by_path) == {"actor.lr", "actor.warmup_steps", "trainer.precision"}
    assert all(f.rule == "schema" and f.severity == "error" for f in res.findings)
    assert by_path["actor.lr"].line == 8 and by_path["actor.lr"].column == 3
    assert '"fast"' in by_path["actor.lr"].message
    assert "[0, 1000000]" in by_path["actor.warmup_steps"].fix
    assert "did you mean `fp16`" in by_path["trainer.precision"].fix
    assert by_path["trainer.precision"].line == 11


@pytest.mark.parametrize("extra,path,suggestion", [
    ("critc:\n  lr: 3.0e-6\n", "critc", "`critic`"),
    ("actor:\n  lrr: 1.0e-6\n", "actor.lrr", "`actor.lr`"),
    ("actor:\n  group_size: 4\n", "actor.group_size", "`algorithm.group_size`"),
    ("algorithm:\n  kl_coef: 0.05\n", "algorithm.kl_coef", "`algorithm.kl.coef`"),
])
def test_unknown_key_did_you_mean(write, extra, path, suggestion):
    res = load_recipe(write(MINIMAL + extra))
    [f] = res.findings
    assert f.path == path and f"unknown key `{path}`" in f.message
    assert f"did you mean {suggestion}" in f.fix
    assert f.line >= 7


def test_missing_required(write):
    res = load_recipe(write("data:\n  train: builtin:arithmetic\nreward:\n  functions: [builtin:format]\n"))
    [f] = res.findings
    assert f.path == "model" and "missing" in f.message and "builtin:tiny-llama" in f.fix
    res = load_recipe(write("model: {}\ndata:\n  train: x\n"))
    assert [f.path for f in res.findings] == ["model.policy"]
    assert res.findings[0].line == 1


def test_device_mesh_string_explains_itself(write):
    path = write(MINIMAL + "algorithm:\n  name: ppo\ncritic:\n  device_mesh: \"cuda:0\"\n")
    recipe, findings = check(path)
    assert recipe is None
    [f] = errors(findings)
    assert f.path == "critic.device_mesh" and (f.line, f.column) == (10, 3)
    assert "list of device ids" in f.message and "one card" in f.message


def test_overrides_get_the_same_checks(write):
    path = write(MINIMAL)
    res = load_recipe(path, ["actor.lr=2e-6", "rollout.engine=hf", "trainer.seed=null", "data.drop_last=false"])
    r = res.recipe
    assert r.actor.lr == 2e-6 and r.rollout.engine == "hf" and r.trainer.seed is None and r.data.drop_last is False
    res = load_recipe(path, ["actor.lrr=1", "actor.lr=-1", "actor.device_mesh=[0,1]"])
    paths = {f.path: f for f in res.findings}
    assert "did you mean `actor.lr`" in paths["actor.lrr"].fix
    assert "from the override `actor.lr=-1`" in paths["actor.lr"].message
    assert "actor.device_mesh" not in paths
    with pytest.raises(RecipeInputError, match="key=value"):
        load_recipe(path, ["actor.lr"])
    with pytest.raises(RecipeInputError, match="dotted key"):
        load_recipe(path, ["a..b=1"])


def test_presets_merge_under_the_recipe(write):
    path = write(MINIMAL + "preset: [1x40gb, cold-start]\nalgorithm:\n  kl:\n    coef: 0.03\n")
    res = load_recipe(path)
    r = res.recipe
    assert r.algorithm.kl.coef == 0.03            # the recipe wins
    assert r.algorithm.clip_range == 0.15         # from cold-start
    assert r.train.batch_size == 64               # from 1x40gb
    assert r.actor.gradient_checkpointing == "selective"
    assert res.origin("train.batch_size") == "preset:1x40gb"
    assert res.where("train.batch_size")[0].endswith("1x40gb.yaml")
    assert res.origin("algorithm.kl.coef") == "recipe"
    # the override wins over both
    assert load_recipe(path, ["algorithm.clip_range=0.2"]).recipe.algorithm.clip_range == 0.2
    # extra presets (trainer/autotune) go under the recipe too
    res = load_recipe(write(MINIMAL), extra_presets=["anti-overfit"])
    assert res.recipe.algorithm.entropy_coef == 0.01 and res.recipe.preset == ["anti-overfit"]


def test_unknown_preset(write):
    path = write(MINIMAL + "preset: cold-strat\n")
    with pytest.raises(RecipeInputError) as ei:
        load_recipe(path)
    msg = str(ei.value)
    assert f"{path}:7:1" in msg and "unknown preset `cold-strat`" in msg
    assert "did you mean `cold-start`" in msg and "acceleration" in msg


def test_preset_from_a_file(write):
    write("actor:\n  lr: 2.0e-6\n", name="mine.yaml")
    res = load_recipe(write(MINIMAL + "preset: mine.yaml\n"))
    assert res.recipe.actor.lr == 2e-6


def test_load_from_text_and_merge_keys():
    text = MINIMAL + "x: &opt\n  lr: 2.0e-6\nactor:\n  <<: *opt\n  warmup_steps: 5\n"
    res = load_recipe_text(text.replace("x: &opt", "lint:\n  waive: {}\nactor_base: &opt"))
    assert res.data["actor"] == {"lr": 2e-6, "warmup_steps": 5}


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=1e-12, max_value=1.0, allow_nan=False, allow_infinity=False))
def test_float_overrides_round_trip(x):
    # repr() gives '1e-06'-style text that YAML 1.1 would read as a string
    res = load_recipe_text(MINIMAL, overrides=[f"actor.lr={x!r}"])
    assert res.recipe.actor.lr == x
    assert isinstance(res.data["actor"]["lr"], float)
    res = load_recipe_text(MINIMAL + f"critic:\n  lr: {x!r}\n")
    assert res.data["critic"]["lr"] == x
