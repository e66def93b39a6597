"""`rltune plan`: the memory budget of a recipe on given hardware, before anything is loaded.

Public API (no torch, transformers or deepspeed import; formulas and sources in docs/plan.md):

    Hardware(device, gpus=1, mem_bytes=None)
    estimate(recipe, hw) -> Plan      # .items, .phases (rollout, experience, update, save), .peak,
                                      # .capacity, .headroom, .proposals, .to_dict()
    hardware_for(recipe, gpus=None, gpu_mem=None, device=None) -> Hardware | None
    parse_size("80GB") -> bytes       # GB and GiB both mean 2^30 bytes (see parse_size)
    ArchUnknown                       # the policy's size cannot be known without loading it
    ConfigError(ArchUnknown)          # a model's config.json is there but unusable (names file, field, fix)
    check_model_configs(recipe)       # read and check every model's config.json (raises ConfigError)
"""

from __future__ import annotations

import math
import os
import re
from typing import Optional

from rltune.plan.arch import Arch, ArchUnknown, ConfigError, resolve_arch  # noqa: F401
from rltune.plan.estimate import PHASES, Hardware, Item, Plan  # noqa: F401
from rltune.plan.estimate import estimate as _estimate_only

__all__ = ["Arch", "ArchUnknown", "ConfigError", "Hardware", "Item", "Plan", "PHASES", "check_model_configs",
           "estimate", "hardware_for", "parse_size", "resolve_arch", "MAX_GPUS"]

_UNITS = {"": 1 << 30, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# a card's memory above this (1 PiB) is a typo, and --gpus above MAX_GPUS too
MAX_SIZE = 1 << 50
MAX_GPUS = 1 << 16


def parse_size(s) -> int:
    """Bytes in a size like `80GB`, `80GiB`, `80G`, `24576MiB`, `0.5TB` or `80` (GiB).

    GB and GiB both mean 2^30 bytes here: GPU memory is sold in binary units (an "80GB" A100 has
    81920 MiB, a "24GB" card 24576 MiB), so `--gpu-mem 80GB` is what the card's name says. A bare
    number is GiB; `B` alone is bytes. Raises ValueError with the accepted forms (and for a size
    that is not positive, or over 1 PiB: `1e999GB` is not a card)."""
    text = str(s).strip()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMgGtT]?)([iI]?[bB])?", text)
    if m is None or (not m.group(2) and m.group(3) and m.group(3).lower() != "b"):
        raise ValueError(f"cannot read the size {s!r}: use e.g. 80GB, 80GiB, 24576MiB or 80 (GiB)")
    number, prefix, suffix = m.groups()
    mult = 1 if (suffix and not prefix) else _UNITS[prefix.lower()]   # "1073741824B": bytes
    amount = float(number) * mult
    if not math.isfinite(amount) or amount > MAX_SIZE:
        raise ValueError(f"size {s!r} is too large: a GPU's memory is at most {MAX_SIZE >> 30:,} GiB here "
                         "(use e.g. 80GB)")
    value = int(amount)
    if value <= 0:
        raise ValueError(f"size {s!r} must be positive")
    return value


def check_model_configs(recipe) -> None:
    """Read and check the config.json of every model the recipe uses (model.policy, the critic of an
    algorithm that has one, model.reference, reward.model), as `plan` does, before anything heavy
    is built: raises ConfigError (file, field, fix) for one that is there but unusable. A model
    whose size is merely unknown to the plan (a hub id not cached, another architecture, an MoE
    layout the plan does not size) passes: loading it is transformers' business."""
    specs = [("model.policy", recipe.model.policy)]
    if recipe.has_critic and recipe.model.critic:
        specs.append(("model.critic", recipe.model.critic))
    if recipe.model.reference:
        specs.append(("model.reference", recipe.model.reference))
    if recipe.reward.model:
        specs.append(("reward.model", recipe.reward.model))
    for key, spec in specs:
        try:
            resolve_arch(spec, key)
        except ConfigError:
            raise
        except ArchUnknown:
            pass


def estimate(recipe, hw: Hardware) -> Plan:
    """The plan of `recipe` on `hw`, with proposals that fit when it is over capacity."""
    from rltune.plan.proposals import propose

    plan = _estimate_only(recipe, hw)
    plan.proposals = propose(recipe, plan, hw, _estimate_only)
    return plan


def _cuda_present() -> bool:
    """An NVIDIA driver on this machine (no torch import: the driver's /proc entry)."""
    return os.path.isdir("/proc/driver/nvidia/gpus") and bool(os.listdir("/proc/driver/nvidia/gpus"))


def hardware_for(recipe, gpus: Optional[int] = None, gpu_mem: Optional[str] = None,
                 device: Optional[str] = None) -> Optional[Hardware]:
    """The hardware a recipe runs on, when it is known: `--device cpu` (or trainer.device cpu), the
    `--gpus` / `--gpu-mem` flags, the recipe's `hardware` section (hardware presets set it), or
    trainer.device cuda with a GPU torch can see (torch is imported only in that case). None =
    unknown: validate then says nothing about memory."""
    ranks = recipe.trainer.nproc * recipe.trainer.nnodes
    mem = parse_size(gpu_mem) if gpu_mem else None
    if device == "cpu" or (device is None and gpus is None and gpu_mem is None and recipe.trainer.device == "cpu"):
        return Hardware("cpu", gpus=ranks, mem_bytes=mem)
    hw_cfg = getattr(recipe, "hardware", None)
    if gpus is not None or mem is not None:
        if mem is None and hw_cfg is not None:
            mem = int(hw_cfg.gpu_mem_gb * (1 << 30))
        return Hardware("cuda", gpus=gpus or ranks, mem_bytes=mem)
    if hw_cfg is not None:
        return Hardware("cuda", gpus=hw_cfg.gpus, mem_bytes=int(hw_cfg.gpu_mem_gb * (1 << 30)))
    if device == "cuda" or recipe.trainer.device == "cuda":
        found = _torch_cuda_memory()
        if found is not None:
            return Hardware("cuda", gpus=ranks, mem_bytes=found)
        if device == "cuda":
            return Hardware("cuda", gpus=ranks, mem_bytes=None)
    return None


def _torch_cuda_memory() -> Optional[int]:
    """Memory of GPU 0 as torch sees it, or None (no torch, no CUDA build, no GPU)."""
    if not _cuda_present():
        return None
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.get_device_properties(0).total_memory)
    except Exception:  # noqa: BLE001 - any failure means: not known
        return None
