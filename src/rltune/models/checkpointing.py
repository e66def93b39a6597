"""Activation checkpointing of a role's decoder layers: `actor.gradient_checkpointing` /
`critic.gradient_checkpointing` = false | full | selective (docs/memory.md).

- full: Hugging Face's checkpointing. Each decoder layer keeps only its input in the forward pass
  and recomputes the rest in backward. HF drops the KV cache of a checkpointed layer, because a
  recompute would append the keys/values a second time, so the shared-prompt passes are off.
- selective: the same per-layer recompute, with each group's prompt computed once
  (`train/shared_prompt.py`): every decoder layer of both passes keeps only its input, and the
  prompt's keys/values are kept, read-only. The prompt pass writes them once (a recompute of
  one of its layers gets its own recomputed keys/values back and changes nothing) and the
  response pass reads them through a cache that is never appended to. HF keeps a cache under
  checkpointing when a layer says so (`_can_checkpoint_with_cache`, set here per layer), so the
  recompute reads the same prompt keys/values the first pass read.

  Where the shared-prompt passes do not apply (one sample per prompt, an unverified model, a
  micro-batch too small to pay off) selective is full.

Only layers built on transformers' `GradientCheckpointingLayer` can be made selective; other
models stay at full, and `checkpointing_mode` says so.
"""

from __future__ import annotations


def _layers(model):
    """The decoder layers Hugging Face checkpoints (GradientCheckpointingLayer instances)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def enable_checkpointing(model, mode) -> None:
    """Turn on `mode` (False | "full" | "selective") for a causal LM or a backbone, before the
    model is wrapped (LoRA) or handed to DeepSpeed."""
    if not mode:
        return
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if mode == "selective":
        for layer in _layers(model):
            layer._can_checkpoint_with_cache = True   # this instance only: our cache is read-only


def checkpointing_mode(model):
    """False | "full" | "selective": what `model` (any wrapper: DeepSpeed engine, LoRA, value
    model) recomputes in training passes."""
    model = getattr(model, "module", model)
    layers = [m for m in _layers(model) if m.gradient_checkpointing]
    if not layers:
        return False
    return "selective" if all(m._can_checkpoint_with_cache for m in layers) else "full"
