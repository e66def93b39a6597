"""Metric sinks: where each step's metrics go. metrics.jsonl always (the file `diagnose` and `plot`
read); TensorBoard, Weights & Biases (offline by default) and MLflow when `logging.*` asks for
them (the `tracking` extra). Only rank 0 writes. Tracker libraries are imported lazily.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Optional

log = logging.getLogger("rltune")


class TrackerUnavailable(RuntimeError):
    """A tracker the recipe asks for is not installed (message says what to install)."""


def _scalars(metrics: dict) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if k == "step" or isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[k] = float(v)
        else:
            try:  # numpy / torch scalars
                out[k] = float(v)
            except (TypeError, ValueError):
                continue
    return out


class MetricSink:
    """One destination for metrics. `log(metrics, step)` per step; `close()` at the end."""

    name = "sink"

    def log(self, metrics: dict, step: int) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class JsonlSink(MetricSink):
    """RUN_DIR/metrics.jsonl: one JSON object per step, `step` first; NaN/Inf written as JSON
    NaN/Infinity (Python's json default). Lines are flushed as they are written."""

    name = "jsonl"

    def __init__(self, path, resume_step: Optional[int] = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            self.truncate_after(resume_step)
        self._f = open(self.path, "a", encoding="utf-8")

    def log(self, metrics: dict, step: int) -> None:
        row = {"step": int(step)}
        for k, v in metrics.items():
            if k == "step":
                continue
            if isinstance(v, (str, bool, int, float)) or v is None:
                row[k] = v
            else:
                try:
                    row[k] = float(v)
                except (TypeError, ValueError):
                    row[k] = str(v)
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def truncate_after(self, step: int) -> int:
        """Resume: rewrite the file keeping the lines with step <= `step` (and dropping a
        truncated last line). Returns the number of lines kept."""
        was_open = getattr(self, "_f", None) is not None and not self._f.closed
        if was_open:
            self._f.close()
        kept = []
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if isinstance(d, dict) and isinstance(d.get("step"), (int, float)) and d["step"] <= step:
                    kept.append(line)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text("".join(x + "\n" for x in kept), encoding="utf-8")
            os.replace(tmp, self.path)
        if was_open:
            self._f = open(self.path, "a", encoding="utf-8")
        return len(kept)

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


class TensorBoardSink(MetricSink):
    """RUN_DIR/tb event files (torch.utils.tensorboard, else tensorboardX)."""

    name = "tensorboard"

    def __init__(self, logdir):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            try:
                from tensorboardX import SummaryWriter
            except ImportError:
                raise TrackerUnavailable(
                    "logging.tensorboard needs the tensorboard package: pip install 'rltune[tracking]'"
                    " (or set logging.tensorboard: false)") from None
        self.logdir = Path(logdir)
        self.writer = SummaryWriter(log_dir=str(self.logdir))

    def log(self, metrics: dict, step: int) -> None:
        for k, v in _scalars(metrics).items():
            self.writer.add_scalar(k, v, global_step=int(step))

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink(MetricSink):
    """Weights & Biases; offline by default (logging.wandb_mode), files under RUN_DIR/wandb."""

    name = "wandb"

    def __init__(self, run_dir, project: str = "rltune", mode: str = "offline", config: Optional[dict] = None,
                 name: Optional[str] = None):
        try:
            import wandb
        except ImportError:
            raise TrackerUnavailable("logging.wandb needs the wandb package: pip install 'rltune[tracking]'"
                                     " (or set logging.wandb: false)") from None
        self._wandb = wandb
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, dir=str(self.run_dir), mode=mode, config=config or {},
                              name=name or self.run_dir.name, reinit="finish_previous")

    def log(self, metrics: dict, step: int) -> None:
        data = {k: v for k, v in metrics.items() if k != "step"
                and (isinstance(v, (int, float, str)) and not isinstance(v, bool))}
        self.run.log(data, step=int(step))

    def close(self) -> None:
        self.run.finish()


class MlflowSink(MetricSink):
    """MLflow: a file store in RUN_DIR/mlruns unless logging.mlflow_tracking_uri is set."""

    name = "mlflow"

    def __init__(self, run_dir, tracking_uri: Optional[str] = None, experiment: str = "rltune",
                 params: Optional[dict] = None, run_name: Optional[str] = None):
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise TrackerUnavailable("logging.mlflow needs the mlflow package: pip install 'rltune[tracking]'"
                                     " (or set logging.mlflow: false)") from None
        run_dir = Path(run_dir)
        if tracking_uri:
            self.tracking_uri = tracking_uri
            self.client = MlflowClient(tracking_uri=tracking_uri)
            exp = self.client.get_experiment_by_name(experiment)
        else:
            store = (run_dir / "mlruns").resolve()
            store.mkdir(parents=True, exist_ok=True)
            # MLflow 3 keeps the file store only on request (maintenance mode); it needs no server
            # and no database, which is what a run directory wants. Newer MLflow without it: sqlite.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            try:
                self.tracking_uri = store.as_uri()
                self.client = MlflowClient(tracking_uri=self.tracking_uri)
                exp = self.client.get_experiment_by_name(experiment)
            except Exception:  # noqa: BLE001 - file store refused or removed
                self.tracking_uri = f"sqlite:///{store / 'mlflow.db'}"
                self.client = MlflowClient(tracking_uri=self.tracking_uri)
                exp = self.client.get_experiment_by_name(experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
        self.run_id = self.client.create_run(exp_id, run_name=run_name or run_dir.name).info.run_id
        if params:
            from mlflow.entities import Param
            ps = [Param(k, str(v)[:500]) for k, v in list(params.items())[:100]]
            self.client.log_batch(self.run_id, params=ps)

    def log(self, metrics: dict, step: int) -> None:
        from mlflow.entities import Metric
        ts = int(time.time() * 1000)
        ms = [Metric(k, v, ts, int(step)) for k, v in _scalars(metrics).items() if math.isfinite(v)]
        for i in range(0, len(ms), 1000):
            self.client.log_batch(self.run_id, metrics=ms[i:i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def make_sinks(recipe, run_dir, rank: int = 0, resume_step: Optional[int] = None) -> list[MetricSink]:
    """The sinks `recipe.logging` asks for; rank != 0 gets none. Raises TrackerUnavailable when a
    requested tracker is not installed (before any training time is spent)."""
    if rank != 0:
        return []
    run_dir = Path(run_dir)
    lg = recipe.logging
    sinks: list[MetricSink] = [JsonlSink(run_dir / "metrics.jsonl", resume_step=resume_step)]
    try:
        if lg.tensorboard:
            sinks.append(TensorBoardSink(run_dir / "tb"))
        if lg.wandb and lg.wandb_mode != "disabled":
            sinks.append(WandbSink(run_dir, project=lg.wandb_project, mode=lg.wandb_mode,
                                   config=recipe.model_dump(mode="json")))
        if lg.mlflow:
            sinks.append(MlflowSink(run_dir, tracking_uri=lg.mlflow_tracking_uri,
                                    params=_flat(recipe.model_dump(mode="json"))))
    except Exception:
        for s in sinks:
            s.close()
        raise
    return sinks


def log_all(sinks: list[MetricSink], metrics: dict, step: int) -> None:
    """Log to every sink; a failing optional tracker is reported once and dropped, never fatal."""
    for s in list(sinks):
        try:
            s.log(metrics, step)
        except Exception as e:  # noqa: BLE001
            if isinstance(s, JsonlSink):
                raise
            log.warning("[Tracker] %s failed (%s: %s); it is disabled for the rest of the run",
                        s.name, type(e).__name__, e)
            sinks.remove(s)
