"""Padding-free passes (`train.padding_free`): a micro-batch's rows concatenated into one sequence.

The plain passes compute a (b, P + T) rectangle: every row padded to the micro-batch's longest
prompt and longest response. With a few long responses (a long tail) most of that rectangle is
padding, and the token budget (`train.max_tokens_per_micro_batch`) has to count it. Here the
rows' real tokens are laid end to end in one (1, L) sequence, L = the tokens the rows really
have, and an attention mask keeps each row's attention within the row:

    [prompt A | response A1 | response A2 | prompt B | response B1]
      A1 attends prompt A and A1; A2 attends prompt A and A2; B1 attends prompt B and B1.

Rows with the same prompt (a GRPO group, `train.share_prompts`) share one copy of it: their
responses all attend to it, as in the shared-prompt passes (`shared_prompt.py`), but in one
model call and with nothing padded. Each token gets the position the plain pass gives it
(`Experience.model_inputs`: its count of real tokens before it), so rotary embeddings see the
same positions.

Why it is exact: each response token attends to exactly the keys it attends to in the plain
pass (its prompt's real tokens and its own response's earlier tokens; padding is masked there)
at the same positions, so its hidden states are the same up to float rounding. The output layer
runs only at the positions that predict a response token (`logits_to_keep` as an index: the
prompt's last token for response token 0, response token j - 1 for token j), and the results go
back to their (row, column) of the (b, T) outputs; padding columns get 0, as every consumer
masks them.

The mask is dense, (1, 1, L, L): bool for SDPA, additive in the model's dtype for eager
attention. That is L^2 bytes (bool) beside the activations, 0.3 MB at L = 544 and 256 MB at
L = 16,384; a varlen kernel (flash-attention's cu_seqlens) would need none, and is not used here
(`packed_reason`). The layout needs prompts left-padded and responses right-padded with no
holes, which the rollout engines produce; `layout` returns None otherwise and the plain pass
runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..algo.logits import token_logprobs_entropy
from ..rollout.experience import Experience
from . import chunked_head
from .shared_prompt import architecture_reason, tied_head_call, transformer

PACKED_ATTENTION = ("sdpa", "eager")   # the implementations that take a dense 4D mask as given


def packed_reason(model) -> str | None:
    """None when the padding-free passes are exact for `model` (a causal LM, a ValueModel or a
    DeepSpeed engine around either), else a one-line reason why the plain passes run."""
    reason = architecture_reason(model, "padding-free passes")
    if reason:
        return reason
    attn = getattr(transformer(model).config, "_attn_implementation", None)
    if attn not in PACKED_ATTENTION:
        return (f"attention implementation {attn!r} takes no dense mask ({', '.join(PACKED_ATTENTION)}; "
                "a varlen flash-attention path is not built)")
    return None


@dataclass
class Packed:
    """One micro-batch laid out padding-free. L = its packed length, N = its response tokens."""
    input_ids: torch.Tensor      # (1, L) long
    position_ids: torch.Tensor   # (1, L) long: each token's position in its own row
    segment: torch.Tensor        # (L,) long: which packed prompt (row group) the token belongs to
    row: torch.Tensor            # (L,) long: the token's row, -1 for a prompt token (shared by its group)
    keep: torch.Tensor           # (N,) long: the position whose output predicts each response token
    labels: torch.Tensor         # (1, N) long: the response tokens
    out_row: torch.Tensor        # (N,) long: each response token's row in the micro-batch
    out_col: torch.Tensor        # (N,) long: and its column

    @property
    def length(self) -> int:
        return self.input_ids.shape[1]

    def attention_mask(self, attn: str, dtype: torch.dtype) -> torch.Tensor:
        """(1, 1, L, L): query q sees key k where k <= q, both in one segment, and k is a prompt
        token or in q's row. Bool (True = attend) for SDPA, 0 / dtype's min for eager."""
        seg, row = self.segment, self.row
        # built in place: at most the mask and one (L, L) bool temporary are alive at once (the
        # plan counts that peak: plan/estimate.py packed_mask_bytes); an expression of (L, L)
        # terms held four to five of them
        allowed = row[:, None] == row[None, :]                                                  # (L, L)
        allowed |= (row < 0)[None, :]
        allowed &= seg[:, None] == seg[None, :]
        allowed = allowed.tril_()[None, None]                                                   # (1, 1, L, L)
        if attn == "sdpa":
            return allowed
        additive = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=seg.device)
        return additive.masked_fill_(allowed, 0.0)


def layout(mb: Experience, share: bool) -> Packed | None:
    """`mb` padding-free (see the module docstring); rows with the same real prompt tokens share one
    copy of them when `share`. None where a row's prompt is empty, no row has a response token (the
    outputs would be constants: no graph for backward) or a mask is not left-padded (prompt) /
    right-padded (response): the plain pass runs there."""
    pm, rm = mb.prompt_mask.bool().cpu(), mb.response_mask.bool().cpu()                    # (b, P), (b, T)
    b, P = pm.shape
    T = rm.shape[1]
    p_len, r_len = pm.sum(-1), rm.sum(-1)                                                  # (b,), (b,)
    left = torch.arange(P)[None, :] >= (P - p_len)[:, None]                                # (b, P)
    right = torch.arange(T)[None, :] < r_len[:, None]                                      # (b, T)
    if bool((p_len == 0).any()) or not bool(r_len.any()) or not torch.equal(pm, left) or not torch.equal(rm, right):
        return None
    p_ids, r_ids = mb.prompt_ids.cpu().tolist(), mb.response_ids.cpu().tolist()
    p_len, r_len = p_len.tolist(), r_len.tolist()
    ids: list[int] = []
    pos: list[int] = []
    seg: list[int] = []
    row: list[int] = []
    keep: list[int] = []
    labels: list[int] = []
    out_row: list[int] = []
    out_col: list[int] = []
    prompts: dict = {}                     # prompt key -> (segment, position of its last token, length)
    for i in range(b):
        prompt = p_ids[i][P - p_len[i]:]
        key = tuple(prompt) if share else i
        if key not in prompts:
            prompts[key] = (len(prompts), len(ids) + len(prompt) - 1, len(prompt))
            ids += prompt
            pos += range(len(prompt))
            seg += [prompts[key][0]] * len(prompt)
            row += [-1] * len(prompt)
        s, last, n_p = prompts[key]
        n_r, start = r_len[i], len(ids)
        ids += r_ids[i][:n_r]
        pos += range(n_p, n_p + n_r)
        seg += [s] * n_r
        row += [i] * n_r
        keep += [last] + list(range(start, start + n_r - 1)) if n_r else []
        labels += r_ids[i][:n_r]
        out_row += [i] * n_r
        out_col += range(n_r)
    device = mb.response_ids.device

    def t(x):
        return torch.tensor(x, dtype=torch.long).to(device)

    return Packed(input_ids=t(ids)[None], position_ids=t(pos)[None], segment=t(seg), row=t(row),
                  keep=t(keep), labels=t(labels)[None], out_row=t(out_row), out_col=t(out_col))


def _unpack(packed: Packed, values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(N,) per-response-token values put at their (row, column) of a (b, T) float32 zero tensor."""
    out = torch.zeros(like.shape, dtype=torch.float32, device=values.device)
    return out.index_put((packed.out_row, packed.out_col), values.float())


