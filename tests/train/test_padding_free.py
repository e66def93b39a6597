"""Padding-free passes (train/packed.py, `train.padding_free`) equal the plain padded passes:
log-probs, entropies, values and gradients, with and without a group's prompt shared, through the
chunked output layer, with checkpointing; the layout and the token counts by hand."""

from __future__ import annotations

import pytest
import torch

from rltune.rollout.experience import Experience
from test_shared_prompt import (  # noqa: F401  (fixtures: lm, critic, one_thread)
    BATCHES, TEMPERATURE, _assert_grad_close, _batch, _grads, checkpointing, critic, lm, one_thread,
)


def _two_rows() -> Experience:
    """Prompt [5, 6] (left-padded to 3) twice; responses [7, 8] and [9] (right-padded to 2)."""
    return Experience(prompt_ids=torch.tensor([[0, 5, 6], [0, 5, 6]]), prompt_mask=torch.tensor([[0, 1, 1], [0, 1, 1]]),
                      response_ids=torch.tensor([[7, 8], [9, 0]]), response_mask=torch.tensor([[1., 1.], [1., 0.]]))


def test_layout_by_hand_shared():
    from rltune.train.packed import layout

    p = layout(_two_rows(), share=True)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 2]]          # row 1's response follows its own prompt
    assert p.row.tolist() == [-1, -1, 0, 0, 1]
    assert p.keep.tolist() == [1, 2, 1]                          # prompt's last token predicts both first tokens
    assert p.labels.tolist() == [[7, 8, 9]]
    assert (p.out_row.tolist(), p.out_col.tolist()) == ([0, 0, 1], [0, 1, 0])
    allowed = p.attention_mask("sdpa", torch.float32)[0, 0].int().tolist()
    assert allowed == [[1, 0, 0, 0, 0],
                       [1, 1, 0, 0, 0],
                       [1, 1, 1, 0, 0],
                       [1, 1, 1, 1, 0],
                       [1, 1, 0, 0, 1]]                          # row 1 sees the prompt, not row 0
    eager = p.attention_mask("eager", torch.bfloat16)
    assert eager.dtype == torch.bfloat16 and torch.equal(eager[0, 0] == 0, torch.tensor(allowed).bool())


def test_layout_by_hand_unshared():
    from rltune.train.packed import layout

    p = layout(_two_rows(), share=False)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 5, 6, 9]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2]]
    assert p.keep.tolist() == [1, 2, 5]
    allowed = p.attention_mask("sdpa", torch.float32)[0, 0].int()
    assert allowed[4:, :4].sum() == 0 and allowed[4:, 4:].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_layout_declines_what_it_cannot_lay_out():
    """A prompt with a hole, a response with a hole, an empty prompt, no response token at all
    (a micro-batch of rows masked out whole): None (the plain pass runs)."""
    from rltune.train.packed import layout

    holes = {"prompt": ("prompt_mask", torch.tensor([[1, 0, 1], [0, 1, 1]])),
             "response": ("response_mask", torch.tensor([[0., 1.], [1., 0.]])),
             "empty prompt": ("prompt_mask", torch.tensor([[0, 0, 0], [0, 1, 1]])),
             "no response token": ("response_mask", torch.zeros(2, 2))}
    for name, (field, value) in holes.items():
        mb = _two_rows()
        setattr(mb, field, value)
        assert layout(mb, share=True) is None, name


def _plain_and_packed(model, mb, share, grads=False):
    from rltune.train.update import response_logp_entropy

    out = []
    for packed in (False, True):
        logp, ent = response_logp_entropy(model, mb, TEMPERATURE, shared=share and packed, packed=packed)
        mask = mb.response_mask
        loss = (logp * mb.advantages * mask).sum() + 0.1 * (ent * mask).sum()
        out.append((logp * mask, ent * mask, _grads(model, loss) if grads else None))
    return out


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_logp_and_entropy_equal_the_plain_pass(lm, batch, share):
    from rltune.train.packed import layout, packed_reason

    assert packed_reason(lm) is None
    mb = BATCHES[batch]()
    lay = layout(mb, share)
    assert lay is not None and lay.length <= int(mb.prompt_mask.sum() + mb.response_mask.sum())
    with torch.no_grad():
        (plain_lp, plain_ent, _), (lp, ent, _) = _plain_and_packed(lm, mb, share)
    assert lp.shape == plain_lp.shape and lp.dtype == torch.float32
    torch.testing.assert_close(lp, plain_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, plain_ent, rtol=0, atol=1e-5)


@pytest.mark.parametrize("share", [False, True])
def test_gradients_equal_the_plain_pass(lm, share):
    mb = _batch(3)
    (_, _, plain), (_, _, packed) = _plain_and_packed(lm, mb, share, grads=True)
    assert any(g is not None and g.abs().sum() > 0 for g in plain)
    for a, b in zip(plain, packed):
        assert (a is None) == (b is None)
        if a is not None:
            _assert_grad_close(b, a)


def test_shared_prompt_counts_once():
    """Groups of 4 share one prompt copy: the packed sequence is shorter by 3 prompts a group."""
    from rltune.train.packed import layout

    mb = _batch()
    alone, shared = layout(mb, False), layout(mb, True)
    assert alone.length - shared.length == 3 * (3 + 5 + 6)      # prompt_lengths (3, 5, 6), groups of 4


