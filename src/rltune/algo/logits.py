"""Memory-bounded log-probabilities and entropies from LM logits.

Both functions flatten ``(B, T, V)`` logits to ``B*T`` rows and process them in
chunks of rows, upcasting one chunk at a time to float32. So at most one
``(chunk, V)`` float32 temporary (plus its softmax for the entropy) exists at a
time in the forward pass; a full ``(B, T, V)`` float32 log-softmax is never
built. (When gradients are required, autograd keeps each chunk's float32 copy
for the backward pass; for float32 input the upcast is free.)
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["entropy_from_logits", "logprobs_from_logits"]

#: Default budget of elements (rows * vocab) of one float32 chunk (~256 MiB).
_CHUNK_ELEMS = 1 << 26


def _rows_per_chunk(vocab: int, chunk_size: Optional[int]) -> int:
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        return int(chunk_size)
    return max(1, _CHUNK_ELEMS // max(vocab, 1))


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: Optional[int] = None
) -> torch.Tensor:
    """Log-probability of ``labels`` under ``softmax(logits)``.

    ``logp[b, t] = logits[b, t, labels[b, t]] - logsumexp(logits[b, t, :])``
    (the policy-gradient log-likelihood of Williams 1992, "Simple statistical
    gradient-following algorithms..."; memory-bounded gather formulation).

    Shapes: ``logits`` ``(B, T, V)`` float32/bfloat16/float16, ``labels``
    ``(B, T)`` long (valid token ids everywhere; replace ignore-indices such as
    -100 by any id and mask the result) -> ``(B, T)`` float32. Differentiable
    w.r.t. ``logits``. ``chunk_size`` = rows of ``B*T`` per chunk (default:
    about 2**26 / V).
    """
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits (B, T, V) and labels (B, T); got {tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    B, T, V = logits.shape
    flat = logits.reshape(B * T, V)  # (N, V)
    flat_labels = labels.reshape(B * T, 1).long()  # (N, 1)
    step = _rows_per_chunk(V, chunk_size)
    out = []
    for start in range(0, B * T, step):
        chunk = flat[start : start + step].float()  # (n, V) float32
        lse = torch.logsumexp(chunk, dim=-1)  # (n,)
        picked = chunk.gather(-1, flat_labels[start : start + step]).squeeze(-1)  # (n,)
        out.append(picked - lse)
    if not out:
        return logits.new_zeros(B, T, dtype=torch.float32)
    return torch.cat(out).view(B, T)


def entropy_from_logits(logits: torch.Tensor, chunk_size: Optional[int] = None) -> torch.Tensor:
    """Entropy of the categorical distribution ``softmax(logits)`` at every position.

    ``H = logsumexp(z) - sum_v softmax(z)_v * z_v`` (equal to
    ``-sum p log p``; the entropy bonus of Mnih et al. 2016, A3C,
    arXiv:1602.01783, selected by ``algorithm.entropy_coef``).

    Shapes: ``logits`` ``(B, T, V)`` float32/bfloat16/float16 -> ``(B, T)``
    float32. Differentiable w.r.t. ``logits``. ``chunk_size`` as in
    :func:`logprobs_from_logits`.
    """
    if logits.dim() != 3:
        raise ValueError(f"expected logits (B, T, V), got {tuple(logits.shape)}")
    B, T, V = logits.shape
    flat = logits.reshape(B * T, V)  # (N, V)
    step = _rows_per_chunk(V, chunk_size)
    out = []
    for start in range(0, B * T, step):
        chunk = flat[start : start + step].float()  # (n, V) float32
        lse = torch.logsumexp(chunk, dim=-1)  # (n,)
        probs = torch.softmax(chunk, dim=-1)  # (n, V)
        # -inf logits (banned tokens) have p = 0 and contribute 0 (avoid 0 * -inf = nan)
        finite = chunk.masked_fill(chunk == float("-inf"), 0.0)  # (n, V)
        out.append(lse - (probs * finite).sum(dim=-1))
    if not out:
        return logits.new_zeros(B, T, dtype=torch.float32)
    return torch.cat(out).view(B, T)
