"""`rltune.plan.estimate` against budgets computed by hand (issue 17): a tiny config on CPU, and a
Llama-2-7B shape at ZeRO-0 on one GPU and ZeRO-3 on eight. The arithmetic is written out here,
not obtained by calling the functions under test."""

from __future__ import annotations

import json

import pytest

from rltune.plan import Hardware, estimate, parse_size, resolve_arch
from rltune.plan.estimate import CPU_RUNTIME
from rltune.recipe.loader import load_recipe_text

GiB = 2**30

TINY = """
model: {policy: builtin:tiny-llama}
data: {train: builtin:arithmetic, max_prompt_length: 16}
reward: {functions: [builtin:exact_answer]}
algorithm: {name: grpo, group_size: 4, kl: {coef: 0.01}}
rollout: {engine: hf, batch_size: 16, max_new_tokens: 6}
train: {batch_size: 64, micro_batch_size: 16}
trainer: {eval_every: 0, device: cpu}
"""

# Llama-2-7B (meta-llama/Llama-2-7b-hf config.json)
LLAMA2_7B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000,
             "tie_word_embeddings": False}
# per layer: q, k, v, o 4 x 4096^2 = 67,108,864; MLP 3 x 4096 x 11008 = 135,266,304; 2 norms 8,192
P7B_LAYER = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096            # 202,383,360
P7B = 32 * P7B_LAYER + 2 * 32000 * 4096 + 4096                        # + embedding, LM head, final norm
assert P7B == 6_738_415_616                                           # "6.74B"


def recipe_of(text: str):
    res = load_recipe_text(text, "test.yaml")
    assert res.recipe is not None, res.findings
    return res.recipe


def item(plan, name: str) -> int:
    found = [i.bytes for i in plan.items if i.name == name]
    assert found, f"no item {name!r} in {[i.name for i in plan.items]}"
    return found[0]


def names(plan) -> set:
    return {i.name for i in plan.items}


# ---------------------------------------------------------------- tiny, CPU, fp32


def test_tiny_llama_params_by_hand():
    a = resolve_arch("builtin:tiny-llama")
    # vocab 77 (4 specials + 73 characters), hidden 64, 2 heads of 32, 1 KV head, MLP 128, untied head
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64   # 36,992
    assert a.params() == 2 * 77 * 64 + 2 * layer + 64 == 83_904


def test_tiny_cpu_budget_by_hand():
    plan = estimate(recipe_of(TINY), Hardware("cpu"))
    W = 83_904 * 4                                   # fp32 weights
    assert item(plan, "actor weights") == W
    assert item(plan, "actor optimizer state") == 83_904 * 8      # Adam m, v in fp32, no master copy
    assert item(plan, "actor gradients") == W
    assert item(plan, "reference weights") == W                   # kl.coef > 0: a frozen copy
    # activations: 2 layers x (16 sequences x (16 + 6) tokens) x (7h + 2h + 4i = 448 + 128 + 512) values
    # (SDPA with a padding mask reads k and v repeated to all heads: h wide, not kv = 32), + the 4-D
    # mask 16 x 22 x 22, x 4 B
    act = (2 * (16 * 22) * (7 * 64 + 2 * 64 + 4 * 128) + 16 * 22 * 22) * 4
    assert item(plan, "actor activations") == act == 3_094_784
    # logits of the 6 + 1 response positions: 16 x 7 x 77 x 4 B, x2 with the gradient, + 3 fp32 chunks
    logits = 2 * 16 * 7 * 77 * 4 + 3 * 16 * 7 * 77 * 4
    assert item(plan, "actor logits (log-prob pass + its gradient)") == logits
    # the step (ZeRO-0, one rank): no all-reduce, so no flat copy of the fp32 gradients
    assert "actor optimizer step: flat gradient copy" not in names(plan)
    # on CPU glibc keeps one more of the pass's activations and logits resident (empirical)
    assert item(plan, "CPU allocator retention (glibc)") == act + logits
    # update = runtime + weights, optimizer, reference (all phases) + gradients + the larger of the
    # actor's pass (with the retention) and its step
    assert plan.phases["update"] == CPU_RUNTIME + W + 2 * W + W + W + 2 * (act + logits)
    # the hf engine samples with the actor's own fp32 tensors: no copy; KV 16 x 22 tokens x 2 x 2 layers x 32 x 4 B
    assert "hf rollout weights (own copy)" not in names(plan)
    assert item(plan, "hf generate KV cache") == 16 * 22 * (2 * 2 * 32 * 4)
    # a checkpoint writes the engine's own tensors (no copy); the final export copies the weights
    assert "checkpoint: cloned weights + optimizer state" not in names(plan)
    assert item(plan, "final export: cloned weights") == W
    assert plan.phases["save"] == CPU_RUNTIME + W + 2 * W + W + W
    assert plan.peak == max(plan.phases.values())
    assert plan.capacity is None and plan.headroom is None and plan.proposals == []


