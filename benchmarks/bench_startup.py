"""Cold start of `python -m rltune validate recipes/minimal.yaml`: median wall time of N runs.

    PYTHONPATH=src python benchmarks/bench_startup.py [--runs 10] [-- extra args]

Prints a markdown table row: wall median/min/max, CPU (user+sys) median, bare interpreter, load average.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("args", nargs="*", default=["validate", "recipes/minimal.yaml"])
    a = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_COLOR": "1"}
    cmd = [sys.executable, "-m", "rltune", *a.args]
    subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True)  # warm the OS file cache and .pyc files
    times, cpu = [], []
    for _ in range(a.runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True)
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        if p.returncode not in (0, 1):
            print(p.stdout.decode(), p.stderr.decode(), file=sys.stderr)
            return p.returncode
    base = []
    for _ in range(a.runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], env=env, capture_output=True)
        base.append(time.perf_counter() - t0)
    shown = "python -m rltune " + " ".join(a.args)
    load = os.getloadavg()[0]
    print("| command | wall median (s) | wall min (s) | wall max (s) | CPU (user+sys) median (s) | bare `python -c pass` (s) | runs | load avg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print(f"| `{shown}` | {statistics.median(times):.3f} | {min(times):.3f} | {max(times):.3f} | "
          f"{statistics.median(cpu):.3f} | {statistics.median(base):.3f} | {a.runs} | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
