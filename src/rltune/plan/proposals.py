"""Changes that make an over-budget recipe fit, each checked by re-running the estimate on a
modified copy of the recipe (`Recipe.model_copy`): the numbers a proposal shows are the plan's own.

Order (best first) is the cost of the change to the run: gradient checkpointing (~1/3 more
compute in training passes), a smaller vLLM share (fewer concurrent sequences), a smaller
micro-batch or train.max_tokens_per_micro_batch (more, smaller passes; the update is the same), the
next ZeRO stage (more
communication), optimizer offload (CPU Adam: slow steps), LoRA (a different method: adapters).
A proposal fits when it leaves 5% of the card free (MARGIN). When no single change fits, they are
combined in that order until the recipe fits, and then those it fits without are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from rltune.plan.budget import fmt_bytes

# a proposal must leave this share of the card free (allocator fragmentation, estimate error)
MARGIN = 0.05


@dataclass
class Proposal:
    changes: dict                  # dotted key -> new value (plain YAML values)
    why: str
    peak: int
    headroom: Optional[int]
    phases: dict
    fits: bool

    def to_dict(self) -> dict:
        return {"changes": dict(self.changes), "why": self.why, "peak": self.peak, "headroom": self.headroom,
                "phases": dict(self.phases), "fits": self.fits}

    def as_fix(self, capacity: Optional[int] = None) -> str:
        """`set a: 1 and b: true (peak X, headroom Y)` for lint fixes and the plan's text."""
        sets = " and ".join(f"{k}: {_yaml(v)}" for k, v in self.changes.items())
        room = "" if self.headroom is None else f", {fmt_bytes(self.headroom)} headroom"
        of = "" if capacity is None else f" of {fmt_bytes(capacity)}"
        return f"set {sets} (peak {fmt_bytes(self.peak)}{of}{room}; {self.why})"


def _yaml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_yaml(x)}" for k, x in v.items()) + "}"
    return str(v)


def with_changes(recipe, changes: dict):
    """A copy of `recipe` with dotted `section.field` keys set (model.lora takes a dict)."""
    by_section: dict = {}
    for key, value in changes.items():
        section, _, name = key.partition(".")
        by_section.setdefault(section, {})[name] = value
    update = {}
    for section, fields in by_section.items():
        obj = getattr(recipe, section)
        if section == "model" and isinstance(fields.get("lora"), dict):
            from rltune.recipe.schema import LoraCfg

            fields = dict(fields, lora=LoraCfg(**fields["lora"]))
        update[section] = obj.model_copy(update=fields)
    return recipe.model_copy(update=update)


def _both(recipe, name: str, value) -> dict:
    """The actor's knob, and the critic's too when the algorithm trains one."""
    out = {f"actor.{name}": value}
    if recipe.has_critic:
        out[f"critic.{name}"] = value
    return out