def test_tiny_checkpointing_keeps_layer_inputs():
    plan = estimate(recipe_of(TINY + "actor: {gradient_checkpointing: true}\n"), Hardware("cpu"))
    # every layer's input (2 x 352 tokens x 64) + one layer recomputed (352 x 1088) + the mask, fp32
    assert item(plan, "actor activations") == (2 * 352 * 64 + 352 * 1088 + 16 * 22 * 22) * 4
    assert plan.activations["without_checkpointing"] == (2 * 352 * 1088 + 16 * 22 * 22) * 4


def test_token_budget_sizes_the_micro_batch_passes():
    """train.max_tokens_per_micro_batch 100 at the longest sequence, 16 + 6 = 22 tokens: 100 // 22 = 4
    sequences per micro-batch, whatever train.micro_batch_size (16) says."""
    plan = estimate(recipe_of(TINY.replace("micro_batch_size: 16}", "micro_batch_size: 16, "
                                           "max_tokens_per_micro_batch: 100}")), Hardware("cpu"))
    # as test_tiny_cpu_budget_by_hand with 4 sequences of 22 tokens: 2 layers x 88 tokens x 1088 + the 4 x 22 x 22 mask
    act = (2 * (4 * 22) * (7 * 64 + 2 * 64 + 4 * 128) + 4 * 22 * 22) * 4
    logits = 2 * 4 * 7 * 77 * 4 + 3 * 4 * 7 * 77 * 4
    assert item(plan, "actor activations") == act == 773_696            # 1/4 of the 16-row micro-batch's
    assert item(plan, "actor logits (log-prob pass + its gradient)") == logits
    assert item(plan, "CPU allocator retention (glibc)") == act + logits
    # the reference pass: one layer's values, 88 tokens x (4h + 2h + 3i) fp32, + the logits without gradient
    assert item(plan, "reference pass") == 88 * (4 * 64 + 2 * 64 + 3 * 128) * 4 + 4 * 7 * 77 * 4 + 3 * 4 * 7 * 77 * 4
    note = next(i.note for i in plan.items if i.name == "actor activations")
    assert "train.max_tokens_per_micro_batch 100: 4 sequence(s) of 22 tokens" in note
    # a budget under one sequence: each micro-batch holds one (it cannot be split)
    one = estimate(recipe_of(TINY.replace("micro_batch_size: 16}", "max_tokens_per_micro_batch: 10}")), Hardware("cpu"))
    assert item(one, "actor activations") == (2 * 22 * 1088 + 22 * 22) * 4


def test_lora_reference_is_the_adapter_disabled_and_only_the_adapter_trains():
    text = TINY.replace("policy: builtin:tiny-llama}", "policy: builtin:tiny-llama, lora: {r: 4, alpha: 8}}")
    plan = estimate(recipe_of(text), Hardware("cpu"))
    # all-linear: q (64+64), k (64+32), v (64+32), o (64+64), gate, up (64+128), down (128+64), x r 4 x 2 layers
    adapter = 2 * 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128))
    assert item(plan, "actor optimizer state") == adapter * 8
    assert item(plan, "actor gradients") == adapter * 4
    assert item(plan, "actor weights") == (83_904 + adapter) * 4
    assert "reference weights" not in names(plan)


