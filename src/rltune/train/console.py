"""Console and log file: a Rich progress bar with live reward/KL, grep-able log lines."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

LOG = logging.getLogger("rltune")


def setup_logging(run_dir: Path | None, mode: str, is_main: bool) -> None:
    """`mode`: rich | plain | quiet. Non-main ranks log warnings only."""
    LOG.handlers.clear()
    LOG.setLevel(logging.INFO)
    LOG.propagate = False
    if run_dir is not None and is_main:
        fh = logging.FileHandler(run_dir / "train.log")
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        LOG.addHandler(fh)
    level = logging.INFO if (is_main and mode != "quiet") else logging.WARNING
    if mode == "rich" and sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False, show_time=False, markup=False)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.setLevel(level)
    LOG.addHandler(handler)
    for noisy in ("transformers", "datasets", "DeepSpeed", "deepspeed", "torch.distributed"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass


class Progress:
    """A progress bar with ETA and live reward/KL (Rich on a TTY, nothing otherwise)."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self.bar = RichProgress(TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                    TimeRemainingColumn(), TextColumn("{task.fields[info]}"), transient=False)
            self.task = self.bar.add_task("train", total=total, completed=start, info="")
            self.bar.start()

    def update(self, step: int, reward: float, kl: float) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=step, info=f"reward {reward:.3f}  kl {kl:.4f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
