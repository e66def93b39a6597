"""An environment's own reward parts (`reward/env/NAME`: an agent's `{"reward", "parts"}`, a
verifiers rubric's criteria) on the console and in the eval, not only in metrics.jsonl: the
`[Rollout]` line ends with `| env: NAME MEAN, ...`, the eval lines carry `; env: ...` and the
final `  env/NAME: before .. -> after ..`, and eval.json holds `before_env` / `after_env`."""

from __future__ import annotations

import json

import pytest

from trainlib import ROOT, run_inproc

from rltune.train.progress import EvalScore, StepClock, eval_line, final_eval_lines, step_line


def _clock() -> StepClock:
    t = [100.0]
    clock = StepClock(total=10, start=0, clock=lambda: t[0])
    clock.begin()
    t[0] += 93.6
    clock.tick(3)
    return clock


def test_step_line_shows_the_environments_parts_after_the_reward_parts():
    m = {"reward/mean": 0.52, "kl": 0.004, "reward/env": 0.59, "reward/builtin:format": 0.8125,
         "reward/env/short": 0.77, "reward/env/digits": 0.41}
    w = {"builtin:format": 0.2, "env": 1.0}
    assert step_line(3, m, _clock(), w) == (
        "[Rollout] step=3 avg_reward=0.5200 kl=0.0040 | 3/10 steps, 31.2 s/step, ETA 3m38s "
        "| parts: format 0.812 x0.2, env 0.590 x1.0 | env: digits 0.410, short 0.770")
    # the environment is the only reward source: no `parts:`, its own parts still shown
    assert step_line(3, m, _clock(), {"env": 1.0}) == (
        "[Rollout] step=3 avg_reward=0.5200 kl=0.0040 | 3/10 steps, 31.2 s/step, ETA 3m38s "
        "| env: digits 0.410, short 0.770")
    # without parts the line is as before
    assert step_line(3, {"reward/mean": 0.52, "kl": 0.004, "reward/env": 0.59}, _clock(), {"env": 1.0}) == \
        "[Rollout] step=3 avg_reward=0.5200 kl=0.0040 | 3/10 steps, 31.2 s/step, ETA 3m38s"


def test_step_line_shows_six_environment_parts_then_counts_the_rest():
    m = {"reward/mean": 0.5, "kl": 0.0} | {f"reward/env/c{i}": i / 10 for i in range(9)}
    assert step_line(3, m, _clock(), {"env": 1.0}) == (
        "[Rollout] step=3 avg_reward=0.5000 kl=0.0000 | 3/10 steps, 31.2 s/step, ETA 3m38s "
        "| env: c0 0.000, c1 0.100, c2 0.200, c3 0.300, c4 0.400, c5 0.500 +3 more")


def test_eval_lines_and_metrics_show_the_environments_parts():
    w = {"env": 1.0}
    ep = {"turns_mean": 1.0, "tool_calls_mean": 0.0}
    before = EvalScore(0.25, {"env": 0.25}, 4, ep, {"short": 0.0, "digits": 0.5})
    after = EvalScore(0.875, {"env": 0.875}, 4, ep, {"short": 1.0, "digits": 0.75})
    assert eval_line("at step 2", after, w) == ("eval at step 2: reward 0.875 on 4 held-out prompts; "
                                                "per episode 1.00 turns, 0.00 tool calls; env: digits 0.750, short 1.000")
    assert final_eval_lines(before, after, w) == [
        "eval reward on 4 held-out prompts: before 0.250 -> after 0.875",
        "  tool calls per episode: before 0.00 -> after 0.00",
        "  turns per episode: before 1.00 -> after 1.00",
        "  env/digits: before 0.500 -> after 0.750",
        "  env/short: before 0.000 -> after 1.000"]
    assert after.metrics() == {"eval/reward": 0.875, "eval/reward/env": 0.875, "eval/reward/env/short": 1.0,
                               "eval/reward/env/digits": 0.75, "eval/episode/turns_mean": 1.0,
                               "eval/episode/tool_calls_mean": 0.0}
    # an eval before from a checkpoint that did not save the parts (an older rltune): nan, not a crash
    old = EvalScore(0.25, {"env": 0.25}, 4, ep)
    assert final_eval_lines(old, after, w)[-1] == "  env/short: before nan -> after 1.000"
    assert eval_line("before training", old, w).endswith("0.00 tool calls")


def test_a_run_with_rubric_parts_prints_them_and_writes_them_to_eval_json(capfd, tmp_path):
    """recipes/verifiers-tiny.yaml (a verifiers rubric with criteria `digits` and `short`), 2 small
    steps: the parts on every `[Rollout]` line and in the eval lines, before -> after in eval.json,
    and `rltune eval --model RUN` prints the run's own before -> after for each part."""
    pytest.importorskip("verifiers")
    pytest.importorskip("openai")
    run = tmp_path / "run"
    recipe = ROOT / "recipes" / "verifiers-tiny.yaml"
    args = (f"trainer.output_dir={run}", "trainer.max_steps=2", "trainer.eval_every=2", "data.eval_size=4",
            "rollout.batch_size=8", "train.batch_size=8", "train.micro_batch_size=8", "algorithm.group_size=4")
    res = run_inproc(capfd, "train", recipe, *args, "--resume", "never")
    assert res.returncode == 0, res.stderr[-3000:]
    rollout = [line for line in res.stderr.splitlines() if "[Rollout] step=" in line]
    m = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rollout) == 2
    for line, x in zip(rollout, m):
        assert line.endswith(f" | env: digits {x['reward/env/digits']:.3f}, short {x['reward/env/short']:.3f}"), line
    ev = json.loads((run / "eval.json").read_text())
    assert set(ev["before_env"]) == set(ev["after_env"]) == {"digits", "short"}
    assert m[-1]["eval/reward/env/digits"] == ev["after_env"]["digits"]
    final = [f"  env/{k}: before {ev['before_env'][k]:.3f} -> after {ev['after_env'][k]:.3f}" for k in ("digits", "short")]
    for line in final:
        assert line in res.stderr
    assert (f"eval before training: reward {ev['before']:.3f} on 4 held-out prompts; per episode "
            in res.stderr)
    assert f"; env: digits {ev['before_env']['digits']:.3f}, short {ev['before_env']['short']:.3f}" in res.stderr

    res = run_inproc(capfd, "eval", recipe, *args, "--model", run / "final")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines()[-2:] == final, res.stdout
    assert f"; env: digits {ev['after_env']['digits']:.3f}, short {ev['after_env']['short']:.3f}" in res.stdout


def test_eval_json_output_has_the_environments_parts(capsys):
    """`rltune eval --json` prints the keys of eval.json: `before_env` / `after_env` too."""
    from types import SimpleNamespace

    from rltune.commands.evaluate import _report

    recipe = SimpleNamespace(model=SimpleNamespace(policy="builtin:tiny-llama"))
    before = EvalScore(0.25, {"env": 0.25}, 4, {}, {"digits": 0.5})
    _report({"engine": "hf", "before": before, "after": None}, "r.yaml", None, recipe, as_json=True)
    out = json.loads(capsys.readouterr().out)
    assert out["before_env"] == {"digits": 0.5} and out["after_env"] is None
    _report({"engine": "hf", "before": before, "after": before}, "r.yaml", "final", recipe, as_json=True)
    assert json.loads(capsys.readouterr().out)["after_env"] == {"digits": 0.5}
