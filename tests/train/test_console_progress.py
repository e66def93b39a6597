"""What `rltune train` shows while it runs: start-up block, first-step line, step lines with
step/total, s/step and ETA, the reward's weighted parts, eval lines, health fixes, the bar."""

from __future__ import annotations

import io
import logging
import re

from trainlib import run_inproc

from rltune.monitor.events import Event
from rltune.train.progress import EvalScore, Progress, StepClock, eval_line, final_eval_lines, fmt_duration, step_line

W = {"builtin:exact_answer": 1.0, "builtin:format": 0.5}


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_step_line_has_total_rate_eta_and_parts():
    t = FakeClock()
    clock = StepClock(total=10, start=0, clock=t)
    clock.begin()
    t.t += 93.6
    clock.tick(3)
    m = {"reward/mean": 0.52, "kl": 0.004, "reward/builtin:exact_answer": 0.125, "reward/builtin:format": 0.8125}
    assert step_line(3, m, clock, W) == ("[Rollout] step=3 avg_reward=0.5200 kl=0.0040 | 3/10 steps, 31.2 s/step, "
                                         "ETA 3m38s | parts: exact_answer 0.125 x1.0, format 0.812 x0.5")
    # one source of weight 1: nothing to break down
    assert step_line(3, m, clock, {"builtin:exact_answer": 1.0}).endswith("ETA 3m38s")


def test_eta_counts_only_this_process_steps_on_resume():
    t = FakeClock()
    clock = StepClock(total=20, start=10, clock=t)
    clock.begin()
    t.t += 20
    clock.tick(12)
    assert clock.text() == "12/20 steps, 10.0 s/step, ETA 1m20s"
    assert [fmt_duration(x) for x in (42, 218, 3720)] == ["42s", "3m38s", "1h02m"]


def test_eval_lines_break_the_reward_into_parts():
    before = EvalScore(0.076, {"builtin:exact_answer": 0.0, "builtin:format": 0.152}, 32)
    after = EvalScore(0.5, {"builtin:exact_answer": 0.0, "builtin:format": 1.0}, 32)
    assert eval_line("at step 10", after, W) == \
        "eval at step 10: reward 0.500 (exact_answer 0.000 x1.0, format 1.000 x0.5) on 32 held-out prompts"
    assert final_eval_lines(before, after, W) == [
        "eval reward on 32 held-out prompts: before 0.076 -> after 0.500",
        "  exact_answer (x1.0): before 0.000 -> after 0.000",
        "  format (x0.5): before 0.152 -> after 1.000"]
    assert after.metrics() == {"eval/reward": 0.5, "eval/reward/builtin:exact_answer": 0.0,
                               "eval/reward/builtin:format": 1.0}


def test_eval_lines_of_episodes_say_turns_and_tool_calls():
    before = EvalScore(0.2, {}, 8, {"turns_mean": 1.0, "tool_calls_mean": 0.25})
    after = EvalScore(0.6, {}, 8, {"turns_mean": 2.5, "tool_calls_mean": 1.5})
    assert eval_line("before training", before, {}) == \
        "eval before training: reward 0.200 on 8 held-out prompts; per episode 1.00 turns, 0.25 tool calls"
    assert final_eval_lines(before, after, {})[1:] == ["  tool calls per episode: before 0.25 -> after 1.50",
                                                      "  turns per episode: before 1.00 -> after 2.50"]
    assert after.metrics() == {"eval/reward": 0.6, "eval/episode/turns_mean": 2.5, "eval/episode/tool_calls_mean": 1.5}


def test_health_line_carries_rule_id_and_fix(caplog):
    from rltune.monitor.detectors import HealthMonitor

    e = Event(7, "kl_spike", "error", "KL spike at step 7: 0.01 -> 1.0", {},
              ["actor.grad_clip null -> 1.0 (clip gradients at 0.5-1.0)", "actor.lr 1e-05 -> 5e-06"])
    assert str(e) == ("[Health] step 7 error: KL spike at step 7: 0.01 -> 1.0 [kl_spike]\n"
                      "    fix: actor.grad_clip null -> 1.0 (clip gradients at 0.5-1.0)\n"
                      "    fix: actor.lr 1e-05 -> 5e-06")
    mon = HealthMonitor(write=False, log_events=True)
    with caplog.at_level(logging.WARNING, logger="rltune"):
        for step in range(1, 8):
            mon.observe({"step": step, "critic/loss": float("nan") if step == 7 else 1.0})
    assert "[Health] step 7 error: Critic loss NaN at step 7" in caplog.text
    assert "[critic_nan]\n    fix: " in caplog.text


