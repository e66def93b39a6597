"""Shared-prompt forward passes: each distinct prompt of a micro-batch is computed once.

GRPO samples every prompt `group_size` times, so a micro-batch holds the same prompt on
several rows and the plain passes (`update.response_logits`, the critic's values) recompute
it on each. Here (cf. "Prefix Grouper", arXiv:2506.05433) one forward runs the u distinct
prompts with a KV cache, the cache is expanded to the b rows by indexing (an autograd op:
the graph is kept), and a second forward runs the response tokens on top of it.

Why it is exact: in a decoder-only model with full causal attention a prompt token never
attends to response tokens, so its keys/values are the same whether computed alone or with
a response behind it; the response tokens attend to those same keys/values with the same
attention mask and the same position ids as `Experience.model_inputs` gives them. Prompt
columns that are padding in every distinct row are dropped: padded keys are masked out and
add 0 to the position count. In backward, the indexing sums the gradients of every row of a
group into its prompt's keys/values, which is what the unshared pass computes row by row.
Results therefore match the unshared pass up to float rounding (different kernel shapes).

The prompt pass writes its keys/values once (`PromptCache`); the response pass reads them
through `PrefixCache`, which expands them to the b rows inside each layer and never appends to
them. So under selective checkpointing (`models/checkpointing.py`) a layer recomputed in backward,
in either pass, sees the same prompt keys/values, and the expansion is recomputed instead of kept.

Every weight is used by both passes, and autograd sums a leaf's gradients from all its uses
before it accumulates them: the response pass's weight gradients, computed first in backward,
would wait for the prompt pass's, a whole set of gradients held beside `.grad` (513 MiB for
SmolLM2 in fp32, the largest item of its update). So the response pass sees its trainable
weights through `_AccumulateNow`, which adds its gradients to `.grad` as they come
(`response_call`: one identity per weight and module call, made as the module runs). Only for
a forward whose gradients `backward()` accumulates into `.grad` (the update's, inside
`into_grad()`): `torch.autograd.grad` would not see the gradients added on the side. The prompt pass keeps the plain graph edge: the weight's own accumulation,
and the hooks DeepSpeed hangs on it (ZeRO-1/2), still come last and see the sum. A tied output
layer (its weight the input embedding's) is the one weight used twice within a pass: the prompt
pass and the unshared pass see it through the same identity (`tied_head_call`), and its embedding
use keeps the plain edge.

It relies on HF's DynamicCache (transformers 5.x) holding every layer's keys/values, so
`shared_prompt_reason` allows only model types and settings that were checked.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache

from ..algo.logits import token_logprobs_entropy
from ..engine.weights import is_zero3
from ..models.checkpointing import checkpointing_mode
from ..rollout.experience import Experience
from .collective import global_max, world_size

# decoder-only, full causal attention, DynamicCache: checked against the unshared passes
VERIFIED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")  # llama includes SmolLM/SmolLM2
VERIFIED_ATTENTION = ("sdpa", "eager")


def _unwrap(model):
    """The nn.Module inside a DeepSpeed engine (`.module`), or the module itself."""
    return getattr(model, "module", model)


def transformer(model):
    """The Hugging Face transformer inside `model`: a DeepSpeed engine's `.module`, a ValueModel's
    backbone, or `model` itself."""
    m = _unwrap(model)
    return getattr(m, "backbone", m)   # ValueModel: the transformer under the value head


def architecture_reason(model, passes: str) -> str | None:
    """None when `model` is a decoder-only model of a verified type with full causal attention in
    every layer, else a one-line reason why `passes` (its name, for the reason) are not used."""
    config = getattr(transformer(model), "config", None)
    if config is None:
        return "not a Hugging Face model (no config)"
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder model"
    model_type = getattr(config, "model_type", None)
    if model_type not in VERIFIED_MODEL_TYPES:
        return f"model type {model_type!r} not verified for {passes} ({', '.join(VERIFIED_MODEL_TYPES)})"
    if getattr(config, "sliding_window", None) is not None:
        return f"sliding-window attention (sliding_window={config.sliding_window})"
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return f"not full attention in every layer ({sorted(set(layer_types))})"
    return None


def shared_prompt_reason(model) -> str | None:
    """None when the shared-prompt passes are exact for `model` (a causal LM, a ValueModel, or
    a DeepSpeed engine around either), else a one-line reason why they are not used."""
    reason = architecture_reason(model, "shared-prompt passes")
    if reason:
        return reason
    m = transformer(model)
    if checkpointing_mode(m) == "full":
        # HF's checkpointed layers drop past_key_values in training: the cache would stay empty
        return "gradient_checkpointing is full (Hugging Face drops the KV cache under it; selective keeps it)"
    attn = getattr(m.config, "_attn_implementation", None)
    if attn not in VERIFIED_ATTENTION:
        return f"attention implementation {attn!r} not verified ({', '.join(VERIFIED_ATTENTION)})"
    return None


# Below this many FLOPs saved, the second forward call's fixed cost (Python, kernel launches)
# outweighs the prompt tokens it saves: a tiny model is faster unshared (tiny-llama's PPO step was
# 34% slower shared on a 2-core CPU; SmolLM2-135M saves ~10^10 per micro-batch and is 26% faster).
MIN_SAVED_FLOP = 2e9


def _param_count(model) -> int:
    m = _unwrap(model)
    n = getattr(m, "_rltune_param_count", None)
    if n is None:   # ZeRO-3 partitions parameters: ds_numel is the full size
        n = sum(getattr(p, "ds_numel", p.numel()) for p in m.parameters())
        m._rltune_param_count = n
    return n


def saves_enough(model, saved_tokens: float) -> bool:
    """Whether not recomputing `saved_tokens` prompt tokens (~2 x parameters FLOPs each) saves
    more than the extra forward call costs."""
    return 2.0 * _param_count(model) * saved_tokens >= MIN_SAVED_FLOP


def pays_off(model, mb: Experience) -> bool:
    """`saves_enough` for a micro-batch: its repeated prompt rows, at their mean length.

    Under ZeRO-3 on several ranks the answer is the ranks' together (shared if any rank's pays
    off): ZeRO-3 gathers the weights around every forward call on all ranks at once, so a rank
    taking the shared pass (two calls) beside one taking the plain pass (one call) would hang.
    Both passes are exact, so the rank that gains nothing only runs the other way round."""
    distinct = torch.unique(mb.prompt_ids.cpu(), dim=0).shape[0]            # on the CPU: distinct_prompts says why
    mine = saves_enough(model, (mb.size - distinct) * float(mb.prompt_mask.cpu().sum()) / max(mb.size, 1))
    if is_zero3(model) and world_size() > 1:
        return global_max([float(mine)])[0] > 0
    return mine


def distinct_prompts(mb: Experience) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The distinct prompt rows of a micro-batch (same ids and same mask), as
    (uniq_ids (u, P'), uniq_mask (u, P'), inverse (b,)) with row i == uniq row inverse[i] and
    the prompt columns that are padding in every distinct row dropped (P' <= P)."""
    P, device = mb.prompt_width, mb.prompt_ids.device
    # on the CPU: torch.unique(dim=0) on CUDA sorts the rows lexicographically (~9 ms for 16 rows of
    # 2 x 1024 on an H200) and waits for the GPU; one small copy is cheaper
    rows = torch.cat([mb.prompt_ids, mb.prompt_mask.long()], dim=1).cpu()  # (b, 2P)
    uniq, inverse = torch.unique(rows, dim=0, return_inverse=True)         # (u, 2P), (b,)
    uniq_ids, uniq_mask = uniq[:, :P], uniq[:, P:]                         # (u, P) each
    used = uniq_mask.bool().any(dim=0)                                     # (P,) column real in some row
    uniq_ids, uniq_mask = uniq_ids[:, used], uniq_mask[:, used]            # (u, P')
    if uniq_mask.shape[1] == 0 or not bool(uniq_mask[:, -1].all()):
        raise ValueError("shared-prompt passes need left-padded, non-empty prompts")
    return uniq_ids.to(device), uniq_mask.to(device), inverse.to(device)


