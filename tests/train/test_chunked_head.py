"""The chunked log-prob pass (train/chunked_head.py): the same log-probs, entropies and gradients
as the pass over whole (b, T, V) logits, plain and shared-prompt, with and without selective
checkpointing, and no tensor of a micro-batch's whole logits is ever made."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from test_shared_prompt import TEMPERATURE, _assert_grad_close, _batch, _grads, one_thread  # noqa: F401 (autouse)

ROWS = 5   # rows per chunk in these tests: 12 rows x 7 positions -> 17 chunks


class _Largest(TorchDispatchMode):
    """The most rows of logits (a last dimension of `vocab`) any op returns, forward and backward."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.vocab, self.numel = weight.shape[0], 0
        self.transposed = tuple(weight.shape[::-1])     # (h, V): the output layer's weight, not logits

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab \
                    and tuple(t.shape) != self.transposed:
                self.numel = max(self.numel, t.numel() // self.vocab)
        return out


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen2"])
def lm(request):
    from rltune.models.loading import load_causal_lm

    torch.manual_seed(0)
    return load_causal_lm(f"builtin:{request.param}", "fp32", "sdpa").train()


def _small_chunks(monkeypatch, lm):
    """Chunks of ROWS positions of `lm`'s vocabulary."""
    from rltune.train import chunked_head

    monkeypatch.setattr(chunked_head, "HEAD_CHUNK_ELEMS", ROWS * lm.get_output_embeddings().weight.shape[0])


def _pass(lm, mb, shared):
    from rltune.train.update import response_logp_entropy

    logp, ent = response_logp_entropy(lm, mb, TEMPERATURE, shared)
    mask = mb.response_mask
    loss = ((logp * mb.advantages + 0.1 * ent) * mask).sum()
    return logp * mask, ent * mask, _grads(lm, loss)


@pytest.mark.parametrize("shared", [False, True])
def test_chunked_equals_whole_logits(lm, monkeypatch, shared):
    from rltune.train import chunked_head, shared_prompt

    monkeypatch.setattr(shared_prompt, "pays_off", lambda model, mb: True)
    mb = _batch(3)
    weight = lm.get_output_embeddings().weight
    with _Largest(weight) as largest:
        whole = _pass(lm, mb, shared)
    assert largest.numel >= mb.size * (mb.response_width - 1)    # the plain pass: whole logits
    _small_chunks(monkeypatch, lm)
    assert chunked_head.worth_chunking(chunked_head.output_layer(lm), mb.size * (mb.response_width + 1))
    with _Largest(weight) as largest:
        chunked = _pass(lm, mb, shared)
    # logits of one chunk at most, forward and backward; the shared pass also has its prompt pass's
    # logits of response token 0, one position per row (b x V)
    assert largest.numel <= (mb.size if shared else ROWS)
    torch.testing.assert_close(chunked[0], whole[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked[1], whole[1], rtol=0, atol=1e-5)
    for a, b in zip(whole[2], chunked[2]):
        assert (a is None) == (b is None)
        if a is not None:
            _assert_grad_close(b, a)
    assert not hasattr(lm.get_output_embeddings(), "forward") or \
        "forward" not in vars(lm.get_output_embeddings())          # the layer's own forward is back


def test_chunked_with_selective_checkpointing(lm, monkeypatch):
    from rltune.models.checkpointing import _layers, enable_checkpointing
    from rltune.train import shared_prompt

    monkeypatch.setattr(shared_prompt, "pays_off", lambda model, mb: True)
    mb = _batch(5)
    whole = _pass(lm, mb, True)
    _small_chunks(monkeypatch, lm)
    enable_checkpointing(lm, "selective")
    try:
        chunked = _pass(lm, mb, True)
    finally:
        lm.gradient_checkpointing_disable()
        for layer in _layers(lm):
            layer._can_checkpoint_with_cache = False
    torch.testing.assert_close(chunked[0], whole[0], rtol=0, atol=1e-5)
    for a, b in zip(whole[2], chunked[2]):
        if a is not None:
            _assert_grad_close(b, a)


def test_no_grad_pass_matches(lm, monkeypatch):
    """The reference / behaviour passes (no autograd, no recompute) give the same log-probs."""
    from rltune.train.update import forward_logp

    mb = _batch(6)
    whole = forward_logp(lm, mb, TEMPERATURE, micro=4, group=4, shared=True)
    _small_chunks(monkeypatch, lm)
    torch.testing.assert_close(forward_logp(lm, mb, TEMPERATURE, micro=4, group=4, shared=True), whole,
                               rtol=0, atol=1e-5)


def test_the_plan_counts_the_chunks_the_pass_makes():
    """The pass and the plan (plan/budget.py, no torch) size the chunks alike on each device."""
    from rltune.plan import budget
    from rltune.train import chunked_head

    for device in ("cpu", "cuda"):
        assert budget.head_chunk_elems(device) == chunked_head.chunk_elems(device)
    assert chunked_head.chunk_elems("cuda") == 2 * chunked_head.chunk_elems("cpu") == 1 << 25
