"""Chunked log-probs and entropies against a naive log_softmax reference."""

import math

import pytest
import torch

from rltune.algo import entropy_from_logits, logprobs_from_logits
from rltune.algo import logits as logits_mod


def _naive(logits, labels):
    lsm = torch.log_softmax(logits.float(), dim=-1)
    logp = lsm.gather(-1, labels[..., None]).squeeze(-1)
    ent = -(lsm.exp() * lsm).sum(-1)
    return logp, ent


def test_by_hand():
    # V = 2, logits [0, ln 3]: p = [1/4, 3/4]
    # logp(label 1) = ln 0.75 ; entropy = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.562335
    # logits [0, 0]: logp = -ln 2, entropy = ln 2
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    labels = torch.tensor([[1, 0]])
    lp = logprobs_from_logits(logits, labels)
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.75), -math.log(2.0)]]))
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([[h, math.log(2.0)]]))


@pytest.mark.parametrize("chunk_size", [None, 1, 3, 7, 100])
def test_matches_naive_float32_with_grads(chunk_size):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 5, 11, generator=g) * 3).requires_grad_(True)
    labels = torch.randint(0, 11, (3, 5), generator=g)
    lp = logprobs_from_logits(logits, labels, chunk_size=chunk_size)
    ent = entropy_from_logits(logits, chunk_size=chunk_size)
    ref_lp, ref_ent = _naive(logits, labels)
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    w1, w2 = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    (gl,) = torch.autograd.grad((lp * w1).sum() + (ent * w2).sum(), logits)
    (gr,) = torch.autograd.grad((ref_lp * w1).sum() + (ref_ent * w2).sum(), logits)
    torch.testing.assert_close(gl, gr)


def test_bfloat16_computed_in_float32():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 4, 50, generator=g) * 4).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 50, (2, 4), generator=g)
    lp = logprobs_from_logits(logits, labels, chunk_size=3)
    ent = entropy_from_logits(logits, chunk_size=3)
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    # reference on the same (bf16-rounded) values upcast to float32: should agree to float32 precision
    ref_lp, ref_ent = _naive(logits.detach().float(), labels)
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    (lp.sum() + ent.sum()).backward()
    assert logits.grad.dtype == torch.bfloat16 and torch.isfinite(logits.grad.float()).all()


def test_neg_inf_logits_entropy_finite():
    logits = torch.tensor([[[0.0, 0.0, float("-inf")]]], requires_grad=True)
    ent = entropy_from_logits(logits)
    torch.testing.assert_close(ent, torch.tensor([[math.log(2.0)]]))
    ent.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_default_chunking_bounds_rows(monkeypatch):
    # shrink the element budget: 40 elements / V=10 -> 4 rows per chunk; results unchanged
    monkeypatch.setattr(logits_mod, "CHUNK_ELEMS", 40)
    calls = []
    real = torch.logsumexp

    def spy(x, dim):
        calls.append(x.shape[0])
        return real(x, dim=dim)

    monkeypatch.setattr(logits_mod.torch, "logsumexp", spy)
    logits = torch.randn(3, 3, 10)
    labels = torch.zeros(3, 3, dtype=torch.long)
    lp = logprobs_from_logits(logits, labels)
    monkeypatch.setattr(logits_mod.torch, "logsumexp", real)
    assert calls == [4, 4, 1]
    torch.testing.assert_close(lp, _naive(logits, labels)[0])


def test_shape_errors():
    with pytest.raises(ValueError):
        logprobs_from_logits(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError):
        entropy_from_logits(torch.zeros(2, 3))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_logprob_entropy_equals_reference_values_and_gradients(dtype, temperature):
    """token_logprobs_entropy == logprobs_from_logits / entropy_from_logits of logits / T, in
    values and in gradients through both outputs; a banned (-inf) token included; chunks of 5
    rows over 3 x 4 rows."""
    from rltune.algo import entropy_from_logits, logprobs_from_logits, token_logprobs_entropy

    g = torch.Generator().manual_seed(0)
    base = (torch.randn(3, 4, 13, generator=g) * 3).to(dtype)
    base[0, 1, 5] = float("-inf")
    labels = torch.randint(0, 13, (3, 4), generator=g)
    labels[0, 1] = 2
    a, b = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    x1 = base.clone().requires_grad_(True)
    x2 = base.clone().requires_grad_(True)
    lp1, en1 = token_logprobs_entropy(x1, labels, temperature, chunk_size=5)
    z = x2.float() / temperature
    lp2, en2 = logprobs_from_logits(z, labels), entropy_from_logits(z)
    assert lp1.dtype == en1.dtype == torch.float32
    torch.testing.assert_close(lp1, lp2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(en1, en2, atol=1e-5, rtol=1e-5)
    (lp1 * a + en1 * b).sum().backward()
    (lp2 * a + en2 * b).sum().backward()
    assert x1.grad.dtype == dtype and torch.isfinite(x1.grad.float()).all()
    assert float(x1.grad[0, 1, 5]) == 0.0                          # a banned token gets no gradient
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(x1.grad.float(), x2.grad.float(), atol=tol, rtol=tol)


def test_fused_logprob_entropy_hand_computed():
    """Two tokens, uniform logits over 4: logp = -log 4, H = log 4; logits (0, log 3) at
    temperature 1: p = (1/4, 3/4), logp(label 1) = log 3/4."""
    import math

    from rltune.algo import token_logprobs_entropy

    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), float("-inf"), float("-inf")]]])
    lp, en = token_logprobs_entropy(logits, torch.tensor([[0, 1]]))
    assert lp.tolist()[0] == pytest.approx([-math.log(4.0), math.log(0.75)], abs=1e-6)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert en.tolist()[0] == pytest.approx([math.log(4.0), h], abs=1e-6)