def test_chunked_output_layer_equals_the_plain_pass(lm, monkeypatch):
    """Output-layer chunks of 3 positions: the same log-probs, entropies and gradients."""
    from rltune.train import chunked_head

    monkeypatch.setattr(chunked_head, "HEAD_CHUNK_ELEMS", 3 * lm.config.vocab_size)
    assert chunked_head.chunk_rows(chunked_head.output_layer(lm)) == 3
    mb = _batch(4)
    (plain_lp, plain_ent, plain), (lp, ent, packed) = _plain_and_packed(lm, mb, True, grads=True)
    torch.testing.assert_close(lp, plain_lp, rtol=0, atol=1e-5)
    torch.testing.assert_close(ent, plain_ent, rtol=0, atol=1e-5)
    for a, b in zip(plain, packed):
        if a is not None:
            _assert_grad_close(b, a)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_checkpointing_equals_the_plain_pass(lm, mode):
    """Recomputing each layer in backward (full or selective) leaves the packed pass's gradients
    equal to the plain pass without recompute."""
    mb = _batch(5)
    (_, _, plain), _ = _plain_and_packed(lm, mb, True, grads=True)
    with checkpointing(lm, mode):
        _, (_, _, packed) = _plain_and_packed(lm, mb, True, grads=True)
    for a, b in zip(plain, packed):
        if a is not None:
            _assert_grad_close(b, a)


@pytest.mark.parametrize("share", [False, True])
def test_values_and_their_gradients_equal_the_plain_pass(critic, share):
    from rltune.train.update import response_values

    mb = _batch(6)
    out = []
    for packed in (False, True):
        v = response_values(critic, mb, shared=share and packed, packed=packed) * mb.response_mask
        out.append((v, _grads(critic, (v * mb.advantages).sum())))
    (plain_v, plain_g), (v, g) = out
    torch.testing.assert_close(v, plain_v, rtol=0, atol=1e-5)
    for a, b in zip(plain_g, g):
        if a is not None:
            _assert_grad_close(b, a)


def test_eager_attention_equals_the_plain_pass():
    """Eager attention gets the additive mask."""
    from rltune.models.loading import load_causal_lm

    model = load_causal_lm("builtin:tiny-llama", "fp32", "eager")
    assert model.config._attn_implementation == "eager"
    mb = _batch(7)
    with torch.no_grad():
        (plain_lp, _, _), (lp, _, _) = _plain_and_packed(model, mb, True)
    torch.testing.assert_close(lp, plain_lp, rtol=0, atol=1e-5)


def test_packed_reason_names_what_is_not_supported():
    from transformers import AutoConfig, AutoModelForCausalLM

    from rltune.train.packed import packed_reason

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1)
    window = AutoModelForCausalLM.from_config(AutoConfig.for_model("mistral", sliding_window=4, **small))
    assert "sliding-window" in packed_reason(window)
    gpt2 = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt2", n_embd=32, n_layer=1, n_head=2, vocab_size=64))
    assert "not verified" in packed_reason(gpt2)
    llama = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **small))
    llama.config._attn_implementation = "flash_attention_2"
    assert "varlen" in packed_reason(llama)


def test_token_counts_by_hand():
    """Rows with prompts [3, 3, 3, 3] and responses [2, 5, 1, 1] in groups of 2."""
    from rltune.train.batching import pack, tokens

    prompt, response = [3, 3, 3, 3], [2, 5, 1, 1]
    assert tokens(prompt, response, 0, 2, 2, "padded") == 2 * (3 + 5)
    assert tokens(prompt, response, 0, 2, 2, "packed") == 3 + 3 + 2 + 5
    assert tokens(prompt, response, 0, 2, 2, "packed-shared") == 3 + 2 + 5
    assert tokens(prompt, response, 1, 4, 2, "packed-shared") == 3 + 5 + 3 + 1 + 1   # two groups touched
    # budget 12: padded, each group alone (16 > 12: group 0 row by row); packed-shared, 10 + 5 > 12
    assert pack(prompt, response, 2, 12, "padded") == [0, 1, 2, 4]
    assert pack(prompt, response, 2, 12, "packed-shared") == [0, 2, 4]
    assert pack(prompt, response, 2, 15, "packed-shared") == [0, 4]
    assert pack(prompt, response, 2, 15, "packed") == [0, 2, 4]                       # 13 + 8 > 15


_MASK_PEAK = r'''
import json, resource, sys, torch
from rltune.train.packed import Packed
L, attn = int(sys.argv[1]), sys.argv[2]
seg = torch.arange(L) // (L // 4)                          # 4 prompts, each with its rows
row = torch.where(torch.arange(L) % 7 == 0, -1, torch.arange(L) // 50)
p = Packed(torch.zeros(1, L, dtype=torch.long), torch.zeros(1, L, dtype=torch.long), seg, row,
           torch.zeros(1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
           torch.zeros(1, dtype=torch.long))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
mask = p.attention_mask(attn, torch.bfloat16)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak": (after - before) * 1024, "kept": mask.numel() * mask.element_size()}))
'''


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_dense_masks_peak_is_what_the_plan_counts(attn):
    """Issue 45.11: building the padding-free mask held four to five (L, L) bool terms at once,
    ~4x the one mask the plan counted. Built in place, the peak (the process's high-water RSS
    grown while it is built, L = 6000) stays within the plan's count: the mask and one temporary."""
    import json
    import subprocess
    import sys

    from rltune.plan.estimate import packed_mask_bytes
    from trainlib import cli_env

    L = 6000
    out = subprocess.run([sys.executable, "-c", _MASK_PEAK, str(L), attn], capture_output=True, text=True,
                         env=cli_env(OMP_NUM_THREADS="1"), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    planned = packed_mask_bytes(rows=1, micro=2, length=L, attn=attn, dtype_bytes=2)
    assert got["kept"] == L * L * (1 if attn == "sdpa" else 2)
    assert got["peak"] <= 1.1 * planned, (got, planned)