def _inputs(mb: Experience):
    """Both passes' inputs, numbered as `Experience.model_inputs` numbers the full sequence.

    Returns (uniq_ids (u, P'), uniq_mask (u, P'), prompt_pos (u, P'), inverse (b,),
    resp_ids (b, T-1), resp_attention (b, P'+T-1), resp_pos (b, T-1)): the response pass
    takes response tokens 0..T-2 only (token T-1 predicts nothing we keep)."""
    uniq_ids, uniq_mask, inverse = distinct_prompts(mb)
    P, T = uniq_ids.shape[1], mb.response_ids.shape[1]
    prompt_pos = (uniq_mask.cumsum(dim=1) - 1).clamp(min=0)                          # (u, P')
    attention = torch.cat([uniq_mask[inverse], mb.response_mask.long()], dim=1)      # (b, P'+T)
    position = (attention.cumsum(dim=1) - 1).clamp(min=0)                            # (b, P'+T)
    resp_ids = mb.response_ids[:, : T - 1]                                           # (b, T-1)
    return (uniq_ids, uniq_mask, prompt_pos, inverse,
            resp_ids, attention[:, : P + T - 1], position[:, P: P + T - 1])


class _AccumulateNow(torch.autograd.Function):
    """The identity on a trainable weight; its gradient is added to `weight.grad` as soon as
    backward reaches it, and nothing flows on to the weight's own accumulation."""

    @staticmethod
    def forward(ctx, weight):
        ctx.weight = weight
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx, grad):
        w = ctx.weight
        if w.grad is None:
            w.grad = grad.detach().clone()
        else:
            w.grad.add_(grad.detach())
        return None


