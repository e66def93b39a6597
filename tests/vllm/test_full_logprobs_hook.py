"""The sampler hook that makes vLLM report the sampled token's log-prob under the full,
temperature-scaled distribution (before top-k/top-p), on stand-ins for vLLM 0.32's two sampler
layouts (no vLLM import; the real engine is covered in test_vllm_engine.py and test_vllm_train.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rltune.rollout.base import Sampling
from rltune.rollout.vllm import VLLMRollout, _report_full_distribution


def _top_k_in_place(logits, k):
    kth = logits.topk(k, dim=-1).values[:, -1:]
    return logits.masked_fill_(logits < kth, float("-inf"))


class _V1TopKTopP(torch.nn.Module):
    """vLLM's TopKTopPSampler: truncates the logits in place, returns (ids, processed log-probs)."""

    def __init__(self):
        super().__init__()
        self.forward = self._forward      # vLLM binds the backend's method per instance

    def _forward(self, logits, generators, k, p):
        logits = _top_k_in_place(logits, k)
        return logits.argmax(-1), logits.log_softmax(-1)


class _V2Sampler:
    return_sampling_mask = False

    def _sample_random(self, processed_logits, idx, top_k, top_p, fused):
        processed_logits = _top_k_in_place(processed_logits, top_k)
        return processed_logits.argmax(-1), processed_logits


def test_v1_layout_reports_the_untruncated_log_softmax():
    sampler = SimpleNamespace(topk_topp_sampler=_V1TopKTopP())
    worker = SimpleNamespace(model_runner=SimpleNamespace(sampler=sampler))
    logits = torch.randn(3, 50) / 0.7                     # what the sampler gets: logits / T
    want = logits.log_softmax(-1)
    assert _report_full_distribution(worker) is True
    assert _report_full_distribution(worker) is True      # idempotent: not wrapped twice
    ids, logp = sampler.topk_topp_sampler(logits.clone(), {}, 5, None)
    assert torch.equal(ids, want.argmax(-1))
    torch.testing.assert_close(logp, want)
    _, truncated = _V1TopKTopP()(logits.clone(), {}, 5, None)   # what vLLM reports unhooked
    assert (truncated.gather(-1, ids[:, None]) - want.gather(-1, ids[:, None]) > 0.1).all()


def test_v2_layout_reports_the_untruncated_logits():
    sampler = _V2Sampler()
    worker = SimpleNamespace(model_runner=SimpleNamespace(sampler=sampler))
    logits = torch.randn(3, 50)
    assert _report_full_distribution(worker) is True
    ids, out = sampler._sample_random(logits.clone(), None, 5, None, False)
    assert torch.equal(ids, logits.argmax(-1))
    assert torch.equal(out, logits)                       # its log-softmax is what vLLM gathers


def test_unknown_layouts_say_why():
    assert "no model_runner.sampler" in _report_full_distribution(SimpleNamespace())
    odd = SimpleNamespace(model_runner=SimpleNamespace(sampler=object()))
    assert "unknown vLLM sampler layout" in _report_full_distribution(odd)
    v2 = _V2Sampler()
    v2.return_sampling_mask = True
    assert "return_sampling_mask" in _report_full_distribution(SimpleNamespace(model_runner=SimpleNamespace(sampler=v2)))


def test_truncated_sampling_without_the_hook_is_an_error():
    """Never the truncated distribution's log-probs silently: an engine whose workers could not
    be hooked refuses top-p / top-k sampling (untruncated and greedy sampling are unaffected)."""
    eng = VLLMRollout.__new__(VLLMRollout)
    eng.asleep, eng.full_logprobs, eng.full_logprobs_why = False, False, "unknown vLLM sampler layout (X)"
    eng.sleep_enabled = False
    for s in (Sampling(top_p=0.9), Sampling(top_k=20)):
        with pytest.raises(RuntimeError, match="rollout.top_p: 1 and rollout.top_k: 0"):
            eng.generate([[1, 2]], s)


class _V2Sampler026:
    """vLLM 0.26's V2 sampler: `sample` applies temperature (and penalties) through
    `apply_sampling_params(..., skip_top_k_top_p=True)`, then truncates; returns the truncated logits."""
    return_sampling_mask = False

    def apply_sampling_params(self, logits, temperature, skip_top_k_top_p=False):
        return logits.div_(temperature)

    def sample(self, logits, temperature, top_k):
        processed = self.apply_sampling_params(logits, temperature, skip_top_k_top_p=True)
        processed = _top_k_in_place(processed, top_k)
        return processed.argmax(-1), processed


def test_v2_layout_of_vllm_026_reports_the_temperature_scaled_logits_before_truncation():
    sampler = _V2Sampler026()
    worker = SimpleNamespace(model_runner=SimpleNamespace(sampler=sampler))
    logits = torch.randn(3, 50)
    want = logits / 0.7
    _, unhooked = _V2Sampler026().sample(logits.clone(), 0.7, 5)
    assert torch.isinf(unhooked).any()                    # what vLLM reports unhooked: truncated
    assert _report_full_distribution(worker) is True
    assert _report_full_distribution(worker) is True      # idempotent
    ids, out = sampler.sample(logits.clone(), 0.7, 5)
    assert torch.equal(ids, want.argmax(-1))
    torch.testing.assert_close(out, want)                 # every token kept, temperature applied
