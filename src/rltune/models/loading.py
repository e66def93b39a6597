"""Resolve a model spec to a local directory, then load models and tokenizers from it."""

from __future__ import annotations

from pathlib import Path

from .common import BUILTINS, ModelSpecError, _atomic_build, cache_dir  # noqa: F401


def resolve_model_dir(spec: str) -> str:
    """A local directory (or a hub id, returned as is) for a model spec."""
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTINS:
            raise ModelSpecError(
                f"unknown builtin model {spec!r}; available: "
                + ", ".join("builtin:" + b for b in BUILTINS))
        if name == "smollm2-135m-instruct":
            from .smollm2 import smollm2_dir

            return str(smollm2_dir(cache_dir()))
        from .builtin import TINY_VERSION, build_tiny

        return str(_atomic_build(cache_dir() / "builtin" / f"{name}-{TINY_VERSION}", lambda d: build_tiny(name, d)))
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelSpecError(
                f"model directory {spec} has no config.json; point to a directory written by "
                "save_pretrained (or use builtin:tiny-llama)")
        return str(path)
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelSpecError(f"model path {spec} does not exist")
    return spec  # a hub id


def _hub_error(spec: str, err: Exception) -> ModelSpecError:
    return ModelSpecError(
        f"could not load model {spec!r}: {type(err).__name__}: {str(err).splitlines()[0][:300]}\n"
        "  fix: use a local directory saved with save_pretrained, or builtin:tiny-llama / "
        "builtin:smollm2-135m-instruct when the model hub is unreachable")


def torch_dtype(precision: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def attn_impl(requested: str, device: str) -> str:
    """`auto` picks flash_attention_2 when installed and on CUDA ("cuda" or "cuda:N"), else sdpa."""
    if requested != "auto":
        return requested
    if str(device).split(":")[0] == "cuda":
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "sdpa"


def load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    path = resolve_model_dir(spec)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - turned into a user message
        raise _hub_error(spec, err) from err
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _from_pretrained(auto_cls, spec: str, precision: str, attn: str, device: str, trust_remote_code: bool):
    path = resolve_model_dir(spec)
    try:
        return auto_cls.from_pretrained(path, dtype=torch_dtype(precision), attn_implementation=attn_impl(attn, device),
                                        trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001
        raise _hub_error(spec, err) from err


def load_causal_lm(spec: str, precision: str = "fp32", attn: str = "auto", device: str = "cpu",
                   trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM

    return _from_pretrained(AutoModelForCausalLM, spec, precision, attn, device, trust_remote_code)


def load_backbone(spec: str, precision: str = "fp32", attn: str = "auto", device: str = "cpu",
                  trust_remote_code: bool = False):
    """The base transformer (no LM head) of a causal LM, for the critic."""
    from transformers import AutoModel

    return _from_pretrained(AutoModel, spec, precision, attn, device, trust_remote_code)


def load_reward_model(spec: str, precision: str = "fp32", trust_remote_code: bool = False):
    """A sequence-classification reward model with one output (its logit is the reward)."""
    from transformers import AutoModelForSequenceClassification

    path = resolve_model_dir(spec)
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=torch_dtype(precision), trust_remote_code=trust_remote_code)
    except Exception as err:  # noqa: BLE001
        raise _hub_error(spec, err) from err
    return model.eval().requires_grad_(False)
