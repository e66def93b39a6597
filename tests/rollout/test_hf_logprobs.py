"""The hf engine's rollout log-probs, captured step by step while sampling (no (B, T, V) logits
kept), equal log_softmax(raw logits / T) of a teacher-forced forward over the same tokens."""

from __future__ import annotations

import pytest
import torch

from rltune.rollout.base import Sampling


@pytest.fixture(scope="module")
def setup():
    from rltune.models.loading import load_causal_lm, load_tokenizer
    from rltune.rollout.hf import HFRollout

    model = load_causal_lm("builtin:tiny-llama", "fp32", "eager", "cpu")
    tok = load_tokenizer("builtin:tiny-llama")
    engine = HFRollout(model, tok, chunk_size=64)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("12+3=", "7*8=", "100-1=")]
    return engine, prompts


def _teacher_forced(engine, exp, temperature):
    """log_softmax(logits / T) of the sampled tokens from one forward over prompt + response,
    attending every generated token as `generate` did."""
    input_ids = torch.cat([exp.prompt_ids, exp.response_ids], dim=1)
    attention = torch.cat([exp.prompt_mask, torch.ones_like(exp.response_ids)], dim=1)
    position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = engine.model(input_ids=input_ids, attention_mask=attention,
                              position_ids=position_ids).logits[:, exp.prompt_width - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, exp.response_ids.unsqueeze(-1)).squeeze(-1)


def _check(engine, exp, temperature):
    ref = _teacher_forced(engine, exp, temperature)
    keep = exp.response_mask.bool()
    assert keep.any()
    assert torch.isfinite(exp.rollout_logp).all()
    torch.testing.assert_close(exp.rollout_logp[keep], ref[keep], rtol=0, atol=1e-4)
    assert (exp.rollout_logp[~keep] == 0).all()          # padding after EOS: exactly 0


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 8, 0.9), (1.3, 5, 1.0), (0.5, 0, 0.8)])
def test_sampled_logprobs_are_raw_logits_at_temperature(setup, temperature, top_k, top_p):
    engine, prompts = setup
    torch.manual_seed(0)
    s = Sampling(n=3, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=12)
    exp = engine.generate(prompts, s)
    assert exp.response_ids.shape[0] == len(prompts) * 3
    _check(engine, exp, temperature)


def test_greedy_logprobs_at_temperature_one(setup):
    engine, prompts = setup
    exp = engine.generate(prompts, Sampling(n=1, temperature=0.5, max_new_tokens=10, greedy=True))
    _check(engine, exp, 1.0)


def test_rows_finishing_early_are_masked_to_zero(setup):
    engine, prompts = setup
    eos = engine.eos_ids
    vocab = engine.model.config.vocab_size
    engine.eos_ids = set(eos) | set(range(5, vocab, 3))   # a third of the vocabulary ends a response
    try:
        torch.manual_seed(1)
        exp = engine.generate(prompts, Sampling(n=4, temperature=1.0, max_new_tokens=12))
    finally:
        engine.eos_ids = eos
    lengths = exp.response_mask.sum(1)
    assert (lengths < exp.response_ids.shape[1]).any(), "no row finished early: the test lost its point"
    _check(engine, exp, 1.0)


@pytest.mark.parametrize("ids,eos,pad,want", [
    ([5, 0, 7, 2, 0, 0], {2}, 0, [1, 1, 1, 1, 0, 0]),   # a pad sampled mid-response is a token; EOS ends it
    ([5, 0, 7, 0, 0, 0], {2}, 0, [1, 1, 1, 0, 0, 0]),   # stopped without EOS (a stop string): the pad suffix
    ([0, 0, 0], {2}, 0, [0, 0, 0]),
    ([5, 2, 9], {2}, 2, [1, 1, 0]),                     # pad == EOS: the first one ends the response
    ([5, 0, 7], {2}, None, [1, 1, 1]),                  # no pad id (vLLM: lengths are known)
])
def test_response_mask_masks_padding_only_as_a_suffix(ids, eos, pad, want):
    from rltune.rollout.base import response_mask_from_ids

    assert response_mask_from_ids(torch.tensor([ids]), eos, pad).tolist() == [want]


def test_a_pad_token_sampled_mid_response_is_trained_as_sampled(setup):
    """The trainer's forward (Experience.model_inputs: attention and positions from the masks)
    gives the rollout's log-probs on every kept token, also after a pad token the engine sampled
    mid-response (near-uniform sampling over the tiny vocabulary draws it often)."""
    from rltune.train.update import forward_logp

    engine, prompts = setup
    torch.manual_seed(0)
    exp = engine.generate(prompts, Sampling(n=8, temperature=20.0, max_new_tokens=8))
    kept = exp.response_mask.bool()
    mid_pad = kept & (exp.response_ids == engine.pad_id)
    assert mid_pad.any(), "no pad token sampled mid-response: the test lost its point"
    trainer = forward_logp(engine.model, exp, 20.0, 4)
    torch.testing.assert_close(trainer[kept], exp.rollout_logp[kept], rtol=0, atol=1e-4)


def test_logits_are_not_requested_from_generate():
    from rltune.rollout.hf import generation_config

    cfg = generation_config(Sampling(temperature=0.7, top_k=4), [2], 0)
    assert not cfg.output_logits and not cfg.output_scores and not cfg.return_dict_in_generate


