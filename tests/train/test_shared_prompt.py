"""Shared-prompt passes (train/shared_prompt.py) equal the plain passes: logits, values and
gradients, on tiny llama / qwen2 models, plain modules and DeepSpeed engines."""

from __future__ import annotations

import contextlib

import pytest
import torch

from rltune.rollout.experience import Experience

P, T, GROUP = 7, 6, 4
TEMPERATURE = 0.7


def _batch(seed=0, prompt_lengths=(3, 5, 6), group=GROUP, T=T, full=False):
    """Groups of `group` rows per prompt, prompts left-padded to P (column 0 is padding in
    every row), responses of different lengths right-padded to T (`full`: all T long), rows
    shuffled."""
    g = torch.Generator().manual_seed(seed)
    ids, mask = [], []
    for n in prompt_lengths:
        pad = torch.zeros(P - n, dtype=torch.long)
        ids.append(torch.cat([pad, torch.randint(4, 60, (n,), generator=g)]))
        mask.append(torch.cat([pad, torch.ones(n, dtype=torch.long)]))
    prompt_ids = torch.stack(ids).repeat_interleave(group, 0)        # (b, P)
    prompt_mask = torch.stack(mask).repeat_interleave(group, 0)      # (b, P)
    b = prompt_ids.shape[0]
    lengths = torch.randint(1, T + 1, (b,), generator=g)
    lengths[0] = T                                                   # one full-length response
    if full:
        lengths[:] = T
    response_mask = (torch.arange(T)[None, :] < lengths[:, None]).float()           # (b, T)
    response_ids = torch.randint(4, 60, (b, T), generator=g) * response_mask.long()  # pad id 0
    perm = torch.randperm(b, generator=g)                            # groups not contiguous
    return Experience(prompt_ids=prompt_ids[perm], prompt_mask=prompt_mask[perm],
                      response_ids=response_ids[perm], response_mask=response_mask[perm],
                      advantages=torch.randn(b, T, generator=g) * response_mask[perm])


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices: one intra-op thread is 50x faster than two on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


BATCHES = {"groups": lambda: _batch(), "all-distinct": lambda: _batch(1, (2, 3, 4, 5, 6, 7), group=1),
           "one-token": lambda: _batch(2, T=1), "two-tokens": lambda: _batch(5, T=2),
           # no padding anywhere: HF may drop the mask; the response pass must not be top-left causal
           "no-padding": lambda: _batch(6, (P, P), full=True)}


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen2"])
def lm(request):
    from rltune.models.loading import load_causal_lm

    return load_causal_lm(f"builtin:{request.param}", "fp32", "sdpa")


@pytest.fixture(scope="module")
def critic():
    from rltune.engine.roles import ValueModel
    from rltune.models.loading import load_backbone

    torch.manual_seed(0)
    return ValueModel(load_backbone("builtin:tiny-qwen2", "fp32", "sdpa"))


def _loss(logits, mb):
    from rltune.algo import logprobs_from_logits

    return (logprobs_from_logits(logits, mb.response_ids) * mb.advantages * mb.response_mask).sum()


def _assert_grad_close(actual, expected, name=""):
    """rtol 1e-4, atol 1e-6 or 1e-5 x the tensor's largest gradient: sums that cancel leave
    float rounding of up to ~1e-6 x max|g| on single elements (seen: 2.3e-6 on a 1.6e-3
    element of a critic gradient whose largest entry is ~3)."""
    atol = max(1e-6, 1e-5 * float(expected.abs().max()))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=atol, msg=name or None)


def _grads(model, loss):
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.autograd.grad(loss, params, allow_unused=True)


def test_distinct_prompts_trims_and_inverts():
    from rltune.train.shared_prompt import distinct_prompts

    mb = _batch()
    ids, mask, inverse = distinct_prompts(mb)
    assert ids.shape == mask.shape == (3, P - 1) and inverse.shape == (mb.size,)
    assert torch.equal(ids[inverse], mb.prompt_ids[:, 1:]) and torch.equal(mask[inverse], mb.prompt_mask[:, 1:])
    assert not mb.prompt_mask[:, 0].any()


