import json
import logging

import pytest

from rltune.monitor.autotune import STAGES, AutoTuner, Knobs
from rltune.monitor.detectors import Event, HealthMonitor
from rltune.recipe.schema import Recipe
from synth import RECIPE, fault, healthy

ON = {**RECIPE, "autotune": {"enabled": True, "window": 3, "cooldown": 5}}


def recipe(**over):
    d = json.loads(json.dumps(ON))
    for k, v in over.items():
        node = d
        *path, last = k.split("__")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v
    return Recipe.model_validate(d)


def drive(tuner, trace, monitor=None):
    changes = []
    for m in trace:
        evs = monitor.observe(m) if monitor else []
        changes += tuner.step(m, evs)
    return changes


def spike(step, kind="kl_spike"):
    return Event(step, kind, "error", f"{kind} at step {step}", {"kl": 1.0})


def test_knobs_from_recipe_and_disabled_does_nothing():
    r = recipe(autotune__enabled=False)
    t = AutoTuner(r)
    assert t.knobs == Knobs(1e-6, 3e-6, 0.05, 0.2, 0.0)
    assert drive(t, healthy(40)) == [] and t.stage == 0


def test_cold_start_to_acceleration_on_a_rising_trace(caplog):
    r = recipe(algorithm__clip_range=0.15)
    t = AutoTuner(r)
    trace = healthy(40, 0, 0.01)
    with caplog.at_level(logging.WARNING, logger="rltune"):
        changes = drive(t, trace, HealthMonitor(r))
    assert t.stage == 1 and t.metrics()["autotune/stage_name"] == "acceleration"
    assert {(c.key, c.new) for c in changes} == {("algorithm.kl.coef", 0.02), ("algorithm.clip_range", 0.2)}
    step = changes[0].step
    assert step == 9   # 3 windows of 3 steps
    assert t.knobs.kl_coef == 0.02 and t.knobs.clip_range == 0.2
    line = [r.getMessage() for r in caplog.records if "algorithm.kl.coef" in r.getMessage()][0]
    assert line.startswith(f"[AutoTune] step {step}: stage acceleration: algorithm.kl.coef 0.05 -> 0.02 because reward +")
    assert "over 2 windows and KL 0.0" in line and "< 0.4" in line
    m = t.metrics()
    assert m["autotune/stage"] == 1 and m["autotune/kl_coef"] == 0.02 and m["autotune/actor_lr"] == 1e-6


def test_no_acceleration_when_flat_or_kl_high():
    t = AutoTuner(recipe())
    flat = healthy(40, 0, 0.01, r0=1.0, r1=1.0)
    assert drive(t, flat) == [] and t.stage == 0
    t = AutoTuner(recipe())
    hot = healthy(40, 0, 0.01)
    for m in hot:
        m["kl"] = 0.5
    assert drive(t, hot) == [] and t.stage == 0


def test_anti_overfit_on_collapse(tmp_path):
    r = recipe()
    t = AutoTuner(r, tmp_path)
    trace, _ = fault("reward_collapse")
    changes = drive(t, trace, HealthMonitor(r))
    assert t.stage == 2
    assert (t.knobs.kl_coef, t.knobs.entropy_coef, t.knobs.clip_range) == (0.08, 0.01, 0.12)
    assert any(c.action == "stage anti-overfit" for c in changes)
    ev = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert all(e["kind"] == "autotune" for e in ev) and len(ev) == len(changes)


def test_spike_fix_with_cooldown():
    t = AutoTuner(recipe())
    c1 = t.step({"step": 10, "reward/mean": 1.0, "kl": 1.0}, [spike(10)])
    got = {c.key: c.new for c in c1}
    assert got.pop("critic.lr") == pytest.approx(2.5e-06, rel=1e-3)   # kept <= 5 x actor.lr
    assert got == {"actor.lr": 5e-07, "algorithm.kl.coef": 0.075, "algorithm.clip_range": 0.15}
    assert t.knobs.critic_lr <= 5 * t.knobs.actor_lr
    assert t.step({"step": 12}, [spike(12, "grad_spike")]) == []          # cooling down
    c3 = t.step({"step": 15}, [spike(15, "reward_swing")])                # cooldown 5 over
    assert {c.key: c.new for c in c3}["actor.lr"] == 2.5e-07
    assert t.knobs.kl_coef == 0.1   # 0.075 * 1.5 capped at 0.1


