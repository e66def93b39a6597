from __future__ import annotations

import pytest
from recipe_testlib import MINIMAL, PPO

from rltune.recipe import RULES, check, lint
from rltune.recipe.rules import num

# rule id -> (base, overrides that break it, severity it reports, overrides that keep it)
CASES = [
    ("lr-order", PPO, ["actor.lr=2e-6", "critic.lr=2e-6"], "error", ["actor.lr=1e-6", "critic.lr=3e-6"]),
    ("lr-order", PPO, ["actor.lr=2e-6", "critic.lr=1e-6"], "error", ["actor.lr=1e-6", "critic.lr=1.5e-6"]),
    ("lr-ratio", PPO, ["actor.lr=1e-6", "critic.lr=1e-5"], "error", ["actor.lr=1e-6", "critic.lr=5e-6"]),
    ("actor-lr-range", MINIMAL, ["actor.lr=1e-5"], "warning", ["actor.lr=5e-6"]),
    ("actor-lr-range", MINIMAL, ["actor.lr=1e-8"], "warning", ["actor.lr=1e-7"]),
    ("batch-ratio-low", MINIMAL, ["rollout.batch_size=16", "train.batch_size=32"], "warning",
     ["rollout.batch_size=8", "train.batch_size=32"]),
    ("batch-ratio-high", MINIMAL, ["rollout.batch_size=8", "train.batch_size=72"], "warning",
     ["rollout.batch_size=8", "train.batch_size=64"]),
    ("batch-ratio-high", MINIMAL, ["rollout.batch_size=8", "train.batch_size=96"], "error",
     ["rollout.batch_size=16", "train.batch_size=96"]),
    ("kl-range", MINIMAL, ["algorithm.kl.coef=0.2"], "warning", ["algorithm.kl.coef=0.1"]),
    ("kl-range", MINIMAL, ["algorithm.kl.coef=0.005"], "warning", ["algorithm.kl.coef=0.01"]),
    # kl.coef 0 is a warning with a reward model; with verifiable rewards only an info (test_rules_algo.py)
    ("kl-range", MINIMAL, ["algorithm.kl.coef=0", "algorithm.kl.mode=loss", "reward.model=rm", "reward.max_length=2048"],
     "warning", ["algorithm.kl.coef=0.03"]),
    ("clip-range", MINIMAL, ["algorithm.clip_range=0.05"], "warning", ["algorithm.clip_range=0.1"]),
    ("clip-range", MINIMAL, ["algorithm.clip_range=0.4"], "warning", ["algorithm.clip_range=0.3"]),
    # clip_range_high below clip_range is now rule clip-high-below-low (an error, test_rules_algo.py)
    ("clip-range", MINIMAL, ["algorithm.clip_range_high=0.35"], "warning", ["algorithm.clip_range_high=0.28"]),
    ("reward-length", MINIMAL, ["reward.model=rm", "reward.max_length=300"], "error",
     ["reward.model=rm", "reward.max_length=320"]),
    ("max-model-len", MINIMAL, ["rollout.max_model_len=256"], "error", ["rollout.max_model_len=320"]),
    ("grad-clip", MINIMAL, ["actor.grad_clip=null"], "warning", ["actor.grad_clip=0.5"]),
    ("grad-clip", PPO, ["critic.grad_clip=10"], "warning", ["critic.grad_clip=5"]),
    ("warmup", MINIMAL, ["actor.warmup_steps=0"], "warning", ["actor.warmup_steps=1"]),
    ("warmup", PPO, ["critic.warmup_steps=0"], "warning", ["critic.warmup_steps=5"]),
    ("precision", MINIMAL, ["trainer.precision=fp16"], "warning", ["trainer.precision=bf16"]),
    ("seed", MINIMAL, ["trainer.seed=null"], "warning", ["trainer.seed=0"]),
    ("device-mesh", PPO, ["critic.device_mesh=[]"], "error", ["critic.device_mesh=[0]"]),
    ("device-mesh", PPO, ["trainer.nproc=2", "actor.device_mesh=[0,2]"], "error", ["trainer.nproc=2", "actor.device_mesh=[0,1]"]),
    ("device-mesh", PPO, ["trainer.nproc=2", "actor.device_mesh=[1,1]"], "error", ["trainer.nproc=2", "actor.device_mesh=[1]"]),
    ("device-mesh", PPO, ["actor.device_mesh=[0]", "critic.device_mesh=[0]"], "info", ["actor.device_mesh=[0]"]),
    ("divisibility", MINIMAL, ["train.micro_batch_size=5"], "error", ["train.micro_batch_size=8"]),
    ("divisibility", MINIMAL, ["rollout.batch_size=8", "train.batch_size=36", "train.micro_batch_size=4"], "error",
     ["rollout.batch_size=8", "train.batch_size=40"]),
    # with a token budget the rows per micro-batch are not the micro-batch size: only the world size divides
    ("divisibility", MINIMAL, ["train.micro_batch_size=5", "train.max_tokens_per_micro_batch=4096", "trainer.nproc=3"],
     "error", ["train.micro_batch_size=5", "train.max_tokens_per_micro_batch=4096"]),
    ("divisibility", MINIMAL, ["algorithm.group_size=3"], "error", ["algorithm.group_size=8"]),
    ("divisibility", MINIMAL, ["trainer.nproc=3"], "error", ["trainer.nproc=2"]),
    ("divisibility", MINIMAL, ["trainer.nproc=4"], "error",  # 2 prompts do not split over 4 ranks
     ["trainer.nproc=4", "rollout.batch_size=16", "train.batch_size=64"]),
    ("divisibility", MINIMAL, ["trainer.nproc=2", "train.micro_batch_size=32"], "error",
     ["trainer.nproc=2", "train.micro_batch_size=16"]),
    ("group-size", MINIMAL, ["algorithm.group_size=1", "rollout.batch_size=8"], "error", ["algorithm.group_size=2"]),
    ("group-size", MINIMAL, ["algorithm.name=rloo", "algorithm.group_size=1"], "error", ["algorithm.name=ppo", "algorithm.group_size=1"]),
    ("greedy-groups", MINIMAL, ["rollout.do_sample=false"], "error", ["rollout.do_sample=false", "algorithm.name=ppo"]),
    ("no-reward", MINIMAL, ["reward.functions=[]"], "error", ["reward.functions=[]", "reward.model=rm", "reward.max_length=2048"]),
    ("unused-critic", MINIMAL, ["critic.lr=1e-5"], "info", ["algorithm.name=ppo", "critic.lr=3e-6"]),
    ("unused-critic", MINIMAL, ["model.critic=foo", "algorithm.lam=0.9"], "info", ["model.reference=foo"]),
    ("clip-inactive", MINIMAL, ["algorithm.clip_range=0.15"], "info", ["algorithm.clip_range=0.15", "train.updates_per_step=2"]),
    ("clip-inactive", MINIMAL, ["algorithm.dual_clip=3"], "info", ["algorithm.dual_clip=3", "train.ppo_epochs=2"]),
    ("unknown-waiver", MINIMAL, ["lint.waive={lr-ordr: because}"], "warning", ["lint.waive={lr-order: because}"]),
    ("waived-error", PPO, ["actor.lr=1e-6", "critic.lr=1e-6", "lint.waive={lr-order: because}"], "error",
     ["actor.lr=1e-6", "critic.lr=3e-6", "lint.waive={lr-order: because}"]),
]


