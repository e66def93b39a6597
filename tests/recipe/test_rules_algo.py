"""The 2026 toolbox lint rules (rules_algo.py) and the algorithm presets (dapo, gspo, dr-grpo,
reinforce-pp): every rule fires on a held case with its computed fix, and stays silent on the
presets merged under the shipped recipes."""

from __future__ import annotations

import pytest
from recipe_testlib import ROOT, assert_rule_case, MINIMAL, PPO

from rltune.recipe import RULES, check, list_presets, load_preset, load_recipe

FG = "algorithm.filter_groups={metric: acc}"
GSPO = ["algorithm.ratio_level=sequence", "algorithm.clip_range=3e-4", "algorithm.clip_range_high=4e-4",
        "algorithm.loss_agg=seq-mean-token-mean"]

# rule id -> (base, overrides that break it, severity, text the fix must hold, overrides that keep it)
CASES = [
    ("clip-high-below-low", MINIMAL, ["algorithm.clip_range_high=0.15"], "error",
     "set algorithm.clip_range_high: 0.2 (= clip_range), or swap them: algorithm.clip_range: 0.15 and "
     "algorithm.clip_range_high: 0.2", ["algorithm.clip_range_high=0.2"]),
    ("clip-high-below-low", MINIMAL, ["algorithm.clip_range=3e-4", "algorithm.clip_range_high=2e-4",
                                      "algorithm.ratio_level=sequence", "algorithm.loss_agg=seq-mean-token-mean"],
     "error", "set algorithm.clip_range_high: 3.0e-04", GSPO),
    # CISPO: clip_range 1.0 (no lower bound) above clip_range_high is the paper's setting
    ("clip-high-below-low", MINIMAL, ["algorithm.clip_range=0.3", "algorithm.clip_range_high=0.25"], "error",
     "set algorithm.clip_range_high: 0.3",
     ["algorithm.policy_loss=cispo", "algorithm.clip_range=1.0", "algorithm.clip_range_high=0.25"]),
    ("clip-higher-without-filter", MINIMAL, ["algorithm.clip_range_high=0.28"], "info",
     "set algorithm.filter_groups: {metric: acc}", ["algorithm.clip_range_high=0.28", FG]),
    ("clip-higher-without-filter", MINIMAL, ["algorithm.name=rloo", "algorithm.clip_range_high=0.28"], "info",
     "preset: dapo", ["algorithm.name=reinforce_pp", "algorithm.clip_range_high=0.28"]),
    ("gspo-token-mean", MINIMAL, GSPO[:3], "warning", "set algorithm.loss_agg: seq-mean-token-mean", GSPO),
    ("gspo-token-mean", MINIMAL, ["algorithm.ratio_level=sequence-token", *GSPO[1:3]], "warning",
     "set algorithm.loss_agg: seq-mean-token-mean", ["algorithm.ratio_level=sequence-token", *GSPO[1:]]),
    ("gspo-clip-size", MINIMAL, ["algorithm.ratio_level=sequence", "algorithm.loss_agg=seq-mean-token-mean"],
     "warning", "set algorithm.clip_range: 3.0e-04", GSPO),
    ("gspo-clip-size", MINIMAL, [*GSPO[:2], "algorithm.clip_range_high=0.28", GSPO[3]], "warning",
     "set algorithm.clip_range_high: 4.0e-04", GSPO),
    ("cispo-ppo-clip", MINIMAL, ["algorithm.policy_loss=cispo"], "warning", "set algorithm.clip_range: 1.0",
     ["algorithm.policy_loss=cispo", "algorithm.clip_range=1.0", "algorithm.clip_range_high=2"]),
    ("cispo-dual-clip", MINIMAL, ["algorithm.policy_loss=cispo", "algorithm.clip_range=1.0", "algorithm.dual_clip=3"],
     "error", "remove algorithm.dual_clip", ["algorithm.dual_clip=3"]),
    ("filter-small-groups", MINIMAL, [FG, "algorithm.group_size=2"], "warning", "set algorithm.group_size: 8",
     [FG, "algorithm.group_size=4"]),
    ("filter-needs-groups", MINIMAL, ["algorithm.name=ppo", "algorithm.group_size=1", FG], "error",
     "set algorithm.group_size: 8", ["algorithm.name=ppo", "algorithm.group_size=1"]),
    ("filter-max-calls", MINIMAL, ["algorithm.filter_groups={metric: acc, max_gen_calls: 3}"], "error",
     "set algorithm.filter_groups.max_gen_calls: 12", ["algorithm.filter_groups={metric: acc, max_gen_calls: 5}"]),
    ("filter-max-calls", MINIMAL, ["algorithm.filter_groups={metric: acc, max_gen_calls: 4}"], "warning",
     "set algorithm.filter_groups.max_gen_calls: 12", [FG]),
    ("filter-max-calls", MINIMAL, ["train.updates_per_step=4", FG], "error",  # 4 x 32 / 8 = 16 calls > 10
     "set algorithm.filter_groups.max_gen_calls: 48",
     ["train.updates_per_step=4", "algorithm.filter_groups={metric: acc, max_gen_calls: 48}"]),
    ("overlong-buffer", MINIMAL, ["reward.overlong={buffer: 64}"], "error", "set reward.overlong.buffer: 12",
     ["reward.overlong={buffer: 12}"]),
    ("overlong-buffer", MINIMAL, ["rollout.max_new_tokens=1", "reward.overlong={buffer: 1}"], "error",
     "raise rollout.max_new_tokens, or remove reward.overlong", ["rollout.max_new_tokens=1"]),
    ("overlong-buffer-small", MINIMAL, ["rollout.max_new_tokens=1024", "reward.overlong={buffer: 12}"], "warning",
     "set reward.overlong.buffer: 204", ["rollout.max_new_tokens=1024", "reward.overlong={buffer: 204}"]),
]
ALGO_RULES = {c[0] for c in CASES}


