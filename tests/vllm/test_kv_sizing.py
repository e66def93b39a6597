"""The CPU KV cache size vLLM is given (no vLLM import: pure arithmetic + config)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rltune.rollout.vllm import GiB, VLLMRollout, cpu_kv_cache_bytes, kv_bytes_per_token


def test_bytes_per_token_uses_kv_heads_and_head_dim():
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 (9 query heads, hidden 576)
    cfg = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    assert kv_bytes_per_token(cfg, 4) == 2 * 30 * 3 * 64 * 4
    cfg = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=None,
                          hidden_size=64, head_dim=32)
    assert kv_bytes_per_token(cfg, 2) == 2 * 2 * 4 * 32 * 2


def test_size_from_the_call_in_whole_blocks_with_safety():
    size, why = cpu_kv_cache_bytes(16, 272, 320, per_token=1000)
    # 16 seqs x ceil(272/128)=3 blocks x 1.5 = 72, + null block
    assert size == 73 * 128 * 1000
    assert "16 seqs/call" in why and "73 blocks" in why


def test_never_below_one_max_model_len_sequence():
    size, why = cpu_kv_cache_bytes(1, 40, 4096, per_token=10)
    assert size == (4096 // 128 + 1) * 128 * 10
    assert "max_model_len" in why


def _cpu_kv(gb, batch_size=8, env=None, monkeypatch=None, seqs=None):
    if env is not None:
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", env)
    elif monkeypatch is not None:
        monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    eng = VLLMRollout.__new__(VLLMRollout)
    eng.max_model_len = 320
    cfg = SimpleNamespace(cpu_kvcache_gb=gb, batch_size=batch_size)
    text = SimpleNamespace(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    return eng._cpu_kv_cache(cfg, text, "fp32", 272, seqs)


def test_explicit_gib_is_kept_and_fractions_are_exact(monkeypatch):
    assert _cpu_kv(2.0, monkeypatch=monkeypatch)[0] == 2 * GiB
    size, line = _cpu_kv(0.5, monkeypatch=monkeypatch)
    assert size == GiB // 2 and "rollout.cpu_kvcache_gb: 0.5" in line


def test_auto_and_user_environment(monkeypatch):
    size, line = _cpu_kv(None, batch_size=16, seqs=32, monkeypatch=monkeypatch)
    assert size == (int(1.5 * 32 * 3) + 1) * 128 * 46080
    assert line.startswith("vLLM CPU KV cache") and "auto" in line and "32 seqs/call" in line
    size, line = _cpu_kv(None, env="3", monkeypatch=monkeypatch)
    assert size == 3 * GiB and "VLLM_CPU_KVCACHE_SPACE" in line


def test_recipe_default_is_auto_and_explicit_still_validates():
    from rltune.recipe.schema import RolloutCfg

    assert RolloutCfg().cpu_kvcache_gb is None
    assert RolloutCfg(cpu_kvcache_gb=1.5).cpu_kvcache_gb == 1.5
    with pytest.raises(Exception):
        RolloutCfg(cpu_kvcache_gb=0)


def test_sequences_per_generate_call():
    from rltune.recipe.schema import Recipe
    from rltune.rollout import sequences_per_generate_call

    base = {"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"}}
    assert sequences_per_generate_call(Recipe.model_validate({**base, "rollout": {"batch_size": 64}})) == 64
    r = Recipe.model_validate({**base, "rollout": {"batch_size": 16}, "data": {"train": "builtin:arithmetic",
                                                                                "eval_size": 8}})
    assert sequences_per_generate_call(r) == 16
    # an eval set (builtin data + eval_every): greedy eval calls of up to 32 prompts
    r = Recipe.model_validate({**base, "rollout": {"batch_size": 8}, "trainer": {"eval_every": 5}})
    assert sequences_per_generate_call(r) == 32
    r = Recipe.model_validate({**base, "rollout": {"batch_size": 8}, "trainer": {"eval_every": 0}})
    assert sequences_per_generate_call(r) == 8
