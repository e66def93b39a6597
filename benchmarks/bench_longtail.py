"""Micro-batches by tokens (`train.max_tokens_per_micro_batch`) on a long-tail batch: peak memory
and the time of steps 3-8.

    python benchmarks/bench_longtail.py [--hidden 512] [--layers 8] [--vocab 32000] [--rows 32]
        [--median 64] [--tail 8] [--long 2] [--micro 4] [--budget TOKENS] [--steps 3]

Builds a random Llama-shaped model from a config (written once to a temporary directory; no
download) and a GRPO step's experience directly (no generation): groups of 4 samples of one
prompt; a long-tail batch has responses around `--median` tokens and `--long` rows `--tail` times
the median, a uniform batch the same total number of tokens in equal rows. Each configuration runs
in a fresh process: the trainer's own steps 3-8 (`loop.learn`: the reference pass, advantages,
one actor update) on real DeepSpeed engines, one warm-up step then `--steps` timed ones, and
reports the median seconds of steps 3-8 and the peak RSS of the timed steps (VmHWM, reset after
the warm-up through /proc/self/clear_refs), beside the RSS they started from:

  a  the long-tail batch, micro-batches of train.micro_batch_size rows
  b  the same batch, train.max_tokens_per_micro_batch (default: the micro-batch size x the
     median sequence, what a micro-batch of typical rows holds, or the longest sequence if that is
     more: a budget below it leaves the longest rows over it, lint `micro-batch-tokens`)
  c  a uniform batch of the same total tokens, the same budget
  d  the long-tail batch, the same budget, train.padding_free (the budget counts real tokens)
  e  the uniform batch, the same budget, train.padding_free

What to look for: with the budget, the peak is set by the budget and not by the longest row
(b well under a, near c), and the long-tail step's time within 10% of the uniform one's (b vs c
padded, d vs e padding-free).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
GROUP, PROMPT = 4, 32
CONFIGS = {"a": ("long tail", "rows"), "b": ("long tail", "tokens"), "c": ("uniform", "tokens"),
           "d": ("long tail", "packed"), "e": ("uniform", "packed")}


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def response_lengths(a, uniform: bool) -> list[int]:
    """Per row: around the median (median/2 .. 3 median/2, seeded), `--long` rows `--tail` x the
    median in different groups; uniform: the same total in equal rows (the remainder spread)."""
    import random

    rng = random.Random(0)
    lengths = [rng.randint(a.median // 2, 3 * a.median // 2) for _ in range(a.rows)]
    for k in range(a.long):
        lengths[(k * GROUP * (a.rows // GROUP // max(1, a.long))) % a.rows + 1] = a.tail * a.median
    if not uniform:
        return lengths
    total = sum(lengths)
    return [total // a.rows + (1 if i < total % a.rows else 0) for i in range(a.rows)]


def experience(lengths: list[int], vocab: int, seed: int):
    """The step's scored experience: B rows of a PROMPT-token prompt (one per group) and right-padded
    responses of `lengths` tokens."""
    import torch

    from rltune.rollout.experience import Experience

    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    prompts = torch.randint(4, vocab, (B // GROUP, PROMPT), generator=g).repeat_interleave(GROUP, 0)   # (B, P)
    mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()                       # (B, T)
    return Experience(prompt_ids=prompts, prompt_mask=torch.ones(B, PROMPT, dtype=torch.long),
                      response_ids=torch.randint(4, vocab, (B, T), generator=g) * mask.long(), response_mask=mask,
                      scores=torch.rand(B, generator=g))


def build_model(a, out: Path) -> None:
    """A random Llama of the given shape, saved with save_pretrained (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(hidden_size=a.hidden, intermediate_size=a.hidden * 8 // 3 // 64 * 64 or 64,
                         num_hidden_layers=a.layers, num_attention_heads=max(1, a.hidden // 64),
                         num_key_value_heads=max(1, a.hidden // 64), vocab_size=a.vocab,
                         max_position_embeddings=PROMPT + a.tail * a.median + 64, tie_word_embeddings=False,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)


def child(a) -> dict:
    """One configuration in this (fresh) process."""
    import torch

    from rltune.algo import make_kl_controller
    from rltune.engine.distributed import init_distributed
    from rltune.engine.roles import build_actor, build_reference
    from rltune.recipe.knobs import Knobs
    from rltune.recipe.schema import Recipe
    from rltune.train import loop
    from rltune.train.setup import Components

    torch.set_num_threads(int(os.environ.get("RLTUNE_BENCH_THREADS", os.cpu_count() or 1)))
    batch, cut = CONFIGS[a.child]
    lengths = response_lengths(a, uniform=batch == "uniform")
    r = Recipe.model_validate({
        "model": {"policy": a.model, "attn_implementation": "sdpa"},
        "data": {"train": "builtin:arithmetic", "max_prompt_length": PROMPT},
        "reward": {"functions": ["builtin:format"]},
        "algorithm": {"name": "grpo", "group_size": GROUP, "kl": {"coef": 0.01, "mode": "loss"}},
        "actor": {"lr": 1e-6, "warmup_steps": 0},
        "rollout": {"batch_size": a.rows, "max_new_tokens": max(lengths)},
        "train": {"batch_size": a.rows, "micro_batch_size": a.micro,
                  "max_tokens_per_micro_batch": a.budget if cut != "rows" else None,
                  "padding_free": cut == "packed"},
        "trainer": {"seed": 0, "device": "cpu"},
    })
    dist = init_distributed("cpu")
    c = Components(r, dist, None, None, None, None, None, build_actor(r, "cpu", 100), None,
                   build_reference(r, "cpu"), None, make_kl_controller(0.01, None, 10000), "none")
    knobs = Knobs.from_recipe(r)
    seconds, start_kb, micro = [], 0, []
    for step in range(a.steps + 1):               # step 0 warms up (allocator, optimizer state)
        exp = experience(lengths, a.vocab, step)
        if step == 1:
            Path("/proc/self/clear_refs").write_text("5")        # VmHWM := the current RSS
            start_kb = _status_kb("VmRSS")
        t0 = time.perf_counter()
        learned = loop.learn(c, exp, knobs, torch.Generator().manual_seed(step))
        if step:
            seconds.append(time.perf_counter() - t0)
            micro.append(learned.timings["batch/micro_batches"])
    return {"seconds": statistics.median(seconds), "peak_kb": _status_kb("VmHWM"), "start_kb": start_kb,
            "micro_batches": statistics.median(micro), "tokens": sum(lengths) + PROMPT * len(lengths),
            "longest": max(lengths) + PROMPT}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--rows", type=int, default=32, help="sequences in the update (whole groups of 4)")
    p.add_argument("--median", type=int, default=64, help="median response tokens")
    p.add_argument("--tail", type=int, default=8, help="the long rows' length, x the median")
    p.add_argument("--long", type=int, default=2, help="long rows in the batch")
    p.add_argument("--micro", type=int, default=4, help="train.micro_batch_size (config a)")
    p.add_argument("--budget", type=int, help="train.max_tokens_per_micro_batch (b-e); default micro x (prompt + "
                                              "median), at least the longest sequence")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--only", default="abcde")
    p.add_argument("--child", choices=sorted(CONFIGS), help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    a = p.parse_args()
    a.budget = a.budget or max(a.micro * (PROMPT + a.median), PROMPT + a.tail * a.median)
    if a.child:
        print(json.dumps(child(a)))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="bench-longtail-") as tmp:
        build_model(a, Path(tmp))
        print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; random "
              f"Llama hidden {a.hidden}, {a.layers} layers, vocab {a.vocab}; {a.rows} rows (groups of {GROUP}), "
              f"prompts {PROMPT} tokens, responses ~{a.median} with {a.long} of {a.tail * a.median}; "
              f"micro_batch_size {a.micro}, budget {a.budget} tokens; median of {a.steps} steps after a warm-up")
        print("| config | batch | micro-batches by | tokens | longest row | micro-batches | steps 3-8 (s) "
              "| RSS at start (GiB) | peak RSS (GiB) | peak - start (GiB) |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        args = [f"--{k}={v}" for k, v in vars(a).items() if k not in ("child", "model", "only") and v is not None]
        for name in a.only:
            cmd = [sys.executable, __file__, *args, f"--child={name}", f"--model={tmp}"]
            env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
            out = subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
            m = json.loads(out.strip().splitlines()[-1])
            batch, cut = CONFIGS[name]
            how = {"rows": f"{a.micro} rows", "tokens": f"{a.budget} tokens",
                   "packed": f"{a.budget} tokens, padding-free"}[cut]
            gib = 1 << 20
            print(f"| {name} | {batch} | {how} | {m['tokens']} | {m['longest']} | {m['micro_batches']:g} | "
                  f"{m['seconds']:.2f} | {m['start_kb'] / gib:.2f} | {m['peak_kb'] / gib:.2f} | "
                  f"{(m['peak_kb'] - m['start_kb']) / gib:.2f} |", flush=True)


if __name__ == "__main__":
    main()
