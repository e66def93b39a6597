import json

import pytest

from rltune.monitor.detectors import Event, HealthMonitor, verdict_event
from rltune.recipe.schema import Recipe
from synth import RECIPE, fault, healthy, healthy_binary

R = Recipe.model_validate(RECIPE)
GRPO = Recipe.model_validate({**RECIPE, "algorithm": {"name": "grpo"}})
GRPO8 = Recipe.model_validate({**RECIPE, "algorithm": {"name": "grpo"}, "train": {"batch_size": 8}})


def run(trace, recipe=R, run_dir=None):
    mon = HealthMonitor(recipe, run_dir)
    return mon, [e for m in trace for e in mon.observe(m)]


@pytest.mark.parametrize("seed", range(8))
def test_healthy_traces_fire_nothing(seed):
    for trace, recipe in ((healthy(80, seed, 0.03), R), (healthy(80, seed, 0.06), R),
                          (healthy(80, seed, ppo=False), GRPO), (healthy_binary(80, seed), GRPO),
                          (healthy_binary(80, seed, batch=8), GRPO8)):
        _, evs = run(trace, recipe)
        assert evs == [], [(e.step, e.kind, e.message) for e in evs]


@pytest.mark.parametrize("kind", ["reward_swing", "kl_high", "kl_spike", "grad_spike", "grad_clip", "critic_nan",
                                  "actor_nan", "entropy_collapse", "length_collapse", "length_runaway",
                                  "sync_slow", "stale_weights", "async_drift"])
def test_fault_fires_once_at_the_right_step(kind):
    trace, at = fault(kind)
    _, evs = run(trace)
    assert [(e.step, e.kind) for e in evs] == [(at, kind)], [(e.step, e.kind, e.message) for e in evs]
    e = evs[0]
    assert e.severity in ("warning", "error") and e.message and e.advice
    json.dumps(e.to_dict())


def test_reward_collapse_fires_in_the_collapse():
    trace, _ = fault("reward_collapse")
    _, evs = run(trace)
    assert [e.kind for e in evs] == ["reward_collapse"]
    assert 31 <= evs[0].step <= 42
    ch = evs[0].changes
    assert ch == {"algorithm.kl.coef": 0.08, "algorithm.entropy_coef": 0.01, "algorithm.clip_range": 0.12}


def test_eval_reward_falling_while_train_rises_is_reward_hacking():
    trace = healthy(80, 3)
    for m in trace:
        if "eval/reward" in m and m["step"] >= 50:
            m["eval/reward"] = 0.6   # eval best ~1.3 at step 40, train keeps rising
    _, evs = run(trace)
    # two evals in a row (50, 60) below the best, each by >= collapse_drop of it
    assert [(e.step, e.kind) for e in evs] == [(60, "reward_hacking")]


def test_messages_use_playbook_words_and_advice_shape():
    _, evs = run(fault("critic_nan")[0])
    assert evs[0].message.startswith("Critic loss NaN at step 12")
    assert evs[0].changes["critic.lr"] == 1.5e-06
    assert "critic.lr 3e-06 -> 1.5e-06; keep actor.lr 1e-06" in evs[0].advice[0]
    _, evs = run(fault("sync_slow")[0])
    assert evs[0].message.startswith("Actor resharding time: ")
    # the field case: lr 1e-5 swinging -> 5e-7, critic moved to stay within 5x
    hot = Recipe.model_validate({**RECIPE, "actor": {"lr": 1e-5}, "critic": {"lr": 3e-5}})
    _, evs = run(fault("reward_swing")[0], hot)
    assert evs[0].changes == {"actor.lr": 5e-07, "critic.lr": 1.5e-06}
    assert evs[0].advice[0].startswith("actor.lr 1e-05 -> 5e-07")
    # GRPO: no critic to keep
    _, evs = run(fault("reward_swing")[0], GRPO)
    assert evs[0].advice[0].startswith("actor.lr 1e-06 -> 5e-07")


def test_kl_high_advice_raises_kl_coef():
    _, evs = run(fault("kl_high")[0])
    assert evs[0].changes == {"algorithm.kl.coef": 0.075}
    capped = Recipe.model_validate({**RECIPE, "algorithm": {"name": "ppo", "kl": {"coef": 0.1}}})
    _, evs = run(fault("kl_high")[0], capped)
    assert "algorithm.kl.coef" not in evs[0].changes and "actor.lr" in evs[0].changes


def test_steps_without_a_gradient_set_no_scale_for_a_spike():
    """A sparse-reward run (tiny-guess: every advantage zero for 15 steps, grad norm 0): its first
    real gradient is no spike; a real spike after real gradients still is one."""
    trace = healthy(60, 1, ppo=False)
    for m in trace[:15]:
        m["actor/grad_norm"] = 0.0
    trace[15]["actor/grad_norm"] = 0.13
    _, evs = run(trace[:30], GRPO)
    assert "grad_spike" not in {e.kind for e in evs}, [(e.step, e.message) for e in evs]
    trace[40]["actor/grad_norm"] = 100.0
    _, evs = run(trace, GRPO)
    assert [e.step for e in evs if e.kind == "grad_spike"] == [41]


