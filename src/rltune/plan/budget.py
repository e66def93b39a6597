"""The memory formulas of `rltune plan`, as small pure functions (bytes; docs/plan.md derives each).

Sources:
- training state per parameter: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
  Trillion Parameter Models" (2020, arXiv:1910.02054), sec. 3.1 and 5: mixed-precision Adam keeps
  2 (16-bit weights) + 2 (16-bit gradients) + 12 (fp32 master weights, momentum, variance) bytes
  per parameter; stage 1 shards the 12 over the data-parallel ranks, stage 2 also the gradients,
  stage 3 also the weights.
- activations: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
  (2022, arXiv:2205.05198), sec. 4: the tensors a layer keeps for its backward pass, per token;
  with full recomputation only each layer's input is kept.
- KV cache: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes per token (vLLM's own sizing).
"""

from __future__ import annotations

from rltune.plan.arch import Arch

GiB = 1 << 30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# DeepSpeed defaults rltune does not override (runtime/zero/config.py): the ZeRO-2 gradient bucket
# (reduce_bucket_size, elements; the stage-0 all-reduce bucket, MEMORY_OPT_ALLREDUCE_SIZE, is the
# same 5e8) and the ZeRO-3 prefetch bucket (stage3_prefetch_bucket_size)
ZERO2_BUCKET = 500_000_000
ZERO3_PREFETCH = 50_000_000
# one (chunk, vocab) float32 block of the chunked log-prob (algo/logits.py CHUNK_ELEMS)
LOGPROB_CHUNK_ELEMS = 1 << 26
# one chunk of the output layer run in chunks (train/chunked_head.py takes both from here). On CUDA
# chunks are twice as large (220 positions of a 151,936 vocabulary): with 110 the pass was bound by
# the host launching each chunk's kernels. Measured on an H200 (benchmarks/bench_update_gpu.py,
# Qwen2.5-0.5B shape, 16 rows of 1024 + 512 tokens): selective 0.56 -> 0.41 s a pass for 1.24 ->
# 1.60 GiB; at 4x (883 positions) selective was slower (0.49 s) and held 4.2 GiB.
HEAD_CHUNK_ELEMS = 1 << 24
CUDA_CHUNK_FACTOR = 2


def head_chunk_elems(device: str) -> int:
    """Logits per chunk of the output layer on `device` ("cpu" | "cuda"): chunked_head.chunk_elems."""
    return HEAD_CHUNK_ELEMS * (CUDA_CHUNK_FACTOR if device == "cuda" else 1)


def train_state(total: int, trainable: int, precision: str, zero: int, world: int,
                offload: bool = False) -> dict:
    """Per-device bytes of one trained model: {"weights", "grads", "optimizer", "step"}.

    16-bit (bf16/fp16) with DeepSpeed: weights 2, gradients 2, fp32 master + Adam m, v 12 bytes per
    trainable parameter (ZeRO paper's K = 12); frozen parameters (LoRA's base) only have weights.
    fp32: weights 4, gradients 4, Adam m, v 8 (no master copy: the weights are fp32 already).
    Stage >= 1 divides the optimizer state by `world`, >= 2 the gradients, 3 the weights.
    `step`: the optimizer step's extra at stage 0: with several ranks DeepSpeed's gradient all-reduce
    (run at the step; one rank skips it, engine/roles.py) flattens the gradients into buckets of up to
    5e8 elements, and in 16-bit its
    FP16/BF16 optimizer then flattens them into one fp32 buffer (4 bytes per trainable parameter).
    `offload` (ZeRO-Offload): the optimizer state lives in host memory (0 on the device).
    """
    w = DTYPE_BYTES[precision]
    opt_bytes = 12 if w == 2 else 8
    weights = total * w
    grads = trainable * w
    optimizer = trainable * opt_bytes
    step = 0
    if zero == 0:
        step = max(min(ZERO2_BUCKET, trainable) * w if world > 1 else 0, trainable * 4 if w == 2 else 0)
    if zero >= 1:
        optimizer //= world
    if zero >= 2:
        grads //= world
    if zero >= 3:
        weights //= world
    if offload:
        optimizer, step = 0, 0
    return {"weights": weights, "grads": grads, "optimizer": optimizer, "step": step}


