"""What each `actor.gradient_checkpointing` choice costs and saves in the update's pass, on a GPU.

    python benchmarks/bench_update_gpu.py [--groups 2] [--group-size 8] [--prompt 256] [--response 1024]

A model shaped like Qwen2.5-0.5B-Instruct (24 layers, hidden 896, GQA 14/2, 151,936-token
vocabulary, tied embeddings; random weights built from the config, bf16, sdpa attention) runs the
update's log-prob pass, forward and backward, on one micro-batch of `--groups` groups of
`--group-size` responses sharing a `--prompt`-token prompt (responses `--response` tokens, a
quarter of them cut short). The pass is the loop's own (`response_logp_entropy` inside
`shared_prompt.into_grad()`, the output layer chunked where its logits would exceed one chunk).
Sides, alternated over `--rounds`:
- `none`: no recompute, each row's prompt computed with it (the shared-prompt passes off);
- `shared`: no recompute, each group's prompt once (rltune's default);
- `selective`: every layer recomputed in backward, each group's prompt once, its keys/values kept;
- `full`: every layer recomputed (Hugging Face's checkpointing; the shared-prompt passes off).
Per side: the median seconds of a pass (after one warm-up) and its peak CUDA memory above the
start (torch.cuda.max_memory_allocated: activations, logits chunks and transient buffers; the
weights and their .grad exist before). The log-probs of the sides agree, which is checked.
This is the update's pass alone: DeepSpeed's optimizer states, the reference model and the
rollout engine are not in it (`rltune plan` counts those).
"""

from __future__ import annotations

import argparse
import statistics
import time

SIDES = ("none", "shared", "selective", "full")


def build(args):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rltune.rollout.experience import Experience

    config = AutoConfig.for_model("qwen2", vocab_size=151_936, hidden_size=896, intermediate_size=4864,
                                  num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                                  max_position_embeddings=32768, tie_word_embeddings=True,
                                  attn_implementation="sdpa")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to("cuda")
    g = torch.Generator().manual_seed(1)
    B, P, T = args.groups * args.group_size, args.prompt, args.response
    prompts = torch.randint(10, 150_000, (args.groups, P), generator=g).repeat_interleave(args.group_size, 0)
    lengths = torch.full((B,), T)
    lengths[::4] = torch.randint(T // 8, T, (len(lengths[::4]),), generator=g)     # a quarter cut short
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    mb = Experience(prompt_ids=prompts, prompt_mask=torch.ones(B, P, dtype=torch.long),
                    response_ids=torch.randint(10, 150_000, (B, T), generator=g) * mask.long(),
                    response_mask=mask, advantages=torch.randn(B, T, generator=g) * mask).to("cuda")
    return model, mb


def one_pass(model, mb, side: str):
    import torch

    from rltune.models.checkpointing import _layers, enable_checkpointing
    from rltune.train import shared_prompt
    from rltune.train.update import response_logp_entropy

    mode = {"none": False, "shared": False, "selective": "selective", "full": "full"}[side]
    enable_checkpointing(model, mode)
    model.train()
    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        with shared_prompt.into_grad():
            logp, ent = response_logp_entropy(model, mb, 1.0, shared=side in ("shared", "selective"))
        ((logp * mb.advantages + 0.01 * ent) * mb.response_mask).sum().backward()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() - start
    finally:
        model.gradient_checkpointing_disable()
        for layer in _layers(model):
            layer._can_checkpoint_with_cache = False
    return seconds, peak, (logp * mb.response_mask).detach()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--response", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--head-chunk-elems", default="",
                   help="comma-separated logits per output-layer chunk to compare (default: rltune's own)")
    args = p.parse_args()

    import torch

    from rltune.train import chunked_head, shared_prompt

    model, mb = build(args)
    assert shared_prompt.shared_prompt_reason(model) is None and shared_prompt.pays_off(model, mb)
    for p_ in model.parameters():                              # .grad exists, as after a first micro-batch
        p_.grad = torch.zeros_like(p_)
    sides = args.sides.split(",")
    n = int(mb.response_mask.sum())
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; Qwen2.5-0.5B shape, bf16, sdpa; "
          f"{mb.size} rows ({args.groups} groups of {args.group_size}), prompt {args.prompt}, response "
          f"{args.response} ({n} response tokens); medians of {args.rounds}")
    for elems in [int(e) for e in args.head_chunk_elems.split(",") if e] or [chunked_head.HEAD_CHUNK_ELEMS]:
        chunked_head.HEAD_CHUNK_ELEMS = elems
        times: dict[str, list] = {s: [] for s in sides}
        peaks: dict[str, list] = {s: [] for s in sides}
        ref = None
        for s in sides:                                       # warm-up: kernels, allocator
            _, _, logp = one_pass(model, mb, s)
            ref = logp if ref is None else ref
            diff = float((logp - ref).abs().max())
            assert diff < 0.1, f"{s}: log-probs differ from {sides[0]}'s by {diff:.3f} nats"
        for r in range(args.rounds):
            for s in sides if r % 2 == 0 else sides[::-1]:
                sec, peak, _ = one_pass(model, mb, s)
                times[s].append(sec)
                peaks[s].append(peak)
        base = statistics.median(times[sides[0]])
        print(f"output layer in chunks of {elems} logits ({elems // 151_936} positions)")
        print(f"{'side':<10} {'s/pass':>8} {'vs ' + sides[0]:>10} {'peak GiB':>9} {'tokens/s':>10}")
        for s in sides:
            sec, peak = statistics.median(times[s]), max(peaks[s])
            print(f"{s:<10} {sec:>8.3f} {sec / base:>9.2f}x {peak / 2**30:>9.2f} {n / sec:>10.0f}")


if __name__ == "__main__":
    main()