# ---------------------------------------------------------------- Llama-2-7B shape, GPU, bf16


SEVEN_B = """
model: {{policy: {path}, attn_implementation: sdpa}}
data: {{train: builtin:arithmetic, max_prompt_length: 512}}
reward: {{functions: [builtin:exact_answer]}}
algorithm: {{name: grpo, group_size: 4, kl: {{coef: 0.02}}}}
actor: {{zero_stage: {zero}, gradient_checkpointing: true}}
rollout: {{engine: hf, batch_size: 64, max_new_tokens: 512}}
train: {{batch_size: 256, micro_batch_size: 2}}
trainer: {{precision: bf16, nproc: {nproc}, eval_every: 0}}
"""


@pytest.fixture
def llama7b(tmp_path):
    d = tmp_path / "llama-2-7b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA2_7B))
    return d


def test_7b_zero0_one_gpu_by_hand(llama7b):
    r = recipe_of(SEVEN_B.format(path=llama7b, zero=0, nproc=1))
    plan = estimate(r, Hardware("cuda", gpus=1, mem_bytes=80 * GiB))
    assert plan.arch.params() == P7B
    # ZeRO paper, mixed-precision Adam: 2 + 2 + 12 = 16 bytes per parameter, nothing sharded
    assert item(plan, "actor weights") == P7B * 2                 # 13.5 GB
    assert item(plan, "actor gradients") == P7B * 2
    assert item(plan, "actor optimizer state") == P7B * 12        # fp32 master + Adam m, v: 80.9 GB
    assert item(plan, "actor weights") + item(plan, "actor gradients") + item(plan, "actor optimizer state") \
        == P7B * 16 == 107_814_649_856
    # DeepSpeed's 16-bit optimizer at stage 0 flattens the gradients into fp32 for the step
    assert item(plan, "actor optimizer step: flat gradient copy") == P7B * 4
    assert item(plan, "reference weights") == P7B * 2
    # the hf engine samples with the actor's bf16 tensors (no copy); its KV cache:
    # 64 sequences x 1024 tokens x (2 x 32 layers x 32 heads x 128 x 2 B = 524,288 B per token) = 32 GiB
    assert item(plan, "hf generate KV cache") == 64 * 1024 * 524_288 == 32 * GiB
    # it does not fit one 80 GB card; a change that fits is proposed, with its new numbers
    assert plan.peak > 80 * GiB and plan.fits is False
    assert plan.proposals and all(p.fits and p.peak <= 0.95 * 80 * GiB for p in plan.proposals)


def test_a_token_budget_is_shrunk_instead_of_the_micro_batch(llama7b):
    from rltune.plan.proposals import candidates

    text = SEVEN_B.format(path=llama7b, zero=0, nproc=1)
    r = recipe_of(text.replace("micro_batch_size: 2}", "micro_batch_size: 2, max_tokens_per_micro_batch: 4096}"))
    hw = Hardware("cuda", gpus=1, mem_bytes=80 * GiB)
    changes = [c for _, c, _, _ in candidates(r, estimate(r, hw), hw)]
    # 4096 tokens hold 4 of the longest sequences (512 + 512): budgets of 3, 2 and 1 of them, no micro_batch_size
    assert {"train.max_tokens_per_micro_batch": [3072, 2048, 1024]} in changes
    assert not [c for c in changes if "train.micro_batch_size" in c]


