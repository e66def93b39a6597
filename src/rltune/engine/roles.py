"""DeepSpeed engines for the three model roles: actor, critic (value head), reference.

Each role is its own `deepspeed.initialize` with the recipe's ZeRO stage, clipping and
optimizer. Gradient accumulation is ours (`managed_gradient_accumulation: false`): the
trainer weights each micro-batch loss by its share of the update's tokens, calls
`backward` per micro-batch and `step` once per update, and can skip a non-finite update
without touching the weights.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from ..models.checkpointing import enable_checkpointing
from ..models.adaptation import adaptation_for
from ..models.loading import load_backbone, load_causal_lm


class ValueModel(nn.Module):
    """A causal-LM backbone with a scalar value head: (B, L) tokens -> (B, L) values."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        self.value_head = nn.Linear(hidden, 1)
        nn.init.normal_(self.value_head.weight, std=1.0 / math.sqrt(hidden + 1))
        nn.init.zeros_(self.value_head.bias)
        self.config = backbone.config

    def gradient_checkpointing_enable(self, **kw):
        self.backbone.gradient_checkpointing_enable(**kw)

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None):
        """`past_key_values`: a cache the backbone's attention layers use as given (the
        shared-prompt passes hand one in: extended by the prompt pass, read by the response
        pass); None = no cache. (use_cache only asks the model to make a cache of its own.)"""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=past_key_values, use_cache=False).last_hidden_state  # (B, L, H)
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)         # (B, L)


# float attributes through which HF modules hand a dropout probability to a functional call in
# train mode (Llama/Qwen2 attention: `dropout=0.0 if not self.training else self.attention_dropout`),
# and LayerDrop's probability of skipping a whole layer in train mode (OPT, BART, Whisper)
_DROPOUT_ATTR_ENDS = ("dropout", "dropout_p", "dropout_prob", "dropout_rate", "pdrop", "layerdrop")
LOG = logging.getLogger("rltune")


def disable_dropout(model: nn.Module) -> list[str]:
    """Every dropout of `model` off, for good: nn.Dropout modules (and their variants) get p = 0,
    and float attributes that feed a functional dropout (a config's attention_dropout copied into
    the attention module) are set to 0. Returns what was on ("name.attr p").

    Why: the policy-gradient ratio pi_theta / pi_old must be exactly 1 at theta = theta_old.
    pi_behaviour (and the reference, the critic's old values) are computed in eval mode, the
    update's forward in train mode (kept: HF applies gradient checkpointing only in train mode);
    dropout there makes every ratio noise (LoRA dropout 0.05: per-sequence mean log-ratio std
    1.4e-3, 44% of sequences clipped by GSPO's 3e-4 range before any weight moved). TRL and verl
    disable dropout for RL the same way. The models' configs are left as they are (final/ saves them)."""
    was_on = []
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            if m.p:
                was_on.append(f"{name or 'model'} p {m.p:g}")
                m.p = 0.0
            continue
        for attr, value in list(vars(m).items()):
            if (type(value) is float and value > 0 and attr.lower().endswith(_DROPOUT_ATTR_ENDS)):
                was_on.append(f"{name + '.' if name else ''}{attr} {value:g}")
                setattr(m, attr, 0.0)
    return was_on


def _dropout_off(model: nn.Module, role: str) -> None:
    was_on = disable_dropout(model)
    if was_on:
        more = f" (+{len(was_on) - 3} more)" if len(was_on) > 3 else ""
        LOG.info("%s: dropout turned off (RL forwards run without dropout, so the first update's ratio is 1): %s%s",
                 role, ", ".join(was_on[:3]), more)


