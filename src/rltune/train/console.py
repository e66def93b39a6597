"""Console and log file: grep-able log lines on stderr, Rich formatting where stderr is a
terminal, and the one Rich console that the log handler and the progress bar (progress.py)
share, so that log lines print above the bar instead of through it."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

LOG = logging.getLogger("rltune")
_console = None


def rich_console():
    """The Rich console on stderr shared by the log handler and the progress bar."""
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(stderr=True)
    return _console


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time: while the progress bar is live, Rich
    redirects it so that each line prints above the bar."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


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

        handler: logging.Handler = RichHandler(console=rich_console(), show_path=False, show_time=False,
                                               markup=False)
    else:
        handler = _StderrHandler()
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
