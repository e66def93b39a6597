"""LoRA adapters through PEFT (`model.lora`): build, reference view, merged weights, export.

The run reaches this module through `models.adaptation.LoraAdapter` (the seam: call sites ask
the role's adaptation, never `model.lora`). What LoRA changes, and where it happens here:
- actor (and, for PPO, the critic backbone): `apply_lora` wraps the model in a PEFT model whose
  base weights are frozen; only the adapter (and the biases `bias` names) has requires_grad, so
  only those reach the optimizer. Every listed target name must match a module (`check_targets`).
  The critic's value head stays fully trainable.
- reference: `AdapterDisabledReference`, the actor's own module run under PEFT's
  `disable_adapter` context: the base model's output, exactly, without a second copy of the
  weights. Only with `bias: none` (trained biases live inside the base layers, so disabling the
  adapter would not give the base model back: the reference is then a full copy as usual).
- rollout: the hf engine gets a model with the same adapter layers (`rollout_model`), whose base
  weights and adapter point at the actor's own tensors after `sync_weights`; vLLM gets the merged
  weights (`merged_params`: W + scaling * B @ A into new tensors, the actor untouched) under the
  base model's parameter names, through its in-place reload, or the adapter (`write_adapter`).
  An adapted module whose weight is tied (tie_word_embeddings) cannot be merged (`tied_adapted_layers`).
- dropout: none. The adapter is built without it whatever `model.lora.dropout` says (lint
  `lora-dropout`), like every other dropout of the actor and critic (`engine.roles.disable_dropout`):
  the update's first forward must reproduce pi_behaviour, which is computed without dropout.
- checkpoints: the trainable parameters only, and the base weights' fingerprint
  (`base_fingerprint`): the frozen base comes from `model.policy` again on resume, and must be the same.
- final/: the adapter in PEFT format (adapter_config.json, adapter_model.safetensors) and, with
  `trainer.save_merged`, the merged model in HF format in final/merged/.

`peft` is imported only when a recipe sets `model.lora` (validate/schema never import it).
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Iterator

from ..errors import UserError
from .lora_names import check_rollout_sync  # noqa: F401  (imported from here too)
from .lora_names import targets_message, tied_message, unmatched_targets

PEFT_PREFIX = "base_model.model."   # PeftModel's prefix before the wrapped model's parameter names
MERGED_DIR = "merged"               # final/merged/: the merged model (trainer.save_merged)


class LoraError(UserError):
    """A LoRA setting that cannot be used with this model (message is user-facing)."""


def lora_config(cfg, task_type: str | None = None):
    """PEFT's LoraConfig for the recipe's `model.lora` section. Always without dropout, whatever
    `model.lora.dropout` says: every RL forward runs without dropout (`engine.roles.disable_dropout`;
    lint `lora-dropout`), so that the update's first forward at theta = theta_old reproduces
    pi_behaviour and the ratio is exactly 1."""
    from peft import LoraConfig

    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(cfg.target_modules)
    return LoraConfig(r=int(cfg.r), lora_alpha=float(cfg.alpha), lora_dropout=0.0,
                      target_modules=targets, bias=cfg.bias, task_type=task_type)


def apply_lora(model, cfg, task_type: str | None = "CAUSAL_LM", autocast_adapter_dtype: bool = True):
    """`model` wrapped in a PEFT model with a fresh adapter (lora_B = 0: the output is the base
    model's until the adapter trains); base weights frozen. `task_type`: CAUSAL_LM for a causal
    LM (actor, rollout copy), None for a bare backbone (the critic's). Every name listed in
    `target_modules` must match a module (`check_targets`)."""
    from peft import get_peft_model

    check_targets(model, cfg.target_modules)
    try:
        peft_model = get_peft_model(model, lora_config(cfg, task_type), autocast_adapter_dtype=autocast_adapter_dtype)
    except ValueError as err:
        text = str(err).splitlines()[0][:300]
        if "not found" in text or "target" in text.lower():
            names = sorted(adaptable_module_names(model))
            raise LoraError(f"model.lora.target_modules {cfg.target_modules!r}: {text}\n"
                            f"  modules an adapter can target in this model: {', '.join(names) or '(none)'}\n"
                            f"  fix: list some of these names, or use target_modules: all-linear") from err
        raise
    check_rank(peft_model, int(cfg.r))
    return peft_model


def check_targets(model, target_modules) -> None:
    """Every listed name must match some module of `model` (PEFT only stops when none does: a typo
    next to a good name would train without it). A bare backbone (the critic's) has no output
    head: a listed head name is the actor's, not a typo."""
    ignore = ("lm_head",) if model.get_output_embeddings() is None else ()
    names = [n for n, _ in model.named_modules() if n]
    unmatched = unmatched_targets(names, target_modules, ignore)
    if unmatched:
        msg, fix = targets_message(target_modules, unmatched, adaptable_module_names(model), "this model")
        raise LoraError(f"{msg}\n  fix: {fix}")


def check_rank(peft_model, r: int) -> None:
    """r above a targeted layer's smaller dimension adds parameters but no rank (B @ A cannot
    exceed min(in, out)): an error naming the layer. The lint rule `lora-r-large` says the same
    for models it can size without loading them."""
    from peft.tuners.lora import LoraLayer

    dims = [(min(m.in_features, m.out_features), name) for name, m in peft_model.named_modules()
            if isinstance(m, LoraLayer) and getattr(m, "in_features", None)]
    if not dims:
        return
    smallest, name = min(dims)
    if r > smallest:
        raise LoraError(f"model.lora.r {r} is larger than the smallest targeted dimension: {name.removeprefix(PEFT_PREFIX)} "
                        f"is {smallest} wide, so the adapter's rank cannot exceed {smallest}\n"
                        f"  fix: set model.lora.r <= {smallest}, or leave that module out of model.lora.target_modules")


def adaptable_module_names(model) -> set[str]:
    """Last name components of the model's linear layers and embeddings (what target_modules
    usually names)."""
    import torch

    kinds = (torch.nn.Linear, torch.nn.Embedding)
    return {name.rsplit(".", 1)[-1] for name, m in model.named_modules()
            if name and (isinstance(m, kinds) or type(m).__name__ == "Conv1D")}


def _module(engine_or_module):
    return getattr(engine_or_module, "module", engine_or_module)


def adapter_reference_ok(recipe) -> bool:
    """The reference can be the actor with its adapter disabled: LoRA on, no separate reference
    model, and no trained biases (those sit in the base layers: disabling the adapter keeps them)."""
    lora = recipe.model.lora
    return lora is not None and not recipe.model.reference and lora.bias == "none"


def trainable_summary(engine) -> tuple[int, int]:
    """(trainable, total) parameter counts (full sizes under ZeRO-3)."""
    trainable = total = 0
    for p in _module(engine).parameters():
        n = getattr(p, "ds_numel", p.numel())
        total += n
        trainable += n if p.requires_grad else 0
    return trainable, total


# ------------------------------------------------------------------ the reference


class _AdapterDisabled:
    """Calls the actor's PEFT model with the adapter disabled and in eval mode (no dropout), and
    shows the attributes the trainer's passes read (config, parameters, modules: the layers'
    gradient checkpointing)."""

    def __init__(self, peft_model):
        self._peft = peft_model

    @property
    def config(self):
        return self._peft.get_base_model().config

    def modules(self):
        return self._peft.modules()

    def parameters(self):
        return self._peft.parameters()

    def named_parameters(self, *args, **kwargs):
        return self._peft.named_parameters(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        peft = self._peft
        training = peft.training
        if training:
            peft.eval()
        try:
            with peft.disable_adapter():
                return peft(*args, **kwargs)
        finally:
            if training:
                peft.train()


class AdapterDisabledReference:
    """The reference role with LoRA: `.module` runs the actor's own module with the adapter
    disabled, so its log-probs are the base model's, with no second copy of the weights.
    Stands where a frozen DeepSpeed engine would (`Components.reference`)."""

    def __init__(self, actor_engine):
        self.actor = actor_engine
        self.module = _AdapterDisabled(_module(actor_engine))

    def eval(self):
        return self

    def zero_optimization_stage(self) -> int:
        return getattr(self.actor, "zero_optimization_stage", lambda: 0)()


# ------------------------------------------------------------------ rollout


def rollout_model(model, cfg):
    """The hf rollout engine's model: `model` (a plain causal LM) with the same adapter layers as
    the actor's, returned as the HF model itself (not the PEFT wrapper: `generate` runs as usual).
    Its parameter names are the actor's without PEFT's prefix (`hf_rollout_name`); the engine
    then points them at the actor's tensors. Its own adapter's random init does not touch the
    trainer's RNG streams."""
    import torch

    with torch.random.fork_rng(devices=[]):
        peft_model = apply_lora(model, cfg, autocast_adapter_dtype=False)
    return peft_model.get_base_model()


def hf_rollout_name(name: str) -> str:
    """An actor parameter name as the hf rollout model (the unwrapped base model) names it."""
    return name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name


def base_name(name: str) -> str:
    """An actor parameter name as the base model's checkpoint names it (`...q_proj.weight`)."""
    return hf_rollout_name(name).replace(".base_layer.", ".")


def merged_params(engine) -> Iterator[tuple[str, "object"]]:
    """(base-model name, tensor) for every base parameter with the adapter merged in:
    W + scaling * B @ A for adapted layers (PEFT's own delta, new tensors: the actor's weights
    are never modified), the base tensors as they are otherwise. Adapter parameters are not
    yielded; a tied weight once (as `named_parameters` does). Under ZeRO-3 each module's
    parameters are gathered while it is read."""
    from peft.tuners.lora import LoraLayer

    from ..engine.weights import is_zero3

    peft_model = _module(engine)
    base = peft_model.get_base_model()
    adapter = peft_model.active_adapter
    zero3 = is_zero3(engine)
    tied = tied_adapted_layers(peft_model)
    if tied:
        raise LoraError(tied_message(tied, "the merged weights (vLLM's rollout.lora_sync: merged, trainer.save_merged)"))
    seen: set[int] = set()
    lora_prefixes: list[str] = []
    for mod_name, mod in base.named_modules():
        if any(mod_name.startswith(p) for p in lora_prefixes):
            continue   # inside an adapted layer: handled with it
        if isinstance(mod, LoraLayer):
            lora_prefixes.append(mod_name + ".")
            layer = mod.get_base_layer()
            with _gathered(list(mod.parameters()), zero3):
                delta = mod.get_delta_weight(adapter) if adapter in mod.lora_A or adapter in getattr(
                    mod, "lora_embedding_A", {}) else None
                for pname, p in layer.named_parameters(recurse=False):
                    if id(p) in seen:
                        continue
                    seen.add(id(p))
                    t = p.detach()
                    if pname == "weight" and delta is not None:
                        t = t + delta.to(t.dtype)
                    elif zero3:
                        t = t.clone()
                    yield f"{mod_name}.{pname}", t
            continue
        own = [(n, p) for n, p in mod.named_parameters(recurse=False) if id(p) not in seen]
        if not own:
            continue
        with _gathered([p for _, p in own], zero3):
            for pname, p in own:
                seen.add(id(p))
                yield (f"{mod_name}.{pname}" if mod_name else pname), (p.detach().clone() if zero3 else p.detach())


def tied_adapted_layers(engine_or_module) -> list[str]:
    """Adapted layers whose weight is tied to another module's (lm_head in `target_modules` of a
    model with tie_word_embeddings): their merged weight W + BA cannot be written back, since the
    same tensor is also the input embedding, which the adapter does not change."""
    from peft.tuners.lora import LoraLayer

    module = _module(engine_or_module)
    owners: dict[int, int] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        owners[id(p)] = owners.get(id(p), 0) + 1
    out = []
    for name, m in module.named_modules():
        if isinstance(m, LoraLayer):
            w = getattr(m.get_base_layer(), "weight", None)
            if w is not None and owners.get(id(w), 0) > 1:
                out.append(hf_rollout_name(name))
    return out


def _gathered(params, zero3: bool):
    if not zero3:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def input_embedding_base_name(engine) -> str | None:
    """The base-model name of the input embedding (vLLM's tied LM head is sent under it)."""
    peft_model = _module(engine)
    try:
        emb = peft_model.get_input_embeddings().weight
    except Exception:  # noqa: BLE001
        return None
    for name, p in peft_model.named_parameters():
        if p is emb:
            return base_name(name)
    return None


# ------------------------------------------------------------------ checkpoints


def base_fingerprint(engine) -> str:
    """sha256 over the frozen (base) parameters, in the module's order: each one's name, shape,
    dtype and bytes. The checkpoint keeps it; a resume whose `model.policy` now loads other base
    weights (edited, or a hub id resolving to a new revision) is refused. Linear in the model's
    size (~0.3 s for SmolLM2-135M's 540 MB on one core); under ZeRO-3 each parameter is gathered
    in turn (every rank takes part)."""
    import hashlib

    import torch

    from ..engine.weights import is_zero3

    zero3 = is_zero3(engine)
    h = hashlib.sha256()
    for name, p in _module(engine).named_parameters():
        if p.requires_grad:
            continue
        with _gathered([p], zero3):
            t = p.detach().to("cpu").contiguous()
            h.update(f"{base_name(name)} {tuple(t.shape)} {t.dtype}\n".encode())
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


# ------------------------------------------------------------------ final/


def adapter_state_dict(engine) -> dict:
    """The trainable parameters (adapter, and trained biases) under the PEFT model's names, on
    CPU, gathered under ZeRO-3 (every rank takes part)."""
    from ..engine.weights import is_zero3

    peft_model = _module(engine)
    named = [(n, p) for n, p in peft_model.named_parameters() if p.requires_grad]
    with _gathered([p for _, p in named], is_zero3(engine)):
        return {n: p.detach().float().cpu().clone() for n, p in named}


def save_final(engine, tokenizer, out: Path, rank: int, save_merged: bool) -> None:
    """Write the adapter in PEFT format into `out` (and the merged HF model into out/merged/ with
    `save_merged`). Every rank calls it (ZeRO-3 gathers); rank 0 writes."""
    state = adapter_state_dict(engine)
    merged = {n: t.float().cpu() for n, t in merged_params(engine)} if save_merged else None
    if rank != 0:
        return
    peft_model = _module(engine)
    peft_model.save_pretrained(str(out), state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if merged is not None:
        base = peft_model.get_base_model()
        _save_plain(base, merged, out / MERGED_DIR)
        tokenizer.save_pretrained(out / MERGED_DIR)


def _save_plain(base, state: dict, out: Path) -> None:
    """A `from_pretrained` directory of a plain model of `base`'s config holding `state`."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(base.config)
    plain.load_state_dict(state, strict=False, assign=True)
    plain.tie_weights()
    missing = [n for n, p in plain.named_parameters() if p.is_meta]
    if missing:
        raise RuntimeError(f"merged export: no weights for {missing[:5]}")
    if getattr(base, "generation_config", None) is not None:
        plain.generation_config = base.generation_config
    plain.save_pretrained(out, safe_serialization=True)


# ------------------------------------------------------------------ vLLM's adapter sync, the start-up line


def write_adapter(engine, out: Path) -> None:
    """The adapter in PEFT format (adapter_config.json, adapter_model.safetensors) in `out`, as
    vLLM's LoRARequest loads it. Every rank calls it (ZeRO-3 gathers the adapter)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    peft_model = _module(engine)
    state = get_peft_model_state_dict(peft_model, state_dict=adapter_state_dict(engine))
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "adapter_model.safetensors"))
    peft_model.peft_config[peft_model.active_adapter].save_pretrained(str(out))


def startup_line(c) -> str:
    lora = c.recipe.model.lora
    trainable, total = trainable_summary(c.actor)
    ref = ("the actor with its adapter disabled (no copy)" if isinstance(c.reference, AdapterDisabledReference)
           else "a full copy" if c.reference is not None else "none")
    targets = lora.target_modules if isinstance(lora.target_modules, str) else ",".join(lora.target_modules)
    sync = "shared adapter tensors" if c.rollout.name == "hf" else f"{c.recipe.rollout.lora_sync} weights"
    unused = (f"; model.lora.dropout {lora.dropout:g} unused: RL forwards run without dropout (lint lora-dropout)"
              if lora.dropout > 0 else "")
    return (f"LoRA: r {lora.r}, alpha {lora.alpha:g} (scale {lora.alpha / lora.r:g}), targets {targets}; actor trains "
            f"{trainable:,} of {total:,} parameters ({100.0 * trainable / max(total, 1):.2f}%); reference: {ref}; "
            f"rollout sync: {sync}{unused}")
