"""A model's architecture, read without torch and without its weights.

Where the sizes come from, in order:
- `builtin:NAME`: the tiny models' configs (models/builtin.py) and SmolLM2-135M's (written here:
  its GGUF is only converted when a run starts);
- a local directory: its config.json;
- a hub id: config.json in the local Hugging Face cache (`huggingface_hub.try_to_load_from_cache`,
  offline), else a few well-known models whose config.json values are written below;
- anything else: unknown, and `ArchUnknown` says how to fix it (point the key at a local directory).

A config.json is input rltune did not write (a model directory someone sent, a hub snapshot): it
is read as data only (never code), with bounds (`read_config_file`: a regular file of at most
MAX_CONFIG_BYTES, JSON nested at most as deep as Python's parser allows), and every size the plan
uses is checked where it is read (`arch_from_config`): a whole number within SIZE_BOUNDS, head
sizes consistent. A config that breaks any of that raises `ConfigError`, whose message names the
recipe key, the file, the field and the fix; `plan`, `validate`'s memory-budget rule and
`train --dry-run` all show that message.

Mixture-of-experts configs (Mixtral; Qwen2-MoE, Qwen3-MoE) are sized: every expert's weights count
for weights, gradients and optimizer state, the experts a token is routed to (`num_experts_per_tok`)
for activations. Other MoE layouts (DeepSeek's `n_routed_experts`, ...) are refused by name.
"""

from __future__ import annotations

import json
import math
import os
import stat
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

# a config.json is a few KiB (one with a large label map a few hundred): anything bigger is not one
MAX_CONFIG_BYTES = 4 << 20

# (smallest, largest) of each size field the plan reads. The largest released models are far
# inside these (hidden 16384, 126 layers, 128 heads, vocab 262144, 384 experts); past them a value is
# a mistake, and a plan from it would be nonsense (or numbers too large to print)
SIZE_BOUNDS = {
    "num_hidden_layers": (1, 4096),
    "hidden_size": (1, 1 << 20),
    "intermediate_size": (1, 1 << 22),
    "num_attention_heads": (1, 1 << 14),
    "num_key_value_heads": (1, 1 << 14),
    "head_dim": (1, 1 << 14),
    "vocab_size": (1, 1 << 24),
    # mixture of experts
    "num_local_experts": (1, 1 << 16),
    "num_experts": (0, 1 << 16),        # Qwen-MoE: 0 = every layer dense
    "num_experts_per_tok": (1, 1 << 16),
    "moe_intermediate_size": (1, 1 << 22),
    "shared_expert_intermediate_size": (0, 1 << 22),
    "decoder_sparse_step": (1, 4096),
}
DENSE_FIELDS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size")
BOOL_FIELDS = ("tie_word_embeddings", "attention_bias", "qkv_bias")

# the mixture-of-experts layouts the plan sizes (transformers' modeling code for each), with the
# defaults transformers' config classes give a field the config.json leaves out
MOE_LAYOUTS = {
    # MixtralSparseMoeBlock: a router (experts x hidden) and experts of intermediate_size, every layer
    "mixtral": dict(experts="num_local_experts", defaults=dict(num_local_experts=8, num_experts_per_tok=2)),
    # Qwen2MoeSparseMoeBlock: router, experts of moe_intermediate_size, one shared expert of
    # shared_expert_intermediate_size with a sigmoid gate (hidden x 1); layers (l + 1) % decoder_sparse_step
    # == 0 not in mlp_only_layers are sparse, the others a dense MLP of intermediate_size
    "qwen2_moe": dict(experts="num_experts", defaults=dict(
        num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
        decoder_sparse_step=1)),
    # Qwen3MoeSparseMoeBlock: as Qwen2-MoE without the shared expert
    "qwen3_moe": dict(experts="num_experts", defaults=dict(
        num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1)),
}
# fields that name a number of experts in other layouts (refused by name)
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


class ArchUnknown(Exception):
    """The model's sizes cannot be known without loading it; the message says how to fix that."""


