"""lint.waive waives warnings and infos only; a waived error stays an error (issue 10, item 10)."""

from __future__ import annotations

import json

from recipe_testlib import MINIMAL, PPO

from rltune.recipe import check

EQUAL_LRS = PPO + "actor:\n  lr: 1.0e-6\ncritic:\n  lr: 1.0e-6\n"
WAIVE_LR_ORDER = "lint:\n  waive:\n    lr-order: \"we know better\"\n"


def test_waiving_an_error_is_an_error_and_the_error_stays(write, cli):
    text = EQUAL_LRS + WAIVE_LR_ORDER
    path = write(text)
    recipe, findings = check(path)
    assert recipe is not None
    by_rule = {f.rule: f for f in findings}
    assert set(by_rule) == {"lr-order", "waived-error"}
    lr = by_rule["lr-order"]
    assert lr.severity == "error" and not lr.waived and lr.path == "critic.lr"
    w = by_rule["waived-error"]
    assert w.severity == "error" and w.path == "lint.waive.lr-order"
    assert w.line == text.splitlines().index('    lr-order: "we know better"') + 1
    assert "lr-order" in w.message and "only warnings and infos can be waived" in w.message
    assert w.fix == "fix the recipe as `lr-order` says (set critic.lr: 3.0e-06 (3 x actor.lr)), then remove lint.waive.lr-order"

    code, out = cli("validate", path)
    assert code == 1 and "waived-error" in out and "lint.waive.lr-order" in out
    code, out = cli("validate", "--format", "json", path)
    rows = json.loads(out[out.index("["):])
    assert code == 1 and {(r["rule"], r["severity"]) for r in rows} == {("lr-order", "error"), ("waived-error", "error")}
    assert all("waived" not in r for r in rows)


def test_a_rule_that_is_an_error_only_above_a_bound(write):
    # batch-ratio-high is a warning up to ratio 10 (waivable) and an error above it (not)
    waive = "lint:\n  waive:\n    batch-ratio-high: \"short smoke run\"\n"
    _, findings = check(write(MINIMAL + waive), ["rollout.batch_size=8", "train.batch_size=72"])
    assert [(f.rule, f.severity, f.waived) for f in findings] == [("batch-ratio-high", "info", True)]
    _, findings = check(write(MINIMAL + waive), ["rollout.batch_size=8", "train.batch_size=96"])
    assert sorted((f.rule, f.severity, f.waived) for f in findings) == [
        ("batch-ratio-high", "error", False), ("waived-error", "error", False)]


def test_waiving_an_error_rule_that_does_not_fire_is_fine(write):
    _, findings = check(write(PPO + WAIVE_LR_ORDER), ["actor.lr=1e-6", "critic.lr=3e-6"])
    assert findings == []


def test_waived_warning_is_still_info_and_strict_keeps_it(write, cli):
    path = write(MINIMAL + "actor:\n  lr: 1.0e-5\nlint:\n  waive:\n    actor-lr-range: \"tiny model\"\n")
    _, findings = check(path, strict=True)
    assert [(f.rule, f.severity, f.waived) for f in findings] == [("actor-lr-range", "info", True)]
    code, _ = cli("validate", "--strict", path)
    assert code == 0
