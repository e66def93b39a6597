"""The autotune experiment (docs/autotune-experiment.md): recipes/experiments/lr-too-high.yaml
trained without autotune, with `autotune.mode: act`, and with act plus `autotune.rollback`, for a
few seeds, through the real CLI.

    PYTHONPATH=src python benchmarks/autotune_experiment.py [--seeds 1 2] [--steps 30]
        [--variants off act] [--out runs/autotune-experiment] [--png docs/img/autotune-experiment.png]

Prints a markdown table (seed, variant, reward first-3 / last-3 mean, max KL, KL last-10 mean,
final entropy, health events, autotune changes) and writes a PNG with the reward and KL curves of
both variants. Runs one training at a time (each ~1-3 min on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "experiments" / "lr-too-high.yaml"
VARIANTS = {"off": ["autotune.enabled=false"], "act": ["autotune.enabled=true", "autotune.mode=act"],
            "rollback": ["autotune.enabled=true", "autotune.mode=act", "autotune.rollback=true"]}
# what the health monitor reports when a run blows up (docs/health.md)
BLOWUP_KINDS = ("kl_spike", "kl_high", "grad_spike", "reward_collapse", "entropy_collapse")


def train(seed: int, variant: str, out_root: Path, steps: int | None = None, recipe: Path = RECIPE,
          extra: list[str] = ()) -> Path:
    """One run through `python -m rltune train`; returns its run directory."""
    run_dir = out_root / f"seed{seed}-{variant}"
    args = [sys.executable, "-m", "rltune", "train", str(recipe), f"trainer.output_dir={run_dir}",
            f"trainer.seed={seed}", *VARIANTS[variant], *extra, "--resume", "never"]
    if steps:
        args.append(f"trainer.max_steps={steps}")
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"seed{seed}-{variant}.log", "w") as log:
        proc = subprocess.run(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}; see {log.name}")
    return run_dir


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(run_dir: Path) -> dict:
    ms = read_jsonl(run_dir / "metrics.jsonl")
    evs = read_jsonl(run_dir / "events.jsonl")
    rewards = [m["reward/mean"] for m in ms]
    kls = [m["kl"] for m in ms]
    health = [e for e in evs if e["kind"] not in ("autotune", "rollback")]
    rollbacks = [e for e in evs if e["kind"] == "rollback"]
    tune = [e for e in evs if e["kind"] == "autotune"]
    return {
        "steps": [m["step"] for m in ms], "reward": rewards, "kl": kls,
        "entropy": [m.get("actor/entropy") for m in ms],
        "reward_first3": sum(rewards[:3]) / 3, "reward_last3": sum(rewards[-3:]) / 3,
        "kl_max": max(kls), "kl_last10": sum(kls[-10:]) / len(kls[-10:]),
        "entropy_last": ms[-1].get("actor/entropy"),
        "health": [(e["step"], e["kind"]) for e in health],
        "blowup": [(e["step"], e["kind"]) for e in health if e["kind"] in BLOWUP_KINDS],
        "rollbacks": [(e["step"], e["numbers"].get("trigger"), e["numbers"].get("from_step")) for e in rollbacks],
        "autotune": [(e["step"], e["numbers"].get("knob"), e["numbers"].get("old"), e["numbers"].get("new"),
                      e["numbers"].get("action")) for e in tune],
    }


def _knob(k: str) -> str:
    return {"actor.lr": "lr", "algorithm.kl.coef": "kl", "algorithm.clip_range": "clip"}.get(k, k)


def table(rows: list[tuple[int, str, dict]]) -> str:
    rb = any(v == "rollback" for _, v, _ in rows)
    out = ["| seed | variant | reward first-3 | reward last-3 | max KL | KL last-10 | entropy end | health events | autotune changes |"
           + (" rollbacks |" if rb else ""),
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |" + (" --- |" if rb else "")]
    for seed, variant, s in rows:
        ev = ", ".join(f"{k}@{st}" for st, k in s["health"]) or "-"
        ch = "; ".join(f"@{st} {_knob(k)} {o:g}->{n:g}" for st, k, o, n, _ in s["autotune"]) or "-"
        out.append(f"| {seed} | {variant} | {s['reward_first3']:.3f} | {s['reward_last3']:.3f} | {s['kl_max']:.1f} | "
                   f"{s['kl_last10']:.1f} | {s['entropy_last']:.3f} | {ev} | {ch} |"
                   + ((" " + ("; ".join(f"@{st} {t} -> step {f}" for st, t, f in s["rollbacks"]) or "-") + " |")
                      if rb else ""))
    return "\n".join(out)


def plot(rows: list[tuple[int, str, dict]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    colors = {"off": "tab:red", "act": "tab:blue", "rollback": "tab:green"}
    names = {"off": "no autotune", "act": "autotune: act", "rollback": "act + rollback"}
    styles = ["-", "--", ":", "-."]
    seeds = sorted({r[0] for r in rows})
    for seed, variant, s in rows:
        ls = styles[seeds.index(seed) % len(styles)]
        lab = f"seed {seed}, {names[variant]}"
        axes[0].plot(s["steps"], s["reward"], ls, color=colors[variant], label=lab)
        axes[1].plot(s["steps"], s["kl"], ls, color=colors[variant], label=lab)
        axes[2].plot(s["steps"], s["entropy"], ls, color=colors[variant], label=lab)
        if variant != "off":
            for st in sorted({c[0] for c in s["autotune"]}):
                for ax in axes:
                    ax.axvline(st, color=colors[variant], alpha=0.35, lw=1, ls=ls)
    axes[0].set(title="reward/mean (exact_answer + format)", xlabel="step")
    axes[1].set(title="KL to the reference (nats / sequence)", xlabel="step")
    axes[2].set(title="actor entropy (nats / token)", xlabel="step")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=8, frameon=False)
    fig.suptitle("lr-too-high.yaml (actor lr 1.0, 20-step warmup): "
                 + " vs ".join(names[v] for v in dict.fromkeys(r[1] for r in rows))
                 + " (vertical lines: autotune changes)", fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["off", "act"])
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="extra recipe overrides for every run (e.g. actor.warmup_steps=2)")
    ap.add_argument("--steps", type=int, default=None, help="trainer.max_steps (default: the recipe's)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "autotune-experiment")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "img" / "autotune-experiment.png")
    ap.add_argument("--reuse", action="store_true", help="keep finished run directories (with final/), train the rest")
    a = ap.parse_args(argv)
    rows = []
    for seed in a.seeds:
        for variant in a.variants:
            run_dir = a.out / f"seed{seed}-{variant}"
            if not (a.reuse and (run_dir / "final").exists()):
                t0 = time.time()
                train(seed, variant, a.out, a.steps, extra=a.set)
                print(f"seed {seed} {variant}: {time.time() - t0:.0f} s", file=sys.stderr)
            rows.append((seed, variant, summarize(run_dir)))
    print(table(rows))
    plot(rows, a.png)
    print(f"\nwrote {a.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