def test_same_values_as_stacking_output_logits(setup):
    """Bit for bit what the engine computed before: log_softmax(stack(output_logits) / T)."""
    from transformers import LogitsProcessorList

    from rltune.rollout.hf import SampledLogprobs, generation_config

    engine, prompts = setup
    ids, mask = _left_padded(engine, prompts)
    P = ids.shape[1]
    s = Sampling(n=1, temperature=0.8, top_k=6, top_p=0.9, max_new_tokens=8)
    cfg = generation_config(s, sorted(engine.eos_ids), engine.pad_id)
    cfg.return_dict_in_generate, cfg.output_logits = True, True
    capture = SampledLogprobs(s.logprob_temperature, prompt_len=P)
    torch.manual_seed(3)
    with torch.no_grad():
        out = engine.model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg,
                                    logits_processor=LogitsProcessorList([capture]))
    response = out.sequences[:, P:]
    old = torch.log_softmax(torch.stack(out.logits, 1).float() / s.logprob_temperature, -1)
    old = old.gather(-1, response.unsqueeze(-1)).squeeze(-1)
    assert torch.equal(capture.finish(response), old)


@pytest.mark.parametrize("greedy", [False, True])
def test_prompts_prefilled_once_per_group_sample_the_same(setup, greedy, monkeypatch):
    """Each prompt prefilled once for its n samples (the cache repeated) == every row prefilled
    whole: same tokens under the same seed, same log-probs (atol 1e-5); left-padded prompts of
    different lengths."""
    engine, prompts = setup
    assert engine.share_prompts
    monkeypatch.setattr("rltune.train.shared_prompt.MIN_SAVED_FLOP", 0.0)   # a tiny model: shared only when forced
    s = Sampling(n=4, temperature=0.9, top_k=0, top_p=1.0, max_new_tokens=12, greedy=greedy)
    out = {}
    for share in (True, False):
        engine.share_prompts = share
        engine.seed(1)
        out[share] = engine.generate(prompts, s)
    engine.share_prompts = True
    a, b = out[True], out[False]
    assert torch.equal(a.prompt_ids, b.prompt_ids) and torch.equal(a.response_ids, b.response_ids)
    assert torch.equal(a.response_mask, b.response_mask)
    torch.testing.assert_close(a.rollout_logp, b.rollout_logp, rtol=0, atol=1e-5)
    _check(engine, a, 1.0 if greedy else 0.9)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_truncated_sampling_reports_the_full_distribution(setup, temperature):
    """`top_p: 0.9, top_k: 20`: the engine samples from the truncated distribution, but
    `rollout_logp` is the sampled token's log-prob under the full softmax(logits / T) -- what the
    trainer's own forward (pi_old, pi_theta) gives -- on every kept token, not the renormalised
    truncated one (which would be higher by -log(mass kept): checked to be far off here)."""
    from rltune.train.update import forward_logp

    engine, prompts = setup
    torch.manual_seed(0)
    exp = engine.generate(prompts, Sampling(n=4, temperature=temperature, top_p=0.9, top_k=20, max_new_tokens=12))
    kept = exp.response_mask.bool()
    trainer = forward_logp(engine.model, exp, temperature, 16)
    torch.testing.assert_close(exp.rollout_logp[kept], trainer[kept], rtol=0, atol=1e-4)
    with torch.no_grad():
        logits = engine.model(**exp.model_inputs()).logits[:, exp.prompt_width - 1:-1].float() / temperature
    top = logits.softmax(-1).topk(20, dim=-1).values
    kept_mass = torch.where(top.cumsum(-1) - top < 0.9, top, torch.zeros_like(top)).sum(-1)
    assert (kept_mass[kept] < 0.9).float().mean() > 0.5, "truncation kept (nearly) everything: the test lost its point"


def _left_padded(engine, prompts):
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), engine.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p)
        mask[i, P - len(p):] = 1
    return ids, mask


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 6, 0.9)])
def test_own_rng_draws_what_generates_sampling_draws(setup, temperature, top_k, top_p):
    """The engine's sampler (argmax of OwnRngSampling's output, its own generator) takes the same
    tokens as `generate`'s own sampling with the global RNG in the same state: same distribution,
    same draws; only the RNG is the engine's."""
    from rltune.rollout.hf import generation_config

    engine, prompts = setup
    s = Sampling(n=1, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=10)
    ids, mask = _left_padded(engine, prompts * 4)
    torch.manual_seed(11)
    with torch.no_grad():
        theirs = engine.model.generate(input_ids=ids, attention_mask=mask,
                                       generation_config=generation_config(s, sorted(engine.eos_ids), engine.pad_id))
    engine.seed(11)
    engine.share_prompts = False
    try:
        ours = engine.generate(prompts * 4, s)
    finally:
        engine.share_prompts = True
    assert torch.equal(ours.response_ids[:, :theirs.shape[1] - ids.shape[1]], theirs[:, ids.shape[1]:])
    _check(engine, ours, temperature)


def test_sampling_ignores_the_global_rng_that_another_thread_rewinds(setup):
    """Issue 44.1: gradient checkpointing replays torch's global RNG state in the trainer thread
    while the producer thread samples. The engine's draws come from its own generator: the same
    seed gives the same samples however often the global RNG is reset meanwhile."""
    import threading

    engine, prompts = setup
    s = Sampling(n=4, temperature=1.0, max_new_tokens=12)
    engine.seed(5)
    quiet = engine.generate(prompts, s)
    stop, saved = threading.Event(), torch.get_rng_state()

    def rewind():          # what torch.utils.checkpoint does around every recompute
        while not stop.is_set():
            torch.set_rng_state(saved)
            torch.rand(64)

    t = threading.Thread(target=rewind)
    t.start()
    try:
        engine.seed(5)
        noisy = engine.generate(prompts, s)
    finally:
        stop.set()
        t.join()
    assert torch.equal(quiet.response_ids, noisy.response_ids)
    engine.seed(6)
    assert not torch.equal(engine.generate(prompts, s).response_ids, quiet.response_ids)
