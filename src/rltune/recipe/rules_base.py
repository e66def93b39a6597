"""The lint rules' shared ground: the playbook's bounds, the rule registry (RULES, @rule), Hit,
Ctx and the helpers every rule module uses (num, world, token_ppo).

The rule modules (rules.py, rules_algo.py, rules_lora.py, rules_memory.py) import from here and
register into RULES; rules.py gathers them (importing it registers every rule) and runs them
(`run_rules`). Layers: this module reads the schema only; the memory plan (rltune.plan) sits
above the schema and below the rules (tests/test_import_layers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from rltune.recipe.schema import Recipe

# playbook bounds (autotune must never move a knob outside them either)
ACTOR_LR_RANGE = (1e-7, 5e-6)
ACTOR_LR_START = 1e-6
CRITIC_LR_FACTOR = 3.0
CRITIC_LR_MAX_FACTOR = 5.0
BATCH_RATIO = (4, 8)
BATCH_RATIO_ERROR = 10
KL_RANGE = (0.01, 0.1)
KL_START = 0.05
CLIP_RANGE = (0.1, 0.3)
CLIP_START = 0.2
GRAD_CLIP_MAX = 5.0
GRAD_CLIP_START = 1.0
WARMUP_START = 10
# LoRA (model.lora): the optimal lr is ~10x full fine-tuning's (Schulman & Thinking Machines,
# "LoRA Without Regret", 2025), so with an adapter the playbook's range moves up 10x
LORA_LR_FACTOR = 10.0
LORA_LR_RANGE = (1e-6, 5e-5)            # ACTOR_LR_RANGE x LORA_LR_FACTOR, written out (no float noise)
LORA_LR_START = 1e-5                     # ACTOR_LR_START x LORA_LR_FACTOR


@dataclass
class Hit:
    path: str
    message: str
    fix: str
    severity: Optional[str] = None  # None = the rule's default


@dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    condition: str
    why: str
    fn: Callable


RULES: dict = {}


def rule(id: str, severity: str, condition: str, why: str):
    def deco(fn):
        RULES[id] = Rule(id, severity, condition, why, fn)
        return fn
    return deco


class Ctx:
    """What a rule may ask beyond the recipe: was a key written by the user? On which hardware
    (`hardware`: an rltune.plan.Hardware from `validate --gpus/--gpu-mem`; None = the recipe's own)?"""

    def __init__(self, result=None, hardware=None):
        self.result = result
        self.hardware = hardware

    def user_set(self, recipe: Recipe, path: str) -> bool:
        if self.result is not None:
            return self.result.user_set(path)
        # no load result: fall back to pydantic's fields_set
        obj = recipe
        for p in path.split("."):
            if p not in getattr(obj, "model_fields_set", ()):
                return False
            obj = getattr(obj, p)
        return True


def num(x) -> str:
    """A compact number that round-trips: 3.0e-06, 0.05, 64."""
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, int):
        return str(x)
    x = float(x)
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        for prec in range(1, 8):
            s = f"{x:.{prec}e}"
            if abs(float(s) - x) <= 1e-12 * abs(x):
                return s
        return f"{x:.8e}"
    s = f"{x:g}"
    return s if any(c in s for c in ".en") else s + ".0"


def world(r: Recipe) -> int:
    return r.trainer.nproc * r.trainer.nnodes


def token_ppo(r: Recipe) -> bool:
    """The PPO clipped surrogate on per-token ratios (PPO, GRPO, DAPO): what the playbook's clip advice is about."""
    return r.algorithm.policy_loss == "ppo" and r.algorithm.ratio_level == "token"
