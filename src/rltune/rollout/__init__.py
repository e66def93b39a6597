"""Rollout engines behind one interface (`generate`, `sync_weights`)."""

from __future__ import annotations

from .base import RolloutEngine, Sampling  # noqa: F401


def make_rollout(recipe, load_policy, tokenizer, device: str):
    """The recipe's rollout engine (hf until the vllm engine lands)."""
    from .hf import HFRollout

    return HFRollout(load_policy(), tokenizer, device)