@pytest.mark.parametrize("batch", list(BATCHES))
def test_logits_equal_the_plain_pass(lm, batch):
    from rltune.train.shared_prompt import shared_prompt_reason, shared_response_logits
    from rltune.train.update import response_logits

    assert shared_prompt_reason(lm) is None
    mb = BATCHES[batch]()
    with torch.no_grad():
        plain = response_logits(lm, mb, TEMPERATURE)
        shared = shared_response_logits(lm, mb, TEMPERATURE)
    assert shared.dtype == torch.float32 and shared.shape == plain.shape
    torch.testing.assert_close(shared, plain, rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_type,attn", [("qwen3", "sdpa"), ("mistral", "sdpa"), ("llama", "eager")])
def test_other_allowed_model_types(model_type, attn):
    """The other allowed types and attention, as tiny random models (mistral without a sliding
    window)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rltune.train.shared_prompt import shared_prompt_reason, shared_response_logits
    from rltune.train.update import response_logits

    extra = {"sliding_window": None} if model_type == "mistral" else {}
    config = AutoConfig.for_model(model_type, vocab_size=64, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                  attn_implementation=attn, **extra)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert shared_prompt_reason(model) is None and model.config._attn_implementation == attn
    mb = _batch(7)
    with torch.no_grad():
        torch.testing.assert_close(shared_response_logits(model, mb, TEMPERATURE),
                                   response_logits(model, mb, TEMPERATURE), rtol=0, atol=1e-5)


def test_gradients_equal_the_plain_pass(lm):
    from rltune.train.shared_prompt import shared_response_logits
    from rltune.train.update import response_logits

    mb = _batch(3)
    plain = _grads(lm, _loss(response_logits(lm, mb, TEMPERATURE), mb))
    shared = _grads(lm, _loss(shared_response_logits(lm, mb, TEMPERATURE), mb))
    assert any(g is not None and g.abs().sum() > 0 for g in plain)
    for a, b in zip(plain, shared):
        assert (a is None) == (b is None)
        if a is not None:
            _assert_grad_close(b, a)


class _Calls:
    """Counts the forward calls of a model's first decoder layer, by the rows it saw."""

    def __init__(self, model):
        from rltune.models.checkpointing import _layers

        self.rows: list[int] = []
        self.handle = _layers(model)[0].register_forward_pre_hook(
            lambda _m, args: self.rows.append(args[0].shape[0]))


@contextlib.contextmanager
def checkpointing(lm, mode):
    """`lm` with `mode` (False | "full" | "selective") on, in training mode (HF recomputes in training
    mode only); no recompute and eval mode afterwards."""
    from rltune.models.checkpointing import _layers, enable_checkpointing

    enable_checkpointing(lm, mode)
    lm.train()
    try:
        yield lm
    finally:
        lm.gradient_checkpointing_disable()
        for layer in _layers(lm):
            layer._can_checkpoint_with_cache = False
        lm.eval()


@pytest.fixture
def selective(lm):
    """`lm` with selective checkpointing, in training mode; restored afterwards."""
    from rltune.models.checkpointing import checkpointing_mode

    with checkpointing(lm, "selective"):
        assert checkpointing_mode(lm) == "selective"
        yield lm


def test_selective_checkpointing_keeps_the_prompt_and_equals_the_plain_pass(selective):
    """Selective checkpointing: the shared-prompt passes stay on, the gradients equal the plain
    unshared pass without recompute, and the layers really recompute: in backward the first
    layer runs again for the b response rows, then for the u prompts."""
    from rltune.train.shared_prompt import shared_prompt_reason, shared_response_logits
    from rltune.train.update import response_logits

    from rltune.models.checkpointing import enable_checkpointing

    lm, mb = selective, _batch(3)
    assert shared_prompt_reason(lm) is None
    lm.gradient_checkpointing_disable()                      # the plain pass: no recompute, unshared
    plain = _grads(lm, _loss(response_logits(lm, mb, TEMPERATURE), mb))
    enable_checkpointing(lm, "selective")
    calls = _Calls(lm)
    logits = shared_response_logits(lm, mb, TEMPERATURE)
    forward_rows = list(calls.rows)
    shared = _grads(lm, _loss(logits, mb))
    calls.handle.remove()
    assert forward_rows == [3, mb.size]                      # u distinct prompts, then b responses
    assert calls.rows[len(forward_rows):] == [mb.size, 3]    # backward recomputed both passes
    for a, b in zip(plain, shared):
        assert (a is None) == (b is None)
        if a is not None:
            _assert_grad_close(b, a)


def test_full_checkpointing_turns_the_shared_prompt_off(lm):
    from rltune.models.checkpointing import checkpointing_mode, enable_checkpointing
    from rltune.train.shared_prompt import shared_prompt_reason

    enable_checkpointing(lm, "full")
    try:
        assert checkpointing_mode(lm) == "full" and "selective keeps it" in shared_prompt_reason(lm)
    finally:
        lm.gradient_checkpointing_disable()
    assert checkpointing_mode(lm) is False


def test_selective_critic_values_and_gradients_equal_the_plain_pass(critic):
    from rltune.models.checkpointing import _layers, enable_checkpointing
    from rltune.train.shared_prompt import shared_prompt_reason, shared_response_values

    mb = _batch()
    plain = critic(**mb.model_inputs())[:, -T - 1:-1].float()
    grads_plain = _grads(critic, (plain * mb.advantages).sum())
    enable_checkpointing(critic.backbone, "selective")
    critic.train()
    try:
        assert shared_prompt_reason(critic) is None
        calls = _Calls(critic)
        shared = shared_response_values(critic, mb)
        grads_shared = _grads(critic, (shared * mb.advantages).sum())
        assert calls.rows == [3, mb.size, mb.size, 3]
        calls.handle.remove()
    finally:
        critic.backbone.gradient_checkpointing_disable()
        for layer in _layers(critic):
            layer._can_checkpoint_with_cache = False
        critic.eval()
    torch.testing.assert_close(shared, plain, rtol=0, atol=1e-5)
    for a, b in zip(grads_plain, grads_shared):
        _assert_grad_close(b, a)


@pytest.mark.parametrize("batch", ["groups", "all-distinct"])
def test_values_and_gradients_equal_the_plain_pass(critic, batch):
    from rltune.train.shared_prompt import shared_prompt_reason, shared_response_values

    assert shared_prompt_reason(critic) is None
    mb = BATCHES[batch]()
    plain = critic(**mb.model_inputs())[:, -T - 1:-1].float()
    shared = shared_response_values(critic, mb)
    torch.testing.assert_close(shared, plain, rtol=0, atol=1e-5)
    grads_plain = _grads(critic, (plain * mb.advantages).sum())
    grads_shared = _grads(critic, (shared * mb.advantages).sum())
    for a, b in zip(grads_plain, grads_shared):
        _assert_grad_close(b, a)


def test_reason_refuses_what_is_not_exact(lm):
    from transformers import AutoModelForCausalLM, GPT2Config, MistralConfig

    from rltune.train.shared_prompt import shared_prompt_reason, shared_response_logits

    lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    try:
        assert "gradient_checkpointing is full" in shared_prompt_reason(lm)
        # HF hands back an empty cache in training under checkpointing: refused, not wrong
        lm.train()
        with pytest.raises(RuntimeError, match="no KV cache"):
            shared_response_logits(lm, _batch(), TEMPERATURE)
    finally:
        lm.gradient_checkpointing_disable()
        lm.eval()
    assert shared_prompt_reason(lm) is None

    small = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=2, num_key_value_heads=1)
    windowed = AutoModelForCausalLM.from_config(MistralConfig(sliding_window=16, **small))
    assert "sliding" in shared_prompt_reason(windowed)
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2))
    assert "gpt2" in shared_prompt_reason(gpt2)
    assert shared_prompt_reason(torch.nn.Linear(2, 2)) is not None


