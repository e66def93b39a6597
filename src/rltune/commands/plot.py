"""`rltune plot RUN_DIR [-o run.png]`: one PNG of a run - reward (+eval), KL with its coefficient,
grad norms, critic loss, entropy, response length, step timings, lr / clipfrac - with the health
events as labelled vertical lines and the autotune stages as shaded bands.

Exit codes: 0 written, 2 unreadable input."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional, Sequence

SEV_COLOUR = {"error": "#d62728", "warning": "#ff7f0e", "info": "#1f77b4"}
STAGE_COLOUR = {0: None, 1: "#2ca02c", 2: "#9467bd"}
STAGE_NAME = {0: "cold-start", 1: "acceleration", 2: "anti-overfit"}


def _series(rows, key):
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(r["step"])
            ys.append(v if math.isfinite(v) else float("nan"))
    return xs, ys


def _has(rows, key) -> bool:
    return any(isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool) for r in rows)


def _stage_bands(rows):
    """[(start_step, end_step, stage)] for stages > 0."""
    bands, cur, start = [], None, None
    last = None
    for r in rows:
        s = r.get("autotune/stage")
        if not isinstance(s, (int, float)) or isinstance(s, bool) or not math.isfinite(s):
            continue
        s = int(s)
        if s != cur:
            if cur:
                bands.append((start, r["step"], cur))
            cur, start = s, r["step"]
        last = r["step"]
    if cur and last is not None:
        bands.append((start, last + 0.5, cur))
    return bands


def render(rows, events, out: Path, title: str, max_new_tokens: Optional[int] = None,
           grad_clip: Optional[float] = None) -> Path:
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, axes = plt.subplots(4, 2, figsize=(15, 14), sharex=True)
    ax = axes.ravel()

    def line(a, key, label=None, **kw):
        xs, ys = _series(rows, key)
        if xs:
            a.plot(xs, ys, label=label or key, lw=1.4, **kw)
        return bool(xs)

    def empty(a, what):
        a.text(0.5, 0.5, f"no {what} logged", transform=a.transAxes, ha="center", va="center", color="grey")

    # 1 reward (+ eval points)
    a = ax[0]
    a.set_title("reward")
    if line(a, "reward/mean", "reward/mean", color="#1f77b4"):
        xs, ys = _series(rows, "reward/mean")
        sx, sd = _series(rows, "reward/std")
        if sx == xs:
            a.fill_between(xs, [y - s for y, s in zip(ys, sd)], [y + s for y, s in zip(ys, sd)],
                           color="#1f77b4", alpha=0.12, lw=0, label="± reward/std")
    else:
        empty(a, "reward/mean")
    ex, ey = _series(rows, "eval/reward")
    if ex:
        a.plot(ex, ey, "o", color="#d62728", ms=5, label="eval/reward")
    # 2 KL + kl_coef on a twin axis
    a = ax[1]
    a.set_title("KL (left) and kl_coef (right)")
    if not line(a, "kl", "kl", color="#2ca02c"):
        empty(a, "kl")
    if _has(rows, "kl_coef"):
        t = a.twinx()
        xs, ys = _series(rows, "kl_coef")
        t.plot(xs, ys, "--", color="#8c564b", lw=1.2, label="kl_coef")
        t.set_ylabel("kl_coef", color="#8c564b")
        t.tick_params(axis="y", colors="#8c564b")
    # 3 grad norms
    a = ax[2]
    a.set_title("grad norm")
    got = line(a, "actor/grad_norm", "actor", color="#1f77b4")
    got = line(a, "critic/grad_norm", "critic", color="#ff7f0e") or got
    if grad_clip:
        a.axhline(grad_clip, color="grey", ls=":", lw=1, label=f"actor.grad_clip {grad_clip:g}")
    if got:
        ys = [y for k in ("actor/grad_norm", "critic/grad_norm") for y in _series(rows, k)[1] if y == y and y > 0]
        if ys and max(ys) / max(min(ys), 1e-12) > 50:
            a.set_yscale("log")
    else:
        empty(a, "grad norm")
    # 4 critic loss (+ explained variance)
    a = ax[3]
    a.set_title("critic loss")
    if not line(a, "critic/loss", "critic/loss", color="#9467bd"):
        empty(a, "critic loss (GRPO: no critic)")
    nan_steps = [r["step"] for r in rows if isinstance(r.get("critic/loss"), float) and not math.isfinite(r["critic/loss"])]
    for s in nan_steps:
        a.plot([s], [0], "x", color="#d62728", ms=9, mew=2)
    if nan_steps:
        a.plot([], [], "x", color="#d62728", label="non-finite")
    # 5 entropy
    a = ax[4]
    a.set_title("entropy (nats/token)")
    if not line(a, "actor/entropy", "actor/entropy", color="#17becf"):
        empty(a, "entropy")
    # 6 response length
    a = ax[5]
    a.set_title("response length (tokens)")
    if not line(a, "response/length_mean", "length mean", color="#bcbd22"):
        empty(a, "response length")
    if max_new_tokens:
        a.axhline(max_new_tokens, color="grey", ls=":", lw=1, label=f"max_new_tokens {max_new_tokens}")
    # 7 timings
    a = ax[6]
    a.set_title("step timings: rollout / train (s, left), sync (ms, right)")
    got = line(a, "timing/rollout_s", "rollout s", color="#1f77b4")
    got = line(a, "timing/train_s", "train s", color="#ff7f0e") or got
    if _has(rows, "timing/sync_ms"):
        t = a.twinx()
        xs, ys = _series(rows, "timing/sync_ms")
        t.plot(xs, ys, color="#d62728", lw=1, alpha=0.8, label="sync ms")
        t.set_ylabel("sync ms", color="#d62728")
        t.tick_params(axis="y", colors="#d62728")
        got = True
    if not got:
        empty(a, "timings")
    # 8 lr / clipfrac
    a = ax[7]
    a.set_title("learning rate (left) and clipfrac (right)")
    got = line(a, "actor/lr", "actor/lr", color="#1f77b4")
    got = line(a, "critic/lr", "critic/lr", color="#ff7f0e") or got
    if _has(rows, "actor/clipfrac"):
        t = a.twinx()
        xs, ys = _series(rows, "actor/clipfrac")
        t.plot(xs, ys, color="#7f7f7f", lw=1, alpha=0.8)
        t.set_ylabel("clipfrac", color="#7f7f7f")
        got = True
    if not got:
        empty(a, "lr / clipfrac")

    # autotune stages: shaded bands
    bands = _stage_bands(rows)
    for a in ax:
        for s0, s1, st in bands:
            a.axvspan(s0 - 0.5, s1 - 0.5, color=STAGE_COLOUR.get(st) or "#cccccc", alpha=0.08, lw=0)
    # events: vertical lines everywhere, labels on the reward panel
    problems = [e for e in events if e.get("severity") in ("warning", "error")]
    tuned = [e for e in events if e.get("kind") == "autotune"]
    for a in ax:
        for e in problems:
            a.axvline(e["step"], color=SEV_COLOUR[e["severity"]], ls="--", lw=1, alpha=0.7)
        for s in sorted({e["step"] for e in tuned}):
            a.axvline(s, color=SEV_COLOUR["info"], ls=":", lw=1, alpha=0.6)
    top = ax[0]
    ymin, ymax = top.get_ylim()
    steps = [r["step"] for r in rows]
    near = max(1.0, 0.1 * (max(steps) - min(steps)))   # labels closer than this are stacked
    placed: list[float] = []
    for e in sorted(problems, key=lambda e: e["step"]):
        k = sum(1 for x in placed if abs(e["step"] - x) < near)
        placed.append(e["step"])
        top.annotate(e["kind"], xy=(e["step"], ymax), xytext=(3, -12 - 11 * k), textcoords="offset points",
                     rotation=0, fontsize=8, color=SEV_COLOUR[e["severity"]], va="top",
                     bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
    for a in ax:
        handles, labels = a.get_legend_handles_labels()
        if handles:
            a.legend(loc="best", fontsize=8, framealpha=0.8)
        a.grid(alpha=0.25)
    for a in axes[-1]:
        a.set_xlabel("step")
    extra = [Patch(color=SEV_COLOUR["error"], label="error event"),
             Patch(color=SEV_COLOUR["warning"], label="warning event")]
    if tuned:
        extra.append(Patch(color=SEV_COLOUR["info"], label="autotune change"))
    extra += [Patch(color=STAGE_COLOUR[s], alpha=0.3, label=f"stage {STAGE_NAME[s]}") for s in sorted({b[2] for b in bands})]
    fig.legend(handles=extra, loc="upper right", ncol=len(extra), fontsize=9, frameon=False)
    fig.suptitle(title, x=0.01, ha="left", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def run(run_dir, out=None, maps: Sequence[str] = (), source: Optional[str] = None) -> int:
    """Entry point for `rltune plot RUN_DIR [-o run.png]`; returns the exit code."""
    from rltune.monitor.detectors import HealthMonitor
    from rltune.monitor.runlog import RunLogError, load_recipe, parse_maps, read_events, read_metrics

    try:
        log = read_metrics(run_dir, parse_maps(maps, source))
    except RunLogError as e:
        print(f"rltune plot: {e}", file=sys.stderr)
        return 2
    recipe, _, _ = load_recipe(run_dir, log.rows)
    events = read_events(run_dir)
    if not any(e.get("kind") != "autotune" for e in events):
        # no health events recorded (another tool's log, or health off): compute them now
        mon = HealthMonitor(recipe, enabled=True, write=False)
        for row in log.rows:
            mon.observe(row)
        events = [e.to_dict() for e in mon.events] + [e for e in events if e.get("kind") == "autotune"]
    p = Path(run_dir)
    base = p if p.is_dir() else p.parent
    out = Path(out) if out else base / "run.png"
    n_prob = sum(1 for e in events if e.get("severity") in ("warning", "error"))
    title = f"{base.name or str(base)}: {len(log.rows)} steps, {n_prob} health event(s)"
    try:
        render(log.rows, events, out, title, recipe.rollout.max_new_tokens, recipe.actor.grad_clip)
    except OSError as e:
        print(f"rltune plot: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
