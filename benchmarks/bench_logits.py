"""The log-prob pass's logits buffer, before and after the chunked output layer (train/chunked_head.py).

    make bench-logits            (or: python benchmarks/bench_logits.py [--rows 4] [--response 256])

A llama-shaped model with Qwen2.5's 151,936-token vocabulary and a small body (hidden 256, 2
layers, fp32, random weights, built from a config) runs one training forward + backward of the
log-prob pass on a micro-batch of `--rows` sequences (32-token prompts, `--response` response
tokens). It does that in a fresh process per side, each process measuring its peak RSS (VmHWM)
above what it held before the pass, and the pass's wall time:
- `whole`: the logits of the whole micro-batch at once (what rltune did before: chunking off);
- `chunked`: the output layer run in chunks of 2^26 // 151,936 = 441 positions.

Both compute the same log-probs, which is checked. Each side also prints the plan's "actor logits"
item for the same shape (plan/budget.py logits_bytes, chunked or not). Sides alternate over
`--rounds`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 151_936


def _vm(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(key)


def one_side(side: str, rows: int, response: int) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from rltune.rollout.experience import Experience
    from rltune.train import chunked_head
    from rltune.train.update import response_logp_entropy

    torch.set_num_threads(2)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).train()
    if side == "whole":
        chunked_head.HEAD_CHUNK_ELEMS = 1 << 62          # one chunk holds any micro-batch: the whole logits
    g = torch.Generator().manual_seed(1)
    P = 32
    mb = Experience(prompt_ids=torch.randint(10, VOCAB, (rows, P), generator=g),
                    prompt_mask=torch.ones(rows, P, dtype=torch.long),
                    response_ids=torch.randint(10, VOCAB, (rows, response), generator=g),
                    response_mask=torch.ones(rows, response))
    Path("/proc/self/clear_refs").write_text("5")
    before = _vm("VmRSS")
    t0 = time.perf_counter()
    logp, ent = response_logp_entropy(model, mb, 1.0)
    (logp.mean() + 0.01 * ent.mean()).backward()
    seconds = time.perf_counter() - t0
    peak = _vm("VmHWM") - before
    from types import SimpleNamespace

    from rltune.plan.budget import logits_bytes

    plan = logits_bytes(SimpleNamespace(vocab=VOCAB), rows, response, 4, backward=True, chunked=side == "chunked")
    return {"side": side, "peak_above_start": peak, "seconds": seconds, "plan_logits": plan,
            "logp_sum": float(logp.sum())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--response", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--side", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.side:
        print(json.dumps(one_side(a.side, a.rows, a.response)))
        return
    runs: dict = {"whole": [], "chunked": []}
    for _ in range(a.rounds):
        for side in runs:
            out = subprocess.run([sys.executable, __file__, "--side", side, "--rows", str(a.rows),
                                  "--response", str(a.response)], cwd=ROOT, capture_output=True, text=True, check=True)
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    sums = {r["logp_sum"] for rs in runs.values() for r in rs}
    same = max(sums) - min(sums) <= 1e-3 * max(1.0, abs(max(sums)))
    print(f"micro-batch {a.rows} x ({a.response} + 1) positions x vocab {VOCAB:,}, fp32, 2 threads; "
          f"{a.rounds} round(s), sides alternated; log-probs equal: {same}")
    print("| side | peak RSS above start (GiB) | forward + backward (s) | plan: actor logits (GiB) |")
    print("| --- | --- | --- | --- |")
    for side, rs in runs.items():
        peak = statistics.median(r["peak_above_start"] for r in rs) / 2**30
        sec = statistics.median(r["seconds"] for r in rs)
        print(f"| {side} | {peak:.2f} | {sec:.2f} | {rs[0]['plan_logits'] / 2**30:.2f} |")


if __name__ == "__main__":
    main()