@pytest.mark.parametrize("checkpointing", [False, "selective"])
def test_deepspeed_zero3_engines_match_the_plain_pass(monkeypatch, checkpointing):
    """Two forwards (prompt, responses) before one backward, through ZeRO-3 engines: the actor
    called as the engine, the critic's backbone and value head called inside the engine.
    Persistence threshold 0: the tiny parameters are released after each module's forward
    and gathered again (by default ZeRO-3 keeps parameters under 1e5 elements gathered), so
    with selective checkpointing the recompute in backward gathers them once more."""
    from deepspeed.utils import safe_get_full_grad

    from rltune.engine import roles
    from rltune.engine.distributed import init_distributed
    from rltune.recipe.schema import Recipe
    from rltune.train.shared_prompt import shared_prompt_reason, shared_response_logits, shared_response_values
    from rltune.train.update import response_logits

    plain_config = roles.ds_config

    def ds_config(*args, **kwargs):
        cfg = plain_config(*args, **kwargs)
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
        return cfg

    monkeypatch.setattr(roles, "ds_config", ds_config)
    init_distributed("cpu")
    r = Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
        "reward": {"functions": ["builtin:format"]}, "algorithm": {"name": "ppo"},
        "actor": {"zero_stage": 3}, "critic": {"zero_stage": 3},
        "rollout": {"batch_size": 8}, "train": {"batch_size": 8, "micro_batch_size": 8}})
    shared_recipe = r.model_copy(update={
        "actor": r.actor.model_copy(update={"gradient_checkpointing": checkpointing}),
        "critic": r.critic.model_copy(update={"gradient_checkpointing": checkpointing})})
    mb = _batch(4)

    def grads(engine):
        return {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters()}

    def check(build, forward_plain, forward_shared, loss):
        torch.manual_seed(0)
        plain_engine = build(r, "cpu", 10)
        torch.manual_seed(0)                      # the same value head
        shared_engine = build(shared_recipe, "cpu", 10)
        plain_engine.train(), shared_engine.train()
        assert shared_prompt_reason(shared_engine) is None
        assert all(p.numel() == 0 for p in shared_engine.module.parameters())   # partitioned, released
        calls = _Calls(shared_engine.module)
        plain, shared = forward_plain(plain_engine), forward_shared(shared_engine)
        torch.testing.assert_close(shared, plain, rtol=0, atol=1e-5)
        plain_engine.backward(loss(plain), scale_wrt_gas=False)
        shared_engine.backward(loss(shared), scale_wrt_gas=False)
        calls.handle.remove()
        assert calls.rows == [3, mb.size] + ([mb.size, 3] if checkpointing else [])   # the recompute
        a, b = grads(plain_engine), grads(shared_engine)
        for n in a:
            _assert_grad_close(b[n], a[n], n)
        shared_engine.step()

    check(roles.build_actor, lambda e: response_logits(e, mb, TEMPERATURE),
          lambda e: shared_response_logits(e, mb, TEMPERATURE), lambda logits: _loss(logits, mb))
    check(roles.build_critic, lambda e: e(**mb.model_inputs())[:, -T - 1:-1].float(),
          lambda e: shared_response_values(e, mb), lambda v: (v * mb.advantages).sum())