def zero_working(arch: Arch, trainable: int, precision: str, zero: int) -> int:
    """ZeRO's own buffers on a device: stage 2 reduces gradients through a bucket of up to 5e8
    elements; stage 3 gathers a layer's weights whole (and prefetches up to 5e7 more) around each
    forward and backward."""
    w = DTYPE_BYTES[precision]
    if zero == 2:
        return min(ZERO2_BUCKET, trainable) * w
    if zero == 3:
        return (arch.layer_params() + min(ZERO3_PREFETCH, arch.params())) * w
    return 0


def kv_width(arch: Arch, attn: str) -> int:
    """Width of the k and v that attention reads, per token. transformers' SDPA and eager paths
    repeat grouped key/value heads up to all heads when there is an attention mask (RL batches are
    always padded, so there is): h each. FlashAttention-2 reads the grouped heads as they are."""
    return arch.kv_dim if attn == "flash_attention_2" else arch.q_dim


def mlp_activation_elems(arch: Arch, sparse: bool = False) -> int:
    """Values a layer's MLP keeps per token for its backward pass. Dense (SwiGLU): gate, silu(gate),
    up and their product (down_proj's input), 4i. A mixture-of-experts block (transformers'
    MixtralExperts / Qwen2MoeExperts loop): for each of the k experts a token is routed to, its
    gathered input h, gate and up (2i'), silu(gate) i', the product i' and the expert's output h
    (kept for the routing weight's product): k x (4i' + 2h); the router's logits and fp32 softmax
    (~3 x experts); Qwen2-MoE's shared expert 4i_s, its output h and its sigmoid gate."""
    if not sparse:
        return 4 * arch.intermediate
    h, k = arch.hidden, arch.experts_per_token
    elems = k * (4 * arch.expert_intermediate + 2 * h) + 3 * arch.experts
    if arch.shared_intermediate:
        elems += 4 * arch.shared_intermediate + h + 2
    return elems


def layer_activation_elems(arch: Arch, attn: str = "sdpa", seq: int = 0, sparse: bool | None = None) -> int:
    """Values one Llama-style decoder layer keeps per token for its backward pass (Korthikanti et
    al.'s count redone for RMSNorm + SwiGLU + grouped-query attention, no dropout):
      attention norm input h, its output (the q/k/v projections' input) h,
      q, and k, v as attention reads them (kv_width) after the rotary embedding: h + 2 kv',
      attention output h and its contiguous copy fed to o_proj h,
      MLP norm input h, its output (the gate/up projections' input) h,
      gate, silu(gate), up and their product (down_proj's input) 4 i  (MoE: mlp_activation_elems)
    = 7h + 2kv' + 4i. (Korthikanti's GPT layer, 4h MLP and dropout, counts to 34 bytes = 17 values x h.)
    Eager attention also keeps the softmax of the scores, heads x seq per token (in fp32 and a cast
    copy: counted twice); SDPA's and FlashAttention's kernels keep none (Korthikanti's 5as/h term).
    `sparse` None: the largest layer (a mixture of experts' sparse one where it has any)."""
    h = arch.hidden
    if sparse is None:
        sparse = arch.moe_layers > 0 and (not arch.dense_layers or mlp_activation_elems(arch, True)
                                          >= mlp_activation_elems(arch, False))
    elems = 7 * h + 2 * kv_width(arch, attn) + mlp_activation_elems(arch, sparse)
    if attn == "eager":
        elems += 2 * arch.heads * seq
    return elems


def all_layers_activation_elems(arch: Arch, attn: str = "sdpa", seq: int = 0) -> int:
    """layer_activation_elems summed over the layers (dense and sparse ones of an MoE model)."""
    dense = arch.dense_layers * layer_activation_elems(arch, attn, seq, False) if arch.dense_layers else 0
    sparse = arch.moe_layers * layer_activation_elems(arch, attn, seq, True) if arch.moe_layers else 0
    return dense + sparse


