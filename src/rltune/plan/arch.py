"""A model's architecture, read without torch and without its weights.

Where the sizes come from, in order:
- `builtin:NAME`: the tiny models' configs (models/builtin.py) and SmolLM2-135M's (written here:
  its GGUF is only converted when a run starts);
- a local directory: its config.json;
- a hub id: config.json in the local Hugging Face cache (`huggingface_hub.try_to_load_from_cache`,
  offline), else a few well-known models whose config.json values are written below;
- anything else: unknown, and `ArchUnknown` says how to fix it (point the key at a local directory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# SmolLM2-135M(-Instruct)'s architecture (a Llama): the GGUF that `builtin:smollm2-135m-instruct`
# converts is only read when a run starts, so its sizes are written here (HuggingFaceTB/SmolLM2-135M
# config.json: hidden 576, intermediate 1536, 9 heads, 3 key/value heads of 64, vocab 49152, tied)
SMOLLM2_135M = dict(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)

# config.json values of a few hub models the shipped recipes and docs name, so that `plan` works
# offline for them (copied from each repository's config.json on the Hugging Face hub)
KNOWN_HUB = {
    "Qwen/Qwen2.5-1.5B-Instruct": dict(
        model_type="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "Qwen/Qwen2-7B-Instruct": dict(
        model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
    "meta-llama/Llama-2-7b-hf": dict(
        model_type="llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=32, vocab_size=32000, tie_word_embeddings=False),
    "meta-llama/Meta-Llama-3-8B-Instruct": dict(
        model_type="llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
}


class ArchUnknown(Exception):
    """The model's sizes cannot be known without loading it; the message says how to fix that."""


def builtin_config(spec: Optional[str]) -> Optional[dict]:
    """The architecture of a builtin model as a plain dict, or None where `spec` is not a known
    builtin (hub ids, local directories)."""
    if not spec or not spec.startswith("builtin:"):
        return None
    name = spec[len("builtin:"):]
    if name == "smollm2-135m-instruct":
        return SMOLLM2_135M
    from rltune.models.builtin import CHARS, SPECIAL, TINY_CONFIGS  # plain data; torch only in functions

    cfg = TINY_CONFIGS.get(name)
    return None if cfg is None else dict(cfg, vocab_size=len(SPECIAL) + len(CHARS))


def linear_shapes(cfg: dict) -> dict:
    """(in, out) features of a Llama/Qwen2 decoder layer's linear modules, by module name, from a
    config.json dict: what LoRA's `all-linear` adapts (PEFT leaves the output head out). Used by
    the plan (adapter sizes) and by the LoRA lint rules (the rank a layer can hold)."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or h // nh
    return {"q_proj": (h, nh * hd), "k_proj": (h, nkv * hd), "v_proj": (h, nkv * hd), "o_proj": (nh * hd, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer (Llama / Qwen2 / Mistral family) in the numbers the budget needs."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False          # the LM head shares the input embedding's weights
    qkv_bias: bool = False      # Qwen2 has q/k/v biases
    model_type: str = ""        # config.json's model_type (llama, qwen2, ...)
    source: str = ""            # where the numbers came from (shown by `plan`)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    def layer_params(self) -> int:
        """One decoder layer: q, k, v, o projections (+ q/k/v biases), a gated MLP (gate, up,
        down: 3 x hidden x intermediate) and two RMSNorm weight vectors."""
        h, i = self.hidden, self.intermediate
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        if self.qkv_bias:
            attn += self.q_dim + 2 * self.kv_dim
        return attn + 3 * h * i + 2 * h

    def params(self, lm_head: bool = True) -> int:
        """All parameters: embedding (vocab x hidden), layers, final norm, and the LM head unless
        tied (or `lm_head=False`: a backbone, the critic's)."""
        emb = self.vocab * self.hidden
        head = emb if (lm_head and not self.tied) else 0
        return emb + self.layers * self.layer_params() + self.hidden + head

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token over all layers: 2 x layers x kv_heads x head_dim x dtype bytes
        (the same formula as rollout/vllm.py kv_bytes_per_token)."""
        return 2 * self.layers * self.kv_dim * dtype_bytes

    def describe(self) -> str:
        return (f"{self.params() / 1e9:.3g}B params: {self.layers} layers, hidden {self.hidden}, MLP "
                f"{self.intermediate}, {self.heads} heads ({self.kv_heads} KV, dim {self.head_dim}), "
                f"vocab {self.vocab}{', tied head' if self.tied else ''} ({self.source})")


def arch_from_config(cfg: dict, source: str = "") -> Arch:
    """An Arch from a config.json dict (multimodal configs: their text_config)."""
    cfg = cfg.get("text_config") or cfg
    try:
        h = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        return Arch(
            layers=int(cfg["num_hidden_layers"]), hidden=h, intermediate=int(cfg["intermediate_size"]),
            heads=heads, kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or h // heads), vocab=int(cfg["vocab_size"]),
            tied=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
            model_type=str(cfg.get("model_type", "")), source=source)
    except (KeyError, TypeError, ValueError) as err:
        raise ArchUnknown(f"{source or 'the config'} lacks the sizes a decoder-only transformer config has "
                          f"({type(err).__name__}: {err})") from err


def _hub_cached_config(repo_id: str) -> Optional[str]:
    """Path of repo_id's config.json in the local Hugging Face cache, or None (never downloads)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except Exception:  # noqa: BLE001 - not installed or broken: nothing cached to read
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - an id huggingface_hub rejects
        return None
    return found if isinstance(found, str) else None


def resolve_arch(spec: str, key: str = "model.policy") -> Arch:
    """The architecture of the model `spec` names (recipe key `key`), without torch or weights.
    Raises ArchUnknown with a fix when it cannot be known."""
    cfg = builtin_config(spec)
    if cfg is not None:
        return arch_from_config(cfg, spec)
    if spec.startswith("builtin:"):
        raise ArchUnknown(f"{key}: unknown builtin model `{spec}`")
    path = Path(spec).expanduser()
    if path.is_dir():
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise ArchUnknown(f"{key}: model directory `{spec}` has no config.json")
        return _read_config(cfg_path, f"{spec}/config.json", key)
    cached = _hub_cached_config(spec)
    if cached:
        return _read_config(Path(cached), f"{spec}: config.json in the Hugging Face cache", key)
    if spec in KNOWN_HUB:
        return arch_from_config(KNOWN_HUB[spec], f"{spec}: config.json values known to rltune")
    raise ArchUnknown(
        f"{key} `{spec}`: the model's size is unknown (not a local directory, not in the Hugging Face "
        f"cache, not a model rltune knows)\n  fix: set {key} to a local directory holding the model's "
        f"config.json (save_pretrained writes one), or fetch it into the Hugging Face cache where the hub is "
        f"reachable: `hf download {spec} config.json`")


def _read_config(path: Path, source: str, key: str) -> Arch:
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ArchUnknown(f"{key}: cannot read {source}: {err}") from err
    if not isinstance(cfg, dict):
        raise ArchUnknown(f"{key}: {source} is not a JSON object")
    return arch_from_config(cfg, source)