def test_selective_checkpointing_under_lora_equals_the_plain_pass():
    """A LoRA actor (PEFT around the model, enabled before the wrap as build_actor does): the adapter's
    gradients under selective checkpointing equal the plain unshared pass's, lora_B made non-zero so
    the adapter's path carries gradient into lora_A too."""
    from rltune.models.checkpointing import checkpointing_mode, enable_checkpointing
    from rltune.models.loading import load_causal_lm
    from rltune.models.lora import apply_lora
    from rltune.recipe.schema import LoraCfg
    from rltune.train.shared_prompt import shared_prompt_reason, shared_response_logits
    from rltune.train.update import response_logits

    def build(mode):
        torch.manual_seed(0)
        model = load_causal_lm("builtin:tiny-llama", "fp32", "sdpa")
        enable_checkpointing(model, mode)
        peft = apply_lora(model, LoraCfg(r=4, alpha=8, dropout=0.0))
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.05 * torch.randn(p.shape, generator=g))
        return peft.train()

    mb = _batch(8)
    plain_model, selective_model = build(False), build("selective")
    assert checkpointing_mode(selective_model) == "selective" and shared_prompt_reason(selective_model) is None
    plain = _grads(plain_model, _loss(response_logits(plain_model, mb, TEMPERATURE), mb))
    calls = _Calls(selective_model)
    shared = _grads(selective_model, _loss(shared_response_logits(selective_model, mb, TEMPERATURE), mb))
    calls.handle.remove()
    assert calls.rows == [3, mb.size, mb.size, 3]
    assert len(plain) == len(shared) > 0 and any(g.abs().sum() > 0 for g in plain)
    for a, b in zip(plain, shared):
        _assert_grad_close(b, a)


