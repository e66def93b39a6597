import json
import math

import pytest

from rltune.monitor.trackers import JsonlSink, MetricSink, log_all, make_sinks
from rltune.recipe.schema import Recipe
from synth import RECIPE

STEPS = [{"reward/mean": 0.1 * s, "kl": 0.01 * s, "autotune/stage_name": "cold-start"} for s in range(1, 6)]


def recipe(**logging):
    return Recipe.model_validate({**RECIPE, "logging": logging})


def test_jsonl_sink_nan_and_truncate_after(tmp_path):
    p = tmp_path / "metrics.jsonl"
    with JsonlSink(p) as s:
        for i, m in enumerate(STEPS, 1):
            s.log(m, i)
        s.log({"critic/loss": float("nan"), "x": float("inf")}, 6)
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert math.isnan(rows[-1]["critic/loss"]) and rows[-1]["x"] == math.inf
    with open(p, "a") as f:
        f.write('{"step": 7, "rew')   # killed mid-write
    s = JsonlSink(p, resume_step=4)      # resume from the step-4 checkpoint
    s.log({"reward/mean": 9.0}, 5)
    s.close()
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5] and rows[-1]["reward/mean"] == 9.0


def test_make_sinks_rank_and_defaults(tmp_path):
    assert make_sinks(recipe(), tmp_path, rank=1) == []
    sinks = make_sinks(recipe(), tmp_path, rank=0)
    assert [type(s).__name__ for s in sinks] == ["JsonlSink"]
    for s in sinks:
        s.close()


def test_failing_optional_sink_is_dropped(tmp_path, caplog):
    class Boom(MetricSink):
        name = "boom"

        def log(self, metrics, step):
            raise RuntimeError("disk full")

    sinks = [JsonlSink(tmp_path / "m.jsonl"), Boom()]
    log_all(sinks, {"kl": 0.1}, 1)
    assert len(sinks) == 1 and "boom failed" in caplog.text
    sinks[0].close()


def test_tensorboard_sink(tmp_path):
    pytest.importorskip("tensorboard", reason="tracking extra not installed: pip install 'rltune[tracking]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    sinks = make_sinks(recipe(tensorboard=True), tmp_path)
    assert [s.name for s in sinks] == ["jsonl", "tensorboard"]
    for i, m in enumerate(STEPS, 1):
        log_all(sinks, m, i)
    for s in sinks:
        s.close()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    vals = [(e.step, round(e.value, 6)) for e in acc.Scalars("reward/mean")]
    assert vals == [(i, round(0.1 * i, 6)) for i in range(1, 6)]


def test_wandb_sink_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="tracking extra not installed: pip install 'rltune[tracking]'")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    sinks = make_sinks(recipe(wandb=True, wandb_mode="offline"), tmp_path)
    assert [s.name for s in sinks] == ["jsonl", "wandb"]
    for i, m in enumerate(STEPS, 1):
        log_all(sinks, m, i)
    for s in sinks:
        s.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and list(runs[0].glob("*.wandb"))


def test_mlflow_sink(tmp_path):
    pytest.importorskip("mlflow", reason="tracking extra not installed: pip install 'rltune[tracking]'")
    from mlflow.tracking import MlflowClient
    sinks = make_sinks(recipe(mlflow=True), tmp_path)
    assert [s.name for s in sinks] == ["jsonl", "mlflow"]
    for i, m in enumerate(STEPS, 1):
        log_all(sinks, m, i)
    ml = sinks[1]
    for s in sinks:
        s.close()
    assert (tmp_path / "mlruns").is_dir()
    hist = MlflowClient(ml.tracking_uri).get_metric_history(ml.run_id, "reward/mean")
    assert sorted((h.step, round(h.value, 6)) for h in hist) == [(i, round(0.1 * i, 6)) for i in range(1, 6)]
