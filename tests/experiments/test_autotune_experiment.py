"""The autotune claim on one seed (docs/autotune-experiment.md), through the real CLI:
recipes/experiments/lr-too-high.yaml blows up without autotune (the health monitor says so) and
stays healthy and learns with `autotune.mode: act`. Two trainings of ~0.5-3 min each on CPU.

The dead run collapses onto a bare number, the maximum of the format reward (1.0), so the
reward does not tell the runs apart; the KL and entropy comparisons do (see the doc)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _experiment():
    spec = importlib.util.spec_from_file_location("autotune_experiment", ROOT / "benchmarks" / "autotune_experiment.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_autotune_rescues_a_too_high_actor_lr(tmp_path):
    exp = _experiment()
    off = exp.summarize(exp.train(1, "off", tmp_path))
    act = exp.summarize(exp.train(1, "act", tmp_path))

    # without autotune: the monitor reports the blow-up, no knob moved, the policy is dead
    assert off["blowup"], off["health"]
    assert "entropy_collapse" in {k for _, k in off["health"]}, off["health"]
    assert off["autotune"] == []
    assert off["entropy_last"] < 0.05
    # with autotune: it acted (lower actor lr among the changes) ...
    assert any(k == "actor.lr" and new < old for _, k, old, new, _ in act["autotune"]), act["autotune"]
    # ... and the run learns: final reward clearly above its start. (Not above the dead run's: since
    # the hf engine samples without transformers' default top_k 50 (issue 10), the dead run on this
    # seed too collapses onto a bare number, the format reward's maximum; see the doc.)
    assert act["reward_last3"] > act["reward_first3"] + 0.3, (act["reward_first3"], act["reward_last3"])
    # ... with a lower KL to the reference and a live policy (no entropy collapse)
    assert "entropy_collapse" not in {k for _, k in act["health"]}, act["health"]
    assert act["entropy_last"] > 0.5
    # (not a lower peak: the fix comes at step 4, once the KL has doubled over two windows)
    assert act["kl_last10"] < off["kl_last10"], (off["kl_last10"], act["kl_last10"])
