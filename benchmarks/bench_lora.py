"""Full fine-tuning vs LoRA on the quickstart workload, side by side.

    python benchmarks/bench_lora.py [--sides full,lora,lora-vllm-merged,lora-vllm-adapter] [--steps 10]
                                    [--sync-steps 4] [--threads 2] [--work DIR]

Sides (fresh processes, one after the other, same seed):
- full: `rltune train recipes/quickstart.yaml` (SmolLM2-135M-Instruct, fp32, hf engine)
- lora: `rltune train recipes/quickstart-lora.yaml` (the same workload, r 16 all-linear, lr 1e-4)
- lora-vllm-merged / lora-vllm-adapter: quickstart-lora on the vLLM engine with
  `rollout.lora_sync` merged / adapter, `--sync-steps` steps without eval: the weight-sync cost
- full-vllm: the quickstart on the vLLM engine, `--sync-steps` steps (the full-weight sync)

Reported per side: peak RSS of the run's process (os.wait4), median step time, median weight
sync (timing/sync_ms), the size of the last checkpoint (written at the end of the run), and the
held-out reward before -> after (greedy answers on 32 prompts; full and lora sides only).
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
COMMON = ["logging.sample_every=0", "trainer.device=cpu", "trainer.save_every=0"]
SIDES = {   # recipe, overrides, evaluated
    "full": ("recipes/quickstart.yaml", ["rollout.engine=hf"], True),
    "lora": ("recipes/quickstart-lora.yaml", ["rollout.engine=hf"], True),
    "full-vllm": ("recipes/quickstart.yaml", ["rollout.engine=vllm"], False),
    "lora-vllm-merged": ("recipes/quickstart-lora.yaml", ["rollout.engine=vllm", "rollout.lora_sync=merged"], False),
    "lora-vllm-adapter": ("recipes/quickstart-lora.yaml", ["rollout.engine=vllm", "rollout.lora_sync=adapter"], False),
}


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(side: str, steps: int, sync_steps: int, out: Path, threads: int = 2) -> dict:
    recipe, extra, evaluated = SIDES[side]
    n = steps if evaluated else sync_steps
    cmd = [sys.executable, "-m", "rltune", "train", recipe, f"trainer.output_dir={out / 'run'}",
           f"trainer.max_steps={n}", f"trainer.eval_every={n if evaluated else 0}", f"trainer.threads={threads}",
           *COMMON, *extra,
           "--resume", "never", "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "log.txt", "w") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{side} exited {status}: {(out / 'log.txt').read_text()[-2000:]}")
    run_dir = out / "run"
    ms = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    ms = [m for m in ms if "timing/step_s" in m]
    ckpts = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.is_dir()) if (run_dir / "checkpoints").is_dir() else []
    res = {"side": side, "steps": n, "wall_s": wall, "maxrss_gib": ru.ru_maxrss / 1024**2,
           "step_s": statistics.median(m["timing/step_s"] for m in ms),
           # the first sync happens at start (not in the metrics); these are the per-step ones
           "sync_ms": statistics.median(m["timing/sync_ms"] for m in ms),
           "checkpoint_mb": du(ckpts[-1]) / 1e6 if ckpts else None,
           "final_mb": du(run_dir / "final") / 1e6 if (run_dir / "final").is_dir() else None}
    if evaluated:
        ev = json.loads((run_dir / "eval.json").read_text())
        res.update(before=ev["before"], after=ev["after"])
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sides", default="full,lora,lora-vllm-merged,lora-vllm-adapter")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--sync-steps", type=int, default=4)
    p.add_argument("--work", default=None)
    p.add_argument("--threads", type=int, default=2, help="torch threads per run (trainer.threads)")
    a = p.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="bench-lora-"))
    sides = a.sides.split(",")
    print(f"# bench-lora: {', '.join(sides)}; {a.steps} steps (vLLM sides {a.sync_steps}); runs in {work}", flush=True)
    rows = []
    for side in sides:
        r = run(side, a.steps, a.sync_steps, work / side, a.threads)
        rows.append(r)
        print(json.dumps(r), flush=True)
    print("\n| side | steps | peak RSS (GiB) | s/step (median) | sync ms (median) | checkpoint (MB) | final/ (MB) | eval before -> after |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ev = f"{r['before']:.3f} -> {r['after']:.3f}" if "after" in r else "-"
        ck = f"{r['checkpoint_mb']:.1f}" if r["checkpoint_mb"] is not None else "-"
        fi = f"{r['final_mb']:.1f}" if r["final_mb"] is not None else "-"
        print(f"| {r['side']} | {r['steps']} | {r['maxrss_gib']:.2f} | {r['step_s']:.2f} | {r['sync_ms']:.0f} | {ck} | {fi} | {ev} |")


if __name__ == "__main__":
    main()