_INTO_GRAD = [0]   # > 0 inside `into_grad()`


@contextlib.contextmanager
def into_grad():
    """Inside: the passes' gradients will be accumulated into `.grad` by `backward()` (the update's
    forward, `update.run_update`), so the response pass may add its weight gradients early."""
    _INTO_GRAD[0] += 1
    try:
        yield
    finally:
        _INTO_GRAD[0] -= 1


def response_call(model, **inputs):
    """`model(**inputs)` with each module's trainable weights seen through `_AccumulateNow`,
    made as the module runs (inside `into_grad()`, outside ZeRO-3); see the module docstring.

    Made per module call, each identity comes right before the ops that use it, so backward
    runs it right after them (autograd runs the latest-made ready node first): made all at
    once before the pass, they would all wait, holding their gradients, until the pass's
    backward ends. Under ZeRO-3 the weights are partitioned and gathered by DeepSpeed's own
    hooks: the plain call (the gradients wait)."""
    modules = [m for m in _unwrap(model).modules() if any(w.requires_grad for w in m.parameters(recurse=False))]
    return _adding_early(model, modules, inputs)


def tied_head_call(model, **inputs):
    """`model(**inputs)` with a tied output layer's weight seen through `_AccumulateNow` (inside
    `into_grad()`, outside ZeRO-3): for the pass that keeps the plain graph edges (the prompt pass,
    the unshared pass).

    A tied weight has two uses in one pass: the output layer, whose gradient backward computes
    first, and the input embedding, whose gradient comes last. Autograd would hold the output
    layer's (V, h) gradient through the whole backward, then sum it with the embedding's into a
    third table. Added to `.grad` at once, it is gone before the embedding's arrives, and the
    embedding's use keeps the weight's own accumulation (and DeepSpeed's hooks on it) last."""
    m = _unwrap(model)
    get_in, get_out = getattr(m, "get_input_embeddings", None), getattr(m, "get_output_embeddings", None)
    head = get_out() if callable(get_out) else None
    emb = get_in() if callable(get_in) else None
    w = getattr(head, "weight", None)
    tied = isinstance(head, torch.nn.Module) and w is not None and w is getattr(emb, "weight", None)
    return _adding_early(model, [head] if tied and w.requires_grad else [], inputs)


