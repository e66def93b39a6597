"""Tool use learnt through the CLI (issue 27): `recipes/calculator.yaml`, SmolLM2-135M-Instruct
with builtin:calculator. From one solved question in the prompt the model calls the tool in some
episodes and writes broken calls or rambles in others; GRPO on the final answer's exactness makes
it call the tool in every episode, with valid calls, and answer right more often.

About 20 minutes on the 2-core CPU (12 steps of 32 episodes): `make test-slow` runs it. The same
command, measured, is in docs/BENCHMARKS.md ("Episodes")."""

from __future__ import annotations

import json
import statistics

import pytest

from trainlib import ROOT, read_metrics, run_cli


@pytest.mark.slow
def test_smollm2_learns_to_use_the_calculator(tmp_path):
    run = tmp_path / "run"
    res = run_cli("train", ROOT / "recipes" / "calculator.yaml", "trainer.max_steps=12", "train.batch_size=32",
                  "trainer.eval_every=12", f"trainer.output_dir={run}", "--resume", "never", timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    m = read_metrics(run)
    first, last = m[:3], m[-3:]
    mean = lambda rows, k: statistics.fmean(x[k] for x in rows)  # noqa: E731
    trace = [(x["reward/mean"], x["episode/tool_calls_mean"]) for x in m]
    assert mean(last, "reward/mean") > mean(first, "reward/mean") + 0.3, trace                  # reward up
    assert mean(last, "episode/tool_calls_mean") > mean(first, "episode/tool_calls_mean") + 0.3, trace  # tool use up
    assert mean(last, "episode/tool_error_frac") < mean(first, "episode/tool_error_frac"), trace
    ev = json.loads((run / "eval.json").read_text())          # greedy, held-out
    assert ev["after"] >= ev["before"] - 0.05, ev
