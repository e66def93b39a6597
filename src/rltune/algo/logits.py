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

__all__ = ["entropy_from_logits", "logprobs_from_logits", "token_logprobs_entropy"]

#: Default budget of elements (rows * vocab) of one float32 chunk (~256 MiB).
CHUNK_ELEMS = 1 << 26


def _rows_per_chunk(vocab: int, chunk_size: Optional[int]) -> int:
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        return int(chunk_size)
    return max(1, CHUNK_ELEMS // max(vocab, 1))


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


class _LogProbEntropy(torch.autograd.Function):
    """Fused, chunked ``log softmax(z / temp)[label]`` and entropy of ``softmax(z / temp)``.

    Forward keeps only the per-row logsumexp and entropy (no float32 copy of the logits, no
    softmax); backward recomputes one chunk's softmax at a time:
    ``d logp / dz = (onehot - p) / temp`` and ``d H / dz = -p (log p + H) / temp``.
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature, rows):                # (N, V), (N,)
        N = logits.shape[0]
        logp = torch.empty(N, dtype=torch.float32, device=logits.device)   # (N,)
        ent = torch.empty_like(logp)                                       # (N,)
        lse = torch.empty_like(logp)                                       # (N,)
        for s in range(0, N, rows):
            z = logits[s:s + rows].float() / temperature                   # (n, V)
            lse[s:s + rows] = torch.logsumexp(z, dim=-1)
            logp_all = z - lse[s:s + rows, None]                           # (n, V) log p
            logp[s:s + rows] = logp_all.gather(-1, labels[s:s + rows, None]).squeeze(-1)
            p = logp_all.exp()
            # -inf logits (banned tokens) have p = 0 and contribute 0 (avoid 0 * -inf = nan)
            ent[s:s + rows] = -(p * logp_all.masked_fill(p == 0, 0.0)).sum(dim=-1)
        ctx.save_for_backward(logits, labels, lse, ent)
        ctx.temperature, ctx.rows = temperature, rows
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):                                   # (N,), (N,)
        logits, labels, lse, ent = ctx.saved_tensors
        temp, rows = ctx.temperature, ctx.rows
        grad = torch.empty_like(logits)                                    # (N, V)
        for s in range(0, logits.shape[0], rows):
            logp_all = logits[s:s + rows].float() / temp - lse[s:s + rows, None]   # (n, V)
            p = logp_all.exp()
            g = torch.zeros_like(p)
            if g_logp is not None:
                gl = g_logp[s:s + rows, None]                              # (n, 1)
                g -= p * gl
                g.scatter_add_(-1, labels[s:s + rows, None], gl)
            if g_ent is not None:
                h = (logp_all + ent[s:s + rows, None]).masked_fill(p == 0, 0.0)
                g -= p * h * g_ent[s:s + rows, None]
            grad[s:s + rows] = (g / temp).to(grad.dtype)
        return grad, None, None, None


def token_logprobs_entropy(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, chunk_size: Optional[int] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of ``labels`` and entropies under ``softmax(logits / temperature)``,
    in one pass and without a float32 copy of the logits kept for backward.

    Same values as ``logprobs_from_logits(logits / temperature, labels)`` and
    ``entropy_from_logits(logits / temperature)``; differentiable w.r.t. ``logits`` through
    both outputs (a fused backward that recomputes one chunk's softmax at a time).

    Shapes: ``logits`` ``(B, T, V)`` float32/bfloat16/float16, ``labels`` ``(B, T)`` long
    -> ``(B, T)`` float32, ``(B, T)`` float32.
    """
    if logits.dim() != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits (B, T, V) and labels (B, T); got {tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    B, T, V = logits.shape
    if B * T == 0:
        z = logits.new_zeros(B, T, dtype=torch.float32)
        return z, z.clone()
    rows = _rows_per_chunk(V, chunk_size)
    logp, ent = _LogProbEntropy.apply(logits.reshape(B * T, V), labels.reshape(B * T).long(),
                                      float(temperature), rows)
    return logp.view(B, T), ent.view(B, T)