def test_spike_advice_covers_clip_lr_precision_warmup():
    r = Recipe.model_validate({**RECIPE, "actor": {"lr": 1e-6, "grad_clip": None, "warmup_steps": 0},
                               "trainer": {"precision": "fp16"}})
    _, evs = run(fault("grad_spike")[0], r)
    ch = evs[0].changes
    assert ch["actor.grad_clip"] == 1.0 and ch["trainer.precision"] == "bf16"
    assert ch["actor.warmup_steps"] == 10 and ch["algorithm.clip_range"] == 0.15 and ch["actor.lr"] < 1e-6


def test_rearms_after_condition_clears():
    trace = healthy(80, 2)
    for s in (20, 50):
        trace[s - 1]["kl"] = 1.0
    _, evs = run(trace)
    assert [(e.step, e.kind) for e in evs] == [(20, "kl_spike"), (50, "kl_spike")]
    # sustained condition fires once, not on every step
    trace, _ = fault("kl_high", n=80)
    _, evs = run(trace)
    assert [e.kind for e in evs] == ["kl_high"]


def test_nan_json_and_missing_keys_tolerated():
    mon = HealthMonitor(R)
    assert mon.observe({"step": 1}) == []
    assert mon.observe({"step": 2, "reward/mean": None, "kl": "x"}) == []
    evs = mon.observe({"step": 3, "critic/loss": float("inf"), "actor/loss": float("nan")})
    assert {e.kind for e in evs} == {"critic_nan", "actor_nan"}
    assert evs[0].message == "Critic loss Inf at step 3"


def test_events_written_and_state_dict_resume(tmp_path):
    trace, _ = fault("kl_spike")
    full, evs_full = run(trace, R, tmp_path / "a")
    assert len((tmp_path / "a" / "events.jsonl").read_text().splitlines()) == 1
    # resume at step 25 from a JSON round-tripped state: same events as the uninterrupted run
    mon = HealthMonitor(R, tmp_path / "b")
    first = [e for m in trace[:25] for e in mon.observe(m)]
    state = json.loads(json.dumps(mon.state_dict()))
    # the killed run went on a little before dying: those events are replayed after resume
    for m in trace[25:32]:
        mon.observe(m)
    mon2 = HealthMonitor(R, tmp_path / "b")
    mon2.load_state_dict(state)
    rest = [e for m in trace[25:] for e in mon2.observe(m)]
    assert [(e.step, e.kind) for e in first + rest] == [(e.step, e.kind) for e in evs_full]
    lines = [json.loads(x) for x in (tmp_path / "b" / "events.jsonl").read_text().splitlines()]
    assert [(d["step"], d["kind"]) for d in lines] == [(30, "kl_spike")]


def test_disabled_monitor_is_silent():
    r = Recipe.model_validate({**RECIPE, "health": {"enabled": False}})
    _, evs = run(fault("critic_nan")[0], r)
    assert evs == []


def test_verdict_ranking():
    ev = lambda s, k, sev="warning": Event(s, k, sev, k)
    assert verdict_event([ev(5, "reward_swing"), ev(9, "critic_nan", "error"), ev(7, "kl_spike", "error")]).kind == "critic_nan"
    assert verdict_event([ev(5, "kl_high"), ev(30, "reward_collapse", "error")]).kind == "reward_collapse"
    assert verdict_event([ev(5, "reward_swing"), ev(30, "kl_high")]).kind == "kl_high"
    assert verdict_event([ev(1, "autotune", "info")]) is None


def test_live_monitor_logs_events(caplog, tmp_path):
    import logging
    with caplog.at_level(logging.WARNING, logger="rltune"):
        run(fault("critic_nan")[0], R, tmp_path)
    assert "[Health] step 12 error: Critic loss NaN at step 12" in caplog.text


ASYNC = Recipe.model_validate({**RECIPE, "rollout": {**RECIPE.get("rollout", {}), "asynchronous": {"max_staleness": 2}}})


def test_stale_samples_are_no_missed_sync_and_their_drift_is_watched():
    """rollout.asynchronous: the rollout/trainer mismatch is the policy's own progress (no
    stale_weights / logprob_drift / is_weight_extreme); async_drift fires when the cap starts
    truncating the stale samples' weights, and advises a smaller lag."""
    trace, _ = fault("stale_weights")             # mean |logp diff| 0.3 from step 15
    for m in trace:
        m.update({"async/staleness_mean": 2.0, "rollout/is_capped_frac": 0.01, "rollout/is_weight_mean": 1.0,
                  "rollout/is_weight_max": 1.5})
    for m in trace[30:]:
        m["rollout/is_weight_max"] = 40.0         # extreme for a synchronous run, not here
    _, evs = run(trace, ASYNC)
    assert evs == [], [(e.step, e.kind, e.message) for e in evs]
    for m in trace[40:]:
        m["rollout/is_capped_frac"] = 0.2         # 20% of the tokens at the cap from step 41
    _, evs = run(trace, ASYNC)
    assert [(e.step, e.kind) for e in evs] == [(42, "async_drift")], [(e.step, e.kind, e.message) for e in evs]
    assert evs[0].changes == {"rollout.asynchronous.max_staleness": 1}        # K 2 -> 1
    assert "max_staleness 0" in " ".join(evs[0].advice)
    # the same trace without generation ahead: the mismatch is a stale sync
    for m in trace:
        del m["async/staleness_mean"]
    _, evs = run(trace, R)
    assert "stale_weights" in {e.kind for e in evs} and "async_drift" not in {e.kind for e in evs}
