"""Generation one step ahead on this machine: synchronous vs `rollout.asynchronous.max_staleness: 1`.

    python benchmarks/bench_async.py [--steps 8] [--rounds 2]

The SmolLM2 workload (recipes/quickstart.yaml: GRPO, 64 sequences of up to 16 new tokens per step)
with `rollout.engine: vllm-server` in its separate placement on a 2-core CPU: the server pinned to
core 0 (`rollout.server.devices: [0]`), the trainer to core 1 (`taskset -c 1`, one torch thread).
The two settings alternate (sync, K=1, sync, K=1, ...) so that a drift of the machine hits both.
Each run's steps after the first are summarised by their medians: s/step, generation (the
producer's with K=1), the trainer's phases, the weight sync, and the idle time of each side
(async/idle_trainer_s: the trainer waiting for a batch or for the producer before a sync;
async/idle_rollout_s: the producer waiting for the schedule). Nothing here is a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ["timing/step_s", "timing/rollout_s", "timing/reward_s", "timing/reference_s", "timing/old_s",
        "timing/train_s", "timing/sync_ms", "async/idle_trainer_s", "async/idle_rollout_s"]


def one(K: int, steps: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"bench-async-{K}-"))
    cmd = ["taskset", "-c", "1", sys.executable, "-m", "rltune", "train", str(ROOT / "recipes" / "quickstart.yaml"),
           f"trainer.output_dir={out}", "rollout.engine=vllm-server", "rollout.server.devices=[0]", "trainer.threads=1",
           f"trainer.max_steps={steps}", "trainer.eval_every=0", "logging.sample_every=0", "logging.console=plain",
           f"rollout.asynchronous.max_staleness={K}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=3600)
    if res.returncode != 0:
        raise SystemExit(f"K={K} failed:\n{res.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    later = rows[1:]
    med = {k: round(statistics.median(r.get(k, 0.0) for r in later), 3) for k in KEYS}
    return {"max_staleness": K, "steps": len(rows), **med,
            "lag_mean": round(statistics.mean(r.get("async/staleness_mean", 0.0) for r in later), 2),
            "reward_first": round(rows[0]["reward/mean"], 3), "reward_last": round(rows[-1]["reward/mean"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    runs = []
    for _ in range(args.rounds):
        for K in (0, 1):
            runs.append(one(K, args.steps))
            print(json.dumps(runs[-1]), flush=True)
    for K in (0, 1):
        mine = [r["timing/step_s"] for r in runs if r["max_staleness"] == K]
        print(f"max_staleness {K}: median s/step per run {mine}")


if __name__ == "__main__":
    main()
