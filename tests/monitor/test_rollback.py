"""Autotune rollback criterion and bookkeeping (AutoTuner.hard_spike / rollback); the trainer
side (exact restore, continue, resume) is tests/train/test_rollback.py."""

import json
import logging

from rltune.monitor.autotune import AutoTuner
from rltune.monitor.detectors import Event
from rltune.recipe.schema import Recipe
from synth import RECIPE

RB = {"enabled": True, "mode": "act", "window": 3, "cooldown": 5, "rollback": True, "max_rollbacks": 2,
      "rollback_factor": 20.0}


def recipe(**autotune):
    d = json.loads(json.dumps(RECIPE))
    d["autotune"] = {**RB, **autotune}
    return Recipe.model_validate(d)


def warm(t, n=6, kl=0.05, grad=1.0):
    for s in range(1, n + 1):
        t.step({"step": s, "reward/mean": 0.5, "kl": kl, "actor/grad_norm": grad})


def ev(step, kind, **nums):
    return Event(step, kind, "error", f"{kind} at step {step}", nums)


def test_spike_far_above_range_is_hard_a_plain_spike_is_not():
    t = AutoTuner(recipe())
    warm(t)
    m = {"step": 7, "kl": 0.05 * 12, "actor/grad_norm": 1.0}
    assert t.hard_spike(m, [ev(7, "kl_spike")]) is None          # 12x: the ordinary spike fix
    m = {"step": 7, "kl": 0.05 * 30, "actor/grad_norm": 1.0}
    assert t.hard_spike(m, []) is None                            # no event: no rollback
    r = t.hard_spike(m, [ev(7, "kl_spike")])
    assert r["trigger"] == "kl_spike" and r["ratio"] == 30.0 and r["recent_max"] == 0.05 and r["before"] == 7
    r = t.hard_spike({"step": 7, "kl": 0.05, "actor/grad_norm": 25.0}, [ev(7, "grad_spike", role="actor")])
    assert r["trigger"] == "grad_spike" and r["value"] == 25.0


def test_a_kl_spike_after_negative_k1_values_is_measured_against_their_size():
    """Issue 46.5: k1 KL estimates can be negative; the recent max of a run whose KL wandered below
    zero was ~0 (the 1e-8 floor), so any KL spike event became a hard spike and a rollback."""
    t = AutoTuner(recipe())
    warm(t, kl=-0.05)
    assert t.hard_spike({"step": 7, "kl": 0.6, "actor/grad_norm": 1.0}, [ev(7, "kl_spike")]) is None   # 12x |KL|
    r = t.hard_spike({"step": 7, "kl": 1.5, "actor/grad_norm": 1.0}, [ev(7, "kl_spike")])
    assert r["ratio"] == 30.0 and r["recent_max"] == 0.05


def test_entropy_collapse_is_hard():
    t = AutoTuner(recipe())
    warm(t)
    r = t.hard_spike({"step": 7, "actor/entropy": 0.0}, [ev(7, "entropy_collapse", steps=2)])
    assert r["trigger"] == "entropy_collapse" and r["value"] == 0.0
    assert r["before"] == 6  # the target checkpoint predates the collapse (below the floor since step 6)


def test_nonfinite_streak_reaches_max_skipped_minus_one():
    t = AutoTuner(recipe())  # health.max_skipped_steps 3 -> rollback at a streak of 2
    warm(t)
    assert t.hard_spike({"step": 7, "health/skipped_steps": 1}) is None
    r = t.hard_spike({"step": 8, "health/skipped_steps": 2})
    assert r["trigger"] == "nonfinite" and r["before"] == 7


def test_off_unless_act_and_rollback():
    for cfg in ({"rollback": False}, {"mode": "advise"}, {"enabled": False}):
        t = AutoTuner(recipe(**cfg))
        warm(t)
        assert t.hard_spike({"step": 7, "health/skipped_steps": 5}) is None


def test_rollback_applies_the_fix_without_cooldown_and_is_limited_and_recorded(tmp_path, caplog):
    t = AutoTuner(recipe(max_rollbacks=2), run_dir=tmp_path)
    warm(t)
    t.step({"step": 7, "kl": 2.0}, [ev(7, "kl_spike")])           # an ordinary fix: the cooldown starts
    lr0, kl0, clip0 = t.knobs.actor_lr, t.knobs.kl_coef, t.knobs.clip_range
    r = t.hard_spike({"step": 8, "health/skipped_steps": 2})
    ch = t.rollback(8, r, {"from_step": 5})
    assert {c.key for c in ch} >= {"actor.lr", "algorithm.kl.coef", "algorithm.clip_range"}
    assert t.knobs.actor_lr < lr0 and t.knobs.kl_coef > kl0 and t.knobs.clip_range < clip0
    lo, hi = t.bounds("actor_lr")
    assert lo <= t.knobs.actor_lr <= hi and t.knobs.clip_range >= 0.1 and t.knobs.kl_coef <= 0.1
    t.rollback(9, t.hard_spike({"step": 9, "health/skipped_steps": 2}), {"from_step": 5})
    assert t.rollbacks == 2
    with caplog.at_level(logging.WARNING, logger="rltune"):
        assert t.hard_spike({"step": 12, "health/skipped_steps": 2}) is None
    assert "max_rollbacks (2) reached" in caplog.text
    evs = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    rb = [e for e in evs if e["kind"] == "rollback"]
    assert [e["step"] for e in rb] == [8, 9] and rb[0]["numbers"]["from_step"] == 5
    assert rb[0]["severity"] == "warning" and rb[0]["numbers"]["fix"]["actor.lr"][0] == lr0
    # the count survives a checkpoint
    t2 = AutoTuner(recipe(max_rollbacks=2))
    t2.load_state_dict(json.loads(json.dumps(t.state_dict())))
    assert t2.rollbacks == 2 and len(t2.rollback_log) == 2 and t2.metrics()["autotune/rollbacks"] == 2
    assert t2.hard_spike({"step": 13, "health/skipped_steps": 2}) is None
    # an old checkpoint without the fields loads with count 0
    old = t.state_dict()
    for k in ("rollbacks", "rollback_log", "hist"):
        old.pop(k)
    t3 = AutoTuner(recipe())
    t3.load_state_dict(old)
    assert t3.rollbacks == 0
