"""An episode task learnt through the CLI (issue 27): `recipes/tiny-guess.yaml`, a tiny random
model playing builtin:guess. It first learns to end its turns (EOS) with a bare number, so the
environment answers and episodes run several turns; then the environment's own reward (the
number found) rises from zero."""

from __future__ import annotations

import json
import statistics

import pytest

from trainlib import ROOT, read_metrics, run_inproc


def test_tiny_guess_learns_to_play(capfd, tmp_path):
    run = tmp_path / "run"
    res = run_inproc(capfd, "train", str(ROOT / "recipes" / "tiny-guess.yaml"), f"trainer.output_dir={run}",
                     "trainer.eval_every=30", "--resume", "never")
    assert res.returncode == 0, res.stderr[-3000:]
    m = read_metrics(run)
    assert len(m) == 30
    first, last = m[:5], m[-5:]
    mean = lambda rows, k: statistics.fmean(x[k] for x in rows)  # noqa: E731
    assert mean(first, "reward/mean") < 0.02 and mean(last, "reward/mean") > 0.1, [x["reward/mean"] for x in m]
    assert mean(first, "episode/turns_mean") < 0.5 < 2.0 < mean(last, "episode/turns_mean")
    assert mean(first, "reward/env") < 0.01 < mean(last, "reward/env")                # numbers found
    assert all(x["episode/prefix_breaks"] == 0 for x in m)
    assert 0 < m[-1]["episode/env_token_frac"] < 1
    assert "grad_spike" not in res.stderr                     # zero-gradient steps set no scale
    ev = json.loads((run / "eval.json").read_text())          # greedy episodes before and after
    assert set(ev["before_episode"]) == set(ev["after_episode"]) == {"turns_mean", "tool_calls_mean"}
    assert ev["after_episode"]["tool_calls_mean"] == 0        # a turns environment has no tools


def test_the_same_game_as_an_openai_client_agent_trains_identically(capfd, tmp_path, monkeypatch):
    """recipes/tiny-guess-agent.yaml: builtin:guess rewritten as ordinary OpenAI-client code
    (recipes/guess_agent.py). Through rltune's recording endpoint its episodes are the class
    environment's token for token (same prompts, same lockstep batches, same environment turns,
    same bounds), so the two runs log the same numbers, step for step. A batch waits at most
    BATCH_WAIT_S for agents still running their own code; on a loaded machine an agent thread can
    be that late (a CI run beside other work once split a batch at step 2), so the wait is long
    here: these agents do no work of their own, and a batch forms as soon as all of them wait."""
    from rltune.train import agent_episodes

    monkeypatch.setattr(agent_episodes, "BATCH_WAIT_S", 60.0)
    runs = {}
    for name in ("tiny-guess", "tiny-guess-agent"):
        run = tmp_path / name
        res = run_inproc(capfd, "train", str(ROOT / "recipes" / f"{name}.yaml"), f"trainer.output_dir={run}",
                         "trainer.max_steps=3", "trainer.eval_every=0", "--resume", "never")
        assert res.returncode == 0, res.stderr[-3000:]
        runs[name] = read_metrics(run)
    timing = ("timing/", "throughput/", "episode/env_time_s")
    for a, b in zip(runs["tiny-guess"], runs["tiny-guess-agent"], strict=True):
        same = {k: v for k, v in a.items() if not k.startswith(timing)}
        assert same == {k: b[k] for k in same}
    assert sum(x["episode/turns_mean"] for x in runs["tiny-guess-agent"]) > 0


@pytest.mark.slow
def test_an_openai_client_agent_learns_to_play(capfd, tmp_path):
    """The agent's own reward (what run() returns) rises through the CLI, as the class's does
    (slow: ~2 min; the default suite has the step-for-step equality with the class above)."""
    run = tmp_path / "run"
    res = run_inproc(capfd, "train", str(ROOT / "recipes" / "tiny-guess-agent.yaml"), f"trainer.output_dir={run}",
                     "trainer.eval_every=30", "--resume", "never")
    assert res.returncode == 0, res.stderr[-3000:]
    m = read_metrics(run)
    mean = lambda rows, k: statistics.fmean(x[k] for x in rows)  # noqa: E731
    assert mean(m[:5], "reward/env") < 0.01 < mean(m[-5:], "reward/env"), [x["reward/env"] for x in m]
    assert mean(m[:5], "episode/turns_mean") < 0.5 < 2.0 < mean(m[-5:], "episode/turns_mean")
    assert all(x["episode/env_crashes"] == 0 and x["episode/prefix_breaks"] == 0 for x in m)
    ev = json.loads((run / "eval.json").read_text())          # greedy episodes through the endpoint too
    assert ev["after_episode"]["turns_mean"] > ev["before_episode"]["turns_mean"]