def activations(arch: Arch, micro: int, seq: int, dtype_bytes: int, checkpointing,
                attn: str = "sdpa", prompt: int = 0, prompts: int = 0) -> int:
    """Activation memory of one training micro-batch of `micro` sequences of `seq` tokens;
    `checkpointing` False | "full" | "selective" (True = full).

    Without recomputation: tokens x layer_activation_elems summed over the layers. With full
    recomputation (gradient checkpointing): each layer keeps only its input (layers x tokens x h)
    and one layer (the largest) is recomputed whole during the backward pass. SDPA and eager
    attention also build one 4-D attention mask per pass, micro x seq x seq.

    `prompts` > 0: the shared-prompt passes (train/shared_prompt.py) run the micro-batch's `prompts`
    distinct prompts (of `prompt` tokens) once and the responses on their cache: see
    shared_prompt_activations; selective recomputes the response pass's layers (see
    selective_activations). Selective without shared prompts is full.
    """
    if prompts and not checkpointing:
        return shared_prompt_activations(arch, micro, prompts, prompt, seq - prompt, dtype_bytes, attn)
    if prompts and checkpointing == "selective":
        return selective_activations(arch, micro, prompts, prompt, seq - prompt, dtype_bytes, attn)
    tokens = micro * seq
    if checkpointing:
        elems = arch.layers * tokens * arch.hidden + tokens * layer_activation_elems(arch, attn, seq)
    else:
        elems = tokens * all_layers_activation_elems(arch, attn, seq)
    if attn != "flash_attention_2":
        elems += micro * seq * seq
    return elems * dtype_bytes


def shared_prompt_activations(arch: Arch, micro: int, prompts: int, prompt: int, response: int,
                              dtype_bytes: int, attn: str = "sdpa") -> int:
    """Activations of a shared-prompt training pass, per layer:
      the prompt pass: prompts x prompt tokens x layer_activation_elems;
      the response pass: micro x response tokens x (7h + 4i) (everything but k and v; MoE:
      mlp_activation_elems in place of 4i), and the k, v
      attention keeps over the whole sequence, its rows' prompt cache concatenated with the new
      tokens: micro x seq x 2 kv' (the cache itself is freed when the forward returns);
    plus the two passes' attention masks."""
    seq = prompt + response
    mlp = (arch.dense_layers * mlp_activation_elems(arch, False) if arch.dense_layers else 0) + (
        arch.moe_layers * mlp_activation_elems(arch, True) if arch.moe_layers else 0)
    elems = (prompts * prompt * all_layers_activation_elems(arch, attn, prompt)
             + micro * response * (arch.layers * 7 * arch.hidden + mlp)
             + arch.layers * micro * seq * 2 * kv_width(arch, attn))
    if attn != "flash_attention_2":
        elems += prompts * prompt * prompt + micro * response * seq
    return elems * dtype_bytes


def selective_activations(arch: Arch, micro: int, prompts: int, prompt: int, response: int,
                          dtype_bytes: int, attn: str = "sdpa") -> int:
    """Activations of a shared-prompt training pass under selective checkpointing
    (models/checkpointing.py): every layer of both passes keeps its input, layers x (prompts x
    prompt + micro x response) x h; the prompt's keys/values stay, layers x prompts x prompt x 2 kv';
    one layer is recomputed whole in backward, micro x response x layer_activation_elems, with its
    rows' prompt keys/values expanded, micro x prompt x 2 kv'; plus the two passes' attention masks."""
    seq = prompt + response
    elems = (arch.layers * (prompts * prompt + micro * response) * arch.hidden
             + arch.layers * prompts * prompt * 2 * kv_width(arch, attn)
             + micro * response * layer_activation_elems(arch, attn, seq)
             + micro * prompt * 2 * kv_width(arch, attn))
    if attn != "flash_attention_2":
        elems += prompts * prompt * prompt + micro * response * seq
    return elems * dtype_bytes