def test_bar_on_a_terminal_shows_rate_eta_reward_kl():
    from rich.console import Console

    out = io.StringIO()
    con = Console(file=out, force_terminal=True, width=150)
    t = FakeClock()
    p = Progress(10, 0, enabled=True, console=con, clock=t)
    p.begin(1)
    t.t += 62.4
    p.update(2, 0.5, 0.0123)
    p.close()
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.getvalue())
    assert "2/10 31.2 s/step  ETA 4m10s  reward 0.500  kl 0.0123" in text
    assert Progress(10, 0, enabled=False, console=con).bar is None                        # --quiet
    assert Progress(10, 0, enabled=True, console=Console(file=io.StringIO())).bar is None  # not a terminal


def test_tiny_run_prints_plan_progress_and_eval_parts(capfd, recipe_factory, tmp_path):
    path = recipe_factory("tiny-grpo.yaml", trainer__max_steps=3, trainer__eval_every=2,
                          data__eval_size=8)
    res = run_inproc(capfd, "train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    err = res.stderr
    run_dir = tmp_path / "run"
    for line in (f"INFO run directory: {run_dir} (new run; metrics.jsonl, events.jsonl, train.log)",
                 "INFO batch plan: grpo, 1 rank, 3 steps, eval every 2 step(s) on 8 held-out prompts",
                 "INFO   one step    4 generation calls x 16 sequences (rollout.batch_size: 4 prompts x 4 samples) "
                 "= 64 sequences",
                 "INFO   one update  64 sequences (train.batch_size) = 1 rank x 4 micro-batches of 16 "
                 "(4 accumulation steps)",
                 "INFO   per step    1 optimizer update = 1 ppo epoch(s) x 1 (train.updates_per_step)",
                 "INFO sampling: temperature 1, top_p 1, top_k off, max_new_tokens 6, 4 per prompt; "
                 "log-probs at temperature 1; rollout correction none",
                 "INFO rollout engine hf (rollout.engine: hf)",
                 "INFO step 1/3: generating 64 sequences (4 generation call(s) of 16), then scoring and updating ..."):
        assert line + "\n" in err, line
    assert re.search(r"INFO eval before training: reward \d\.\d{3} \(exact_answer \d\.\d{3} x1\.0, "
                     r"format \d\.\d{3} x1\.0\) on 8 held-out prompts\n", err)
    for step in (1, 2, 3):
        assert re.search(rf"INFO \[Rollout\] step={step} avg_reward=\d\.\d{{4}} kl=\d\.\d{{4}} \| {step}/3 steps, "
                         rf"\d+\.\d s/step, ETA \d+s \| parts: exact_answer \d\.\d{{3}} x1\.0, format \d\.\d{{3}} x1\.0\n",
                         err), step
    assert "ETA 0s" in err
    assert re.search(r"INFO eval at step 2: reward \d\.\d{3} \(exact_answer", err)
    assert re.search(r"INFO eval reward on 8 held-out prompts: before \d\.\d{3} -> after \d\.\d{3}\n"
                     r"INFO   exact_answer \(x1\.0\): before \d\.\d{3} -> after \d\.\d{3}\n", err)
    # the order: the block, then the first step's line, then its [Rollout] line
    assert err.index("batch plan:") < err.index("step 1/3: generating") < err.index("[Rollout] step=1 ")
    assert err.index("[Rollout] step=2 ") < err.index("eval at step 2:") < err.index("[Rollout] step=3 ")


def test_quiet_shows_none_of_it(capfd, recipe_factory):
    path = recipe_factory("tiny-grpo.yaml", trainer__max_steps=1, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path, "--quiet")
    assert res.returncode == 0, res.stderr[-4000:]
    for text in ("batch plan", "generating", "[Rollout]", "s/step", "eval "):
        assert text not in res.stderr, text