class ConfigError(ArchUnknown):
    """A model's config.json that is there but cannot be used: not a regular file, too large, not
    JSON, or a size that is not a whole number within bounds (or inconsistent with another). The
    message names the recipe key, the file, the field and the fix."""

    def __init__(self, key: str, file: str, problem: str, fix: str, field: str = ""):
        self.key, self.file, self.problem, self.fix, self.field = key, file, problem, fix, field
        super().__init__(f"{key}: {file}: {problem}\n  fix: {fix}")


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
    the LoRA lint rules (the rank a layer can hold; builtin models). The plan uses Arch.linears()."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = cfg.get("head_dim") or h // nh
    return {"q_proj": (h, nh * hd), "k_proj": (h, nkv * hd), "v_proj": (h, nkv * hd), "o_proj": (nh * hd, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


@dataclass(frozen=True)
class Arch:
    """A decoder-only transformer (Llama / Qwen2 / Qwen3 / Mistral family, and the Mixtral, Qwen2-MoE
    and Qwen3-MoE mixtures of experts) in the numbers the budget needs."""

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
    qk_norm: bool = False       # Qwen3: an RMSNorm of head_dim on q and on k
    # mixture of experts (0 = a dense model): `moe_layers` of the layers have a router over `experts`
    # experts of MLP size `expert_intermediate`, `experts_per_token` of them used per token, and
    # (Qwen2-MoE) a shared expert of `shared_intermediate` with a sigmoid gate; the other layers
    # have a dense MLP of `intermediate`
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    moe_layers: int = 0

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def dense_layers(self) -> int:
        return self.layers - self.moe_layers

    def attn_params(self) -> int:
        """q, k, v, o projections (+ q/k/v biases, + Qwen3's q/k norms) and the layer's two RMSNorms."""
        h = self.hidden
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h + 2 * h
        if self.qkv_bias:
            attn += self.q_dim + 2 * self.kv_dim
        if self.qk_norm:
            attn += 2 * self.head_dim
        return attn

    def moe_mlp_params(self, active: bool = False) -> int:
        """A sparse MLP block: the router (experts x hidden), the experts' gated MLPs (3 x hidden x
        expert_intermediate each; `active`: only the experts a token uses) and the shared expert
        with its gate (hidden x 1)."""
        h = self.hidden
        n = self.experts_per_token if active else self.experts
        shared = 3 * h * self.shared_intermediate + h if self.shared_intermediate else 0
        return self.experts * h + n * 3 * h * self.expert_intermediate + shared

    def layer_params(self) -> int:
        """The largest decoder layer (what ZeRO-3 gathers at once): q, k, v, o projections (+ q/k/v
        biases), a gated MLP (gate, up, down: 3 x hidden x intermediate) or a sparse MLP block with
        all its experts, and two RMSNorm weight vectors."""
        dense = self.attn_params() + 3 * self.hidden * self.intermediate
        if not self.moe_layers:
            return dense
        sparse = self.attn_params() + self.moe_mlp_params()
        return sparse if not self.dense_layers else max(dense, sparse)

    def params(self, lm_head: bool = True, active: bool = False) -> int:
        """All parameters: embedding (vocab x hidden), layers, final norm, and the LM head unless
        tied (or `lm_head=False`: a backbone, the critic's). `active`: the parameters one token
        uses (MoE: only its experts; the FLOPs per token are about 2 x these)."""
        emb = self.vocab * self.hidden
        head = emb if (lm_head and not self.tied) else 0
        layers = (self.layers * self.attn_params() + self.dense_layers * 3 * self.hidden * self.intermediate
                  + self.moe_layers * self.moe_mlp_params(active))
        return emb + layers + self.hidden + head

    def linears(self, all_linear: bool = True) -> list:
        """What LoRA adapts in the decoder layers: [(name, in, out, how many)], each costing
        r x (in + out) (PEFT's A: r x in, B: out x r). The nn.Linear modules (PEFT leaves the output
        head out): q, k, v, o, the dense layers' gate, up, down, Qwen2-MoE's shared expert (gate, up,
        down) and its gate (hidden x 1). `all_linear` (target_modules: all-linear) on an MoE block
        also: measured with peft 0.21.2 and transformers 5.19.0 (whose experts are 3-D parameters),
        PEFT adapts Mixtral's and Qwen3-MoE's router (hidden -> experts) and every expert, as rank
        r per expert per projection: gate_up 2r x experts x (hidden + 2i'), down r x experts x
        (i' + hidden); Qwen2-MoE's router and experts it leaves alone."""
        h, n = self.hidden, self.layers
        out = [("q_proj", h, self.q_dim, n), ("k_proj", h, self.kv_dim, n), ("v_proj", h, self.kv_dim, n),
               ("o_proj", self.q_dim, h, n)]
        for i, m in ((self.intermediate, self.dense_layers), (self.shared_intermediate, self.moe_layers)):
            if i and m:
                out += [("gate_proj", h, i, m), ("up_proj", h, i, m), ("down_proj", i, h, m)]
        if self.shared_intermediate and self.moe_layers:
            out.append(("shared_expert_gate", h, 1, self.moe_layers))
        if all_linear and self.moe_layers and self.model_type in ("mixtral", "qwen3_moe"):
            e, i, m = self.experts, self.expert_intermediate, self.moe_layers
            out += [("router", h, e, m), ("experts.gate_up_proj", h, 2 * i, 2 * e * m),
                    ("experts.down_proj", i, h, e * m)]
        return out

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token over all layers: 2 x layers x kv_heads x head_dim x dtype bytes
        (the same formula as rollout/vllm.py kv_bytes_per_token)."""
        return 2 * self.layers * self.kv_dim * dtype_bytes

    def describe(self) -> str:
        if self.moe_layers:
            shared = f", a shared expert of {self.shared_intermediate}" if self.shared_intermediate else ""
            dense = f" ({self.dense_layers} dense layers of MLP {self.intermediate})" if self.dense_layers else ""
            mlp = (f"mixture of experts: {self.experts} experts of MLP {self.expert_intermediate}, "
                   f"{self.experts_per_token} per token{shared}, in {self.moe_layers} layers{dense}")
            size = f"{self.params() / 1e9:.3g}B params ({self.params(active=True) / 1e9:.3g}B active per token)"
        else:
            mlp, size = f"MLP {self.intermediate}", f"{self.params() / 1e9:.3g}B params"
        return (f"{size}: {self.layers} layers, hidden {self.hidden}, {mlp}, {self.heads} heads "
                f"({self.kv_heads} KV, dim {self.head_dim}), vocab {self.vocab}{', tied head' if self.tied else ''} "
                f"({self.source})")


def _fix(field: str, file: str, key: str) -> str:
    return (f"set `{field}` in {file} to the model's real value (what save_pretrained wrote for it), or point "
            f"{key} at a directory holding the model's original config.json")


def _size(cfg: dict, name: str, file: str, key: str, prefix: str = "", default=None) -> Optional[int]:
    """cfg[name] as a whole number within SIZE_BOUNDS[name]; `default` where it is absent or null.
    A value of another type, out of bounds, not finite: ConfigError naming the field."""
    value = cfg.get(name)
    if value is None:
        return default
    field = prefix + name
    lo, hi = SIZE_BOUNDS[name]
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isnan(value):
            what = "NaN"
        elif isinstance(value, float) and math.isinf(value):
            what = "Infinity" if value > 0 else "-Infinity"
        elif isinstance(value, float):
            what = f"{value!r}, a fraction" if not value.is_integer() else f"{value!r}, a float"
        else:
            what = _show(value)
        raise ConfigError(key, file, f"`{field}` is {what}: it must be a whole number from {lo:,} to {hi:,}",
                          _fix(field, file, key), field)
    if not lo <= value <= hi:
        shown = f"{value:,}" if abs(value) < 10 ** 30 else f"a {len(str(abs(value)))}-digit number"
        raise ConfigError(key, file, f"`{field}` is {shown}: it must be a whole number from {lo:,} to {hi:,}",
                          _fix(field, file, key), field)
    return value


def _json_type(value) -> str:
    return {str: "string", list: "array", dict: "object", bool: "boolean"}.get(type(value), type(value).__name__)


def _show(value) -> str:
    """A JSON value in a message, short (a string's first 40 characters; an array or object by its
    type only: it may be large or deeply nested)."""
    if isinstance(value, str):
        return json.dumps(value if len(value) <= 40 else value[:40] + "...") + ", a JSON string"
    if isinstance(value, (list, dict)):
        return f"a JSON {_json_type(value)}"
    return json.dumps(value)


def _flag(cfg: dict, name: str, file: str, key: str, prefix: str, default: bool) -> bool:
    value = cfg.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        field = prefix + name
        raise ConfigError(key, file, f"`{field}` is {_show(value)}: it must be true or false",
                          _fix(field, file, key), field)
    return value


def arch_from_config(cfg: dict, source: str = "", key: str = "model.policy") -> Arch:
    """An Arch from a config.json dict (multimodal configs: their text_config), every size checked
    (ConfigError names the field). A required size that is absent: ArchUnknown naming it. `source`:
    the file (or builtin) the dict came from, shown in messages and by `plan`."""
    file = source or "the model's config.json"
    prefix = ""
    text = cfg.get("text_config")
    if text is not None:
        if not isinstance(text, dict):
            raise ConfigError(key, file, f"`text_config` is a JSON {_json_type(text)}, not an object",
                              _fix("text_config", file, key), "text_config")
        cfg, prefix = text, "text_config."
    model_type = cfg.get("model_type", "")
    if not isinstance(model_type, str):
        raise ConfigError(key, file, f"`{prefix}model_type` is {_show(model_type)}, not a string",
                          _fix(prefix + "model_type", file, key), prefix + "model_type")

    def size(name, default=None):
        return _size(cfg, name, file, key, prefix, default)

    # every size field present is checked first, so that a bad value is named even when another is missing
    for name in DENSE_FIELDS:
        size(name)
    missing = [prefix + n for n in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
               if cfg.get(n) is None]
    layout = MOE_LAYOUTS.get(model_type)
    if cfg.get("intermediate_size") is None and not (layout and model_type != "mixtral"):
        missing.insert(1, prefix + "intermediate_size")
    if missing:
        raise ArchUnknown(
            f"{key}: {file} lacks {', '.join(f'`{m}`' for m in missing)}: the sizes of a decoder-only transformer "
            f"(Llama, Qwen2, Mistral) that rltune plan reads\n  fix: point {key} at a directory whose config.json "
            f"has them (a model of another architecture cannot be planned yet)")
    h, heads = size("hidden_size"), size("num_attention_heads")
    kv_heads = size("num_key_value_heads", heads)
    head_dim = size("head_dim")
    if head_dim is None:
        if h % heads:
            raise ConfigError(key, file, f"`{prefix}hidden_size` {h:,} is not a multiple of "
                                         f"`{prefix}num_attention_heads` {heads:,}, and there is no `{prefix}head_dim`",
                              _fix(prefix + "num_attention_heads", file, key), prefix + "num_attention_heads")
        head_dim = h // heads
    if heads % kv_heads:
        raise ConfigError(key, file, f"`{prefix}num_attention_heads` {heads:,} is not a multiple of "
                                     f"`{prefix}num_key_value_heads` {kv_heads:,} (each key/value head serves a whole "
                                     "number of query heads)",
                          _fix(prefix + "num_key_value_heads", file, key), prefix + "num_key_value_heads")
    tied = _flag(cfg, "tie_word_embeddings", file, key, prefix, False)
    bias_default = model_type in ("qwen2", "qwen2_moe")
    bias_field = "qkv_bias" if model_type == "qwen2_moe" else "attention_bias"
    qkv_bias = _flag(cfg, bias_field, file, key, prefix, bias_default)
    layers = size("num_hidden_layers")
    moe = _moe(cfg, model_type, layout, layers, file, key, prefix, size)
    return Arch(layers=layers, hidden=h, intermediate=size("intermediate_size", 0), heads=heads,
                kv_heads=kv_heads, head_dim=head_dim, vocab=size("vocab_size"), tied=tied, qkv_bias=qkv_bias,
                model_type=model_type, source=source, qk_norm=model_type in ("qwen3", "qwen3_moe"), **moe)


def _moe(cfg, model_type, layout, layers, file, key, prefix, size) -> dict:
    """The mixture-of-experts fields of Arch (empty for a dense model); ArchUnknown for an MoE layout
    rltune does not size."""
    if layout is None:
        counts = [cfg.get(n) for n in EXPERT_FIELDS]
        experts = max((v for v in counts if isinstance(v, int) and not isinstance(v, bool)), default=0)
        if experts > 1 or isinstance(cfg.get("ffn_config"), dict):
            k = cfg.get("num_experts_per_tok")
            what = f"{experts} experts" if experts > 1 else "experts"
            if experts > 1 and isinstance(k, int) and not isinstance(k, bool):
                what += f", {k} active per token"
            raise ArchUnknown(
                f"{key}: {file}: rltune plan does not size mixture-of-experts models of model_type "
                f"`{model_type or '?'}` yet ({what}; it sizes mixtral, qwen2_moe and qwen3_moe): every expert's "
                f"weights count for memory, only the active ones for activations, and a dense plan would be wrong"
                f"\n  fix: plan a Mixtral or Qwen-MoE model, or size this run by hand (docs/plan.md)")
        return {}
    d = layout["defaults"]
    experts = size(layout["experts"], d[layout["experts"]])
    if not experts:     # Qwen-MoE with num_experts 0: every layer has the dense MLP
        if cfg.get("intermediate_size") is None:
            raise ArchUnknown(f"{key}: {file} lacks `{prefix}intermediate_size` (the dense layers' MLP size)\n"
                              f"  fix: point {key} at a directory whose config.json has it")
        return {}
    k = size("num_experts_per_tok", d["num_experts_per_tok"])
    if k > experts:
        field = prefix + "num_experts_per_tok"
        raise ConfigError(key, file, f"`{field}` {k:,} is more than the {experts:,} experts "
                                     f"(`{prefix}{layout['experts']}`)", _fix(field, file, key), field)
    if model_type == "mixtral":
        expert_i, shared, moe_layers = size("intermediate_size"), 0, layers
    else:
        expert_i = size("moe_intermediate_size", d["moe_intermediate_size"])
        shared = size("shared_expert_intermediate_size", d.get("shared_expert_intermediate_size", 0))
        step = size("decoder_sparse_step", d["decoder_sparse_step"])
        only = cfg.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in only):
            field = prefix + "mlp_only_layers"
            raise ConfigError(key, file, f"`{field}` is {_show(only)}: it must be a list of layer indices",
                              _fix(field, file, key), field)
        dense_only = set(only)
        moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        if moe_layers < layers and cfg.get("intermediate_size") is None:  # dense layers need it
            raise ArchUnknown(f"{key}: {file} lacks `{prefix}intermediate_size` (the dense layers' MLP size)\n"
                              f"  fix: point {key} at a directory whose config.json has it")
    return dict(experts=experts, experts_per_token=k, expert_intermediate=expert_i, shared_intermediate=shared,
                moe_layers=moe_layers)


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
    Raises ArchUnknown with a fix when it cannot be known, ConfigError (an ArchUnknown) when its
    config.json is there but unusable."""
    cfg = builtin_config(spec)
    if cfg is not None:
        return arch_from_config(cfg, spec, key)
    if spec.startswith("builtin:"):
        raise ArchUnknown(f"{key}: unknown builtin model `{spec}`")
    path = Path(spec).expanduser()
    if path.is_dir():
        cfg_path = path / "config.json"
        if not (cfg_path.exists() or cfg_path.is_symlink()):
            raise ArchUnknown(f"{key}: model directory `{spec}` has no config.json")
        return arch_from_config(read_config_file(cfg_path, key), str(cfg_path), key)
    cached = _hub_cached_config(spec)
    if cached:
        return arch_from_config(read_config_file(Path(cached), key), f"{cached} (config.json of {spec} in the "
                                "Hugging Face cache)", key)
    if spec in KNOWN_HUB:
        return arch_from_config(KNOWN_HUB[spec], f"{spec}: config.json values known to rltune", key)
    raise ArchUnknown(
        f"{key} `{spec}`: the model's size is unknown (not a local directory, not in the Hugging Face "
        f"cache, not a model rltune knows)\n  fix: set {key} to a local directory holding the model's "
        f"config.json (save_pretrained writes one), or fetch it into the Hugging Face cache where the hub is "
        f"reachable: `hf download {spec} config.json`")


def read_config_file(path: Path, key: str = "model.policy") -> dict:
    """A config.json as a dict, read as untrusted data: a regular file (not a FIFO or a device behind
    the name: it is opened without blocking and checked before reading) of at most MAX_CONFIG_BYTES,
    UTF-8 JSON whose top level is an object. Anything else: ConfigError naming the file."""
    file = str(path)
    fix = f"point {key} at a directory holding the model's config.json as save_pretrained writes it"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise ConfigError(key, file, f"cannot be opened: {err.strerror or err}", fix) from err
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode) else "a device" if
                    stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                    else "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file")
            raise ConfigError(key, file, f"is {kind}, not a regular file: rltune reads a model's config.json "
                                         "only from a plain file", fix)
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(key, file, f"is {st.st_size:,} bytes: a model's config.json is a few KiB, and rltune "
                                         f"reads at most {MAX_CONFIG_BYTES >> 20} MiB", fix)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(key, file, f"cannot be read: {err.strerror or err}", fix) from err
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:   # it grew after the size check
        raise ConfigError(key, file, f"is over {MAX_CONFIG_BYTES >> 20} MiB: a model's config.json is a few KiB", fix)
    try:
        cfg = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(key, file, f"is not UTF-8 text (byte {err.start})", fix) from err
    except RecursionError as err:
        raise ConfigError(key, file, "is JSON nested too deeply to read (a config.json is a flat object "
                                     "with a few nested ones)", fix) from err
    except ValueError as err:   # json.JSONDecodeError, or an integer of more digits than Python converts
        raise ConfigError(key, file, f"is not valid JSON: {err}", fix) from err
    if not isinstance(cfg, dict):
        raise ConfigError(key, file, f"is a JSON {_json_type(cfg)}, not an object of model settings", fix)
    return cfg