def test_never_outside_lint_bounds():
    t = AutoTuner(recipe(autotune__cooldown=0))
    for s in range(1, 40):
        t.step({"step": s}, [spike(s)])
        k = t.knobs
        assert 1e-7 <= k.actor_lr <= 5e-6
        assert 0.01 <= k.kl_coef <= 0.1 and 0.1 <= k.clip_range <= 0.3
        assert k.actor_lr <= k.critic_lr <= 5 * k.actor_lr
    assert t.knobs.actor_lr == 1e-7 and t.knobs.clip_range == 0.1 and t.knobs.kl_coef == 0.1
    # a deliberately high start lr may come down toward the bound, never go further out
    t = AutoTuner(recipe(actor__lr=2e-5, critic__lr=6e-5, autotune__cooldown=0))
    lo, hi = t.bounds("actor_lr")
    assert (lo, hi) == (1e-7, 2e-5)
    for s in range(1, 5):
        t.step({"step": s}, [spike(s)])
    assert t.knobs.actor_lr == 1.25e-06 and t.knobs.critic_lr <= 5 * t.knobs.actor_lr


def test_advise_mode_changes_nothing(caplog):
    r = recipe(autotune__mode="advise")
    t = AutoTuner(r)
    before = Knobs(**vars(t.knobs))
    with caplog.at_level(logging.WARNING, logger="rltune"):
        changes = drive(t, healthy(40, 0, 0.01), HealthMonitor(r))
        changes += t.step({"step": 41}, [spike(41)])
    assert t.knobs == before
    assert changes and not any(c.applied for c in changes)
    assert any("(advise, not applied)" in rec.getMessage() for rec in caplog.records)


def test_state_dict_round_trip():
    r = recipe()
    t = AutoTuner(r)
    trace = healthy(40, 0, 0.01)
    drive(t, trace[:20], HealthMonitor(r))
    t.step({"step": 20}, [spike(20)])
    state = json.loads(json.dumps(t.state_dict()))
    t2 = AutoTuner(r)
    t2.load_state_dict(state)
    assert t2.knobs == t.knobs and t2.stage == t.stage and t2.last_fix == 20
    assert t2.state_dict() == state
    # cooldown survives the resume
    assert t2.step({"step": 22}, [spike(22)]) == []


def test_stage_names():
    assert STAGES == ("cold-start", "acceleration", "anti-overfit")


def test_kl_high_is_a_spike_fix_trigger():
    # a KL that runs away under a too-high lr is already high before it could form a 10x spike:
    # the sustained kl_high event gets the spike fix (lr down, kl coef up, clip tighter)
    t = AutoTuner(recipe())
    ev = Event(6, "kl_high", "warning", "KL 1.2 > 0.6 sustained for 5 steps (since step 2)", {"kl": 1.2})
    got = {c.key: c.new for c in t.step({"step": 6, "reward/mean": 1.0, "kl": 1.2}, [ev])}
    assert got["actor.lr"] == 5e-07 and got["algorithm.kl.coef"] == 0.075 and got["algorithm.clip_range"] == 0.15
    assert all(c.action == "spike fix (kl_high)" for c in t.changes)
    # with the health monitor: a KL held above health.kl_high fires kl_high once, and autotune acts once
    t = AutoTuner(recipe(autotune__cooldown=0))
    mon = HealthMonitor(t.recipe)
    trace = [{"step": s, "reward/mean": 1.0, "reward/std": 0.1, "kl": 0.9} for s in range(1, 15)]
    changes = drive(t, trace, mon)
    assert [e.kind for e in mon.events] == ["kl_high"]
    assert {c.step for c in changes} == {5} and t.knobs.actor_lr == 5e-07


def test_far_too_high_lr_comes_down_by_ten():
    # more than 10x above the playbook range (5e-6): x0.1 per fix, then x0.5 once within 10x
    t = AutoTuner(recipe(actor__lr=0.3, critic__lr=0.9, autotune__cooldown=0,
                         lint={"waive": {"actor-lr-range": "test", "lr-ratio": "test"}}))
    lrs = []
    for s in range(1, 8):
        t.step({"step": s}, [spike(s)])
        lrs.append(t.knobs.actor_lr)
        assert t.knobs.actor_lr <= t.knobs.critic_lr <= 5 * t.knobs.actor_lr
    assert lrs == pytest.approx([0.03, 3e-3, 3e-4, 3e-5, 1.5e-5, 7.5e-6, 3.75e-6])
    # inside 10x of the range the cut stays x0.5 (the 2e-5 case above: 1e-5, 5e-6, ...)
    t = AutoTuner(recipe(actor__lr=4e-5, critic__lr=1.2e-4))
    t.step({"step": 1}, [spike(1)])
    assert t.knobs.actor_lr == 2e-05
