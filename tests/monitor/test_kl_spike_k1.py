"""The KL spike's baseline with a k1 estimator (issue 46 item 5).

k1 (log p - log p_ref) is unbiased but noisy and can be negative; with off-policy (async, partial)
samples it wanders around 0 or below. The detector compared the new value with max(recent KL,
1e-4): a floor reached through negative values, so 0.0 -> 0.767 read '7668x its recent max 0.0001'
(an ERROR advising to halve the lr) while synchronous runs with larger jumps stayed quiet. The
baseline is now the recent |KL| (the estimator's real scale), at least kl_spike_min / (10 x kl_spike_factor)."""

import random

import pytest

from rltune.monitor.detectors import HealthMonitor
from rltune.recipe.schema import Recipe
from synth import RECIPE, fault, healthy

R = Recipe.model_validate(RECIPE)
K1 = Recipe.model_validate({**RECIPE, "algorithm": {**RECIPE.get("algorithm", {}), "kl": {"estimator": "k1"}}})


def spikes(trace, recipe=K1):
    mon = HealthMonitor(recipe)
    return [e for m in trace for e in mon.observe(m) if e.kind == "kl_spike"]


def k1_trace(seed, at=30, jump=0.767, noise=0.12, below=True, n=60):
    """A healthy trace whose KL is a k1 estimate around 0 (every value <= 0 with `below`, so its
    max is the old 1e-4 floor), then `jump` at step `at` and a KL that stays near it."""
    tr = healthy(n, seed)
    rng = random.Random(seed + 7)
    for m in tr[:at - 1]:
        x = rng.gauss(-noise / 2 if below else 0.0, noise / 2)
        m["kl"] = min(x, 0.0) if below else x
    for m in tr[at - 1:]:
        m["kl"] = jump * (1 + rng.gauss(0, 0.05))
    tr[at - 1]["kl"] = jump
    return tr


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("below", [True, False])
def test_a_k1_kl_around_zero_then_0767_is_not_a_spike(seed, below):
    """The async partial run: negative k1 values of the estimator's own size, then 0.767 (an
    ordinary move at that scale): no error. It used to fire at 'thousands of x its recent max'."""
    tr = k1_trace(seed, below=below)
    assert min(m["kl"] for m in tr[:29]) < 0
    evs = spikes(tr)
    assert evs == [], [(e.step, e.message) for e in evs]


def test_a_jump_large_against_a_tiny_k1_scale_still_fires_without_a_meaningless_ratio():
    """k1 values within 1e-4 of 0, then 0.767: large against the run's real scale, so an error;
    the message says what it is measured against (kl_spike_min), not '7668x its recent max 0.0001'."""
    tr = k1_trace(0, noise=1e-4)
    evs = spikes(tr)
    assert [e.step for e in evs] == [30], [(e.step, e.message) for e in evs]
    msg = evs[0].message
    assert "7668x" not in msg and "recent max 0.0001" not in msg, msg
    assert "health.kl_spike_min 0.3" in msg and "-> 0.767" in msg, msg
    # the value before the spike is shown as it was (k1 may be negative), not clamped to 0.0
    assert tr[28]["kl"] < 0 and msg.split("->")[0].split(": ")[1].startswith("-"), msg
    # measured against the floor kl_spike_min / (10 x kl_spike_factor), not against 1e-4
    assert evs[0].numbers["scale"] == 0.003 and evs[0].numbers["recent_max"] < 2e-4, evs[0].numbers


@pytest.mark.parametrize("seed", range(4))
def test_the_playbook_spike_still_fires_with_negative_k1_values_in_its_history(seed):
    """DESIGN section 4: 0.01 -> 1.0, then high for a few steps. A k1 history around 0.01 that
    dips below 0 now and then does not hide it."""
    tr = healthy(60, seed)
    rng = random.Random(seed)
    for m in tr[:29]:
        m["kl"] = rng.gauss(0.01, 0.01)
    assert min(m["kl"] for m in tr[:29]) < 0
    tr[29]["kl"] = 1.0
    for m in tr[30:33]:
        m["kl"] = 0.2
    evs = spikes(tr)
    assert [e.step for e in evs] == [30], [(e.step, e.message) for e in evs]
    assert "x its recent max |KL|" in evs[0].message and evs[0].numbers["factor"] > 10


def test_the_synthetic_fault_still_fires_once():
    trace, at = fault("kl_spike")
    evs = spikes(trace, R)
    assert [e.step for e in evs] == [at]
    assert evs[0].severity == "error"