def test_7b_zero3_eight_gpus_by_hand(llama7b):
    r = recipe_of(SEVEN_B.format(path=llama7b, zero=3, nproc=8))
    plan = estimate(r, Hardware("cuda", gpus=8, mem_bytes=80 * GiB))
    # stage 3 shards weights, gradients and optimizer state over the 8 ranks: 16 B x P / 8
    assert item(plan, "actor weights") == P7B * 2 // 8
    assert item(plan, "actor gradients") == P7B * 2 // 8
    assert item(plan, "actor optimizer state") == P7B * 12 // 8
    assert "actor optimizer step: flat gradient copy" not in names(plan)
    # the reference is a ZeRO-0 engine without optimizer: whole on every rank
    assert item(plan, "reference weights") == P7B * 2
    # the hf engine needs its own copy (ZeRO-3 shards the actor's): whole, bf16
    assert item(plan, "hf rollout weights (own copy)") == P7B * 2
    # 64 sequences per call / 8 ranks = 8 per rank x 1024 tokens x 524,288 B
    assert item(plan, "hf generate KV cache") == 8 * 1024 * 524_288
    # activations with checkpointing: 32 layer inputs of 2 x 1024 tokens x 4096, one layer whole,
    # the 4-D attention mask 2 x 1024 x 1024; bf16
    per_layer = 7 * 4096 + 2 * 4096 + 4 * 11008
    assert item(plan, "actor activations") == (32 * 2048 * 4096 + 2048 * per_layer + 2 * 1024 * 1024) * 2
    assert plan.fits is True and plan.headroom == 80 * GiB - plan.peak


def test_vllm_kv_tokens_and_sequences(llama7b):
    text = SEVEN_B.format(path=llama7b, zero=3, nproc=8).replace("engine: hf", "engine: vllm")
    plan = estimate(recipe_of(text), Hardware("cuda", gpus=8, mem_bytes=80 * GiB))
    from rltune.plan.estimate import VLLM_GPU_RESERVE

    # vLLM's share 0.5 x 80 GiB, minus its bf16 weights and reserve, in 524,288-byte tokens
    tokens = (int(0.5 * 80 * GiB) - P7B * 2 - VLLM_GPU_RESERVE) // 524_288
    assert plan.kv["tokens"] == tokens
    assert plan.kv["sequences"] == tokens // 1024
    assert item(plan, "vLLM KV cache") == tokens * 524_288
    # sleep mode (default): vLLM's memory is freed while the trainer runs
    kv = next(i for i in plan.items if i.name == "vLLM KV cache")
    assert kv.phases == ("rollout",)


def test_parse_size_units():
    assert parse_size("80GB") == parse_size("80GiB") == parse_size("80") == 80 * GiB
    assert parse_size("24576MiB") == 24 * GiB
    assert parse_size("1073741824B") == GiB
    with pytest.raises(ValueError):
        parse_size("eighty")


# ---------------------------------------------------------------- shared-prompt passes


QUICK = """
model: {policy: builtin:smollm2-135m-instruct}
data: {train: builtin:arithmetic, max_prompt_length: 40}
reward: {functions: [builtin:exact_answer]}
algorithm: {name: grpo, group_size: 4, kl: {coef: 0.02}}
rollout: {engine: hf, batch_size: 16, max_new_tokens: 16}
train: {batch_size: 64, micro_batch_size: 8}
trainer: {eval_every: 0, device: cpu}
"""


def test_shared_prompt_activations_by_hand():
    plan = estimate(recipe_of(QUICK), Hardware("cpu"))
    # micro-batch 8 = 2 groups of 4: the 2 distinct 40-token prompts run once with everything a layer
    # keeps (7h + 2h + 4i = 11,328 values per token: SmolLM2 h 576, i 1536, SDPA repeats k/v), the 8
    # responses' 16 tokens without k, v (7h + 4i = 10,176), and attention keeps k, v over all 56
    # tokens of the 8 rows (2 x 576); 30 layers; + the masks 2 x 40 x 40 and 8 x 16 x 56; fp32
    per_layer = 2 * 40 * 11_328 + 8 * 16 * 10_176 + 8 * 56 * 2 * 576
    assert item(plan, "actor activations") == (30 * per_layer + 2 * 40 * 40 + 8 * 16 * 56) * 4
    # unshared (share_prompts off): 8 rows x 56 tokens x 11,328, + the mask 8 x 56 x 56
    off = estimate(recipe_of(QUICK.replace("micro_batch_size: 8}", "micro_batch_size: 8, share_prompts: false}")),
                   Hardware("cpu"))
    assert item(off, "actor activations") == (30 * 8 * 56 * 11_328 + 8 * 56 * 56) * 4


