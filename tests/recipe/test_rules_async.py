"""Generation one step ahead (rules_async.py): each rule fires on a held case with its fix and
stays silent once the fix is applied."""

from __future__ import annotations

import pytest
from recipe_testlib import MINIMAL, assert_rule_case

from rltune.recipe import RULES

K1, K2 = "rollout.asynchronous.max_staleness=1", "rollout.asynchronous.max_staleness=2"
SERVER = "rollout.engine=vllm-server"
GSPO = ["algorithm.ratio_level=sequence", "algorithm.clip_range=0.0003", "algorithm.clip_range_high=0.0004"]

CASES = [
    ("async-unsupported", MINIMAL, [K1, "rollout.engine=vllm"], "error", "set rollout.engine: vllm-server",
     [K1, SERVER]),
    ("async-unsupported", MINIMAL, [K1, "trainer.nproc=2"], "error", "set trainer.nproc: 1",
     [K1, "trainer.nproc=1"]),
    ("async-unsupported", MINIMAL, [K1, "rollout.asynchronous.partial=true", "rollout.engine=hf"], "error",
     "set rollout.engine: vllm-server", [K1, "rollout.asynchronous.partial=true", SERVER]),
    ("async-unsupported", MINIMAL, [K1, "rollout.asynchronous.partial=true", SERVER, "rollout.env=builtin:calculator",
                                    "rollout.max_new_tokens=256"], "error", "set rollout.asynchronous.partial: false",
     [K1, SERVER, "rollout.env=builtin:calculator", "rollout.max_new_tokens=256"]),
    ("async-without-correction", MINIMAL, [K1, "algorithm.rollout_correction.mode=none"], "warning",
     "set algorithm.rollout_correction.mode: tis", [K1, "algorithm.rollout_correction.mode=auto"]),
    # (1 + 0.2)^4 = 2.07 > cap 2: the fix's K keeps (1.2)^K under it
    ("staleness-vs-cap", MINIMAL, ["rollout.asynchronous.max_staleness=4"], "warning",
     "set rollout.asynchronous.max_staleness: 3", ["rollout.asynchronous.max_staleness=3"]),
    ("staleness-vs-cap", MINIMAL, [K2, "train.updates_per_step=2", "train.batch_size=32", "rollout.batch_size=8"],
     "warning", "or algorithm.rollout_correction.cap: 2.1", [K2, "train.updates_per_step=2", "train.batch_size=32",
                                                            "rollout.batch_size=8", "algorithm.rollout_correction.cap=2.1"]),
    ("staleness-vs-cap", MINIMAL, ["rollout.asynchronous.max_staleness=6", "algorithm.clip_range=0.1",
                                   "algorithm.rollout_correction.cap=5"], "warning",
     "set rollout.asynchronous.max_staleness: 4", ["rollout.asynchronous.max_staleness=4", "algorithm.clip_range=0.1",
                                                   "algorithm.rollout_correction.cap=5"]),
    ("staleness-gspo", MINIMAL, [K2, *GSPO], "warning", "set rollout.asynchronous.max_staleness: 1", [K1, *GSPO]),
    ("setting-without-effect", MINIMAL, ["rollout.asynchronous.partial=true"], "error",
     "set rollout.asynchronous.max_staleness: 1", ["rollout.asynchronous.partial=true", K1, SERVER]),
    ("setting-without-effect", MINIMAL, ["rollout.asynchronous.on_stale=drop"], "error",
     "remove rollout.asynchronous.on_stale", ["rollout.asynchronous.on_stale=drop", K1]),
]


@pytest.mark.parametrize("rule,base,bad,severity,fix,good", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_with_its_fix_and_stays_silent(write, rule, base, bad, severity, fix, good):
    assert_rule_case(write(base), rule, bad, severity, fix, good)


def test_registered_before_the_waiver_rules():
    ids = list(RULES)
    assert {c[0] for c in CASES} <= set(ids) and ids[-2:] == ["unknown-waiver", "waived-error"]


def test_the_default_async_recipe_is_clean(write):
    from rltune.recipe import check

    _, findings = check(write(MINIMAL), [K1])
    assert [f for f in findings if f.rule in RULES and f.rule.startswith(("async", "staleness"))] == []