def mlp_forward_elems(arch: Arch) -> int:
    """Values an MLP holds at once in a forward pass without autograd, per token: dense, gate, up
    and their product (3i); an MoE block runs its experts one after another, so one expert's
    gathered input, gate/up, product and output (3i' + 2h; counted for every token, the worst
    routing), the block's output h and the router's logits and softmax (~3 x experts), and
    Qwen2-MoE's shared expert (3i_s + h). The larger of the model's layer kinds."""
    dense = 3 * arch.intermediate if arch.dense_layers else 0
    if not arch.moe_layers:
        return dense
    h = arch.hidden
    sparse = 3 * arch.expert_intermediate + 3 * h + 3 * arch.experts
    if arch.shared_intermediate:
        sparse += 3 * arch.shared_intermediate + h
    return max(dense, sparse)


def forward_working(arch: Arch, micro: int, seq: int, dtype_bytes: int, attn: str = "sdpa") -> int:
    """A forward pass without autograd (reference, behaviour, value, reward passes, generation's
    prefill) holds about one layer's values at a time: the residual stream, the norm output, q, k, v,
    the attention output and the MLP's gate, up and product: tokens x (4h + 2kv' + 3i)
    (MoE: mlp_forward_elems in place of 3i)."""
    h = arch.hidden
    return micro * seq * (4 * h + 2 * kv_width(arch, attn) + mlp_forward_elems(arch)) * dtype_bytes


def logits_bytes(arch: Arch, micro: int, response: int, dtype_bytes: int, backward: bool,
                 chunked: bool = True, device: str = "cpu") -> int:
    """The log-prob pass's logits (algo/logits.py, train/update.py): the model returns logits for
    the response tokens only (logits_to_keep = response + 1), (micro, response + 1, vocab) in the
    model's dtype; log-probs and entropies are computed in float32 chunks of at most 2^26 values
    (the chunk, its log-softmax and its softmax: 3 chunks live). The backward pass adds the
    logits' gradient (same size as the logits).

    `chunked` (not under ZeRO-3): where those logits exceed `head_chunk_elems(device)`, the output layer
    itself runs chunk by chunk (train/chunked_head.py), so one such chunk's logits, gradient and
    fp32 temporaries exist at a time, not the micro-batch's."""
    rows = micro * (response + 1)
    if chunked:
        rows = min(rows, max(1, head_chunk_elems(device) // arch.vocab))
    logits = rows * arch.vocab * dtype_bytes
    chunk = min(rows * arch.vocab, LOGPROB_CHUNK_ELEMS) * 4
    return logits * (2 if backward else 1) + 3 * chunk


def kv_cache_bytes(arch: Arch, seqs: int, seq: int, dtype_bytes: int) -> int:
    """`seqs` sequences of `seq` tokens in a KV cache."""
    return seqs * seq * arch.kv_bytes_per_token(dtype_bytes)


def lora_params(arch: Arch, r: int, target_modules, critic: bool = False) -> int:
    """Adapter parameters: r x (in + out) for each targeted linear of each layer (PEFT's A: r x in,
    B: out x r); `all-linear` = Arch.linears() (q, k, v, o, gate, up, down; the output head is left
    out; an MoE block's router and experts where PEFT adapts them). A list of names counts the
    nn.Linear modules of those names."""
    if isinstance(target_modules, str):
        linears = arch.linears(all_linear=True)
    else:
        wanted = {n.rsplit(".", 1)[-1] for n in target_modules}
        linears = [lin for lin in arch.linears(all_linear=False) if lin[0] in wanted]
    return sum(r * (i + o) * n for _, i, o, n in linears)


def vllm_kv_tokens(util: float, mem: int, weights: int, reserve: int, per_token: int) -> int:
    """Tokens vLLM's KV cache holds on a GPU: its share of the card (gpu_memory_utilization x
    memory) minus its weights and its working reserve (activations of the profiling run, CUDA
    graphs), divided by the KV bytes of one token."""
    return max(0, int(util * mem) - weights - reserve) // per_token


def fmt_bytes(n) -> str:
    """Bytes as GiB / MiB (binary units, what allocators and nvidia-smi report)."""
    if n is None:
        return "?"
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / (1 << 20):.0f} MiB"
