"""What a LoRA recipe can ask for, decided from names and configs alone (no torch, no peft):
the lint rules (recipe/rules_lora.py) and the start-of-run checks (models/adaptation.py) share it.

- target names: PEFT adapts the modules whose dotted name is a listed name or ends with "." + it;
  every listed name must match some module (`unmatched_targets`), with a did-you-mean
  (`targets_message`). A Llama / Qwen2 model's module names are known from its config
  (`layout_module_names`).
- tied modules: with tie_word_embeddings the input embedding and the output head are one tensor.
  An adapter on either makes the adapted model's head differ from its embedding, which merged
  weights (one tensor) cannot hold: vLLM's `rollout.lora_sync: merged` and `trainer.save_merged`
  refuse it (`tied_message`).
- vLLM's LoRA: ranks it accepts, and what its adapters cannot carry (`check_rollout_sync`).
"""

from __future__ import annotations

import difflib
from typing import Iterable, Optional

HEAD = "lm_head"                  # a Llama / Qwen2 causal LM's output head
EMBEDDING = "embed_tokens"        # ... and its input embedding
TIED_NAMES = (EMBEDDING, HEAD)    # the modules that share one tensor under tie_word_embeddings
LAYOUT_TYPES = ("llama", "qwen2")  # model types whose module names `layout_module_names` knows


# ---------------------------------------------------------------- target names


def target_list(target_modules) -> list[str]:
    """The listed names (`all-linear` lists none: it cannot miss)."""
    return [] if isinstance(target_modules, str) else list(target_modules)


def matches(module_name: str, target: str) -> bool:
    """PEFT's rule for a listed name: the module's dotted name is it, or ends with "." + it."""
    return module_name == target or module_name.endswith("." + target)


def unmatched_targets(module_names: Iterable[str], target_modules, ignore: Iterable[str] = ()) -> list[str]:
    """The listed names that match no module (`ignore`: names allowed to match nothing)."""
    names = list(module_names)
    return [t for t in target_list(target_modules)
            if t not in ignore and not any(matches(n, t) for n in names)]


def suggestion(target: str, candidates: Iterable[str]) -> Optional[str]:
    """The close candidate for a listed name (its last component compared), or None."""
    prefix, _, last = target.rpartition(".")
    close = difflib.get_close_matches(last, sorted(set(candidates)), n=1, cutoff=0.6)
    return None if not close else (f"{prefix}.{close[0]}" if prefix else close[0])


def fixed_targets(target_modules, unmatched: list[str], candidates: Iterable[str]) -> list[str]:
    """The list with each unmatched name replaced by its suggestion (dropped where there is none)."""
    candidates = list(candidates)
    out = []
    for t in target_list(target_modules):
        new = suggestion(t, candidates) if t in unmatched else t
        if new and new not in out:
            out.append(new)
    return out


def targets_message(target_modules, unmatched: list[str], candidates: Iterable[str], where: str) -> tuple[str, str]:
    """(message, fix) for listed names that match no module of `where` (e.g. "builtin:tiny-llama")."""
    candidates = sorted(set(candidates))
    hints = [f"{t} (did you mean {s}?)" if (s := suggestion(t, candidates)) else t for t in unmatched]
    fixed = fixed_targets(target_modules, unmatched, candidates)
    msg = (f"model.lora.target_modules: {', '.join(hints)} matches no module of {where}: PEFT adapts the modules "
           f"whose name is, or ends with, a listed name; a name that matches nothing trains nothing. "
           f"Modules an adapter can target there: {', '.join(candidates) or '(none)'}")
    fix = (f"set model.lora.target_modules: [{', '.join(fixed)}]" if fixed
           else "list some of those names, or use target_modules: all-linear")
    return msg, fix


