"""LoRA lint rules (rules_lora.py), the actor-lr-range shift for adapters, the lora-1gpu preset and
recipes/quickstart-lora.yaml: every rule fires on a held case with its computed fix, and stays
silent on the preset and the recipe."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from recipe_testlib import ROOT, assert_rule_case, MINIMAL, PPO

from rltune.recipe import RULES, check, list_presets, load_preset, load_recipe
from rltune.recipe.rules_lora import smallest_target

# lm_head adapted: the base recipes' builtin:tiny-llama is a random model, whose frozen head all-linear would
# leave it unable to learn (lora-frozen-head)
LORA = "model.lora={r: 8, alpha: 16, target_modules: [q_proj, v_proj, lm_head]}"
ALL_LINEAR = "model.lora={r: 8, alpha: 16}"

# rule id -> (base, overrides that break it, severity, text the fix must hold, overrides that keep it)
CASES = [
    ("lora-lr", MINIMAL, [LORA, "actor.lr=1e-6"], "warning",
     "set actor.lr: 1.0e-05 (10 x actor.lr; LoRA range [1.0e-06, 5.0e-05])", [LORA, "actor.lr=1e-5"]),
    ("lora-lr", PPO, [LORA, "actor.lr=2e-6", "critic.lr=6e-6"], "warning",
     "set actor.lr: 2.0e-05 (10 x actor.lr; LoRA range [1.0e-06, 5.0e-05]) and critic.lr: 6.0e-05",
     [LORA, "actor.lr=2e-5", "critic.lr=6e-5"]),
    # far below: 10x is still a full-fine-tuning lr, the fix is the LoRA start
    ("lora-lr", MINIMAL, [LORA, "actor.lr=1e-7"], "warning", "set actor.lr: 1.0e-05 (the playbook's start",
     ["actor.lr=1e-7"]),  # no LoRA: the full-fine-tuning range holds
    # tiny-llama: hidden 64, 2 heads of 32, 1 key/value head: k_proj / v_proj are 64 -> 32
    ("lora-r-large", MINIMAL, ["model.lora={r: 64, alpha: 128}", "actor.lr=1e-5"], "error",
     "set model.lora.r: 32 (at most k_proj's 32", ["model.lora={r: 32, alpha: 64}", "actor.lr=1e-5"]),
    ("lora-r-large", MINIMAL, ["model.lora={r: 100, alpha: 200, target_modules: [gate_proj, up_proj]}"], "error",
     "set model.lora.r: 64 (at most gate_proj's 64", ["model.lora={r: 64, alpha: 128, target_modules: [gate_proj]}"]),
    ("lora-r-large", MINIMAL, ["model.policy=builtin:smollm2-135m-instruct", "model.lora={r: 256, alpha: 512}"], "error",
     "set model.lora.r: 192", ["model.policy=builtin:smollm2-135m-instruct", "model.lora={r: 192, alpha: 384}"]),
    ("lora-alpha", MINIMAL, ["model.lora={r: 16, alpha: 128}"], "info", "set model.lora.alpha: 32.0 (2r)",
     ["model.lora={r: 16, alpha: 64}"]),
    ("lora-alpha", MINIMAL, ["model.lora={r: 32, alpha: 8}"], "info", "scale actor.lr by 8",
     ["model.lora={r: 32, alpha: 16}"]),
    ("lora-dropout", MINIMAL, ["model.lora={r: 8, alpha: 16, dropout: 0.05, target_modules: [q_proj, lm_head]}"],
     "warning", "set model.lora.dropout: 0", ["model.lora={r: 8, alpha: 16, dropout: 0.0, target_modules: [q_proj, lm_head]}"]),
    ("lora-frozen-head", MINIMAL, [ALL_LINEAR], "warning",
     "set model.lora.target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head]", [LORA]),
    ("lora-frozen-head", MINIMAL, ["model.lora={r: 8, alpha: 16, target_modules: [q_proj, v_proj]}"], "warning",
     "set model.lora.target_modules: [q_proj, v_proj, lm_head]",
     ["model.lora={r: 8, alpha: 16, target_modules: [q_proj, model.lm_head]}"]),
    # tied head (tiny-qwen2): the fix says what the merged weights cannot hold
    ("lora-frozen-head", MINIMAL, ["model.policy=builtin:tiny-qwen2", ALL_LINEAR], "warning",
     "lm_head] (builtin:tiny-qwen2's head is tied to its embedding", ["model.policy=builtin:tiny-qwen2", LORA]),
    # a pretrained model's head: all-linear is right
    ("lora-frozen-head", MINIMAL, [ALL_LINEAR], "warning", "lm_head]",
     ["model.policy=builtin:smollm2-135m-instruct", ALL_LINEAR, "actor.lr=1e-5"]),
    ("lora-sync-adapter", MINIMAL, [LORA, "rollout.engine=hf", "rollout.lora_sync=adapter"], "info",
     "remove rollout.lora_sync", [LORA, "rollout.engine=hf"]),
    ("lora-sync-adapter", MINIMAL, [LORA, "rollout.engine=vllm", "rollout.lora_sync=adapter", "trainer.device=cpu"],
     "info", "set rollout.lora_sync: merged", [LORA, "rollout.engine=vllm", "trainer.device=cpu"]),
    # a typo beside good names: PEFT would train without v_proj (issue 25, item 10)
    ("lora-target-unknown", MINIMAL, ["model.lora={r: 8, alpha: 16, target_modules: [q_proj, v_prj, lm_head]}"], "error",
     "set model.lora.target_modules: [q_proj, v_proj, lm_head]", [LORA]),
    ("lora-target-unknown", MINIMAL, ["model.policy=builtin:smollm2-135m-instruct", "actor.lr=1e-5",
                                      "model.lora={r: 8, alpha: 16, target_modules: [q_proj, model.layers.29.mlp.gate]}"],
     "error", "set model.lora.target_modules: [q_proj, model.layers.29.mlp.gate_proj]",
     ["model.policy=builtin:smollm2-135m-instruct", "actor.lr=1e-5",
      "model.lora={r: 8, alpha: 16, target_modules: [q_proj, model.layers.29.mlp.gate_proj]}"]),
    # an adapter on a tied head or embedding (tiny-qwen2) where merged weights are needed (issue 25, item 9)
    ("lora-tied-merge", MINIMAL, ["model.policy=builtin:tiny-qwen2", LORA, "trainer.save_merged=true"], "error",
     "leave lm_head out of model.lora.target_modules", ["model.policy=builtin:tiny-qwen2", LORA, "rollout.engine=hf"]),
    ("lora-tied-merge", MINIMAL, ["model.policy=builtin:tiny-qwen2", "rollout.engine=vllm",
                                  "model.lora={r: 8, alpha: 16, target_modules: [q_proj, embed_tokens]}"], "error",
     "leave embed_tokens out of model.lora.target_modules",
     ["model.policy=builtin:tiny-qwen2", "rollout.engine=vllm", "model.lora={r: 8, alpha: 16, target_modules: [q_proj]}"]),
    ("lora-tied-merge", MINIMAL, ["model.policy=builtin:tiny-qwen2", LORA], "info", "set rollout.engine: hf",
     [LORA, "trainer.save_merged=true"]),    # tiny-llama's head is its own tensor: merged weights hold it
]
LORA_RULES = {c[0] for c in CASES}


@pytest.mark.parametrize("rule,base,bad,severity,fix,good", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_with_its_fix_and_stays_silent(write, rule, base, bad, severity, fix, good):
    assert_rule_case(write(base), rule, bad, severity, fix, good)


def test_rules_registered_with_metadata_before_the_waiver_rules():
    ids = list(RULES)
    assert LORA_RULES <= set(ids)
    assert ids[-2:] == ["unknown-waiver", "waived-error"]
    for rid in LORA_RULES:
        r = RULES[rid]
        assert r.severity in ("error", "warning", "info") and r.condition and r.why
    assert "LoRA Without Regret" in RULES["lora-lr"].why and "alpha = 2r" in RULES["lora-lr"].why


def test_lora_lr_fix_is_clean(write):
    # the fix leads to a recipe neither lr rule reports
    path = write(PPO)
    _, f = check(path, [LORA, "actor.lr=1e-6", "critic.lr=3e-6"])
    assert sorted(x.rule for x in f if x.severity != "info") == ["lora-lr"]
    _, f = check(path, [LORA, "actor.lr=1e-5", "critic.lr=3e-5"])
    assert [x for x in f if x.severity != "info"] == []


def test_actor_lr_range_moves_up_10x_with_lora(write):
    path = write(MINIMAL)
    # full fine-tuning: 1e-5 is too high; with an adapter it is the start
    _, f = check(path, ["actor.lr=1e-5"])
    assert [x.rule for x in f] == ["actor-lr-range"]
    _, f = check(path, [LORA, "actor.lr=1e-5"])
    assert f == []
    _, f = check(path, [LORA, "actor.lr=5e-5"])
    assert f == []
    _, f = check(path, [LORA, "actor.lr=1e-4"])
    [x] = f
    assert x.rule == "actor-lr-range" and x.severity == "warning" and "LoRA range [1.0e-06, 5.0e-05]" in x.message
    assert x.fix == "set actor.lr: 1.0e-05 (the playbook's start x 10 for LoRA)"
    # too low with an adapter: one finding (lora-lr), not two that disagree
    for lr in ("1e-6", "5e-6", "5e-8"):
        _, f = check(path, [LORA, f"actor.lr={lr}"])
        assert [x.rule for x in f] == ["lora-lr"], lr


def test_lora_r_large_only_where_sizes_are_known(write):
    path = write(MINIMAL)
    for spec in ("some-org/some-7b", "./my-model"):
        _, f = check(path, [f"model.policy={spec}", "model.lora={r: 4096, alpha: 8192}", "actor.lr=1e-5"])
        assert [x for x in f if x.rule == "lora-r-large"] == [], spec
    assert smallest_target("builtin:tiny-qwen2", "all-linear") == ("k_proj", 32)
    assert smallest_target("builtin:smollm2-135m-instruct", ["q_proj", "v_proj"]) == ("v_proj", 192)
    assert smallest_target("builtin:tiny-llama", ["model.layers.0.mlp.down_proj"]) == ("down_proj", 64)
    assert smallest_target("builtin:tiny-llama", ["not_a_module"]) is None  # the start-of-run check's case
    assert smallest_target("hub/id", "all-linear") is None


def test_target_names_are_checked_where_the_layout_is_known(write):
    path = write(PPO)
    # the critic's backbone has no lm_head: the actor's head in the list is no typo there
    _, f = check(path, [LORA, "model.critic=builtin:tiny-qwen2", "actor.lr=1e-5", "critic.lr=3e-5"])
    assert [x for x in f if x.rule == "lora-target-unknown"] == []
    # the message names what exists and the close name; a name with nothing close is dropped from the fix
    _, f = check(path, ["model.lora={r: 8, alpha: 16, target_modules: [q_proj, v_prj, qkv_linear]}"])
    [x] = [x for x in f if x.rule == "lora-target-unknown"]
    assert "v_prj (did you mean v_proj?), qkv_linear matches no module of model.policy builtin:tiny-llama" in x.message
    assert "Modules an adapter can target there: down_proj, embed_tokens, gate_proj" in x.message
    assert x.fix == "set model.lora.target_modules: [q_proj, v_proj]"
    # unknown layouts (a hub id, a directory) are left to the start-of-run check
    for spec in ("some-org/some-7b", "./my-model"):
        _, f = check(path, [f"model.policy={spec}", "model.lora={r: 8, alpha: 16, target_modules: [v_prj]}"])
        assert [x for x in f if x.rule == "lora-target-unknown"] == [], spec


def test_lora_sync_adapter_with_vllm_says_what_the_start_says(write):
    from rltune.models.lora import check_rollout_sync

    # vLLM takes the adapter (A, B) as a LoRA: no finding, and the start-of-run check agrees
    recipe, f = check(write(MINIMAL), [LORA, "rollout.engine=vllm", "rollout.lora_sync=adapter"])
    assert [x for x in f if x.rule == "lora-sync-adapter"] == []
    assert check_rollout_sync(recipe, "vllm") is None
    # what vLLM's adapters cannot carry: trained biases, ranks above 512
    for bad, fix in (("model.lora={r: 8, alpha: 16, bias: all}", "lora_sync: merged"),
                     ("model.lora={r: 1024, alpha: 2048}", "r <= 512")):
        recipe, f = check(write(MINIMAL), [bad, "rollout.engine=vllm", "rollout.lora_sync=adapter"])
        [x] = [x for x in f if x.rule == "lora-sync-adapter"]
        assert x.severity == "error" and fix in x.fix, x
        assert check_rollout_sync(recipe, "vllm")
    _, f = check(write(MINIMAL), [LORA, "rollout.engine=auto", "rollout.lora_sync=adapter"])
    assert [x for x in f if x.rule == "lora-sync-adapter"] == []  # the engine is picked at start


# ---------------------------------------------------------------- the preset and the recipe

QUICKSTART = (ROOT / "recipes" / "quickstart.yaml").read_text()
QUICKSTART_LORA = ROOT / "recipes" / "quickstart-lora.yaml"


def test_preset_shipped_with_its_memory_arithmetic(cli):
    assert "lora-1gpu" in list_presets()
    text = (ROOT / "src" / "rltune" / "presets" / "lora-1gpu.yaml").read_text()
    assert text.splitlines()[0].startswith("# Hardware — one 24 GB GPU, a 7B model in bf16 with LoRA r=64")
    for s in ("159.9M", "2.56 GB", "12.6 GiB", "gradient checkpointing"):
        assert s in text
    p = load_preset("lora-1gpu")
    assert p["model"]["lora"] == {"r": 64, "alpha": 128, "dropout": 0.0, "target_modules": "all-linear"}
    assert p["trainer"]["precision"] == "bf16" and p["actor"]["gradient_checkpointing"] == "selective"
    assert 1e-5 <= p["actor"]["lr"] <= 5e-5 and p["train"]["micro_batch_size"] <= 2
    code, out = cli("presets", "show", "lora-1gpu")
    assert code == 0 and out == text


@pytest.mark.parametrize("base", ["quickstart", "quickstart-lora"])
def test_preset_validates_clean_under_the_quickstarts(write, base):
    text = QUICKSTART if base == "quickstart" else QUICKSTART_LORA.read_text()
    path = write(text + "preset: lora-1gpu\n")
    recipe, findings = check(path)
    assert recipe is not None, findings
    assert [f for f in findings if f.severity in ("error", "warning")] == []
    assert [f for f in findings if f.rule in LORA_RULES] == []
    assert recipe.model.lora is not None


def test_preset_on_a_tiny_model_is_refused_by_rank(write):
    # r 64 on tiny-llama (k_proj 64 -> 32): the preset is for 7B models
    _, f = check(write(MINIMAL + "preset: lora-1gpu\n"))
    assert sorted((x.rule, x.severity) for x in f if x.severity != "info") == [
        ("lora-frozen-head", "warning"), ("lora-r-large", "error")]     # and all-linear cannot move a random model


def test_quickstart_lora_is_the_quickstart_with_an_adapter():
    r = load_recipe(QUICKSTART_LORA).recipe
    q = load_recipe(ROOT / "recipes" / "quickstart.yaml").recipe
    assert r.model.lora is not None and r.model.lora.r == 16 and r.model.lora.alpha == 32
    assert r.model.lora.target_modules == "all-linear"
    assert r.actor.lr == 1e-4 and r.model.policy == q.model.policy
    assert r.trainer.output_dir != q.trainer.output_dir
    _, findings = check(QUICKSTART_LORA)
    assert [f for f in findings if f.severity in ("error", "warning")] == []
    assert [f for f in findings if f.rule in LORA_RULES] == []


def test_validate_lora_imports_no_torch():
    script = (
        "import sys\n"
        "from rltune.cli import main\n"
        "try:\n"
        "    main(['validate', 'recipes/quickstart-lora.yaml'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "import rltune.recipe as r\n"
        "r.check('recipes/quickstart-lora.yaml', ['rollout.engine=vllm', 'rollout.lora_sync=adapter'])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'peft', 'vllm', 'numpy'))\n"
        "print('HEAVY', bad, file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_COLOR": "1"}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert "HEAVY []" in p.stderr, p.stderr[-2000:]
