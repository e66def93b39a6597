"""Issue 24: held-out traces the detectors missed (each test failed before its fix), with the
healthy traces that must stay quiet next to them."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rltune.commands.diagnose import run as diagnose
from rltune.recipe.schema import Recipe
from synth import (RECIPE, eval_falls_to_zero, healthy, healthy_binary, long_clipping, observe_all, oscillating,
                   problems, write_run, zero_std, zero_storm)

R = Recipe.model_validate(RECIPE)
GRPO = Recipe.model_validate({**RECIPE, "algorithm": {"name": "grpo"}})
# the quickstart's shape: 4 generation calls x 4 prompts = 16 groups per step
GRPO16 = Recipe.model_validate({**RECIPE, "algorithm": {"name": "grpo"}, "rollout": {"batch_size": 16},
                                "train": {"batch_size": 64}})
GRPO8 = Recipe.model_validate({**RECIPE, "algorithm": {"name": "grpo"}, "train": {"batch_size": 8}})
GRPO_RUN = {**RECIPE, "algorithm": {"name": "grpo"}}
MONITOR = Path(__file__).resolve().parents[2] / "src" / "rltune" / "monitor"


def run(trace, recipe=R):
    return observe_all(trace, recipe)


# (a) long clipping is an info unless the run shows harm -------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_long_clipping_on_a_healthy_run_is_an_info(seed):
    evs = run(long_clipping(260, seed))
    assert problems(evs) == []
    clip = [(e.step, e.numbers["role"], e.severity) for e in evs if e.kind == "grad_clip"]
    assert clip == [(5, "actor", "info"), (5, "critic", "info")], clip


def test_long_clipping_with_the_reward_falling_is_a_warning():
    tr = long_clipping(260, 0)
    for m in tr[179:]:     # the reward slides from step 180 on while the gradients stay clipped
        m["reward/mean"] *= 1 - 0.01 * (m["step"] - 179)
    warn = [e for e in run(tr) if e.kind == "grad_clip" and e.severity == "warning"]
    assert [(e.step, e.numbers["role"]) for e in warn] == [(200, "actor"), (200, "critic")]
    assert "clipped on 200 of the last 200 steps and reward falling" in warn[0].message
    assert warn[0].changes == {"actor.lr": 6e-07}      # critic.lr 3e-06 kept within 5x


def test_long_clipping_with_a_kl_spike_in_the_stretch_is_a_warning():
    tr = long_clipping(260, 0)
    tr[149]["kl"] = 1.0
    evs = run(tr)
    warn = [e for e in evs if e.kind == "grad_clip" and e.severity == "warning"]
    assert [(e.step, e.numbers["role"]) for e in warn] == [(200, "actor")]
    assert "a kl_spike at step 150" in warn[0].message


# (b) a regular up-down alternation within the noise of each swing ---------------------------

def test_reward_alternating_within_the_noise_for_many_steps_is_flagged():
    tr = oscillating(60, 0, amp=0.05, start=10, steps=16)
    evs = run(tr, GRPO)
    assert [(e.kind, e.severity) for e in evs] == [("reward_swing", "warning")], problems(evs)
    e = evs[0]
    assert 18 <= e.step <= 25 and "oscillates" in e.message and e.numbers["autocorr"] <= -0.8
    # no single swing is beyond the size threshold: the pattern is what is flagged
    assert "standard errors per swing" in e.message
    assert e.changes == {"actor.lr": 5e-07} and e.advice[0].startswith("actor.lr 1e-06 -> 5e-07")
    # PPO: the playbook's "lower actor lr, keep critic lr" (6e-07: critic.lr 3e-06 stays within 5x)
    ppo = run(tr, R)
    assert ppo[0].kind == "reward_swing"
    assert ppo[0].advice[0].startswith("actor.lr 1e-06 -> 6e-07; keep critic.lr 3e-06")


def test_alternation_too_short_or_too_small_is_not_flagged():
    assert problems(run(oscillating(60, 0, amp=0.05, steps=8), GRPO)) == []
    assert problems(run(oscillating(60, 0, amp=0.005, steps=30), GRPO)) == []


@pytest.mark.parametrize("seed", range(20))
def test_noisy_but_random_rewards_are_not_an_oscillation(seed):
    assert problems(run(healthy(50, seed, noise=0.04, ppo=False), GRPO)) == []
    assert problems(run(healthy_binary(50, seed), GRPO)) == []
    assert problems(run(healthy_binary(50, seed, batch=8), GRPO8)) == []
    tr = healthy(50, seed, noise=0.04, ppo=False)
    for m in tr:                                   # no reward/std logged (another tool's log)
        m.pop("reward/std")
    assert problems(run(tr, GRPO)) == []


# (c) zero-advantage groups jumping ----------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_zero_std_frac_jump_is_flagged_within_3_steps(seed):
    evs = run(zero_std(80, seed, level=0.1, jump_to=0.8, at=30, groups=16), GRPO16)
    assert [(e.kind, e.severity, e.numbers["role"]) for e in evs] == [("zero_advantage", "warning", "data")]
    assert 30 <= evs[0].step <= 33 and "jumped" in evs[0].message
    assert evs[0].advice and evs[0].changes == {}


# a tiny-grpo run (recipes/tiny-grpo.yaml, 24 steps): reward/mean, reward/std, rollout/zero_std_frac
TINY_GRPO = [(0.1, 0.218, 0.125), (0.088, 0.185, 0.0), (0.112, 0.22, 0.0625), (0.16, 0.28, 0.0625),
             (0.202, 0.336, 0.0625), (0.17, 0.218, 0.0), (0.256, 0.308, 0.0), (0.218, 0.217, 0.0),
             (0.272, 0.29, 0.0625), (0.331, 0.304, 0.0), (0.343, 0.343, 0.0), (0.525, 0.393, 0.0),
             (0.46, 0.368, 0.0625), (0.735, 0.352, 0.125), (0.896, 0.265, 0.5), (0.877, 0.281, 0.375),
             (0.988, 0.094, 0.9375), (0.966, 0.217, 0.6875), (0.969, 0.144, 0.8125), (0.982, 0.102, 0.875),
             (0.962, 0.173, 0.8125), (1.005, 0.151, 0.875), (0.991, 0.073, 0.9375), (0.992, 0.184, 0.8125)]


def test_zero_std_frac_jump_while_the_policy_solves_its_prompts_is_an_info():
    # the share jumps 0.06 -> 0.7 because the groups are now all right (reward 0.4 -> 0.98): not a fault
    tr = [{"step": i + 1, "reward/mean": r, "reward/std": s, "rollout/zero_std_frac": z}
          for i, (r, s, z) in enumerate(TINY_GRPO)]
    evs = run(tr, GRPO16)
    assert [(e.step, e.kind, e.severity) for e in evs] == [(18, "zero_advantage", "info")]
    assert "solves most of its prompts" in evs[0].message and evs[0].changes == {}
    # the same jump with the reward flat: a warning
    for m in tr:
        m["reward/mean"] = 0.3
    assert [(e.step, e.kind, e.severity) for e in run(tr, GRPO16)] == [(18, "zero_advantage", "warning")]


@pytest.mark.parametrize("seed", range(10))
def test_stable_or_slowly_rising_zero_std_frac_is_quiet(seed):
    for level in (0.1, 0.4, 0.6):
        assert run(zero_std(100, seed, level=level, groups=16), GRPO16) == []
        assert run(zero_std(100, seed, level=level), GRPO) == []
    assert run(zero_std(100, seed, level=0.1, ramp_to=0.9, groups=16), GRPO16) == []
    assert run(zero_std(100, seed, level=0.1, ramp_to=0.9), GRPO) == []


# issue 44: a zero-advantage storm (~90% of the groups scoring alike) that arrives over a few
# steps, or is there from the first step, used to be flagged ~30 steps late (2 x window above 0.95) or never

W, WARMUP = R.health.window, R.health.warmup_steps


def _storm_warnings(evs):
    return [e for e in evs if e.kind == "zero_advantage" and e.severity == "warning"]


@pytest.mark.parametrize("seed", range(10))
def test_a_storm_ramping_over_six_steps_with_a_flat_reward_is_flagged(seed):
    # 0.1 -> 0.9 over steps 30-35 (0.9 from step 35, the first at the storm level 0.8): no single jump
    for recipe, groups, slack in ((GRPO16, 16, 2), (GRPO, 8, W)):   # 8 groups: noisier
        evs = run(zero_storm(80, seed, at=30, ramp=6, groups=groups), recipe)
        assert [(e.kind, e.severity) for e in evs] == [("zero_advantage", "warning")], (groups, evs)
        assert 30 <= evs[0].step <= 35 + W + slack, (groups, evs[0].step, evs[0].message)
        assert evs[0].numbers["role"] == "data" and evs[0].advice


@pytest.mark.parametrize("seed", range(10))
def test_a_storm_from_the_first_step_with_a_flat_reward_is_flagged(seed):
    evs = run(zero_storm(80, seed, at=1, ramp=1, groups=16), GRPO16)
    assert [(e.kind, e.severity) for e in evs] == [("zero_advantage", "warning")], evs
    assert evs[0].step <= W + WARMUP, evs[0].step
    msg = evs[0].message
    assert "teaches almost nothing" in msg and "the reward did not rise" in msg, msg
    assert evs[0].changes == {"algorithm.group_size": 8}          # the high event's advice: more samples
    # 8 groups a step: 40 in a window, whose noise can take a few steps more
    evs = run(zero_storm(80, seed, at=1, ramp=1, groups=8), GRPO)
    assert [(e.kind, e.severity) for e in evs] == [("zero_advantage", "warning")], evs
    assert evs[0].step <= 2 * W + WARMUP + 2, evs[0].step


@pytest.mark.parametrize("seed", range(10))
def test_a_storm_while_the_reward_rises_is_no_warning(seed):
    # the groups score alike because the policy now solves their prompts (reward 0.2 -> 1.0 with the share)
    for kw in (dict(at=30, ramp=6), dict(at=1, ramp=1)):
        assert _storm_warnings(run(zero_storm(80, seed, groups=16, reward="rising", **kw), GRPO16)) == []
        assert _storm_warnings(run(zero_storm(80, seed, groups=8, reward="rising", **kw), GRPO)) == []


def test_a_jump_that_becomes_a_storm_is_one_event():
    # tiny-grpo's jump at step 18 with a flat reward, then ~85% for the rest: the jump's warning only
    tr = [{"step": i + 1, "reward/mean": 0.3, "reward/std": s, "rollout/zero_std_frac": z}
          for i, (_, s, z) in enumerate(TINY_GRPO)]
    tr += [{"step": 25 + i, "reward/mean": 0.3, "reward/std": 0.2, "rollout/zero_std_frac": 0.875}
           for i in range(20)]
    assert [(e.step, e.kind, e.severity) for e in run(tr, GRPO16)] == [(18, "zero_advantage", "warning")]


def test_a_storm_that_ends_and_comes_back_is_flagged_again():
    tr = zero_storm(80, 0, at=1, ramp=1, groups=16)
    for m in tr[20:40]:
        m["rollout/zero_std_frac"] = 0.125
    evs = run(tr, GRPO16)
    assert [e.severity for e in evs] == ["warning", "warning"] and 41 <= evs[1].step <= 41 + W + 2, evs


# (d) eval reward falling to zero while the train reward climbs ------------------------------

@pytest.mark.parametrize("every,evals,at", [(5, (0.076, 0.05, 0.02, 0.0, 0.0), 15),
                                            (5, (0.076, 0.0, 0.0, 0.0, 0.0), 15),
                                            (10, (0.076, 0.01, 0.0), 25)])
def test_eval_reward_falling_to_zero_is_reward_hacking(every, evals, at):
    evs = run(eval_falls_to_zero(25, 0, every, evals), GRPO)
    assert [(e.step, e.kind, e.severity) for e in evs] == [(at, "reward_hacking", "error")]
    assert evs[0].numbers["eval_best"] == 0.076 and evs[0].numbers["role"] == "reward"


def test_diagnose_on_the_eval_falls_run_is_not_healthy(tmp_path, capsys):
    d = write_run(tmp_path / "run", eval_falls_to_zero(), GRPO_RUN)
    assert diagnose(d) == 1
    out = capsys.readouterr().out
    assert "Healthy" not in out and "Eval reward fell 0.076 -> " in out
    assert diagnose(d, fmt="json") == 1
    assert json.loads(capsys.readouterr().out)["verdict"]["kind"] == "reward_hacking"


@pytest.mark.parametrize("seed", range(20))
def test_eval_reward_tracking_the_train_reward_is_quiet(seed):
    for tr in (healthy_binary(80, seed), healthy(80, seed, ppo=False)):
        assert problems(run(tr, GRPO)) == []
    flat = eval_falls_to_zero(25, seed, 5, (0.05, 0.06, 0.04, 0.05, 0.06))   # tiny and noisy, not falling
    assert problems(run(flat, GRPO)) == []


# (e) module size and the import direction -------------------------------------------------

def test_no_monitor_module_exceeds_600_lines():
    sizes = {p.relative_to(MONITOR).as_posix(): len(p.read_text().splitlines()) for p in MONITOR.rglob("*.py")}
    assert max(sizes.values()) <= 600, sizes


def _module_level_imports(path: Path) -> set[str]:
    """Modules a file imports at module level (not inside functions), absolute or relative."""
    tree = ast.parse(path.read_text())
    out = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            out.add(("." * node.level) + (node.module or ""))
    return out


def test_runlog_does_not_import_importers():
    src = (MONITOR / "runlog.py").read_text()
    assert "importers" not in {m.rsplit(".", 1)[-1] for m in _module_level_imports(MONITOR / "runlog.py")}
    assert "import importers" not in src and "from rltune.monitor.importers" not in src \
        and "from .importers" not in src, "runlog.py must not import importers.py (even lazily)"
    code = ("import sys, rltune.monitor.runlog as r; r.parse_maps(source='trl');"
            " print('rltune.monitor.importers' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "False"
