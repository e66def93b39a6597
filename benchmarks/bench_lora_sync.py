"""Weight sync into vLLM with a LoRA actor: merged weights vs the adapter alone.

    python benchmarks/bench_lora_sync.py [--syncs 6] [--r 16]

For each `rollout.lora_sync` mode, in a fresh process: SmolLM2-135M-Instruct wrapped in a PEFT
adapter (r 16, alpha 32, all-linear, as recipes/quickstart-lora.yaml), the vLLM rollout engine the
quickstart-lora recipe builds on this machine, then `--syncs` syncs, each after the adapter moved
(as an update moves it), with one short generation between syncs (so that the next sync finds
the engine as a training step leaves it). Reported: the median sync time in ms (what
`timing/sync_ms` logs: merged = merge + in-place reload of 135M parameters; adapter = write the
adapter in PEFT format + load it as a vLLM LoRA) and the mean |rollout logp - actor logp| after
the last sync (the stale-weight probe). Then `--gen-calls` timed generation calls of the
quickstart-lora rollout's shape (4 prompts x 4 samples, 16 new tokens, temperature 1): what
generating costs with the engine built for each mode (adapter: vLLM with `enable_lora`, every
request carrying the adapter; merged: plain vLLM on merged weights).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_mode(mode: str, syncs: int, r: int, gen_calls: int) -> dict:
    import torch

    from rltune.models import load_causal_lm, load_tokenizer
    from rltune.models.lora import apply_lora
    from rltune.recipe import load_recipe
    from rltune.rollout import make_rollout
    from rltune.rollout.base import Sampling

    recipe = load_recipe(str(ROOT / "recipes" / "quickstart-lora.yaml"),
                         ["rollout.engine=vllm", f"rollout.lora_sync={mode}", f"model.lora.r={r}",
                          f"model.lora.alpha={2 * r}", "trainer.device=cpu"]).recipe
    torch.set_num_threads(2)
    actor = apply_lora(load_causal_lm(recipe.model.policy), recipe.model.lora)
    tok = load_tokenizer(recipe.model.policy)
    engine = make_rollout(recipe, None, tok, "cpu")
    prompts = [tok(t)["input_ids"] for t in ("What is 3+4?", "What is 9-2?")]
    s = Sampling(n=1, greedy=True, max_new_tokens=8)
    gen = torch.Generator().manual_seed(0)
    times = []
    try:
        for _ in range(syncs):
            with torch.no_grad():   # the adapter moves, as an update moves it
                for n, p in actor.named_parameters():
                    if "lora_B" in n:
                        p.add_(torch.randn(p.shape, generator=gen) * 1e-3)
            times.append(engine.sync_weights(actor))
            out = engine.generate(prompts, s)
        actor.eval()
        ids = torch.cat([out.prompt_ids, out.response_ids], dim=1)
        mask = torch.cat([out.prompt_mask, torch.ones_like(out.response_ids)], dim=1)
        with torch.no_grad():
            logits = actor(input_ids=ids, attention_mask=mask).logits[:, out.prompt_ids.shape[1] - 1:-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, out.response_ids[..., None])[..., 0]
        diff = float(((logp - out.rollout_logp).abs() * out.response_mask).sum() / out.response_mask.sum())
        rollout = [tok(f"What is {a}+{b}?")["input_ids"] for a, b in ((3, 4), (9, 2), (5, 5), (7, 1))]
        shape = Sampling(n=4, temperature=1.0, max_new_tokens=16)
        gen_s, tokens = [], []
        for _ in range(gen_calls + 1):                       # the first call warms up, not counted
            t0 = time.perf_counter()
            out = engine.generate(rollout, shape)
            gen_s.append(time.perf_counter() - t0)
            tokens.append(float(out.response_mask.sum()))
    finally:
        engine.close()
    gen_med = statistics.median(gen_s[1:] or gen_s)
    return {"mode": mode, "syncs_ms": [round(t, 1) for t in times], "median_ms": statistics.median(times[1:] or times),
            "logprob_diff_mean": diff, "gen_s": [round(t, 3) for t in gen_s[1:]], "gen_median_s": gen_med,
            "gen_tokens_per_s": sum(tokens[1:]) / max(sum(gen_s[1:]), 1e-9)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--syncs", type=int, default=6)
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--gen-calls", type=int, default=5)
    p.add_argument("--mode", default=None, help=argparse.SUPPRESS)   # the child process
    a = p.parse_args()
    if a.mode:
        print("RESULT " + json.dumps(one_mode(a.mode, a.syncs, a.r, a.gen_calls)), flush=True)
        return
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1")
    rows = []
    for mode in ("merged", "adapter"):
        proc = subprocess.run([sys.executable, __file__, "--mode", mode, "--syncs", str(a.syncs), "--r", str(a.r),
                               "--gen-calls", str(a.gen_calls)],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise SystemExit(f"{mode} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        rows.append(json.loads(line[len("RESULT "):]))
        print(json.dumps(rows[-1]), flush=True)
    print("\n| lora_sync | sync ms (median, first excluded) | each sync (ms) | logprob diff after the last sync |")
    print("| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['mode']} | {r['median_ms']:.0f} | {', '.join(f'{t:.0f}' for t in r['syncs_ms'])} | {r['logprob_diff_mean']:.1e} |")
    print("\n| lora_sync | generation call, median s (4 prompts x 4 samples, 16 tokens) | tokens/s |")
    print("| --- | --- | --- |")
    for r in rows:
        print(f"| {r['mode']} | {r['gen_median_s']:.3f} | {r['gen_tokens_per_s']:.0f} |")


if __name__ == "__main__":
    main()
