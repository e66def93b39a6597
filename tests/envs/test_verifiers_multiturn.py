"""A multi-turn verifiers environment learns (issue 48, item 5): recipes/verifiers-guess-tiny.yaml
trains the tiny model on rltune.envs.verifiers_examples.guess (guess 1-8, told Higher/Lower, up to 4
turns) through rltune's recording endpoint; its rubric (found, number, brief) is the reward."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers")
pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_shipped_multi_turn_recipe_learns(tmp_path):
    out = subprocess.run([sys.executable, "-m", "rltune", "train", str(ROOT / "recipes/verifiers-guess-tiny.yaml"),
                          f"trainer.output_dir={tmp_path / 'run'}"], capture_output=True, text=True, timeout=1800,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    m = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    first = sum(x["reward/mean"] for x in m[:5]) / 5
    last = sum(x["reward/mean"] for x in m[-5:]) / 5
    assert last > first + 0.2, (first, last)
    assert max(x["episode/turns_mean"] for x in m) > 1.0             # the game went on past one turn
    assert sum(x["reward/env/found"] for x in m[-5:]) / 5 > 0.05     # and the number was found