@pytest.mark.parametrize("rule,base,bad,severity,fix,good", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_with_its_fix_and_stays_silent(write, rule, base, bad, severity, fix, good):
    assert_rule_case(write(base), rule, bad, severity, fix, good)


def test_rules_registered_with_metadata_before_the_waiver_rules():
    ids = list(RULES)
    assert ALGO_RULES <= set(ids)
    assert ids[-2:] == ["unknown-waiver", "waived-error"]  # they must see every other rule
    for rid in ALGO_RULES:
        r = RULES[rid]
        assert r.severity in ("error", "warning", "info") and r.condition and r.why


def test_filter_group_fix_keeps_divisibility(write):
    # rollout 6 holds no group of 8, 16 or 4: the fix moves rollout.batch_size and train.batch_size too
    path = write(MINIMAL)
    base = [FG, "algorithm.group_size=2", "rollout.batch_size=6", "train.batch_size=36", "train.micro_batch_size=6"]
    _, findings = check(path, base)
    [f] = [f for f in findings if f.rule == "filter-small-groups"]
    assert f.fix == ("set algorithm.group_size: 8 and rollout.batch_size: 8 and train.batch_size: 48 "
                     "(6 x rollout.batch_size)")
    assert "82%" in f.message and "43%" in f.message  # dropped at 10% accuracy: 2 vs 8 samples
    _, findings = check(path, [FG, "algorithm.group_size=8", "rollout.batch_size=8", "train.batch_size=48",
                               "train.micro_batch_size=6"])
    assert [f for f in findings if f.severity != "info"] == []
    # two ranks: a group of 8 in a rollout of 8 would straddle them, 4 keeps 2 prompts per call
    _, findings = check(path, [FG, "algorithm.group_size=2", "trainer.nproc=2"])
    [f] = [f for f in findings if f.rule == "filter-small-groups"]
    assert f.fix == "set algorithm.group_size: 4"


def test_clip_range_playbook_only_for_token_ratios_in_the_ppo_surrogate(write):
    path = write(MINIMAL)
    _, f = check(path, GSPO)  # 3e-4 is far below [0.1, 0.3]: right for GSPO
    assert [x for x in f if x.rule == "clip-range"] == []
    _, f = check(path, ["algorithm.policy_loss=cispo", "algorithm.clip_range=1.0", "algorithm.clip_range_high=4"])
    assert [x for x in f if x.severity != "info"] == []
    # the PPO surrogate on token ratios keeps the playbook, errors included
    _, f = check(path, ["algorithm.clip_range=1.0"])
    assert [(x.rule, x.severity) for x in f if x.rule == "clip-range"] == [("clip-range", "error")]
    _, f = check(path, ["algorithm.clip_range_high=2"])
    assert ("clip-range", "error") in [(x.rule, x.severity) for x in f]
    # an upper bound below the lower one is clip-high-below-low's (an error), not clip-range's
    _, f = check(path, ["algorithm.clip_range_high=0.15"])
    assert [(x.rule, x.severity) for x in f if x.severity != "info"] == [("clip-high-below-low", "error")]


def test_no_kl_is_an_info_with_verifiable_rewards_and_a_warning_with_a_reward_model(write):
    path = write(MINIMAL)
    _, f = check(path, ["algorithm.kl.coef=0"])
    [k] = [x for x in f if x.rule == "kl-range"]
    assert k.severity == "info" and "turns the KL penalty off" in k.message and "DAPO" in k.message
    assert "set algorithm.kl.coef: 0.05" in k.fix
    _, f = check(path, ["algorithm.kl.coef=0", "reward.model=rm", "reward.max_length=2048"])
    [k] = [x for x in f if x.rule == "kl-range"]
    assert k.severity == "warning" and "reward hacking" in k.message
    assert k.fix == "set algorithm.kl.coef: 0.05"


def test_waiving_a_new_error_is_an_error(write):
    _, f = check(write(MINIMAL), ["algorithm.policy_loss=cispo", "algorithm.clip_range=1.0", "algorithm.dual_clip=3",
                                  "lint.waive={cispo-dual-clip: because}"])
    assert {(x.rule, x.severity) for x in f} >= {("cispo-dual-clip", "error"), ("waived-error", "error")}


# ---------------------------------------------------------------- presets

NEW_PRESETS = ["dapo", "gspo", "dr-grpo", "reinforce-pp"]
QUICKSTART = (ROOT / "recipes" / "quickstart.yaml").read_text()


def test_presets_shipped_with_a_citing_header():
    assert set(NEW_PRESETS) <= set(list_presets())
    ids = {"dapo": "arXiv:2503.14476", "gspo": "arXiv:2507.18071", "dr-grpo": "arXiv:2503.20783",
           "reinforce-pp": "arXiv:2501.03262"}
    for name, arxiv in ids.items():
        text = (ROOT / "src" / "rltune" / "presets" / f"{name}.yaml").read_text()
        first = text.splitlines()[0]
        assert first.startswith("# Algorithm — ") and arxiv in first
        assert "sec" in text  # the settings name the paper's sections


@pytest.mark.parametrize("name", NEW_PRESETS)
@pytest.mark.parametrize("base", [QUICKSTART, MINIMAL, PPO], ids=["quickstart", "minimal", "ppo"])
def test_preset_validates_under_a_recipe(write, name, base):
    path = write(base + f"preset: {name}\n")
    recipe, findings = check(path)
    assert recipe is not None, findings
    assert [f for f in findings if f.severity in ("error", "warning")] == []
    # none of the new rules has anything to say, not even an info
    assert [f for f in findings if f.rule in ALGO_RULES] == []


def test_preset_values():
    d = load_preset("dapo")
    a = d["algorithm"]
    assert (a["name"], a["clip_range"], a["clip_range_high"], a["loss_agg"]) == ("grpo", 0.2, 0.28, "token-mean")
    assert a["filter_groups"]["metric"] == "acc" and a["filter_groups"]["max_gen_calls"] >= 8
    assert a["kl"]["coef"] == 0
    assert d["reward"]["overlong"] == {"penalty": 1.0, "buffer": 12} and d["rollout"]["mask_truncated"] is False
    g = load_preset("gspo")["algorithm"]
    assert (g["ratio_level"], g["clip_range"], g["clip_range_high"], g["loss_agg"]) == \
        ("sequence", 3e-4, 4e-4, "seq-mean-token-mean")
    assert "kl" not in g  # the paper does not say; the recipe's KL stays
    dr = load_preset("dr-grpo")["algorithm"]
    assert dr == {"name": "grpo", "scale_by_std": False, "loss_agg": "seq-mean-token-sum-norm"}
    rp = load_preset("reinforce-pp")["algorithm"]
    assert rp["name"] == "reinforce_pp" and rp["kl"] == {"mode": "reward", "estimator": "k1"}


def test_dapo_under_minimal_is_the_paper_algorithm(write):
    r = load_recipe(write(MINIMAL + "preset: dapo\n")).recipe
    a = r.algorithm
    assert a.kl.coef == 0 and a.clip_range_high == 0.28 and a.filter_groups.metric == "acc"
    assert r.reward.overlong.buffer < r.rollout.max_new_tokens and not r.rollout.mask_truncated
    # the recipe wins: quickstart keeps its own kl.coef
    r = load_recipe(write(QUICKSTART + "preset: dapo\n")).recipe
    assert r.algorithm.kl.coef == 0.02 and r.reward.overlong.buffer < r.rollout.max_new_tokens == 16


def test_dapo_buffer_scaled_by_the_lint_on_long_responses(write):
    _, f = check(write(MINIMAL + "preset: dapo\n"), ["rollout.max_new_tokens=4096"])
    [x] = [x for x in f if x.rule == "overlong-buffer-small"]
    assert x.severity == "warning" and x.fix.startswith("set reward.overlong.buffer: 819")
    assert x.file.endswith("dapo.yaml")  # located at the preset's key


def test_cli_lists_and_shows_the_presets(cli):
    code, out = cli("presets", "list")
    assert code == 0
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    for name in NEW_PRESETS:
        assert "Algorithm — " in lines[name] and "arXiv:" in lines[name]
    code, out = cli("presets", "show", "dapo")
    assert code == 0 and out == (ROOT / "src" / "rltune" / "presets" / "dapo.yaml").read_text()