def test_shared_prompt_conditions_match_the_trainer():
    import importlib

    from rltune.train import shared_prompt as S

    E = importlib.import_module("rltune.plan.estimate")   # the module (rltune.plan.estimate is also a function)

    assert E.SHARED_MODEL_TYPES == S.VERIFIED_MODEL_TYPES
    assert E.SHARED_ATTENTION == S.VERIFIED_ATTENTION
    assert E.SHARED_MIN_SAVED_FLOP == S.MIN_SAVED_FLOP


def test_selective_checkpointing_by_hand():
    """actor.gradient_checkpointing: selective on the quickstart shape: every layer (30) keeps its input
    (h = 576) for the 2 distinct 40-token prompts and the 8 responses' 16 tokens, and the prompts' keys/values
    (2 x 576: SDPA repeats k/v); one layer is recomputed whole (11,328 values per token) with its rows'
    prompt keys/values (8 x 40 x 2 x 576); + the masks 2 x 40 x 40 and 8 x 16 x 56; fp32."""
    plan = estimate(recipe_of(QUICK + "actor: {gradient_checkpointing: selective}\n"), Hardware("cpu"))
    sel = (30 * (2 * 40 + 8 * 16) * 576 + 30 * 2 * 40 * 2 * 576 + 8 * 16 * 11_328 + 8 * 40 * 2 * 576
           + 2 * 40 * 40 + 8 * 16 * 56) * 4
    assert item(plan, "actor activations") == sel == plan.activations["selective"]
    # every choice is counted in the note and in plan.activations; selective is the smallest here
    a = plan.activations
    assert a["checkpointing"] == "selective" and sel < a["with_checkpointing"] < a["without_checkpointing"]
    note = next(i.note for i in plan.items if i.name == "actor activations")
    assert "gradient_checkpointing selective" in note and "full: " in note and "false: " in note
    assert "2 distinct prompt(s)" in note
    # full: the shared-prompt passes are off, 8 rows x 56 tokens: layer inputs + one layer + the mask
    full = estimate(recipe_of(QUICK + "actor: {gradient_checkpointing: full}\n"), Hardware("cpu"))
    assert item(full, "actor activations") == (30 * 8 * 56 * 576 + 8 * 56 * 11_328 + 8 * 56 * 56) * 4


def test_padding_free_by_hand():
    """train.padding_free on the quickstart shape: the micro-batch is one sequence of its 2 groups'
    40-token prompts once and 8 x 16 response tokens = 208 tokens, 11,328 values per token and layer,
    + one 208 x 208 mask; no shared-prompt passes. Without train.share_prompts each row's prompt:
    8 x 56 = 448 tokens. The reference pass adds the mask at its peak while built, in bytes (SDPA's
    bool mask and one bool temporary: train/packed.py), to its one-layer working set of those tokens."""
    def plan(extra):
        return estimate(recipe_of(QUICK.replace("micro_batch_size: 8}", f"micro_batch_size: 8{extra}}}")),
                        Hardware("cpu"))

    packed, alone = plan(", padding_free: true"), plan(", padding_free: true, share_prompts: false")
    assert item(packed, "actor activations") == (30 * 208 * 11_328 + 208 * 208) * 4
    assert item(alone, "actor activations") == (30 * 448 * 11_328 + 448 * 448) * 4
    assert packed.activations["shared_prompts"] == 0
    note = next(i.note for i in packed.items if i.name == "actor activations")
    assert "padding-free: one sequence of at most 208 tokens" in note
    plain = plan(", share_prompts: false")
    assert item(alone, "reference pass") - item(plain, "reference pass") == 2 * 448 * 448


