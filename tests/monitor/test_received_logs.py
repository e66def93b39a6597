"""A run directory or log someone sent is data: reading it takes time and memory linear in its size,
and whatever it holds ends in a result or a message, never a traceback (issue 25, items 6 and 7)."""

from __future__ import annotations

import json
import os
import time

import pytest

from rltune.monitor.importers import _segments
from rltune.monitor.runlog import read_events, read_metrics


def _rows(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_new_key_in_every_row_is_read_in_linear_time(tmp_path):
    # a dense column per key re-allocated per new key: 20,000 rows took 7 min and 4.4 GB
    n = 20_000
    _rows(tmp_path / "run" / "metrics.jsonl", ({"step": i, "reward/mean": 0.5, f"k{i}": float(i)} for i in range(1, n + 1)))
    t0 = time.monotonic()
    log = read_metrics(tmp_path / "run")
    assert time.monotonic() - t0 < 60                    # a hang guard, not a benchmark (it takes ~1 s)
    assert len(log) == n and len(log.keys) == n + 1
    assert log.series("k7") == ([7], [7.0]) and log.series("reward/mean")[1] == [0.5] * n
    rows = log.rows
    assert rows[6] == {"step": 7, "reward/mean": 0.5, "k7": 7.0}


def test_sparse_columns_keep_the_step_order_and_the_last_value(tmp_path):
    _rows(tmp_path / "m.jsonl", [{"step": 3, "a": 1.0}, {"step": 1, "a": 2.0, "b": 5.0}, {"step": 2, "b": 6.0},
                                 {"step": 3, "a": 9.0}])
    log = read_metrics(tmp_path / "m.jsonl")
    assert log.steps == [1, 2, 3]
    assert log.series("a") == ([1, 3], [2.0, 9.0]) and log.series("b") == ([1, 2], [5.0, 6.0])
    assert log.rows == [{"step": 1, "a": 2.0, "b": 5.0}, {"step": 2, "b": 6.0}, {"step": 3, "a": 9.0}]


def test_a_log_without_newlines_is_read_in_linear_time(tmp_path):
    # the old reader re-split everything it had not yet broken into lines with every 1 MB block
    f = tmp_path / "log.txt"
    f.write_bytes(b"{'loss': 0.1, 'reward': 0.5} " * 400_000)      # 12 MB, no line break
    t0 = time.monotonic()
    assert list(_segments(f)) == []                                  # one over-long segment: dropped
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("cmd", ["diagnose", "plot"])
def test_a_metrics_file_that_is_a_device_is_refused(tmp_path, cli, cmd):
    run = tmp_path / "run"
    run.mkdir()
    os.symlink("/dev/zero", run / "metrics.jsonl")
    code, text = cli(cmd, str(run))
    assert code == 2 and "not a regular file" in text, text


@pytest.mark.parametrize("cmd", ["diagnose", "plot"])
def test_crafted_contents_end_in_a_result_or_a_message(tmp_path, cli, cmd):
    run = tmp_path / "run"
    rows = [{"step": i, "reward/mean": 0.5, "kl": 1e308, "actor/grad_norm": 1e308, "reward/std": 1e308}
            for i in range(1, 60)]
    _rows(run / "metrics.jsonl", rows)
    with open(run / "metrics.jsonl", "a") as f:
        f.write("[" * 100_000 + "\n")                                # RecursionError in json
        f.write(json.dumps({"step": 60, "reward/mean": 0.5, "autotune/stage": 7}) + "\n")   # no such stage
    events = [{"step": 3, "kind": "autotune", "severity": "info", "stage": "warp", "message": "x"},
              {"step": 4, "severity": "warning", "message": "no kind"},
              {"step": "five", "kind": "kl_spike", "severity": "warning", "message": "string step"},
              {"step": 6, "kind": "autotune", "severity": "info", "message": "x", "changes": "nope"},
              {"step": 7, "kind": "kl_spike", "severity": "panic", "message": "unknown severity"}]
    _rows(run / "events.jsonl", events)
    (run / "recipe.yaml").write_text("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi")))
    code, text = cli(cmd, str(run))
    assert code in (0, 1, 2) and "Traceback" not in text and "probably a bug" not in text, text
    if cmd == "plot":
        assert code == 0 and (run / "run.png").is_file()
    kept = read_events(run)
    assert [e["step"] for e in kept] == [3, 6] and "changes" not in kept[1]


def test_masked_out_fires_when_most_responses_are_cut(tmp_path):
    # rollout.mask_truncated with a tiny max_new_tokens: 95-100% of the rows masked, grad norm 0, no word
    # from the monitor before; now a warning with the change (issue 25, item 15)
    from rltune.monitor.detectors import HealthMonitor
    from rltune.recipe.schema import Recipe

    recipe = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                                    "reward": {"functions": ["builtin:exact_answer"]},
                                    "rollout": {"mask_truncated": True, "max_new_tokens": 6}})
    mon = HealthMonitor(recipe, enabled=True, write=False)
    for step in range(1, 11):
        mon.observe({"step": step, "reward/mean": 0.1, "kl": 0.01, "rollout/masked_truncated_frac": 0.2 if step < 5 else 0.97})
    fired = [(e.step, e.kind, e.severity) for e in mon.events]
    assert fired == [(7, "masked_out", "warning")], fired
    assert mon.events[0].changes == {"rollout.max_new_tokens": 12}