def lr_factor(update: int, warmup: int, total: int, schedule: str, min_ratio: float) -> float:
    """LR multiplier for optimizer update number `update` (0-based)."""
    if warmup > 0 and update < warmup:
        return (update + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return 1.0
    progress = min(1.0, (update - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return 1.0 - (1.0 - min_ratio) * progress
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def ds_config(opt_cfg, precision: str, micro_batch: int, device: str, with_optimizer: bool) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": float(opt_cfg.grad_clip or 0.0) if with_optimizer else 0.0,
        "zero_optimization": {"stage": opt_cfg.zero_stage if with_optimizer else 0},
        # DeepSpeed's overflow check skips an update with inf/nan gradients (run_update relies on
        # it under ZeRO-2/3, where the gradients never sit in .grad); pinned, not left to defaults
        "bf16": {"enabled": precision == "bf16", "check_grad_overflow": True},
        # hysteresis 1: every fp16 overflow halves the loss scale at once (default 2 skips one
        # overflow without backing off)
        "fp16": {"enabled": precision == "fp16", "initial_scale_power": 16, "hysteresis": 1},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if with_optimizer and opt_cfg.offload_optimizer:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if with_optimizer and opt_cfg.offload_optimizer and device.startswith("cuda"):
        # offloaded optimizer state: DeepSpeed's CPU Adam (its cpu_adam op) steps it on the host.
        # Otherwise the engine gets torch's fused AdamW (`_initialize`), on GPUs too: DeepSpeed's
        # own FusedAdam is compiled on first use and needs nvcc, which CUDA runtime images lack.
        cfg["optimizer"] = {"type": "AdamW", "params": {
            "lr": opt_cfg.lr, "betas": list(opt_cfg.betas), "eps": opt_cfg.eps,
            "weight_decay": opt_cfg.weight_decay}}
    return cfg


def _initialize(model: nn.Module, opt_cfg, precision, micro_batch, device, total_updates):
    import deepspeed

    config = ds_config(opt_cfg, precision, micro_batch, device, with_optimizer=True)
    optimizer = None
    if "optimizer" not in config:
        # torch's fused AdamW (no DeepSpeed op to compile), on CPUs and GPUs. It updates every
        # tensor in place in one kernel: on CPU ~5x faster than the per-parameter loop on a 135M
        # model and without its temporaries (~0.2 GiB for SmolLM2's tied embedding); TRL's
        # default on torch >= 2.8. ZeRO 1-3 shard its state like DeepSpeed's own Adam's.
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=opt_cfg.lr,
                                      betas=tuple(opt_cfg.betas), eps=opt_cfg.eps,
                                      weight_decay=opt_cfg.weight_decay, fused=True)

    def scheduler(opt):
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda u: lr_factor(
            u, opt_cfg.warmup_steps, total_updates, opt_cfg.lr_schedule, opt_cfg.min_lr_ratio))

    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=config, model_parameters=None if optimizer else
                                           [p for p in model.parameters() if p.requires_grad])  # LoRA: adapter only
    _undo_state_warmup(engine)
    if engine.zero_optimization_stage() == 0 and engine.dp_world_size == 1:
        # one rank: DeepSpeed's all-reduce at the step would average the gradients over this rank
        # alone, after flattening all of them into a copy (a trainable-size buffer: 0.5 GiB for
        # SmolLM2 in fp32, the update's peak on CPU). Skipped; nothing else changes.
        engine.enable_backward_allreduce = False
    return engine


def _undo_state_warmup(engine) -> None:
    """ZeRO 0 in bf16/fp16 wraps a torch optimizer in DeepSpeed's FP16_UnfusedOptimizer, which
    creates the optimizer state by one step on zero gradients. That step counts: Adam's first
    real update is then bias-corrected as its second (0.74 x lr on the first update, 0.9x on the
    second, ...), and AdamW's decoupled weight decay has shrunk the fp32 master weights once
    before any training. Undone here: the state is emptied (torch creates it on the first real
    step) and the master weights are copied from the model's again (they were cloned from them)."""
    from deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    opt = engine.optimizer
    if not isinstance(opt, FP16_UnfusedOptimizer):
        return
    opt.optimizer.state.clear()
    with torch.no_grad():
        for masters, params in zip(opt.fp32_groups, opt.fp16_groups):
            for master, p in zip(masters, params):
                master.copy_(p.detach().float())