def _backward_grads(model, loss, existing=None):
    """The gradients `loss.backward()` accumulates into .grad (on top of `existing`, or from None),
    as the update takes them; .grad is left as it was found (None)."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p, e in zip(params, existing or [None] * len(params)):
        p.grad = None if e is None else e.clone()
    loss.backward()
    out = [None if p.grad is None else p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    return out


def early_and_plain_grads(lm, mb, mode, existing):
    """.grad after the plain unshared pass, and after the update's pass (shared prompt, gradients added
    early, checkpointing `mode` False or "selective"), each on top of `existing` (or from None); asserts
    that both passes ran, and again in backward when selective. tests/gpu runs it on CUDA."""
    from rltune.train import shared_prompt
    from rltune.train.update import response_logits

    plain = _backward_grads(lm, _loss(response_logits(lm, mb, TEMPERATURE), mb), existing)
    with checkpointing(lm, mode):
        calls = _Calls(lm)
        try:
            with shared_prompt.into_grad():
                logits = shared_prompt.shared_response_logits(lm, mb, TEMPERATURE)
            early = _backward_grads(lm, _loss(logits, mb), existing)
        finally:
            calls.handle.remove()
    assert calls.rows == [3, mb.size] + ([mb.size, 3] if mode else [])   # recomputed when selective
    assert all(type(w) is torch.nn.Parameter for w in lm.parameters())   # the weights are back
    return plain, early


@pytest.mark.parametrize("checkpointing", [False, "selective"])
@pytest.mark.parametrize("on_top", [False, True], ids=["from-none", "accumulated"])
def test_early_accumulation_into_grad_equals_the_plain_pass(lm, checkpointing, on_top):
    """Inside `into_grad()` (the update's forward) the response pass adds its weight gradients to
    .grad as backward reaches them: .grad after backward equals the plain unshared pass's, whether
    .grad held an earlier micro-batch's sum or nothing, with and without selective recompute."""
    mb = _batch(3)
    params = [p for p in lm.parameters() if p.requires_grad]
    plain, early = early_and_plain_grads(lm, mb, checkpointing, [torch.randn_like(p) for p in params] if on_top else None)
    for a, b in zip(plain, early):
        assert (a is None) == (b is None)
        if a is not None:
            _assert_grad_close(b, a)


def test_early_accumulation_leaves_no_layer_waiting(lm):
    """What the early accumulation is for: the response pass's weight gradients reach .grad as
    backward goes, not once the prompt pass's arrive. Each layer's response-pass gradients are in
    .grad before the backward of the layer below it starts (a full backward pre-hook per decoder
    layer: it fires for the response pass's calls first, the layers from the last down)."""
    from rltune.models.checkpointing import _layers
    from rltune.train import shared_prompt

    layers = _layers(lm)
    mb, seen = _batch(3), []
    for p in lm.parameters():
        p.grad = None

    def before_backward(i):
        def hook(module, grad_output):
            # the layer above (i + 1), whose backward ran just before: its weights' gradients
            above = layers[i + 1] if i + 1 < len(layers) else None
            if above is not None:
                seen.append((i, all(p.grad is not None for p in above.parameters())))
        return hook

    handles = [layer.register_full_backward_pre_hook(before_backward(i)) for i, layer in enumerate(layers)]
    try:
        with shared_prompt.into_grad():
            logits = shared_prompt.shared_response_logits(lm, mb, TEMPERATURE)
        _loss(logits, mb).backward()
    finally:
        for h in handles:
            h.remove()
        for p in lm.parameters():
            p.grad = None
    first_pass = seen[:len(layers) - 1]                       # the response pass, layers from the top down
    assert [i for i, _ in first_pass] == list(range(len(layers) - 2, -1, -1)), seen
    assert all(ok for _, ok in first_pass), seen
    # and without it (a plain forward) they wait: the check itself can fail
    seen.clear()
    handles = [layer.register_full_backward_pre_hook(before_backward(i)) for i, layer in enumerate(layers)]
    try:
        _loss(shared_prompt.shared_response_logits(lm, mb, TEMPERATURE), mb).backward()
    finally:
        for h in handles:
            h.remove()
        for p in lm.parameters():
            p.grad = None
    assert not any(ok for _, ok in seen[:len(layers) - 1]), seen


def _tied_lm():
    from rltune.models.loading import load_causal_lm

    lm = load_causal_lm("builtin:tiny-qwen2", "fp32", "sdpa")
    assert lm.get_output_embeddings().weight is lm.get_input_embeddings().weight      # tied
    return lm


@pytest.mark.parametrize("chunked", [False, True], ids=["whole-logits", "chunked-head"])
@pytest.mark.parametrize("on_top", [False, True], ids=["from-none", "accumulated"])
def test_tied_head_added_early_equals_the_plain_pass(monkeypatch, chunked, on_top):
    """Inside `into_grad()` the unshared pass adds a tied output layer's gradient to .grad at once
    (`tied_head_call`): .grad after backward equals the plain pass's, with the whole logits and
    with the chunked output layer, from None and on top of an earlier micro-batch's sum."""
    from rltune.train import chunked_head, shared_prompt
    from rltune.train.update import response_logp_entropy

    lm, mb = _tied_lm(), _batch(7)
    if chunked:
        monkeypatch.setattr(chunked_head, "HEAD_CHUNK_ELEMS", 5 * lm.get_output_embeddings().weight.shape[0])
        assert chunked_head.worth_chunking(chunked_head.output_layer(lm), mb.size * (T + 1))

    def loss():
        logp, ent = response_logp_entropy(lm, mb, TEMPERATURE)
        return ((logp * mb.advantages + 0.1 * ent) * mb.response_mask).sum()

    params = [p for p in lm.parameters() if p.requires_grad]
    existing = [torch.randn_like(p) for p in params] if on_top else None
    plain = _backward_grads(lm, loss(), existing)
    with shared_prompt.into_grad():
        early_loss = loss()
    early = _backward_grads(lm, early_loss, existing)
    assert all(type(w) is torch.nn.Parameter for w in lm.parameters())   # the weights are back
    for a, b in zip(plain, early):
        _assert_grad_close(b, a)


def _early_adds(monkeypatch) -> list:
    """The weights `_AccumulateNow` adds to .grad, one entry per add, in backward's order."""
    from rltune.train import shared_prompt

    adds, plain_backward = [], shared_prompt._AccumulateNow.backward

    def backward(ctx, grad):
        adds.append(ctx.weight)
        return plain_backward(ctx, grad)

    monkeypatch.setattr(shared_prompt._AccumulateNow, "backward", staticmethod(backward))
    return adds


@pytest.mark.parametrize("shared", [False, True], ids=["unshared", "shared-prompt"])
def test_tied_head_gradient_does_not_wait_for_the_embedding(monkeypatch, shared):
    """What it is for: a tied weight's output-layer gradient (computed first in backward) used to
    wait for its input-embedding gradient (computed last), a (V, h) table held through the whole
    backward. Added early, the unshared pass's tied weight has a .grad as the lowest decoder layer's
    backward begins (without `into_grad()` it has none: the check can fail); the shared-prompt
    passes add three of its four uses early (both output layers and the response pass's embedding),
    and leave the prompt pass's embedding to the weight's own accumulation (DeepSpeed's hooks)."""
    from rltune.models.checkpointing import _layers
    from rltune.train import shared_prompt
    from rltune.train.update import response_logits

    lm, mb = _tied_lm(), _batch(8)
    tied = lm.get_input_embeddings().weight
    adds, at_layer0 = _early_adds(monkeypatch), []
    handle = _layers(lm)[0].register_full_backward_pre_hook(lambda m, g: at_layer0.append(tied.grad is not None))
    try:
        for early in (True, False):
            tied.grad = None
            with shared_prompt.into_grad() if early else contextlib.nullcontext():
                logits = (shared_prompt.shared_response_logits(lm, mb, TEMPERATURE) if shared
                          else response_logits(lm, mb, TEMPERATURE))
            _loss(logits, mb).backward()
    finally:
        handle.remove()
        for p in lm.parameters():
            p.grad = None
    if shared:
        # the response pass's output layer and embedding, then the prompt pass's output layer
        assert sum(w is tied for w in adds) == 3, len(adds)
        assert at_layer0 == [True, True, False, False]
    else:
        assert [w is tied for w in adds] == [True]          # only the tied weight, only its head use
        assert at_layer0 == [True, False]
