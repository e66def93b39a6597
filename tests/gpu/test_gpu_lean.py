"""The memory paths (issue "Lean", docs/memory.md) on CUDA: the shared-prompt passes, selective
recompute, gradients added early and the chunked output layer give the plain pass's log-probs and
gradients with CUDA's attention kernels (fp32 without TF32: exact to float rounding; bf16: to bf16
rounding), and the chunked output layer lowers the measured CUDA peak, not only the plan's."""

from __future__ import annotations

import pytest
import torch

from gpulib import GPU
from test_shared_prompt import BATCHES, TEMPERATURE, _backward_grads, _batch, checkpointing, early_and_plain_grads

pytestmark = GPU


@pytest.fixture(autouse=True)
def no_tf32():
    """fp32 matmuls in fp32 (TF32 keeps 10 mantissa bits: no use for exactness checks)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _lm(name: str, precision: str = "fp32"):
    from rltune.models.loading import load_causal_lm

    lm = load_causal_lm(f"builtin:{name}", precision, "sdpa", "cuda").to("cuda")   # the device picks attention only
    assert next(lm.parameters()).device.type == "cuda"
    return lm


def _close(actual, expected, name, rtol=1e-3):
    """fp32 on CUDA: the kernels (SDPA's flash / memory-efficient paths, split-K matmuls) sum in
    other orders at other shapes, so rounding is looser than the CPU tests' 1e-4."""
    atol = max(1e-5, 1e-4 * float(expected.abs().max()))
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_shared_prompt_logits_equal_the_plain_pass_on_cuda(model, batch):
    """Each group's prompt once, its keys/values read by the responses (padding, one-token and
    unpadded batches: the masks CUDA's SDPA kernels see differ from the plain pass's)."""
    from rltune.train.shared_prompt import shared_prompt_reason, shared_response_logits
    from rltune.train.update import response_logits

    lm, mb = _lm(model), BATCHES[batch]().to("cuda")
    assert shared_prompt_reason(lm) is None
    with torch.no_grad():
        plain = response_logits(lm, mb, TEMPERATURE)
        shared = shared_response_logits(lm, mb, TEMPERATURE)
    assert shared.device.type == "cuda" and shared.shape == plain.shape
    torch.testing.assert_close(shared, plain, rtol=0, atol=1e-4)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("checkpointing", [False, "selective"])
def test_update_pass_gradients_equal_the_plain_pass_on_cuda(model, checkpointing):
    """The update's pass (shared prompt, gradients added to .grad early, with and without selective
    recompute) leaves the plain unshared pass's .grad, on top of an earlier micro-batch's sum; with
    selective, backward really recomputes both passes."""
    lm, mb = _lm(model), _batch(3).to("cuda")
    plain, early = early_and_plain_grads(lm, mb, checkpointing, [torch.randn_like(p) for p in lm.parameters()])
    for (name, _), a, b in zip(lm.named_parameters(), plain, early):
        _close(b, a, name)


@pytest.mark.parametrize("shared", [False, True], ids=["unshared", "shared-prompt"])
def test_tied_chunked_head_equals_the_plain_pass_on_cuda(monkeypatch, shared):
    """A tied output layer run in chunks of 5 positions, its gradient added early, with selective
    recompute: the log-probs, entropies and .grad of the plain pass over whole logits."""
    from rltune.train import chunked_head, shared_prompt
    from rltune.train.update import response_logp_entropy

    lm, mb = _lm("tiny-qwen2"), _batch(7).to("cuda")
    assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight
    monkeypatch.setattr(shared_prompt, "pays_off", lambda model, mb: True)

    def run():
        logp, ent = response_logp_entropy(lm, mb, TEMPERATURE, shared)
        loss = ((logp * mb.advantages + 0.1 * ent) * mb.response_mask).sum()
        return (logp * mb.response_mask).detach(), (ent * mb.response_mask).detach(), loss

    logp0, ent0, loss0 = run()
    plain = _backward_grads(lm, loss0)
    monkeypatch.setattr(chunked_head, "HEAD_CHUNK_ELEMS", 5 * lm.get_output_embeddings().weight.shape[0])
    assert chunked_head.worth_chunking(chunked_head.output_layer(lm), mb.size * (mb.response_width + 1))
    with checkpointing(lm, "selective"):
        with shared_prompt.into_grad():
            logp1, ent1, loss1 = run()
        early = _backward_grads(lm, loss1)
    torch.testing.assert_close(logp1, logp0, rtol=0, atol=1e-4)
    torch.testing.assert_close(ent1, ent0, rtol=0, atol=1e-4)
    for (name, _), a, b in zip(lm.named_parameters(), plain, early):
        _close(b, a, name)


def test_every_memory_path_at_once_in_bf16(monkeypatch):
    """bf16 (what GPU runs use): shared prompt + selective + early adds + chunked head against the
    plain pass: log-probs within bf16 rounding (mean |diff| < 0.02 nats), and the gradient the
    same direction (cosine > 0.99) and size (within 5%)."""
    from rltune.train import chunked_head, shared_prompt
    from rltune.train.update import response_logp_entropy

    lm, mb = _lm("tiny-qwen2", "bf16"), _batch(3).to("cuda")
    monkeypatch.setattr(shared_prompt, "pays_off", lambda model, mb: True)

    def run(shared):
        logp, _ = response_logp_entropy(lm, mb, TEMPERATURE, shared)
        return (logp * mb.response_mask).detach(), ((logp * mb.advantages) * mb.response_mask).sum()

    logp0, loss0 = run(False)
    plain = torch.cat([g.float().flatten() for g in _backward_grads(lm, loss0)])
    monkeypatch.setattr(chunked_head, "HEAD_CHUNK_ELEMS", 5 * lm.get_output_embeddings().weight.shape[0])
    with checkpointing(lm, "selective"):
        with shared_prompt.into_grad():
            logp1, loss1 = run(True)
        lean = torch.cat([g.float().flatten() for g in _backward_grads(lm, loss1)])
    keep = mb.response_mask.bool()
    diff = (logp1[keep].float() - logp0[keep].float()).abs().mean()
    assert float(diff) < 0.02, f"mean |log-prob diff| {float(diff):.4f} nats"
    cos = float(torch.nn.functional.cosine_similarity(lean, plain, dim=0))
    assert cos > 0.99, cos
    assert abs(float(lean.norm()) / float(plain.norm()) - 1) < 0.05


def test_chunked_head_lowers_the_measured_cuda_peak(monkeypatch):
    """A 151,936-token vocabulary (Qwen2's) on a one-layer model, 4 rows x 257 positions in fp32
    (on an H200 with 110-position chunks: whole 2,795 MiB, chunked 556 MiB):
    the log-prob pass's peak CUDA memory (torch.cuda.max_memory_allocated above its start, forward
    and backward) with the chunked output layer is under half the whole-logits pass's, and the
    log-probs and output-layer gradient are the same."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rltune.rollout.experience import Experience
    from rltune.train import chunked_head
    from rltune.train.update import response_logp_entropy

    config = AutoConfig.for_model("qwen2", vocab_size=151_936, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                  tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(config).to("cuda").train()
    B, P, T = 4, 1, 256
    g = torch.Generator().manual_seed(0)
    mb = Experience(prompt_ids=torch.randint(4, 1000, (B, P), generator=g), prompt_mask=torch.ones(B, P, dtype=torch.long),
                    response_ids=torch.randint(4, 1000, (B, T), generator=g), response_mask=torch.ones(B, T),
                    advantages=torch.randn(B, T, generator=g)).to("cuda")
    head = lm.get_output_embeddings()

    def measured(chunk_elems):
        monkeypatch.setattr(chunked_head, "HEAD_CHUNK_ELEMS", chunk_elems)
        head.weight.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        logp, _ = response_logp_entropy(lm, mb, 1.0, False)
        (logp * mb.advantages).sum().backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - start
        grad = head.weight.grad.clone()
        for p in lm.parameters():
            p.grad = None
        return peak, logp.detach(), grad

    default = chunked_head.HEAD_CHUNK_ELEMS
    whole, logp_w, grad_w = measured(1 << 40)                         # one chunk: whole logits
    chunked, logp_c, grad_c = measured(default)                       # rltune's: 220 positions a chunk on CUDA
    assert chunked_head.worth_chunking(head, B * T) and chunked_head.chunk_rows(head) == 220
    print(f"\nlog-prob pass peak above start, 151,936 vocabulary, {B} x {T + P} positions, fp32: "
          f"whole {whole / 2**20:.0f} MiB, chunked {chunked / 2**20:.0f} MiB")
    assert chunked < 0.5 * whole, (whole, chunked)
    torch.testing.assert_close(logp_c, logp_w, rtol=0, atol=1e-4)
    _close(grad_c, grad_w, "lm_head.weight")


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen2"])
@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_padding_free_equals_the_plain_pass_on_cuda(model, batch, share):
    """train.padding_free (train/packed.py): the rows end to end under a dense bool mask, which
    CUDA's SDPA runs on its masked kernels; log-probs, entropies and gradients equal the padded pass."""
    from rltune.train.packed import layout, packed_reason
    from rltune.train.update import response_logp_entropy

    lm, mb = _lm(model), BATCHES[batch]().to("cuda")
    assert packed_reason(lm) is None and layout(mb, share) is not None
    out = []
    for packed in (False, True):
        lm.zero_grad(set_to_none=True)
        logp, ent = response_logp_entropy(lm, mb, TEMPERATURE, shared=share and packed, packed=packed)
        mask = mb.response_mask
        ((logp * mb.advantages * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        out.append((logp * mask, ent * mask, {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}))
    (plain_lp, plain_ent, plain_g), (lp, ent, g) = out
    assert lp.device.type == "cuda"
    torch.testing.assert_close(lp, plain_lp, rtol=0, atol=1e-4)
    torch.testing.assert_close(ent, plain_ent, rtol=0, atol=1e-4)
    assert plain_g.keys() == g.keys()
    for name in plain_g:
        _close(g[name], plain_g[name], name)


def test_padding_free_bf16_on_cuda():
    """bf16, padding-free with shared prompts against the padded pass: log-probs within bf16
    rounding (0.02 nats)."""
    from rltune.train.update import response_logp_entropy

    lm, mb = _lm("tiny-llama", "bf16"), _batch(3).to("cuda")
    with torch.no_grad():
        plain, _ = response_logp_entropy(lm, mb, TEMPERATURE)
        packed, _ = response_logp_entropy(lm, mb, TEMPERATURE, shared=True, packed=True)
    mask = mb.response_mask
    assert float(((packed - plain) * mask).abs().max()) < 0.02
