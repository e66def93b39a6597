"""The hf engine samples from exactly the recipe's distribution, whatever the checkpoint's
generation_config says, and reports log-probs at the log-prob temperature."""

from __future__ import annotations

import pytest
import torch

from rltune.rollout.base import Sampling

N = 4000  # samples of one token: total-variation noise ~ sqrt(V / N) / 2


def _engine(tmp_path, hostile: bool):
    from rltune.models.loading import load_causal_lm, load_tokenizer
    from rltune.rollout.hf import HFRollout

    model = load_causal_lm("builtin:tiny-llama", "fp32", "eager", "cpu")
    tok = load_tokenizer("builtin:tiny-llama")
    if hostile:  # what real checkpoints carry, exaggerated: most tokens suppressed, penalties on
        gc = model.generation_config
        gc.suppress_tokens = list(range(5, model.config.vocab_size))
        gc.repetition_penalty = 3.0
        gc.no_repeat_ngram_size = 1
        gc.top_k = 3
        gc.min_new_tokens = 1
    return HFRollout(model, tok, chunk_size=N), tok


def _expected(engine, prompt, temperature, top_k=0, top_p=1.0):
    """softmax(logits / T), then top-k and top-p by hand: the recipe's distribution."""
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt])).logits[0, -1].double()
    p = torch.softmax(logits / temperature, -1)
    keep = torch.ones_like(p, dtype=torch.bool)
    if top_k:
        keep &= p >= p.topk(top_k).values[-1]
    if top_p < 1.0:
        order = p.argsort(descending=True)
        cum = p[order].cumsum(0)
        drop_sorted = (cum - p[order]) >= top_p          # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(keep)
        drop[order[drop_sorted]] = True
        keep &= ~drop
    q = torch.where(keep, p, torch.zeros_like(p))
    return q / q.sum()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.3, 8, 1.0)])
def test_hf_samples_follow_the_recipe_not_the_checkpoint(tmp_path, temperature, top_k, top_p):
    engine, tok = _engine(tmp_path, hostile=True)
    prompt = tok("12+3=", add_special_tokens=False)["input_ids"]
    torch.manual_seed(0)
    s = Sampling(n=N, temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=1)
    exp = engine.generate([prompt], s)
    first = exp.response_ids[:, 0]
    freq = torch.bincount(first, minlength=engine.model.config.vocab_size).double() / N
    want = _expected(engine, prompt, temperature, top_k, top_p)
    tv = 0.5 * float((freq - want).abs().sum())
    assert tv < 0.06, f"total variation {tv:.3f}: the engine samples from another distribution"
    # the suppressed tokens (ids >= 5) are sampled as often as the model says
    assert float(freq[5:].sum()) == pytest.approx(float(want[5:].sum()), abs=0.05)
    # reported log-probs: the untruncated softmax(logits / T) of the sampled token
    full = torch.log_softmax(engine.model(torch.tensor([prompt])).logits[0, -1].double() / temperature, -1)
    kept = exp.response_mask[:, 0].bool()            # a pad token sampled last is padding (log-prob 0)
    torch.testing.assert_close(exp.rollout_logp[kept, 0].double(), full[first[kept]], rtol=0, atol=1e-5)


def test_greedy_reports_log_probs_at_temperature_one(tmp_path):
    engine, tok = _engine(tmp_path, hostile=False)
    prompt = tok("1+1=", add_special_tokens=False)["input_ids"]
    exp = engine.generate([prompt], Sampling(n=1, temperature=0.5, max_new_tokens=1, greedy=True))
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt])).logits[0, -1]
    assert int(exp.response_ids[0, 0]) == int(logits.argmax())
    torch.testing.assert_close(exp.rollout_logp[0, 0], torch.log_softmax(logits, -1)[logits.argmax()], atol=1e-5, rtol=0)


def test_log_prob_temperature_is_the_sampling_one_or_one_when_greedy():
    from rltune.recipe.schema import Recipe

    base = {"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"}}
    assert Recipe.model_validate({**base, "rollout": {"temperature": 0.6}}).logprob_temperature == 0.6
    greedy = Recipe.model_validate({**base, "rollout": {"temperature": 0.6, "do_sample": False}})
    assert greedy.logprob_temperature == 1.0
    assert Sampling(temperature=0.6, greedy=True).logprob_temperature == 1.0


def test_dry_run_engine_runs_every_response_to_max_new_tokens(tmp_path):
    """`train --dry-run` measures the longest responses: the FullLength wrapper holds EOS back until
    max_new_tokens. At temperature 5 the tiny model's EOS comes often, so without it rows end early."""
    from rltune.train.dryrun import FullLength

    engine, tok = _engine(tmp_path, hostile=False)
    prompt = tok("12+3=", add_special_tokens=False)["input_ids"]
    s = Sampling(n=64, temperature=5.0, max_new_tokens=12)
    torch.manual_seed(0)
    free = engine.generate([prompt], s)
    assert (free.response_mask.sum(-1) < 12).any()          # the check below could fail
    torch.manual_seed(0)
    full = FullLength(engine).generate([prompt], s)
    assert full.response_ids.shape[1] == 12
    ended = sum((full.response_ids[:, :-1] == e).sum() for e in engine.eos_ids)
    assert int(ended) == 0, "an EOS before the last position: the response ended early"
    assert FullLength(engine).eos_ids == engine.eos_ids      # everything else is the engine's