@pytest.mark.parametrize("rule,base,bad,severity,good", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_and_stays_silent(write, rule, base, bad, severity, good):
    path = write(base)
    recipe, findings = check(path, bad)
    assert recipe is not None, findings
    hits = [f for f in findings if f.rule == rule]
    assert hits, f"{rule} did not fire on {bad}: {findings}"
    assert severity in {f.severity for f in hits}
    for f in hits:
        assert f.message and f.fix and f.path
        assert f.file == path and f.line >= 1
    _, findings = check(path, good)
    assert [f for f in findings if f.rule == rule] == []


def test_every_rule_is_tested():
    from test_rules_algo import ALGO_RULES  # the 2026 toolbox rules are tested there
    from test_rules_lora import LORA_RULES  # and the LoRA rules there
    from test_rules_settings import CASES as SETTINGS_CASES  # settings without effect, rollback, mask
    MEMORY_RULES = {"memory-budget"}        # tests/plan/test_cli.py (needs a model config and hardware)

    assert {c[0] for c in CASES} | ALGO_RULES | LORA_RULES | MEMORY_RULES | {c[0] for c in SETTINGS_CASES} == set(RULES)


def test_every_rule_has_metadata():
    for r in RULES.values():
        assert r.id == r.id.lower() and " " not in r.id
        assert r.severity in ("error", "warning", "info")
        assert r.condition and r.why


def test_oscillating_recipe_is_flagged(write):
    # the playbook's field case: actor lr 1e-5, kl 0.1 (in range), clip 0.1
    recipe, findings = check(write(PPO), ["actor.lr=1e-5", "critic.lr=3e-5", "algorithm.kl.coef=0.1",
                                           "algorithm.clip_range=0.1"])
    rules = {f.rule: f for f in findings}
    assert {k for k, f in rules.items() if f.severity != "info"} == {"actor-lr-range"}
    # with one update per step the ratio is 1: the field case's clip change cannot act here
    assert rules["clip-inactive"].severity == "info"
    f = rules["actor-lr-range"]
    assert "1.0e-05" in f.message and "±25%" in f.message
    assert "set actor.lr: 1.0e-06" in f.fix


def test_equal_lrs_is_an_error_with_computed_fix(write):
    _, findings = check(write(PPO), ["actor.lr=1e-6", "critic.lr=1e-6"])
    [f] = [f for f in findings if f.severity == "error"]
    assert f.rule == "lr-order" and f.path == "critic.lr"
    assert f.fix == "set critic.lr: 3.0e-06 (3 x actor.lr)"


def test_waived_rule_is_reported_as_info(write, cli):
    text = MINIMAL + "algorithm:\n  name: ppo\n  kl:\n    coef: 0.2\n"
    _, findings = check(write(text))
    assert [f.rule for f in findings if f.severity == "warning"] == ["kl-range"]
    path = write(text + "lint:\n  waive:\n    kl-range: \"value model pre-trained; measured stable\"\n")
    _, findings = check(path)
    [f] = findings
    assert f.rule == "kl-range" and f.severity == "info" and f.waived
    assert f.waive_reason == "value model pre-trained; measured stable"
    assert f.to_dict()["waived"] is True
    code, out = cli("validate", path)
    assert code == 0 and "waived" in out


def test_batch_ratio_playbook_cases(write):
    path = write(MINIMAL)
    _, f = check(path, ["rollout.batch_size=8", "train.batch_size=64", "train.micro_batch_size=4"])
    assert f == []
    _, f = check(path, ["rollout.batch_size=64", "train.batch_size=128", "train.micro_batch_size=4"])
    assert [(x.rule, x.severity) for x in f] == [("batch-ratio-low", "warning")]
    assert "set train.batch_size: 256" in f[0].fix
    _, f = check(path, ["rollout.batch_size=8", "train.batch_size=96", "train.micro_batch_size=4"])
    assert [(x.rule, x.severity) for x in f] == [("batch-ratio-high", "error")]
    assert "12" in f[0].message


def test_strict_turns_warnings_into_errors(write):
    path = write(MINIMAL)
    _, f = check(path, ["trainer.seed=null"], strict=True)
    assert [(x.rule, x.severity) for x in f] == [("seed", "error")]


def test_critic_rules_only_for_ppo(write):
    _, f = check(write(MINIMAL), ["actor.lr=1e-6", "critic.lr=1e-6", "critic.grad_clip=null"])
    assert {x.rule for x in f} == {"unused-critic"}
    assert all(x.severity == "info" for x in f)


def test_lint_accepts_a_bare_recipe(write):
    res_recipe, _ = check(write(PPO), ["critic.lr=1e-6"])
    f = lint(res_recipe)
    assert [x.rule for x in f] == ["lr-order"]


def test_num_formatting():
    assert num(3e-6) == "3.0e-06"
    assert num(1.25e-6) == "1.25e-06"
    assert num(0.05) == "0.05"
    assert num(1.0) == "1.0"
    assert num(64) == "64"
