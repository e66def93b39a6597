"""GRPO vs the DAPO and GSPO presets on the quickstart workload, several seeds each.

    python benchmarks/bench_algorithms.py [--seeds 1,2,3] [--steps 10] [--work DIR]

Each run is `rltune train recipes/quickstart.yaml` (SmolLM2-135M-Instruct, builtin arithmetic,
16 prompts x 4 samples per step, <= 16 new tokens, fp32, 2 threads, hf engine) with the side's
overrides, evaluated before the first and after the last step (greedy answers on 32 held-out
prompts). Runs alternate by seed (A B C A B C ...) in fresh processes. Reported per side: the
held-out reward before -> after (mean and per seed), the run's wall time, the median step time,
the generation time per step and, for DAPO, what dynamic sampling cost (generation calls per
step, extra generation time, the share of zero-variance groups).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["trainer.save_every=0", "logging.sample_every=0", "trainer.threads=2",
          "trainer.device=cpu", "rollout.engine=hf"]
SIDES = {
    "grpo": [],
    # DAPO removes the KL term (sec. 2.3); quickstart's own kl.coef would win over the preset's.
    # Its overlong buffer must fit quickstart's 16 new tokens.
    "dapo": ["preset=dapo", "algorithm.kl.coef=0", "reward.overlong={buffer: 4, penalty: 1.0}"],
    "gspo": ["preset=gspo"],
}


def run(side: str, seed: int, steps: int, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "rltune", "train", "recipes/quickstart.yaml", f"trainer.output_dir={out / 'run'}",
           f"trainer.max_steps={steps}", f"trainer.eval_every={steps}", f"trainer.seed={seed}", *COMMON, *SIDES[side], "--resume", "never", "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    with open(out / "log.txt", "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{side} seed {seed} exited {proc.returncode}: {(out / 'log.txt').read_text()[-2000:]}")
    ms = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    ms = [m for m in ms if "timing/step_s" in m]
    ev = json.loads((out / "run" / "eval.json").read_text())
    med = lambda k: statistics.median(m.get(k, 0.0) for m in ms)  # noqa: E731
    return {"side": side, "seed": seed, "before": ev["before"], "after": ev["after"], "wall_s": wall,
            "step_s": med("timing/step_s"), "rollout_s": med("timing/rollout_s"),
            "extra_gen_s": sum(m.get("timing/extra_gen_s", 0.0) for m in ms) / len(ms),
            "gen_calls": sum(m.get("rollout/gen_calls", 4.0) for m in ms) / len(ms),
            "zero_std": sum(m.get("rollout/zero_std_frac", 0.0) for m in ms) / len(ms),
            "reward_first": ms[0]["reward/mean"], "reward_last": ms[-1]["reward/mean"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--sides", default=",".join(SIDES))
    p.add_argument("--work", default=None)
    a = p.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="bench-algos-"))
    seeds = [int(s) for s in a.seeds.split(",")]
    sides = a.sides.split(",")
    print(f"# bench-algorithms: {', '.join(sides)}; seeds {seeds}; {a.steps} steps; runs in {work}", flush=True)
    rows = []
    for seed in seeds:
        for side in sides:
            r = run(side, seed, a.steps, work / f"{side}-s{seed}")
            rows.append(r)
            print(f"{side} seed {seed}: eval {r['before']:.3f} -> {r['after']:.3f}, wall {r['wall_s']:.0f} s, "
                  f"step {r['step_s']:.1f} s, gen calls/step {r['gen_calls']:.1f}", flush=True)
    (work / "results.json").write_text(json.dumps(rows, indent=1))
    print("\n| side | eval reward before → after (mean of seeds) | after, per seed | run wall (s, mean) | "
          "s/step (median) | generation s/step | generation calls/step | extra generation s/step | zero-std groups |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for side in sides:
        rs = [r for r in rows if r["side"] == side]
        mean = lambda k: sum(r[k] for r in rs) / len(rs)  # noqa: E731
        print(f"| {side} | {mean('before'):.3f} → {mean('after'):.3f} | "
              f"{', '.join(format(r['after'], '.3f') for r in rs)} | {mean('wall_s'):.0f} | {mean('step_s'):.1f} | "
              f"{mean('rollout_s'):.1f} | {mean('gen_calls'):.1f} | {mean('extra_gen_s'):.1f} | {mean('zero_std'):.2f} |")


if __name__ == "__main__":
    main()
