"""Tiny random models with a character tokenizer, built offline in a fraction of a second.

They exist so that tests and smoke runs exercise the real code paths (HF model classes,
DeepSpeed engines, generation) without a model hub. The tokenizer is character-level so
the arithmetic task's answers are a few tokens long and a random model finds them.
"""

from __future__ import annotations

import string
from pathlib import Path

SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
# digits first: they are what the builtin task asks for
CHARS = list(string.digits) + list("+-*=?., :!") + list(string.ascii_lowercase) + list(string.ascii_uppercase) + ["\n"]

# head size 32 (64 / 2 heads): vLLM's CPU attention kernels support 32, 64, 80, ... not 16
TINY_VERSION = "v2"
TINY_CONFIGS = {
    "tiny-llama": dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
    ),
    "tiny-qwen2": dict(
        model_type="qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
    ),
}


def build_char_tokenizer():
    """A PreTrainedTokenizerFast over single characters (no chat template)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", padding_side="left",
    )


def build_tiny(name: str, out_dir: Path, seed: int = 0) -> Path:
    """Write a random tiny model + tokenizer to `out_dir` (deterministic for a seed)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg_kw = dict(TINY_CONFIGS[name])
    tokenizer = build_char_tokenizer()
    model_type = cfg_kw.pop("model_type")
    config = AutoConfig.for_model(
        model_type, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **cfg_kw)
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
