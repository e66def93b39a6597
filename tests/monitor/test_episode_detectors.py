"""The episode detectors (issue 27, item 6): a tool-error storm, and a policy that stops calling
its tools; quiet on healthy episode runs and on runs without episodes."""

from __future__ import annotations

from rltune.monitor.detectors import HealthMonitor
from rltune.recipe.schema import Recipe
from synth import RECIPE, healthy

GRPO = Recipe.model_validate({**RECIPE, "algorithm": {"name": "grpo"},
                              "rollout": {**RECIPE.get("rollout", {}), "env": "builtin:calculator"}})


def _run(trace):
    mon = HealthMonitor(GRPO, None)
    return [e for m in trace for e in mon.observe(m)]


def _episodes(n=60, calls=1.5, err=0.05, seed=0):
    trace = healthy(n, seed, ppo=False)
    for m in trace:
        m.update({"episode/tool_calls_mean": calls, "episode/tool_error_frac": err, "episode/timeouts": 0.0})
    return trace


def test_healthy_episode_runs_and_single_turn_runs_fire_nothing_new():
    for trace in (_episodes(), healthy(60, 1, ppo=False)):
        kinds = {e.kind for e in _run(trace)}
        assert not kinds & {"tool_errors", "tool_use_dropped"}, kinds


def test_tool_error_storm_fires_after_three_steps_and_advises_the_timeout_when_calls_time_out():
    trace = _episodes()
    for m in trace[20:30]:
        m["episode/tool_error_frac"] = 0.8
    trace[22]["episode/timeouts"] = 3.0
    evs = [e for e in _run(trace) if e.kind == "tool_errors"]
    assert [(e.step, e.severity) for e in evs] == [(trace[22]["step"], "warning")]
    assert "80% of the tool calls failed" in evs[0].message
    assert evs[0].changes == {"rollout.tool_timeout_s": 20.0}


def test_tool_use_dropped_is_a_warning_when_the_reward_did_not_rise():
    trace = _episodes()
    for m in trace[30:]:
        m["episode/tool_calls_mean"] = 0.1
        m["reward/mean"] = trace[25]["reward/mean"]           # the reward stalled
    evs = [e for e in _run(trace) if e.kind == "tool_use_dropped"]
    assert len(evs) == 1 and evs[0].severity == "warning", [(e.step, e.message) for e in evs]
    assert "below 25% of its best 1.50" in evs[0].message
    # the reward rose meanwhile: an info (the model may need the tool less)
    for i, m in enumerate(trace[30:]):
        m["reward/mean"] += 0.5 + 0.01 * i
    evs = [e for e in _run(trace) if e.kind == "tool_use_dropped"]
    assert [e.severity for e in evs] == ["info"]
