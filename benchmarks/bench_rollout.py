"""Rollout engine timings: hf vs vllm on the quickstart workload.

    PYTHONPATH=src python benchmarks/bench_rollout.py [--engines hf,vllm] [--models smollm2,tiny-llama]

Prints markdown rows: engine | model | workload | first call s | steady s | sync ms.
Workload: 8 prompts x n=4, 24 new tokens, temperature 1 (the quickstart GRPO step).
`tiny-llama` for vLLM on CPU is builtin:tiny-llama's architecture with 2 heads of 32
(vLLM's CPU attention has no kernel for head size 16); hf runs the same model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "vllm"))


def model_dir(name: str, tmp: Path) -> str:
    from rltune.models import resolve_model_dir

    if name == "smollm2":
        return resolve_model_dir("builtin:smollm2-135m-instruct")
    from rollout_test_helpers import build_tiny_llama32

    return str(build_tiny_llama32(tmp / "tiny-llama32"))


def prompts_for(tok, k: int = 8) -> list[list[int]]:
    qs = [f"What is {a}+{b}? Answer with a number." for a, b in
          [(17, 25), (12, 34), (5, 9), (48, 27), (33, 61), (70, 8), (14, 14), (99, 1)]][:k]
    out = []
    for q in qs:
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                          tokenize=True, return_dict=False)
            if hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tok(q)["input_ids"]
        out.append(list(ids))
    return out


def bench(engine_name: str, mname: str, d: str, repeats: int = 3) -> str:
    import torch

    from rltune.models import load_causal_lm, load_tokenizer
    from rltune.recipe.schema import RolloutCfg
    from rltune.rollout.base import Sampling

    tok = load_tokenizer(d)
    prompts = prompts_for(tok)
    s = Sampling(n=4, temperature=1.0, max_new_tokens=24)
    actor = load_causal_lm(d)
    t0 = time.perf_counter()
    if engine_name == "hf":
        from rltune.rollout.hf import HFRollout

        eng = HFRollout(load_causal_lm(d), tok)
    else:
        from rltune.rollout.vllm import VLLMRollout

        max_len = max(len(p) for p in prompts) + s.max_new_tokens
        eng = VLLMRollout(d, tok, RolloutCfg(cpu_kvcache_gb=2), "fp32", 0, max_len)
    init_s = time.perf_counter() - t0
    torch.manual_seed(0)
    t0 = time.perf_counter()
    eng.generate(prompts, s)
    first = time.perf_counter() - t0
    steady, syncs, cpu = [], [], []
    for _ in range(repeats):
        syncs.append(eng.sync_weights(actor))
        t0, c0 = time.perf_counter(), time.process_time()
        eng.generate(prompts, s)
        steady.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    label = {"smollm2": "SmolLM2-135M fp32", "tiny-llama": "tiny-llama (2x32 heads) fp32"}[mname]
    if hasattr(eng, "close"):
        eng.close()
    return (f"| {engine_name} | {label} | 8 prompts x 4, 24 tokens, T=1 | {init_s:.1f} | {first:.2f} | "
            f"{statistics.median(steady):.2f} | {statistics.median(cpu):.2f} | {statistics.median(syncs):.0f} | "
            f"{os.getloadavg()[0]:.1f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--models", default="tiny-llama,smollm2")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)   # ENGINE:MODEL:DIR, in a child
    a = ap.parse_args()
    if a.one:
        e, m, d = a.one.split(":", 2)
        print(bench(e, m, d, a.repeats), flush=True)
        return
    import subprocess
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")   # quiet DeepSpeed's accelerator probe
    print(f"<!-- torch {torch.__version__}, {os.cpu_count()} CPU cores, threads {torch.get_num_threads()} -->")
    print("| engine | model | workload | engine init s | first call s | steady s (median) | steady CPU s | "
          "sync ms (median) | load avg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for m in a.models.split(","):
            d = model_dir(m, Path(tmp))
            for e in a.engines.split(","):
                # one process per row: vLLM's CPU worker binds OpenMP threads for the process
                out = subprocess.run([sys.executable, __file__, "--one", f"{e}:{m}:{d}", "--repeats",
                                      str(a.repeats)], capture_output=True, text=True)
                rows = [ln for ln in out.stdout.splitlines() if ln.startswith("| ")]
                print(rows[-1] if rows else f"| {e} | {m} | failed: {out.stderr.strip().splitlines()[-1:]} |",
                      flush=True)


if __name__ == "__main__":
    main()