def layout_module_names(model_type: str, layers: int, head: bool = True) -> Optional[list[str]]:
    """Every module name of a Llama / Qwen2 causal LM with `layers` decoder layers (`head`:
    the causal LM with its output head; without: the bare backbone a critic uses, whose names
    lack the `model.` prefix), or None for another model type."""
    if model_type not in LAYOUT_TYPES:
        return None
    top = "model." if head else ""
    names = [f"{top}{EMBEDDING}", f"{top}layers", f"{top}norm", f"{top}rotary_emb"]
    for i in range(int(layers)):
        layer = f"{top}layers.{i}"
        names += [layer, f"{layer}.self_attn", f"{layer}.mlp", f"{layer}.mlp.act_fn",
                  f"{layer}.input_layernorm", f"{layer}.post_attention_layernorm"]
        names += [f"{layer}.self_attn.{p}_proj" for p in "qkvo"]
        names += [f"{layer}.mlp.{p}_proj" for p in ("gate", "up", "down")]
    return names + (["model", HEAD] if head else [])


def adaptable_names(module_names: Iterable[str]) -> list[str]:
    """The last components of a Llama / Qwen2 layout's linear layers and embedding (what a
    target list names)."""
    ends = ("_proj", EMBEDDING, HEAD)
    return sorted({n.rsplit(".", 1)[-1] for n in module_names if n.endswith(ends)})


# ---------------------------------------------------------------- tied modules


def tied_targets(tied: bool, target_modules) -> list[str]:
    """Listed names that adapt a module sharing its tensor under tie_word_embeddings (by the
    Llama / Qwen2 names; the start-of-run check finds any other model's from the loaded modules)."""
    if not tied:
        return []
    return [t for t in target_list(target_modules) if t.rsplit(".", 1)[-1] in TIED_NAMES]


def merged_consumers(recipe, engine_name: str) -> list[str]:
    """What takes the merged weights in this run: vLLM's `rollout.lora_sync: merged` sync (when
    the engine is vllm) and `trainer.save_merged`'s final/merged/."""
    out = []
    if engine_name == "vllm" and recipe.rollout.lora_sync == "merged":
        out.append("vLLM's merged-weight sync (rollout.lora_sync: merged)")
    if recipe.trainer.save_merged:
        out.append("trainer.save_merged's final/merged/")
    return out


def tied_message(tied: list[str], what: str) -> str:
    short = sorted({n.rsplit(".", 1)[-1] for n in tied})
    return (f"model.lora.target_modules adapts {', '.join(tied)}, whose weight is one tensor shared by the input "
            f"embedding and the output head (tie_word_embeddings): {what} cannot hold the adapted model, whose "
            f"head and embedding differ once the adapter trains (merging into the one tensor would drop the "
            f"adapter from one of them or apply it to both)\n"
            f"  fix: leave {', '.join(short)} out of model.lora.target_modules, or use rollout.engine: hf "
            f"(it samples with the adapter itself) and trainer.save_merged: false (final/ holds the adapter, "
            f"which PeftModel.from_pretrained applies exactly)")


# ---------------------------------------------------------------- vLLM's LoRA


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)   # vLLM's allowed max_lora_rank values


def vllm_max_lora_rank(r: int) -> int | None:
    """The smallest rank vLLM accepts as max_lora_rank that holds `r`; None above vLLM's largest."""
    return next((x for x in VLLM_LORA_RANKS if x >= int(r)), None)


def check_rollout_sync(recipe, engine_name: str) -> str | None:
    """None when `rollout.lora_sync` works with this rollout engine, else the user-facing error.
    `adapter` with vLLM: the engine loads the adapter (A, B) as a vLLM LoRA; vLLM's adapters carry
    no biases and have a largest rank."""
    lora = recipe.model.lora
    if lora is None or recipe.rollout.lora_sync != "adapter" or engine_name != "vllm":
        return None
    if lora.bias != "none":
        return (f"rollout.lora_sync: adapter with model.lora.bias {lora.bias}: vLLM's LoRA adapters carry no "
                "biases, so the engine would sample with stale ones\n"
                "  fix: set rollout.lora_sync: merged (the merged weights include the biases), or model.lora.bias: none")
    if vllm_max_lora_rank(lora.r) is None:
        return (f"rollout.lora_sync: adapter with model.lora.r {lora.r}: vLLM's LoRA supports ranks up to "
                f"{VLLM_LORA_RANKS[-1]}\n  fix: set rollout.lora_sync: merged, or model.lora.r <= {VLLM_LORA_RANKS[-1]}")
    return None