def candidates(recipe, plan, hw) -> list:
    """(cost rank, changes, label, why) of the single changes that could lower this plan's peak."""
    out = []
    gc_off = not recipe.actor.gradient_checkpointing or (recipe.has_critic and not recipe.critic.gradient_checkpointing)
    if gc_off:
        out.append((1, _both(recipe, "gradient_checkpointing", "selective"), "selective gradient checkpointing",
                    "recompute each layer of the response tokens in the backward pass, each group's prompt "
                    "computed once (full where the shared-prompt passes do not apply)"))
        out.append((1, _both(recipe, "gradient_checkpointing", "full"), "full gradient checkpointing",
                    "recompute every layer in the backward pass: keeps only each layer's input"))
    if hw.device == "cuda" and recipe.trainer.precision == "fp32":
        out.append((2, {"trainer.precision": "bf16"},
                    "bf16", "16-bit weights and gradients (mixed precision: fp32 master weights stay in the optimizer)"))
    if plan.engine == "vllm" and hw.device == "cuda" and hw.mem_bytes:
        util = _fitting_util(recipe, plan, hw)
        if util is not None:
            out.append((3, {"rollout.gpu_memory_utilization": util},
                        "a smaller vLLM share", "fewer KV tokens, the rest stays with the trainer"))
    world = plan.world
    per_rank = max(1, recipe.train.batch_size // world)
    m = recipe.train.micro_batch_size
    smaller = [d for d in range(m - 1, 0, -1) if per_rank % d == 0]
    budget = recipe.train.max_tokens_per_micro_batch
    if budget is not None:   # micro-batches by tokens: budgets of fewer longest sequences
        seq = recipe.data.max_prompt_length + recipe.response_tokens
        smaller = [k * seq for k in range(recipe.micro_rows - 1, 0, -1)]
        if smaller:
            out.append((4, {"train.max_tokens_per_micro_batch": smaller}, "a smaller token budget",
                        "smaller passes; the update (train.batch_size) is unchanged"))
    elif smaller:
        out.append((4, {"train.micro_batch_size": smaller}, "a smaller micro-batch", "smaller passes; the update (train.batch_size) is unchanged"))
    if world > 1 and recipe.actor.zero_stage < 3:
        out.append((5, _both(recipe, "zero_stage", recipe.actor.zero_stage + 1),
                    "the next ZeRO stage", f"shard more of the training state over the {world} ranks"))
    if hw.device == "cuda" and not recipe.actor.offload_optimizer:
        out.append((6, _both(recipe, "offload_optimizer", True),
                    "optimizer offload", "optimizer state in host memory (needs DeepSpeed's cpu_adam op; slower steps)"))
    if recipe.model.lora is None:
        out.append((7, {"model.lora": {"r": 16, "alpha": 32, "target_modules": "all-linear"}},
                    "LoRA", "train LoRA adapters only: no gradients or optimizer state for the base weights, the "
                    "reference is the adapter disabled (raise actor.lr ~10x: lint rule lora-lr)"))
    return out


def _fitting_util(recipe, plan, hw) -> Optional[float]:
    """The largest gpu_memory_utilization (2 decimals) at which the rollout phase fits and vLLM
    still holds one generation call's sequences; None when there is none below the current one."""
    from rltune.plan.budget import GiB

    mem = hw.mem_bytes
    util = recipe.rollout.gpu_memory_utilization
    vllm_share = sum(i.bytes for i in plan.items if i.name.startswith("vLLM") and "rollout" in i.phases)
    rest = plan.phases["rollout"] - vllm_share
    new = int(100 * (mem - rest - GiB // 4) / mem) / 100      # a quarter GiB of slack
    need = sum(i.bytes for i in plan.items if i.name in ("vLLM weights", "vLLM working reserve"))
    need += (plan.kv.get("per_token_bytes") or 0) * (recipe.data.max_prompt_length + recipe.response_tokens) * \
        max(1, recipe.rollout.batch_size // plan.world)
    if new >= util or new <= 0 or new * mem < need:
        return None
    return new


def propose(recipe, plan, hw, estimate: Callable) -> list:
    """Proposals that fit, best first (see the module docstring); [] when the plan fits or the
    capacity is unknown."""
    if plan.capacity is None or plan.peak <= plan.capacity:
        return []

    def check(changes: dict, why: str) -> Proposal:
        p = estimate(with_changes(recipe, changes), hw)
        return Proposal(changes, why, p.peak, p.headroom, dict(p.phases), p.peak <= (1 - MARGIN) * p.capacity)

    def resolve(changes: dict, why: str, base: Optional[dict] = None) -> Proposal:
        """A micro-batch candidate lists sizes (rows or token budgets): take the largest that fits
        (else the smallest)."""
        base = dict(base or {})
        key = next((k for k, v in changes.items() if isinstance(v, list)), None)
        if key is None:
            return check({**base, **changes}, why)
        last = None
        for s in changes[key]:
            last = check({**base, key: s}, why)
            if last.fits:
                break
        return last

    cands = sorted(candidates(recipe, plan, hw), key=lambda c: c[0])
    fitting = [p for p in (resolve(ch, why) for _, ch, _, why in cands) if p.fits]
    if fitting:
        return fitting
    # no single change fits: add them in order until it fits, then drop those it fits without
    steps: list = []
    combined: dict = {}
    for _, ch, label, _ in cands:
        p = resolve(ch, label, combined)
        steps.append(({k: v for k, v in p.changes.items() if combined.get(k) != v}, label))
        combined = dict(p.changes)
        if p.fits:
            break
    else:
        return []
    for k in range(len(steps) - 2, -1, -1):
        trial = {key: v for j, (ch, _) in enumerate(steps) if j != k for key, v in ch.items()}
        if check(trial, "").fits:
            steps.pop(k)
    changes = {key: v for ch, _ in steps for key, v in ch.items()}
    p = check(changes, "")
    return [Proposal(changes, "combined: " + " + ".join(label for _, label in steps),
                     p.peak, p.headroom, p.phases, True)]
