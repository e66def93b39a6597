"""An episode task learnt through the CLI (issue 27): `recipes/tiny-guess.yaml`, a tiny random
model playing builtin:guess. It first learns to end its turns (EOS) with a bare number, so the
environment answers and episodes run several turns; then the environment's own reward (the
number found) rises from zero."""

from __future__ import annotations

import json
import statistics

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