def _adding_early(model, modules: list, inputs: dict):
    """`model(**inputs)` with the trainable weights of `modules` seen through `_AccumulateNow` as
    each module runs; the plain call outside `into_grad()`, without grad, or under ZeRO-3."""
    if not torch.is_grad_enabled() or not _INTO_GRAD[0] or not modules:
        return model(**inputs)
    if any(hasattr(w, "ds_id") for m in modules for w in m.parameters(recurse=False)):
        return model(**inputs)
    swapped: dict[int, list] = {}       # id(module) -> [(name, weight)] while the module runs

    def restore(module) -> None:
        for name, w in swapped.pop(id(module), []):
            module._parameters[name] = w

    def before(module, args):
        restore(module)
        names = [n for n, w in module._parameters.items() if w is not None and w.requires_grad]
        swapped[id(module)] = [(n, module._parameters[n]) for n in names]
        for n, w in swapped[id(module)]:
            module._parameters[n] = _AccumulateNow.apply(w)

    def after(module, args, output):
        restore(module)

    hooks = [h for m in modules for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    try:
        return model(**inputs)
    finally:
        for h in hooks:
            h.remove()
        for m in modules:
            restore(m)


def _prefix_cache(cache, inverse: torch.Tensor, prompt_len: int):
    """The prompt pass's cache as the response pass reads it (`PrefixCache`)."""
    if cache is None or cache.get_seq_length() != prompt_len:
        # e.g. full gradient checkpointing in training: HF returns an empty cache instead of failing
        raise RuntimeError("the prompt pass returned no KV cache; see shared_prompt_reason")
    return PrefixCache(cache, inverse)


class PromptCache(DynamicCache):
    """The prompt pass's cache: each layer's keys/values are stored the first time the layer runs.
    A second call for a layer is that layer recomputed in backward (selective checkpointing):
    it gets its own recomputed keys/values back and the cache keeps the first ones, which the
    response pass read (and which carry the graph the gradients flow through)."""

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if layer_idx < len(self.layers) and self.layers[layer_idx].is_initialized:
            return key_states, value_states                # a recompute: the prompt has no past
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


class PrefixCache(DynamicCache):
    """The u distinct prompts' keys/values, read by the b response rows and never appended to.

    `update(keys, values, layer)` returns the prompt's keys/values for each row
    (u, H, P', D) -> (b, H, P', D), by `inverse`, followed by the response's own (b, H, T', D),
    and stores nothing. So a layer can run twice (recomputed in backward) and see the same
    keys/values. The indexing is an autograd op: the rows of a group add their gradients into
    their prompt's keys/values."""

    def __init__(self, prompt_cache, inverse: torch.Tensor):
        super().__init__()
        self.layers = prompt_cache.layers        # every layer's prompt keys/values (u rows)
        self.layer_class_to_replicate = None
        self.inverse = inverse                   # (b,) row -> distinct prompt

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        layer = self.layers[layer_idx]
        return (torch.cat([layer.keys[self.inverse], key_states], dim=-2),
                torch.cat([layer.values[self.inverse], value_states], dim=-2))


def _two_passes(model, mb: Experience, response_head=contextlib.nullcontext):
    """The prompt pass, then the response pass on the prompts' keys/values: (first (b, 1, V)
    logits, the last prompt position's, which predict response token 0; the response pass's
    output `.logits` (b, T-1, ...) for tokens 1..T-1, None when T == 1). The response pass
    runs inside `response_head(labels)` (b, T-1): `chunked_head.logp_head` makes it return
    log-probs and entropies instead of logits."""
    T = mb.response_ids.shape[1]
    uniq_ids, uniq_mask, prompt_pos, inverse, resp_ids, resp_attention, resp_pos = _inputs(mb)
    # (our own cache: under checkpointing HF's model forward would not make one)
    cache = PromptCache()
    out = tied_head_call(model, input_ids=uniq_ids, attention_mask=uniq_mask, position_ids=prompt_pos,
                         past_key_values=cache, use_cache=False, logits_to_keep=1)
    first = out.logits[inverse]                                                    # (b, 1, V)
    if T == 1:
        return first, None
    cache = _prefix_cache(cache, inverse, uniq_ids.shape[1])
    with response_head(mb.response_ids[:, 1:]):
        rest = response_call(model, input_ids=resp_ids, attention_mask=resp_attention, position_ids=resp_pos,
                             past_key_values=cache, use_cache=False).logits        # (b, T-1, ...)
    return first, rest


def shared_response_logits(model, mb: Experience, temperature: float = 1.0) -> torch.Tensor:
    """Logits that predict each response token: (b, T, V) in the model's dtype at temperature 1
    (no copy: the fused log-prob pass applies the temperature), else float32 divided by it;
    equal to `update.response_logits` with each distinct prompt computed once (also right,
    just not cheaper, when no prompt repeats)."""
    first, rest = _two_passes(model, mb)
    logits = first if rest is None else torch.cat([first, rest], dim=1)          # (b, T, V)
    return logits if temperature == 1.0 else logits.float() / temperature


def shared_response_logp_entropy(model, mb: Experience, temperature: float, response_head):
    """(b, T) log-probs and (b, T) entropies of the response tokens at `temperature`, float32:
    token 0 from the prompt pass's logits, tokens 1..T-1 from the response pass run inside
    `response_head(labels)` (`chunked_head.logp_head`: no (b, T, V) logits)."""
    first, rest = _two_passes(model, mb, response_head)
    logp, ent = token_logprobs_entropy(first, mb.response_ids[:, :1], temperature)     # (b, 1) each
    if rest is None:
        return logp, ent
    return torch.cat([logp, rest[..., 0]], dim=1), torch.cat([ent, rest[..., 1]], dim=1)


def shared_response_values(critic, mb: Experience) -> torch.Tensor:
    """The critic's value before each response token: (b, T) float32, equal to
    `critic(**mb.model_inputs())[:, -T-1:-1]` (last prompt position, then response 0..T-2).

    `critic` is a ValueModel or a DeepSpeed engine around one; both passes go through its
    forward: the prompt pass fills a `PromptCache`, the response pass reads it (`PrefixCache`)."""
    T = mb.response_ids.shape[1]
    uniq_ids, uniq_mask, prompt_pos, inverse, resp_ids, resp_attention, resp_pos = _inputs(mb)
    cache = PromptCache()
    prompt_values = critic(input_ids=uniq_ids, attention_mask=uniq_mask, position_ids=prompt_pos,
                           past_key_values=cache)                                  # (u, P')
    values = prompt_values[:, -1:][inverse]                                        # (b, 1)
    if T > 1:
        cache = _prefix_cache(cache, inverse, uniq_ids.shape[1])
        rest = response_call(critic, input_ids=resp_ids, attention_mask=resp_attention, position_ids=resp_pos,
                             past_key_values=cache)                                # (b, T-1)
        values = torch.cat([values, rest], dim=1)                                  # (b, T)
    return values.float()
