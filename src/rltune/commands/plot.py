"""`rltune plot RUN_DIR [--output run.png]`: one PNG of a run - reward (+eval), KL with its coefficient,
grad norms, critic loss, entropy, response length, step timings, lr / clipfrac - with the health
events as labelled vertical lines and the autotune stages as shaded bands. Only the panels with data
are drawn (`panels`: a GRPO run has no critic loss), two a row; the eval before training (eval.json)
is a marker at step 0; kl_coef gets a twin axis only when it changes (`kl_coef_axis`); a resume is a
vertical line labelled "resumed" (`resume_steps`).

Long runs: every series is downsampled to at most MAX_POINTS points (the min and the max of each
bucket of steps, so spikes stay visible); every event is still drawn (as a tick along the top of
each panel when there are many); event labels are summarised per kind ("kl_high ×4,210").

Exit codes: 0 written, 2 unreadable input."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

SEV_COLOUR = {"error": "#d62728", "warning": "#ff7f0e", "info": "#1f77b4"}
STAGE_COLOUR = {0: None, 1: "#2ca02c", 2: "#9467bd"}
STAGE_NAME = {0: "cold-start", 1: "acceleration", 2: "anti-overfit"}
MAX_POINTS = 2000      # per plotted series
LABELS_PER_KIND = 4    # event labels on the reward panel, per kind (each names its count)
LABEL_ALL = 12         # up to this many events each gets a label; more: summarised per kind
LABEL_GAP = 0.25       # labels of a kind at least this share of the step range apart; closer ones stack
DENSE_EVENTS = 200     # more events than this: drawn as ticks along the top of each panel
DEFAULT_NAME = "plot.png"   # `--output DIR/`: the file written inside DIR


def downsample_indices(ys, max_points: int = MAX_POINTS) -> list[int]:
    """Indices of the points to draw: all of them when there are at most `max_points`; else, per
    bucket of consecutive points, the min and the max (in step order; NaNs skipped, a bucket of
    only NaNs keeps one to leave the gap)."""
    n = len(ys)
    if n <= max_points:
        return list(range(n))
    import numpy as np

    y = np.asarray(ys, dtype=float)
    nan = np.isnan(y)
    lo_fill, hi_fill = np.where(nan, np.inf, y), np.where(nan, -np.inf, y)
    buckets = max(1, max_points // 2)
    keep: list[int] = []
    for b in range(buckets):
        lo, hi = b * n // buckets, (b + 1) * n // buckets
        if nan[lo:hi].all():
            keep.append(lo)
            continue
        i, j = lo + int(lo_fill[lo:hi].argmin()), lo + int(hi_fill[lo:hi].argmax())
        keep.extend((i,) if i == j else sorted((i, j)))
    return keep


def _series(log, key, max_points: int = MAX_POINTS):
    xs, ys = log.series(key)
    idx = downsample_indices(ys, max_points)
    if len(idx) == len(xs):
        return xs, ys
    return [xs[i] for i in idx], [ys[i] for i in idx]


def _stage_bands(log):
    """[(start_step, end_step, stage)] for stages > 0."""
    bands, cur, start = [], None, None
    last = None
    for step, s in zip(*log.series("autotune/stage")):
        if not math.isfinite(s) or s != int(s) or int(s) not in STAGE_NAME:
            continue   # a stage rltune does not have (a log someone sent): no band
        s = int(s)
        if s != cur:
            if cur:
                bands.append((start, step, cur))
            cur, start = s, step
        last = step
    if cur and last is not None:
        bands.append((start, last + 0.5, cur))
    return bands


# ---- what the plot shows: pure functions of the log (tested without drawing) ----------------------

PANELS = ("reward", "kl", "grad_norm", "critic_loss", "entropy", "length", "timing", "lr")
PANEL_KEYS = {
    "reward": ("reward/mean", "eval/reward"),
    "kl": ("kl", "kl_coef"),
    "grad_norm": ("actor/grad_norm", "critic/grad_norm"),
    "critic_loss": ("critic/loss",),
    "entropy": ("actor/entropy",),
    "length": ("response/length_mean",),
    "timing": ("timing/rollout_s", "timing/train_s", "timing/sync_ms"),
    "lr": ("actor/lr", "critic/lr", "actor/clipfrac"),
}


def _logged(log, key: str) -> bool:
    """`key` has at least one value (a non-finite one counts: critic/loss NaN steps are marked)."""
    return log.has(key) and bool(log.values(key))


def panels(log, eval_before: Optional[float] = None) -> list[str]:
    """The panels drawn, in order: those with data (a GRPO log has no critic loss; a log without
    clipfrac or learning rates has no lr panel). The reward panel stays when nothing else has data
    (it then says "no reward/mean logged" and carries the event labels)."""
    out = [name for name in PANELS
           if any(_logged(log, k) for k in PANEL_KEYS[name]) or (name == "reward" and eval_before is not None)]
    return out or ["reward"]


def kl_coef_axis(log) -> tuple[bool, Optional[float]]:
    """(twin axis?, the constant value): kl_coef gets its own axis only when it changes; a constant
    one (a fixed-coefficient run) is stated in the KL legend instead of a twin axis zoomed into a
    flat line. (False, None) when kl_coef is not logged."""
    ys = [y for y in log.values("kl_coef") if math.isfinite(y)]
    if not ys:
        return False, None
    lo, hi = min(ys), max(ys)
    if hi - lo <= 1e-9 * max(abs(hi), abs(lo), 1e-12):
        return False, ys[0]
    return True, None


def kl_series(log) -> tuple[str, str]:
    """(key, label) of the KL drawn: per token where logged, the figure the health monitor compares
    with health.kl_high (`kl` is summed over a response's tokens and grows with its length)."""
    return ("kl/token_mean", "KL per token") if _logged(log, "kl/token_mean") else ("kl", "KL")


def lr_panel_title(log) -> tuple[bool, str]:
    """(clipfrac on a twin axis?, the panel's title): clipfrac that is 0 on every step (one update
    per batch: the ratio is 1, nothing to clip) is said in the title, not drawn as an empty axis."""
    ys = [y for y in log.values("actor/clipfrac") if math.isfinite(y)]
    if any(y != 0 for y in ys):
        return True, "learning rate (left) and clipfrac (right)"
    return False, "learning rate (clipfrac 0 on every step)" if ys else "learning rate"


def eval_points(run_dir) -> dict[str, float]:
    """The run's eval before and after training, from eval.json ({"before": .., "after": ..}, written
    at the end of a run with an eval set); {} when there is none. The before-score is drawn at
    step 0 on the reward panel (the headline "eval 0.70 -> 0.85")."""
    import json

    p = Path(run_dir)
    p = (p if p.is_dir() else p.parent) / "eval.json"
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(d, dict):
        return {}
    out = {}
    for k in ("before", "after"):
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[k] = float(v)
    return out


def resume_steps(run_dir, events=()) -> list[int]:
    """The steps a run resumed from (the checkpoint's step; training went on at the next one):
    train.log's "resumed from CKPT at step N" lines, and, in metrics.jsonl's line order, a step
    that goes back or repeats (a resumed run appends the steps after its checkpoint again), unless
    a `rollback` event at the step before explains the jump (autotune rolled back, not a resume)."""
    import re

    from rltune.monitor.runlog import _parse_line, bounded_lines, metrics_path

    p = Path(run_dir)
    base = p if p.is_dir() else p.parent
    found: set[int] = set()
    try:
        with open(base / "train.log", "r", encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.search(r"resumed from .* at step (\d+)", line)
                if m:
                    found.add(int(m.group(1)))
    except OSError:
        pass
    rolled = {int(e["step"]) for e in events if e.get("kind") == "rollback" and is_int(e.get("step"))}
    try:
        path = metrics_path(run_dir)
        if path.suffix != ".json":
            prev: Optional[int] = None
            with open(path, "rb") as f:
                for raw, whole in bounded_lines(f):
                    d = _parse_line(raw) if whole and raw.strip() else None
                    if not isinstance(d, dict) or not is_int(d.get("step")):
                        continue
                    s = int(d["step"])
                    if prev is not None and s <= prev and prev not in rolled:
                        found.add(s - 1)   # back to (or again at) s: it resumed from step s - 1
                    prev = s
    except Exception:   # no metrics file (or an unreadable one): read_metrics has said so already
        pass
    return sorted(found)


def is_int(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v == int(v)


def _labels(problems: list[dict], near: float) -> list[tuple[dict, int]]:
    """(event, count) to label: per kind its first event, then the next one at least `near` steps
    after the last label, at most LABELS_PER_KIND; count = events of that kind up to the next label."""
    if len(problems) <= LABEL_ALL:
        return [(e, 1) for e in sorted(problems, key=lambda e: e["step"])]
    by_kind: dict[str, list[dict]] = {}
    for e in sorted(problems, key=lambda e: e["step"]):
        by_kind.setdefault(e["kind"], []).append(e)
    out = []
    for es in by_kind.values():
        chosen: list[list] = []
        for e in es:
            if not chosen or (e["step"] - chosen[-1][0]["step"] >= near and len(chosen) < LABELS_PER_KIND):
                chosen.append([e, 1])
            else:
                chosen[-1][1] += 1
        out.extend((e, n) for e, n in chosen)
    return sorted(out, key=lambda x: x[0]["step"])


def _reward_panel(a, log, series, empty, max_points, eval_at) -> None:
    a.set_title("reward")
    xs, ys = log.series("reward/mean")
    if xs:
        idx = downsample_indices(ys, max_points)
        a.plot([xs[i] for i in idx], [ys[i] for i in idx], label="reward/mean", lw=1.4, color="#1f77b4")
        sx, sd = log.series("reward/std")
        if sx == xs:
            lo = [ys[i] - sd[i] for i in idx]
            hi = [ys[i] + sd[i] for i in idx]
            a.fill_between([xs[i] for i in idx], lo, hi, color="#1f77b4", alpha=0.12, lw=0, label="± reward/std")
    elif not log.has("eval/reward") and "before" not in eval_at:
        empty(a, "reward/mean")
    ex, ey = series("eval/reward")
    if ex:
        a.plot(ex, ey, "o", color="#d62728", ms=5, label="eval/reward")
    before, after = eval_at.get("before"), eval_at.get("after")
    if before is not None:
        a.plot([0], [before], "D", color="#d62728", ms=8, mfc="white", mew=2,
               label=f"eval before training {before:.2f}" + (f" -> {after:.2f}" if after is not None else ""))
        a.annotate(f"{before:.2f}", xy=(0, before), xytext=(6, -4), textcoords="offset points", fontsize=8,
                   color="#d62728", va="top")
    if after is not None and log.steps:
        a.plot([log.steps[-1]], [after], "D", color="#d62728", ms=8, mew=2,
               label="eval after training" if before is None else None)
        a.annotate(f"{after:.2f}", xy=(log.steps[-1], after), xytext=(-6, 6), textcoords="offset points",
                   fontsize=8, color="#d62728", ha="right")


def render(log, events, out: Path, title: str, max_new_tokens: Optional[int] = None,
           grad_clip: Optional[float] = None, max_points: int = MAX_POINTS, force: bool = False,
           default: bool = False, eval_at: Optional[dict] = None, resumed: Sequence[int] = (),
           kl_high: Optional[float] = None) -> Path:
    """Draw the panels that have data (`panels`), two a row. `eval_at`: eval.json's {"before",
    "after"} scores (drawn at step 0 and the last step); `resumed`: the steps a run resumed from
    (vertical lines labelled "resumed")."""
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    eval_at = eval_at or {}
    names = panels(log, eval_at.get("before"))
    nrows = (len(names) + 1) // 2
    fig, axes = plt.subplots(nrows, 2, figsize=(15, 3.5 * nrows + 0.5), sharex=True, squeeze=False)
    grid = axes.ravel()
    for a in grid[len(names):]:      # an odd count: the last cell stays empty; the one above gets x ticks
        fig.delaxes(a)
        if len(names) > 1:
            grid[len(names) - 2].tick_params(labelbottom=True)
            grid[len(names) - 2].set_xlabel("step")
    ax = list(grid[:len(names)])
    panel = dict(zip(names, ax))

    def series(key):
        return _series(log, key, max_points)

    def line(a, key, label=None, **kw):
        xs, ys = series(key)
        if xs:
            a.plot(xs, ys, label=label or key, lw=1.4, **kw)
        return bool(xs)

    def empty(a, what):
        a.text(0.5, 0.5, f"no {what} logged", transform=a.transAxes, ha="center", va="center", color="grey")

    # 1 reward (+ eval points, the eval before training at step 0)
    a = panel.get("reward")
    if a is not None:
        _reward_panel(a, log, series, empty, max_points, eval_at)
    # 2 KL + kl_coef on a twin axis (only when it changes; a constant one is named in the legend)
    a = panel.get("kl")
    if a is not None:
        twin, const = kl_coef_axis(log)
        key, what = kl_series(log)
        a.set_title(f"{what} (left) and kl_coef (right)" if twin else
                    what if const is None else f"{what} (kl_coef {const:g}, constant)")
        if not line(a, key, key, color="#2ca02c"):
            empty(a, key)
        if key != "kl" and kl_high:
            a.axhline(kl_high, color="grey", ls=":", lw=1, label=f"health.kl_high {kl_high:g}")
        if const is not None:   # a legend entry only: no axis for a flat line
            a.plot([], [], " ", label=f"kl_coef {const:g} (constant)")
        if twin:
            t = a.twinx()
            xs, ys = series("kl_coef")
            t.plot(xs, ys, "--", color="#8c564b", lw=1.2, label="kl_coef")
            t.set_ylabel("kl_coef", color="#8c564b")
            t.tick_params(axis="y", colors="#8c564b")
    # 3 grad norms
    a = panel.get("grad_norm")
    if a is not None:
        a.set_title("grad norm")
        got = line(a, "actor/grad_norm", "actor", color="#1f77b4")
        got = line(a, "critic/grad_norm", "critic", color="#ff7f0e") or got
        if grad_clip:
            a.axhline(grad_clip, color="grey", ls=":", lw=1, label=f"actor.grad_clip {grad_clip:g}")
        ys = [y for k in ("actor/grad_norm", "critic/grad_norm") for y in log.series(k)[1] if y == y and y > 0]
        if ys and max(ys) / max(min(ys), 1e-12) > 50:
            a.set_yscale("log")
        if not got:
            empty(a, "grad norm")
    # 4 critic loss (+ non-finite steps marked x: every one of them, in one call)
    a = panel.get("critic_loss")
    if a is not None:
        a.set_title("critic loss")
        line(a, "critic/loss", "critic/loss", color="#9467bd")
        nan_steps = [s for s, v in zip(*log.series("critic/loss")) if v != v]
        if nan_steps:
            a.plot(nan_steps, [0] * len(nan_steps), "x", color="#d62728", ms=9, mew=2, label="non-finite")
    # 5 entropy
    a = panel.get("entropy")
    if a is not None:
        a.set_title("entropy (nats/token)")
        line(a, "actor/entropy", "actor/entropy", color="#17becf")
    # 6 response length
    a = panel.get("length")
    if a is not None:
        a.set_title("response length (tokens)")
        line(a, "response/length_mean", "length mean", color="#bcbd22")
        if max_new_tokens:
            a.axhline(max_new_tokens, color="grey", ls=":", lw=1, label=f"max_new_tokens {max_new_tokens}")
    # 7 timings
    a = panel.get("timing")
    if a is not None:
        a.set_title("step timings: rollout / train (s, left), sync (ms, right)")
        line(a, "timing/rollout_s", "rollout s", color="#1f77b4")
        line(a, "timing/train_s", "train s", color="#ff7f0e")
        if log.has("timing/sync_ms"):
            t = a.twinx()
            xs, ys = series("timing/sync_ms")
            t.plot(xs, ys, color="#d62728", lw=1, alpha=0.8, label="sync ms")
            t.set_ylabel("sync ms", color="#d62728")
            t.tick_params(axis="y", colors="#d62728")
    # 8 lr / clipfrac (clipfrac on a twin axis when logged)
    a = panel.get("lr")
    if a is not None:
        clip, lr_title = lr_panel_title(log)
        a.set_title(lr_title)
        line(a, "actor/lr", "actor/lr", color="#1f77b4")
        line(a, "critic/lr", "critic/lr", color="#ff7f0e")
        if clip:
            t = a.twinx()
            xs, ys = series("actor/clipfrac")
            t.plot(xs, ys, color="#7f7f7f", lw=1, alpha=0.8)
            t.set_ylabel("clipfrac", color="#7f7f7f")
    # autotune stages: shaded bands
    bands = _stage_bands(log)
    for a in ax:
        for s0, s1, st in bands:
            a.axvspan(s0 - 0.5, s1 - 0.5, color=STAGE_COLOUR.get(st) or "#cccccc", alpha=0.08, lw=0)
    # events: vertical lines everywhere (one collection per colour: thousands of events stay cheap),
    # labels on the reward panel
    problems = [e for e in events if e.get("severity") in ("warning", "error")]
    tuned = [e for e in events if e.get("kind") == "autotune"]
    marks = [(sorted(e["step"] for e in problems if e["severity"] == sev), SEV_COLOUR[sev], "--", 0.7)
             for sev in ("warning", "error")]
    marks.append((sorted({e["step"] for e in tuned}), SEV_COLOUR["info"], ":", 0.6))
    # many events: a solid tick along the top of each panel each, so they do not hide the curves
    dense = len(problems) + len(tuned) > DENSE_EVENTS
    y0 = 0.93 if dense else 0.0
    for a in ax:
        for steps, colour, ls, alpha in marks:
            if steps:
                a.vlines(steps, y0, 1, transform=a.get_xaxis_transform(), colors=colour,
                         linestyles="-" if dense else ls, lw=0.8 if dense else 1, alpha=alpha)
    # resume points: a black dash-dot vertical line on every panel, labelled "resumed" on the first
    for a in ax:
        if resumed:
            a.vlines(list(resumed), 0, 1, transform=a.get_xaxis_transform(), colors="black", linestyles="-.",
                     lw=1.1, alpha=0.7)
    if resumed:
        for r in resumed:
            ax[0].annotate("resumed", xy=(r, 0), xycoords=("data", "axes fraction"), xytext=(2, 3),
                           textcoords="offset points", fontsize=7, color="black", rotation=90, va="bottom")
    top = ax[0]
    ymin, ymax = top.get_ylim()
    steps = log.steps
    span = steps[-1] - steps[0]
    few = len(problems) <= LABEL_ALL
    width = max(1.0, (0.1 if few else 0.22) * span)   # about a label's width, in steps
    placed: list[tuple[float, int]] = []              # (step, row) of the labels so far
    for e, count in _labels(problems, max(1.0, LABEL_GAP * span)):
        busy = {row for x, row in placed if e["step"] - x < width}
        k = next(r for r in range(len(placed) + 1) if r not in busy)   # the first free row
        placed.append((e["step"], k))
        text = e["kind"] if count == 1 else f"{e['kind']} ×{count:,}"
        top.annotate(text, xy=(e["step"], ymax), xytext=(3, -12 - 11 * k - (8 if dense else 0)), textcoords="offset points",
                     rotation=0, fontsize=8, color=SEV_COLOUR[e["severity"]], va="top",
                     bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8))
    for a in ax:
        handles, labels = a.get_legend_handles_labels()
        if handles:
            a.legend(loc="best", fontsize=8, framealpha=0.8)
        a.grid(alpha=0.25)
    for a in grid[-2:]:
        if a in ax:
            a.set_xlabel("step")
    extra = [Patch(color=SEV_COLOUR["error"], label="error event"),
             Patch(color=SEV_COLOUR["warning"], label="warning event")]
    if tuned:
        extra.append(Patch(color=SEV_COLOUR["info"], label="autotune change"))
    if resumed:
        extra.append(Patch(color="black", label="resumed"))
    extra += [Patch(color=STAGE_COLOUR[s], alpha=0.3, label=f"stage {STAGE_NAME[s]}") for s in sorted({b[2] for b in bands})]
    fig.legend(handles=extra, loc="upper right", ncol=len(extra), fontsize=9, frameon=False)
    fig.suptitle(title, x=0.01, ha="left", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    try:
        from rltune.outputs import write_output

        fmt = (out.suffix[1:] or "png").lower()
        write_output(out, lambda tmp: fig.savefig(tmp, dpi=100, format=fmt), force=force, replace_ok=default)
    finally:
        plt.close(fig)
    return out


def output_path(out, base: Path) -> Path:
    """Where the PNG goes: RUN_DIR/run.png by default; DIR/plot.png for an existing directory or a
    path ending in '/'; a name without a suffix gets '.png' (what matplotlib writes anyway)."""
    if not out:
        return base / "run.png"
    text = str(out)
    p = Path(out)
    if text.endswith(("/", os.sep)) or p.is_dir():
        return p / DEFAULT_NAME
    if not p.suffix:
        return p.with_name(p.name + ".png")
    return p


def run(run_dir, out=None, maps: Sequence[str] = (), source: Optional[str] = None, force: bool = False) -> int:
    """Entry point for `rltune plot RUN_DIR [--output run.png]`; returns the exit code."""
    from rltune.monitor.detectors import HealthMonitor
    from rltune.monitor.runlog import RunLogError, load_recipe, parse_maps, read_events, read_metrics

    try:
        log = read_metrics(run_dir, parse_maps(maps, source))
    except RunLogError as e:
        print(f"rltune plot: {e}", file=sys.stderr)
        return 2
    recipe, _, _ = load_recipe(run_dir, log)
    events = read_events(run_dir)
    if not any(e.get("kind") != "autotune" for e in events):
        # no health events recorded (another tool's log, or health off): compute them now
        mon = HealthMonitor(recipe, enabled=True, write=False)
        for row in log.iter_rows():
            mon.observe(row)
        events = [e.to_dict() for e in mon.events] + [e for e in events if e.get("kind") == "autotune"]
    p = Path(run_dir)
    base = p if p.is_dir() else p.parent
    default = not out                      # RUN_DIR/run.png: rltune's own output, rewritten by a later call
    out = output_path(out, base)
    n_prob = sum(1 for e in events if e.get("severity") in ("warning", "error"))
    title = f"{base.name or str(base)}: {len(log)} steps, {n_prob} health event(s)"
    try:
        render(log, events, out, title, recipe.rollout.max_new_tokens, recipe.actor.grad_clip, force=force,
               default=default, eval_at=eval_points(run_dir), resumed=resume_steps(run_dir, events),
               kl_high=recipe.health.kl_high)
    except OSError as e:
        print(f"rltune plot: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 2
    except ValueError as e:   # matplotlib: an unknown file format
        if "format" not in str(e).lower():
            raise
        print(f"rltune plot: cannot write {out}: {e}; fix: use a .png (or .svg, .pdf) file name",
              file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0
