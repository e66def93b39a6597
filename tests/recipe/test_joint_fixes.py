"""The batch rules' fixes work together (issue 26, item 2): applying every fix `validate` prints
gives a recipe without divisibility or batch-ratio findings. Each fix used to be computed from the
original values (train 200 / rollout 16 / micro 16 proposed rollout 40, train 192 and micro 10:
two new divisibility errors); now every batch rule prints one joint proposal."""

from __future__ import annotations

import re

import pytest
from recipe_testlib import MINIMAL

from rltune.recipe import check

BATCH_RULES = {"divisibility", "batch-ratio-low", "batch-ratio-high"}
BATCH_KEYS = {"rollout.batch_size", "train.batch_size", "train.micro_batch_size"}

# (id, overrides): recipes with broken batch sizes
BROKEN = [
    ("issue-26", ["train.batch_size=200", "rollout.batch_size=16", "train.micro_batch_size=16"]),
    ("group-3", ["algorithm.group_size=3", "rollout.batch_size=8", "train.batch_size=32"]),
    ("group-6", ["algorithm.group_size=6", "rollout.batch_size=16", "train.batch_size=64"]),
    ("group-5-rloo", ["algorithm.name=rloo", "algorithm.group_size=5", "rollout.batch_size=16", "train.batch_size=100",
                      "train.micro_batch_size=8"]),
    ("world-2", ["trainer.nproc=2", "rollout.batch_size=12", "train.batch_size=48", "train.micro_batch_size=8"]),
    ("world-8", ["trainer.nproc=8", "rollout.batch_size=8", "train.batch_size=64"]),
    ("world-2x2-ppo", ["algorithm.name=ppo", "trainer.nproc=2", "trainer.nnodes=2", "rollout.batch_size=6",
                       "train.batch_size=30", "train.micro_batch_size=4"]),
    ("world-3-micro", ["trainer.nproc=3", "rollout.batch_size=24", "train.batch_size=96", "train.micro_batch_size=5"]),
    ("ratio-low", ["rollout.batch_size=64", "train.batch_size=96", "train.micro_batch_size=8"]),
    ("ratio-low-2", ["rollout.batch_size=16", "train.batch_size=32", "train.micro_batch_size=3"]),
    ("ratio-high", ["rollout.batch_size=8", "train.batch_size=200", "train.micro_batch_size=16"]),
    ("ratio-high-error", ["rollout.batch_size=4", "train.batch_size=96"]),
    ("micro", ["train.micro_batch_size=5"]),
    ("micro-world-2", ["trainer.nproc=2", "train.micro_batch_size=32"]),
    ("everything", ["algorithm.group_size=6", "trainer.nproc=4", "rollout.batch_size=10", "train.batch_size=7",
                    "train.micro_batch_size=3"]),
]

_PAIR = re.compile(r"([a-z_]+(?:\.[a-z_0-9]+)+): ([^\s,;()]+)")


def fix_pairs(fix: str) -> dict:
    """The key: value pairs a fix sets (`set a.b: 1 and c.d: 2 (why)`), alternatives (`, or ...`) left out."""
    if not fix.startswith("set "):
        return {}
    first = re.split(r",? or |; ", fix, maxsplit=1)[0]
    first = re.sub(r"\([^()]*\)", "", first)
    return dict(_PAIR.findall(first))


def test_fix_pairs():
    assert fix_pairs("set rollout.batch_size: 40 and train.batch_size: 200 (ratio 5)") == {
        "rollout.batch_size": "40", "train.batch_size": "200"}
    assert fix_pairs("set train.batch_size: 48 (6 x rollout.batch_size), or lower rollout.batch_size to 8") == {
        "train.batch_size": "48"}
    assert fix_pairs("did you mean `x`?") == {}


@pytest.mark.parametrize("overrides", [b[1] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_applying_every_fix_lints_clean(write, overrides):
    path = write(MINIMAL)
    recipe, findings = check(path, overrides)
    assert recipe is not None, findings
    batch = [f for f in findings if f.rule in BATCH_RULES and f.severity in ("error", "warning")]
    assert batch, f"{overrides}: the case is not broken"
    # every batch finding proposes the same joint fix
    assert len({f.fix for f in batch}) == 1, [(f.rule, f.fix) for f in batch]
    edits: dict = {}
    for f in findings:
        for k, v in fix_pairs(f.fix).items():
            assert edits.get(k, v) == v, f"conflicting fixes for {k}: {edits[k]} and {v} ({findings})"
            edits[k] = v
    assert set(edits) & BATCH_KEYS
    fixed = list(overrides) + [f"{k}={v}" for k, v in edits.items()]
    recipe, after = check(path, fixed)
    assert recipe is not None, after
    left = [(f.rule, f.severity, f.message) for f in after
            if f.rule in BATCH_RULES and f.severity in ("error", "warning")]
    assert left == [], f"{overrides} + fixes {edits}: {left}"


def test_issue_case_keeps_the_micro_batch_consistent(write):
    _, findings = check(write(MINIMAL), ["train.batch_size=200", "rollout.batch_size=16", "train.micro_batch_size=16"])
    fixes = {f.fix for f in findings if f.rule in BATCH_RULES}
    assert len(fixes) == 1
    pairs = fix_pairs(fixes.pop())
    rb = int(pairs.get("rollout.batch_size", 16))
    tb = int(pairs.get("train.batch_size", 200))
    mb = int(pairs.get("train.micro_batch_size", 16))
    assert tb % rb == 0 and 4 <= tb // rb <= 8 and tb % mb == 0 and rb % 4 == 0


def test_waived_ratio_is_kept_by_the_divisibility_fix(write):
    """With batch-ratio-high waived (a short smoke run), the divisibility fix need not move the ratio."""
    text = MINIMAL + "lint:\n  waive:\n    batch-ratio-high: \"smoke run\"\n"
    _, findings = check(write(text), ["rollout.batch_size=8", "train.batch_size=72", "train.micro_batch_size=5"])
    [f] = [f for f in findings if f.rule == "divisibility"]
    assert fix_pairs(f.fix) == {"train.micro_batch_size": "4"}