def test_padding_free_conditions_match_the_trainer():
    import importlib

    from rltune.train import packed as P

    E = importlib.import_module("rltune.plan.estimate")
    assert E.SHARED_ATTENTION == P.PACKED_ATTENTION


def test_large_vocabulary_logits_are_one_chunk(llama7b):
    """A 152k vocabulary: 2 x 513 response positions would be 1026 rows of logits; the output layer
    runs in chunks of 2^25 // 151,936 = 220 rows on CUDA and 2^24 // 151,936 = 110 on the CPU
    (train/chunked_head.py), except under ZeRO-3."""
    V = 151_936
    (llama7b / "config.json").write_text(json.dumps({**LLAMA2_7B, "vocab_size": V}))
    rows = (1 << 25) // V
    assert rows == 220
    plan = estimate(recipe_of(SEVEN_B.format(path=llama7b, zero=0, nproc=1)), Hardware("cuda", gpus=1))
    assert item(plan, "actor logits (log-prob pass + its gradient)") == rows * V * 2 * 2 + 3 * rows * V * 4
    cpu = estimate(recipe_of(SEVEN_B.format(path=llama7b, zero=0, nproc=1)), Hardware("cpu"))
    assert item(cpu, "actor logits (log-prob pass + its gradient)") == 110 * V * 2 * 2 + 3 * 110 * V * 4
    zero3 = estimate(recipe_of(SEVEN_B.format(path=llama7b, zero=3, nproc=8)), Hardware("cuda", gpus=8))
    assert item(zero3, "actor logits (log-prob pass + its gradient)") == 2 * 513 * V * 2 * 2 + 3 * (1 << 26) * 4


def test_waiting_gradients_only_under_zero3_shared_prompts(llama7b):
    """ZeRO-3 keeps the response pass's weight gradients waiting for the prompt pass's (docs/memory.md,
    "Shared-prompt gradients"): one unpartitioned set in the weights' dtype. ZeRO-0 to 2 add them to
    .grad early, and without shared prompts nothing waits."""
    name = "actor gradients waiting (shared prompts, ZeRO-3)"
    selective = SEVEN_B.replace("gradient_checkpointing: true", "gradient_checkpointing: selective")
    plan = estimate(recipe_of(selective.format(path=llama7b, zero=3, nproc=8)), Hardware("cuda", gpus=8, mem_bytes=80 * GiB))
    assert plan.activations["shared_prompts"] and item(plan, name) == P7B * 2          # bf16, not / 8
    for zero in (0, 2):
        other = estimate(recipe_of(selective.format(path=llama7b, zero=zero, nproc=8)),
                         Hardware("cuda", gpus=8, mem_bytes=80 * GiB))
        assert name not in names(other)
    full = estimate(recipe_of(SEVEN_B.format(path=llama7b, zero=3, nproc=8)), Hardware("cuda", gpus=8, mem_bytes=80 * GiB))
    assert not full.activations["shared_prompts"] and name not in names(full)


def test_a_started_vllm_server_sleeps_beside_the_trainer_as_the_in_process_engine_does(llama7b):
    """rollout.engine vllm-server on the trainer's GPU: its weights and KV cache are freed while the
    trainer runs (vLLM's sleep mode through the server's /sleep and /wake_up); not with devices of
    its own, not under generation ahead (it generates while the trainer trains), and its CUDA
    context stays in every phase."""
    base = SEVEN_B.format(path=llama7b, zero=3, nproc=8).replace("engine: hf", "engine: vllm-server")
    hw = Hardware("cuda", gpus=8, mem_bytes=80 * GiB)

    def phases(text):
        plan = estimate(recipe_of(text), hw)
        return {i.name: i.phases for i in plan.items if i.name.startswith("vLLM")}

    slept = phases(base)
    assert slept["vLLM KV cache"] == slept["vLLM weights"] == ("rollout",)
    assert len(slept["vLLM server CUDA context"]) > 1
    for text in (base.replace("engine: vllm-server", "engine: vllm-server, sleep_mode: false"),
                 base.replace("engine: vllm-server", "engine: vllm-server, asynchronous: {max_staleness: 1}")):
        awake = phases(text)
        assert len(awake["vLLM KV cache"]) > 1 and len(awake["vLLM weights"]) > 1, awake


