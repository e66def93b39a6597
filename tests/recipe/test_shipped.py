"""Every shipped recipe and preset validates; generated docs and schema are fresh."""

from __future__ import annotations

import json
import os

import pytest
from recipe_testlib import ROOT, MINIMAL, PPO

from rltune.recipe import check, list_presets, load_preset, load_recipe

RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
PRESETS = ["cold-start", "acceleration", "anti-overfit", "1x40gb", "8-gpu"]


def test_presets_shipped():
    assert set(PRESETS) <= set(list_presets())
    link = ROOT / "presets"
    assert link.is_symlink() and os.readlink(link) == "src/rltune/presets"


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_recipe_validates(path):
    recipe, findings = check(path)
    assert recipe is not None
    assert [f for f in findings if f.severity == "error"] == []
    assert [f for f in findings if f.severity == "warning"] == []
    assert path.read_text().startswith("# yaml-language-server: $schema=../schema/recipe.schema.json\n")


def test_minimal_recipe_is_the_design_one():
    text = (ROOT / "recipes" / "minimal.yaml").read_text()
    body = "".join(ln + "\n" for ln in text.splitlines() if not ln.startswith("#"))
    assert body == MINIMAL
    assert check(ROOT / "recipes" / "minimal.yaml")[1] == []


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("base", [MINIMAL, PPO], ids=["grpo", "ppo"])
def test_preset_validates_under_a_recipe(write, name, base):
    path = write(base + f"preset: {name}\n")
    recipe, findings = check(path)
    assert recipe is not None, findings
    assert [f for f in findings if f.severity in ("error", "warning")] == []
    text = (ROOT / "src" / "rltune" / "presets" / f"{name}.yaml").read_text()
    assert text.startswith("# ")


def test_preset_values():
    cs = load_preset("cold-start")
    assert cs["actor"]["lr"] == 1e-6 and cs["critic"]["lr"] == 3e-6
    assert cs["algorithm"]["kl"]["coef"] == 0.05 and cs["algorithm"]["clip_range"] == 0.15
    acc = load_preset("acceleration")["algorithm"]
    assert acc["kl"]["coef"] == 0.02 and acc["clip_range"] == 0.2
    ao = load_preset("anti-overfit")["algorithm"]
    assert ao["kl"]["coef"] == 0.08 and ao["entropy_coef"] == 0.01 and ao["clip_range"] == 0.12
    hw = load_preset("1x40gb")
    assert hw["rollout"]["batch_size"] == 8 and hw["train"]["batch_size"] == 64
    assert hw["train"]["micro_batch_size"] == 4 and hw["trainer"]["precision"] == "bf16"
    assert hw["actor"]["gradient_checkpointing"] and hw["critic"]["gradient_checkpointing"]
    g8 = load_preset("8-gpu")
    assert g8["rollout"]["batch_size"] == 64 and g8["train"]["batch_size"] == 256
    assert g8["trainer"]["nproc"] == 8 and g8["trainer"]["precision"] == "bf16"


def test_stage_presets_stacked_in_order(write):
    r = load_recipe(write(MINIMAL + "preset: [cold-start, acceleration]\n")).recipe
    assert r.algorithm.kl.coef == 0.02 and r.actor.lr == 1e-6


def test_docs_and_schema_not_stale():
    from rltune.recipe import docgen

    assert docgen.DOC_PATH.read_text() == docgen.render_markdown(), \
        "docs/recipe.md is stale: run `python -m rltune.recipe.docgen --write`"
    assert docgen.SCHEMA_PATH.read_text() == docgen.render_schema(), \
        "schema/recipe.schema.json is stale: run `python -m rltune.recipe.docgen --write`"
    s = json.loads(docgen.SCHEMA_PATH.read_text())
    assert s["title"] == "rltune recipe"


def test_docs_cover_every_field():
    from rltune.recipe import introspect as ins

    doc = (ROOT / "docs" / "recipe.md").read_text()
    leaves = [p for p in ins.all_paths() if ins.model_at(p.split(".")) is None]
    missing = [p for p in leaves if f"`{p}`" not in doc]
    assert missing == []


def test_recipes_doc_lists_every_rule():
    from rltune.recipe import RULES

    doc = (ROOT / "docs" / "recipes.md").read_text()
    assert [r for r in RULES if f"`{r}`" not in doc] == []
    for s in ("`rollout.batch_size`: sequences generated per generation call. Small = fits memory, fresh data.",
              "the ratio `train.batch_size / rollout.batch_size` is the playbook's golden ratio (4–8).",
              "GRPO: `algorithm.group_size` samples per prompt; batches must hold whole groups."):
        assert s in doc