def _zero3_context(opt_cfg, precision, micro_batch, device):
    """Under ZeRO-3, HF models must be constructed with HfDeepSpeedConfig alive."""
    if opt_cfg.zero_stage != 3:
        return None
    from transformers.integrations import HfDeepSpeedConfig

    return HfDeepSpeedConfig(ds_config(opt_cfg, precision, micro_batch, device, with_optimizer=True))


def build_actor(recipe, device: str, total_updates: int, adaptation=None):
    """`adaptation`: the run's (models/adaptation.py); by default the recipe's."""
    adaptation = adaptation or adaptation_for(recipe)
    keep = _zero3_context(recipe.actor, recipe.trainer.precision, recipe.train.micro_batch_size, device)  # noqa: F841
    model = load_causal_lm(recipe.model.policy, "fp32", recipe.model.attn_implementation, device,
                           recipe.model.trust_remote_code)
    model.config.use_cache = False
    enable_checkpointing(model, recipe.actor.gradient_checkpointing)   # false | full | selective
    model = adaptation.wrap(model, "actor")   # LoRA: base frozen, only the adapter trains
    _dropout_off(model, "actor")
    return adaptation.attach(_initialize(model, recipe.actor, recipe.trainer.precision,
                                         recipe.train.micro_batch_size, device, total_updates))


def build_critic(recipe, device: str, total_updates: int, adaptation=None):
    adaptation = adaptation or adaptation_for(recipe)
    spec = recipe.model.critic or recipe.model.policy
    keep = _zero3_context(recipe.critic, recipe.trainer.precision, recipe.train.micro_batch_size, device)  # noqa: F841
    backbone = load_backbone(spec, "fp32", recipe.model.attn_implementation, device, recipe.model.trust_remote_code)
    backbone = adaptation.wrap(backbone, "critic")   # LoRA: the backbone's adapter; the value head trains fully
    # LoRA: peft makes the adapters after loading, unpartitioned and fp32, and ZeRO-3 flattens the
    # trainable partitions into one buffer of a single dtype: the value head joins them as they are
    adapters = any(p.requires_grad and not hasattr(p, "ds_id") for p in backbone.parameters())
    if recipe.critic.zero_stage == 3 and not adapters:
        import deepspeed

        # the value head is partitioned like the backbone, in the engine's precision
        with deepspeed.zero.Init(config_dict_or_path=ds_config(
                recipe.critic, recipe.trainer.precision, recipe.train.micro_batch_size, device, True)):
            model = ValueModel(backbone)
    else:
        model = ValueModel(backbone)
    _dropout_off(model, "critic")
    enable_checkpointing(backbone, recipe.critic.gradient_checkpointing)
    return adaptation.attach(_initialize(model, recipe.critic, recipe.trainer.precision,
                                         recipe.train.micro_batch_size, device, total_updates))


def build_reference(recipe, device: str):
    """Frozen, inference only: a stage-0 engine without optimizer (stages 1-2 need one)."""
    import deepspeed

    spec = recipe.model.reference or recipe.model.policy
    model = load_causal_lm(spec, "fp32", recipe.model.attn_implementation, device, recipe.model.trust_remote_code)
    model.config.use_cache = False
    model.eval().requires_grad_(False)
    config = ds_config(recipe.actor, recipe.trainer.precision, recipe.train.micro_batch_size, device,
                       with_optimizer=False)
    engine, _, _, _ = deepspeed.initialize(model=model, config=config)
    engine.eval()
    return engine


def set_lr(engine, base_lr: float) -> None:
    """Change a role's base learning rate (autotune); the schedule factor still applies."""
    sched = engine.lr_scheduler
    if sched is not None and hasattr(sched, "base_lrs"):
        factor = sched.lr_lambdas[0](max(sched.last_epoch, 0)) if hasattr(sched, "lr_lambdas") else 1.0
        sched.base_lrs = [base_lr for _ in sched.base_lrs]
        for group in engine.optimizer.param_groups:
            group["lr"] = base_lr * factor
    else:
        for group in engine.optimizer.param_groups:
            group["lr"] = base_lr


def current_lr(engine) -> float:
    return float(engine.get_lr()[0])