def test_a_fleet_on_gpus_is_budgeted_per_replica_and_named_in_the_notes(llama7b):
    base = SEVEN_B.format(path=llama7b, zero=3, nproc=8).replace("engine: hf", "engine: vllm-server")
    hw = Hardware("cuda", gpus=8, mem_bytes=80 * GiB)
    one = estimate(recipe_of(base), hw)
    assert not [n for n in one.notes if "a fleet" in n]
    fleet = base.replace("engine: vllm-server", "engine: vllm-server, server: {replicas: 2, devices: [6, 7]}")
    plan = estimate(recipe_of(fleet), hw)
    (note,) = [n for n in plan.notes if "a fleet" in n]
    assert note.startswith("rollout.server.replicas 2: a fleet rank 0 starts; each replica holds its own copy")
    # a replica per device group: the device that holds one holds one server's weights and KV cache
    assert item(plan, "vLLM weights") == item(estimate(recipe_of(base.replace(
        "engine: vllm-server", "engine: vllm-server, server: {devices: [7]}")), hw), "vLLM weights")


def test_a_cpu_fleet_counts_every_replica_and_attached_servers_none():
    """On a CPU the replicas rank 0 starts share the machine's memory: each its own runtime, weights
    and KV cache (vllm_server sizes every replica's as one server's). Attached servers (urls) run
    elsewhere: not counted, as one attached url is not."""
    base = TINY.replace("rollout: {engine: hf, ", "rollout: {engine: vllm-server, ")
    assert "engine: vllm-server" in base
    one = estimate(recipe_of(base), Hardware("cpu"))
    two = estimate(recipe_of(base.replace("engine: vllm-server, ",
                                          "engine: vllm-server, server: {replicas: 2, devices: [0, 1]}, ")),
                   Hardware("cpu"))
    for name in ("vLLM server processes (runtime)", "vLLM weights", "vLLM KV cache"):
        assert item(two, f"{name} x 2 replicas") == 2 * item(one, name), name
    assert two.peak - one.peak == sum(item(one, n) for n in (
        "vLLM server processes (runtime)", "vLLM weights", "vLLM KV cache"))
    (note,) = [n for n in two.notes if "a fleet" in n]
    assert "counted x2 in rank 0's budget" in note
    attached = estimate(recipe_of(base.replace(
        "engine: vllm-server, ", "engine: vllm-server, server: {urls: [http://10.0.0.5:8000, http://10.0.0.6:8000], "
        "secret_env: S}, ")), Hardware("cpu"))
    assert not [n for n in names(attached) if n.startswith("vLLM")]
    assert any(n.startswith("rollout.server.urls (2 servers): attached servers'") for n in attached.notes)


def test_server_sleeps_only_beside_the_trainer_on_cuda():
    from rltune.recipe.schema import RolloutCfg
    from rltune.rollout.vllm_api import server_sleeps

    assert server_sleeps(RolloutCfg(), "cuda") is True
    assert server_sleeps(RolloutCfg(), "cpu") is False                      # vLLM on CPU has no sleep mode
    assert server_sleeps(RolloutCfg(sleep_mode=False), "cuda") is False
    assert server_sleeps(RolloutCfg(server={"devices": [1]}), "cuda") is False
    assert server_sleeps(RolloutCfg(server={"url": "http://127.0.0.1:8000"}), "cuda") is False
    assert server_sleeps(RolloutCfg(asynchronous={"max_staleness": 1}), "cuda") is False