def _inputs(model, packed: Packed) -> dict:
    m = transformer(model)
    dtype = next(m.parameters()).dtype
    return {"input_ids": packed.input_ids, "position_ids": packed.position_ids,
            "attention_mask": packed.attention_mask(m.config._attn_implementation, dtype)}


def logp_entropy(model, mb: Experience, packed: Packed, temperature: float):
    """(b, T) log-probs of the response tokens and (b, T) entropies at `temperature`, float32,
    from one padding-free call; the output layer in chunks where the N kept positions' logits
    exceed one (`chunked_head`)."""
    inputs = _inputs(model, packed)
    head = chunked_head.output_layer(model)
    n = packed.keep.numel()
    if chunked_head.worth_chunking(head, n):
        with chunked_head.logp_head(model, packed.labels, temperature):
            out = tied_head_call(model, **inputs, use_cache=False, logits_to_keep=packed.keep).logits  # (1, N, 2)
        logp, entropy = out[0, :, 0], out[0, :, 1]                                          # (N,), (N,)
    else:
        logits = tied_head_call(model, **inputs, use_cache=False, logits_to_keep=packed.keep).logits   # (1, N, V)
        logp, entropy = token_logprobs_entropy(logits, packed.labels, temperature)          # (1, N) each
        logp, entropy = logp[0], entropy[0]
    like = mb.response_ids
    return _unpack(packed, logp, like), _unpack(packed, entropy, like)


def values(critic, mb: Experience, packed: Packed) -> torch.Tensor:
    """(b, T) float32 critic values before each response token, from one padding-free call."""
    v = critic(**_inputs(critic, packed))[0]                                                # (L,)
    return _unpack(packed, v[packed.keep], mb.response_ids)
