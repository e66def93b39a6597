"""The log-prob pass without a (b, T, V) logits tensor: the output layer run chunk by chunk.

A causal LM's output layer (lm_head, `get_output_embeddings()`) maps every kept position's hidden
state (b, T, h) to logits (b, T, V) at once. The update's backward then holds those logits and
their gradient, each b x T x V: for a 150k-vocabulary model that is the largest single buffer of
an update (`rltune plan`'s "actor logits" item).

`logp_head(model, labels, temperature)` changes what the output layer returns for one model
call. Given the labels (b, L) of the L positions it sees, it returns (b, L, 2): each position's
log-probability of its label and its entropy, at `temperature`. It works through the b x L rows
in chunks of HEAD_CHUNK_ELEMS // V rows (2^24 values: 64 MiB in fp32, a quarter of algo/logits.py's
chunk, since a chunk's log-softmax and backward hold several float32 copies of it). A chunk's
logits exist only while that chunk is computed, and in backward they are computed again
(torch.utils.checkpoint): one more output-layer matmul per token. That is the price of never
holding them, so `worth_chunking` uses it only where a micro-batch's logits exceed one chunk.
Below that, the whole micro-batch is one chunk, and the plain pass is the same computation.

With the shared-prompt passes, response token 0 is predicted by the prompt pass: its logits, one
position per row (b, 1, V), are still made whole.

Exact: the same matmul and the same fused log-softmax, row by row; rows are independent.
Not used where the output layer's weight is partitioned (ZeRO-3): it is gathered by the layer's
own hooks, which a recompute in backward would bypass. There the plain pass runs.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import checkpoint

from ..algo.logits import token_logprobs_entropy
from ..plan import budget

# logits per chunk of the output layer (110 positions of a 151,936 vocabulary), and on CUDA
# CUDA_CHUNK_FACTOR times that: one definition, the plan's (plan/budget.py says why)
HEAD_CHUNK_ELEMS = budget.HEAD_CHUNK_ELEMS
CUDA_CHUNK_FACTOR = budget.CUDA_CHUNK_FACTOR


def chunk_elems(device_type: str) -> int:
    """Logits per chunk of the output layer on a device of `device_type` ("cpu", "cuda")."""
    return HEAD_CHUNK_ELEMS * (CUDA_CHUNK_FACTOR if device_type == "cuda" else 1)


def output_layer(model):
    """The output layer (an nn.Module with a (V, h) weight) of a causal LM or a wrapper around
    one (DeepSpeed engine, LoRA), or None where there is none to run in chunks."""
    m = getattr(model, "module", model)
    get = getattr(m, "get_output_embeddings", None)
    head = get() if callable(get) else None
    weight = getattr(head, "weight", None)
    if not isinstance(head, torch.nn.Module) or weight is None or weight.dim() != 2:
        return None
    if hasattr(weight, "ds_id"):   # ZeRO-3: partitioned, gathered by the module's hooks only
        return None
    return head


def chunk_rows(head) -> int:
    """Rows per chunk: one chunk holds at most `chunk_elems` logits on the layer's device."""
    return max(1, chunk_elems(head.weight.device.type) // head.weight.shape[0])


def worth_chunking(head, rows: int) -> bool:
    """Whether `rows` positions' logits are more than one chunk."""
    return head is not None and rows > chunk_rows(head)


@contextlib.contextmanager
def logp_head(model, labels: torch.Tensor, temperature: float):
    """For the model calls inside: the output layer takes hidden states (b, L, h) and returns
    (b, L, 2) float32 = [log p(labels), entropy] at `temperature`, with labels (b, L) long."""
    head = output_layer(model)
    plain = head.forward                            # the layer's own forward (LoRA's included)
    rows = chunk_rows(head)

    def one_chunk(x, y):                            # (n, h), (n,) -> (n, 2)
        logp, ent = token_logprobs_entropy(plain(x)[None], y[None], temperature, chunk_size=x.shape[0])  # (1, n)
        return torch.stack([logp[0], ent[0]], dim=-1)

    def forward(hidden):                            # (b, L, h) -> (b, L, 2)
        b, L, h = hidden.shape
        if labels.shape != (b, L):
            raise ValueError(f"logp_head: labels {tuple(labels.shape)} for hidden states {tuple(hidden.shape)}")
        flat, y = hidden.reshape(b * L, h), labels.reshape(b * L)
        recompute = torch.is_grad_enabled()
        out = [checkpoint(one_chunk, flat[s:s + rows], y[s:s + rows], use_reentrant=False) if recompute
               else one_chunk(flat[s:s + rows], y[s:s + rows]) for s in range(0, b * L, rows)]
        return torch.cat(out).view(b, L, 2)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward
