"""Lint rules about memory. `micro-batch-tokens`: a token budget per micro-batch under the longest
sequence. `memory-budget`: the plan (rltune.plan) against the hardware, when the hardware is
known: `validate --gpus N --gpu-mem SIZE`, the recipe's `hardware` section (hardware presets set
it), or trainer.device cuda on a machine with a GPU. With no hardware known it says nothing.
A model whose config.json is there but unusable (plan.ConfigError: not a regular file, too large,
not JSON, a size that is not a whole number within bounds) is an error naming the file and field.

Same shape as rules.py; registered in RULES (rules_base.py) when rules.py imports this module.
No torch import (except where trainer.device is cuda: `hardware_for` asks torch for the card's
memory).
"""

from __future__ import annotations

from typing import Iterator

from rltune.recipe.rules_base import RULES, Ctx, Hit, rule
from rltune.recipe.schema import Recipe

TIGHT = 0.05     # headroom below this share of the card: a warning (allocator fragmentation, CUDA graphs)


@rule("micro-batch-tokens", "warning",
      "train.max_tokens_per_micro_batch < data.max_prompt_length + the response tokens (the longest sequence)",
      "a sequence cannot be split across micro-batches: each one longer than the budget goes alone in a micro-batch "
      "over it, so the budget does not bound the passes' memory (`rltune plan` and the dry run size them at the "
      "longest sequence)")
def micro_batch_tokens(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    budget, seq = r.train.max_tokens_per_micro_batch, r.data.max_prompt_length + r.response_tokens
    if budget is not None and budget < seq:
        yield Hit("train.max_tokens_per_micro_batch",
                  f"train.max_tokens_per_micro_batch {budget} is below the longest sequence, data.max_prompt_length "
                  f"{r.data.max_prompt_length} + {r.response_label} = {seq} tokens: {RULES['micro-batch-tokens'].why}",
                  f"set train.max_tokens_per_micro_batch: {seq} (one longest sequence; a multiple of it packs more), "
                  "or lower data.max_prompt_length / the response length")


def _hardware(r: Recipe, ctx: Ctx):
    if ctx.hardware is not None:
        return ctx.hardware
    from rltune.plan import hardware_for

    try:
        return hardware_for(r)
    except ValueError:
        return None


def _largest(plan, n: int = 3) -> str:
    from rltune.plan.budget import fmt_bytes

    live = sorted((i for i in plan.items if plan.peak_phase in i.phases), key=lambda i: -i.bytes)[:n]
    return ", ".join(f"{i.name} {fmt_bytes(i.bytes)}" for i in live)


@rule("memory-budget", "error",
      "the hardware is known (validate --gpus/--gpu-mem, a hardware preset's `hardware`, or trainer.device cuda on "
      "a GPU machine) and the plan's per-device peak exceeds the card's memory (a warning within 5% of it)",
      "a run that does not fit dies with out-of-memory after minutes of start-up (vLLM, three engines and the "
      "optimizer share the card); `rltune plan` shows the budget item by item (docs/plan.md)")
def memory_budget(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    hw = _hardware(r, ctx)
    if hw is None or hw.mem_bytes is None or hw.device != "cuda":
        return
    from rltune.plan import ArchUnknown, ConfigError, estimate
    from rltune.plan.budget import fmt_bytes

    try:
        plan = estimate(r, hw)
    except ConfigError as err:   # a model's config.json is unusable: the run would fail on it too
        yield Hit(err.key, f"{err.file}: {err.problem} (the memory budget cannot be checked, and the run would "
                           "fail on it)", err.fix, severity="error")
        return
    except ArchUnknown as err:
        msg, _, fix = str(err).partition("\n  fix: ")
        yield Hit("model.policy", f"memory budget not checked: {msg}", fix or "point model.policy at a local directory",
                  severity="info")
        return
    where = f"{hw.gpus} x {fmt_bytes(hw.mem_bytes)}"
    if plan.peak > plan.capacity:
        best = plan.proposals[0] if plan.proposals else None
        fix = (best.as_fix(plan.capacity) if best else
               "no single change fits: use more GPUs (--gpus), larger cards or a smaller model")
        if best and len(plan.proposals) > 1:
            fix += f"; {len(plan.proposals) - 1} other change(s) fit: rltune plan shows them"
        path = next(iter(best.changes)) if best else "model.policy"
        yield Hit(path, f"the plan's peak per device is {fmt_bytes(plan.peak)} in the {plan.peak_phase} phase, "
                        f"over the {fmt_bytes(plan.capacity)} of each card ({where}) by "
                        f"{fmt_bytes(plan.peak - plan.capacity)} (largest: {_largest(plan)}): "
                        f"{RULES['memory-budget'].why}", fix)
    elif plan.headroom < TIGHT * plan.capacity:
        yield Hit("model.policy", f"the plan's peak per device is {fmt_bytes(plan.peak)} in the {plan.peak_phase} "
                                  f"phase, within {fmt_bytes(plan.headroom)} of the {fmt_bytes(plan.capacity)} card "
                                  f"({where}): allocator fragmentation can tip it over",
                  "leave 5% or more free: e.g. set actor.gradient_checkpointing: selective or a smaller "
                  "train.micro_batch_size (rltune plan shows the budget)", severity="warning")


@rule("padding-free-attention", "warning",
      "train.padding_free with model.attn_implementation flash_attention_2",
      "the padding-free passes keep each row's attention within the row by a dense mask, which SDPA and eager "
      "attention take and flash-attention does not (a varlen path is not built): the padded passes would run")
def padding_free_attention(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if r.train.padding_free and r.model.attn_implementation == "flash_attention_2":
        yield Hit("train.padding_free",
                  f"train.padding_free with model.attn_implementation flash_attention_2: "
                  f"{RULES['padding-free-attention'].why}",
                  "set model.attn_implementation: sdpa (or auto without flash-attn), or train.padding_free: false")
