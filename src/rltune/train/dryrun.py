"""`rltune train RECIPE --dry-run`: build every engine exactly as a run does, run one step of the
smallest real work, and print the peak memory of each phase beside `rltune plan`'s estimate.

The step is the loop's own `train_step` (loop.py) on the recipe with smaller batches, so the same
code runs: the memory-relevant sizes stay as the recipe has them (rollout.batch_size sequences
per generation call, train.micro_batch_size sequences per forward/backward pass, the sequence
lengths, the engines, ZeRO stage, precision), only the amount of work shrinks to one step with
one optimizer update of the fewest whole generation calls that fill one micro-batch per rank
(train.batch_size = lcm(rollout.batch_size, micro_batch_size x world), ppo_epochs 1,
updates_per_step 1). Nothing is written: no run directory, train.log, metrics, checkpoint or final/.
Before anything is built, the models' config.json files are read and checked as `rltune plan` reads
them (`check_configs`): one that is unusable (not a regular file, too large, not JSON, a size that is
not a whole number within bounds) stops the dry run with exit 2 and a message naming the file and field.

Memory per phase, on one device (the largest over ranks):
- CUDA: torch.cuda.max_memory_allocated, reset (reset_peak_memory_stats) as each phase begins;
- CPU: the process's resident-set high-water mark (VmHWM in /proc/self/status), reset as each
  phase begins by writing "5" to /proc/self/clear_refs (Linux >= 4.0). Where that is refused
  the numbers are the cumulative peak since the process started, and the report says so.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import time
from pathlib import Path

from ..recipe.schema import Recipe
from .console import LOG, setup_logging

PHASES = ("setup", "rollout", "experience", "update", "sync")
WHAT = {"setup": "engines built",
        "rollout": "steps 1-2: generation and reward",
        "experience": "steps 3-7: reference / behaviour / value passes, advantages",
        "update": "step 8: one optimizer update (forward, backward, optimizer step)",
        "sync": "step 9: weight sync actor -> rollout engine, metrics"}


def reduced(recipe: Recipe, world: int) -> Recipe:
    """The recipe for one dry-run step: same engines and per-pass sizes, the least work."""
    r = recipe
    per_update = math.lcm(r.rollout.batch_size, r.train.micro_batch_size * world)
    return r.model_copy(update={
        "train": r.train.model_copy(update={"batch_size": per_update, "updates_per_step": 1, "ppo_epochs": 1}),
        "trainer": r.trainer.model_copy(update={"max_steps": 1, "save_every": 0, "eval_every": 0}),
    })


class Meter:
    """Peak memory since the last mark, per phase (bytes)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.device = device
        self.cumulative = False   # CPU only: VmHWM could not be reset
        self.peaks: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    @property
    def measure(self) -> str:
        if self.cuda:
            return "torch.cuda.max_memory_allocated, reset at each phase"
        if self.cumulative:
            return "peak RSS (VmHWM), cumulative since start: /proc/self/clear_refs could not reset it"
        return "peak RSS (VmHWM), reset at each phase"

    def begin(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif not self.cumulative:
            try:
                Path("/proc/self/clear_refs").write_text("5")   # resets VmHWM to the current RSS
            except OSError:
                self.cumulative = True
        self._t = time.perf_counter()

    def mark(self, phase: str) -> None:
        """`phase` just ended: record its peak and time, start the next one."""
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = _vm_hwm()
        self.peaks[phase] = int(peak)
        self.seconds[phase] = time.perf_counter() - self._t
        self.begin()


def _vm_hwm() -> int:
    text = Path("/proc/self/status").read_text()
    found = re.search(r"^VmHWM:\s+(\d+)\s+kB", text, re.M)
    if found is None:  # not Linux: the peak as resource reports it (kB on Linux, bytes on macOS)
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    return int(found.group(1)) * 1024


def plan_phases(recipe: Recipe, dist) -> tuple[dict[str, int] | None, str | None]:
    """`rltune plan`'s per-phase estimate on this run's hardware, or (None, why not)."""
    try:
        from ..plan import Hardware, estimate

        if dist.device.startswith("cuda"):
            import torch

            hw = Hardware(device="cuda", gpus=dist.world_size,
                          mem_bytes=torch.cuda.get_device_properties(dist.local_rank).total_memory)
        else:
            hw = Hardware(device="cpu")
        return dict(estimate(recipe, hw).phases), None
    except Exception as err:  # noqa: BLE001 - the measurement stands without the estimate
        return None, f"no plan estimate: {type(err).__name__}: {err}"


def check_configs(recipe: Recipe) -> str | None:
    """The models' config.json files, read and checked as `rltune plan` reads them (plan/arch.py:
    bounded read, every size a whole number within bounds) before anything heavy is imported or
    built: the message (recipe key, file, field, fix) of the first unusable one, or None. A size the
    plan merely does not know (a hub id not cached, another architecture) is transformers' business."""
    from ..plan import ConfigError, check_model_configs

    try:
        check_model_configs(recipe)
    except ConfigError as err:
        return str(err)
    return None


def dry_run(recipe: Recipe, recipe_path: Path, fmt: str = "text", quiet: bool = False) -> int:
    problem = check_configs(recipe)      # before torch and the engines are imported
    if problem is not None:
        if os.environ.get("RANK", "0") == "0":   # launched ranks: say it once
            print(f"rltune: {problem}", file=sys.stderr)
        return 2
    from ..engine.distributed import process_group

    with process_group(recipe.trainer.device) as dist:
        return _dry_run(recipe, recipe_path, fmt, quiet, dist)


def _dry_run(recipe: Recipe, recipe_path: Path, fmt: str, quiet: bool, dist) -> int:
    import torch

    from .collective import global_max
    from .loop import initial_knobs, train_step
    from .setup import build

    # console only: no train.log (nothing is written under trainer.output_dir)
    setup_logging(None, "quiet" if quiet else recipe.logging.console, dist.is_main)
    small = reduced(recipe, dist.world_size)
    LOG.info("dry run: building the engines, then one step with train.batch_size %d (nothing is written)",
             small.train.batch_size)
    meter = Meter(dist.device)
    # stdout carries the report alone (`--format json` stays parseable): what the engines print
    # there (DeepSpeed's memory lines) goes to stderr
    with contextlib.redirect_stdout(sys.stderr):
        meter.begin()
        c = build(small, dist, Path(recipe_path).parent)
        meter.mark("setup")
        try:
            gen = torch.Generator().manual_seed((small.trainer.seed or 0) + 17)
            m = train_step(c, 1, initial_knobs(c), gen, mark=meter.mark)
            meter.mark("sync")
        finally:
            close = getattr(c.rollout, "close", None)
            if close is not None:
                close()
    peaks = dict(zip(PHASES, (int(x) for x in global_max([float(meter.peaks[p]) for p in PHASES]))))
    if not dist.is_main:
        return 0
    plan, why = plan_phases(recipe, dist)
    report = {
        "recipe": str(recipe_path),
        "device": dist.device.split(":")[0],
        "world_size": dist.world_size,
        "measure": meter.measure,
        "cumulative": meter.cumulative,
        "work": {"generation_calls": small.gen_calls_per_step, "sequences_per_call": small.rollout.batch_size,
                 "micro_batch_size": small.train.micro_batch_size,
                 "micro_batches_per_rank": small.train.batch_size // dist.world_size // small.train.micro_batch_size,
                 "optimizer_updates": 1},
        "phases": {p: {"measured": peaks[p], "plan": (plan or {}).get(p), "seconds": round(meter.seconds[p], 3),
                       "what": WHAT[p] if p != "setup" else f"{WHAT[p]}: {', '.join(_roles(c))}"} for p in PHASES},
        "plan_error": why,
        "step": {k: (m[k] if math.isfinite(m[k]) else None)
                 for k in ("reward/mean", "kl", "actor/loss", "timing/sync_ms") if k in m},
        "written": [],
    }
    if fmt == "json":
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report, recipe.trainer.output_dir))
    return 0


def _roles(c) -> list[str]:
    roles = ["actor"] + ["critic"] * (c.critic is not None) + ["reference"] * (c.reference is not None)
    return roles + [f"rollout ({c.rollout.name})"]


def format_report(report: dict, output_dir: str) -> str:
    from ..plan.budget import fmt_bytes

    w = report["work"]
    lines = [f"rltune dry run: {report['recipe']} on {report['device']} ({report['world_size']} rank(s)): one step, "
             f"{w['generation_calls']} generation call(s) of {w['sequences_per_call']} sequences, "
             f"{w['micro_batches_per_rank']} micro-batch(es) of {w['micro_batch_size']} per rank, 1 optimizer update",
             f"peak memory per phase on one device: {report['measure']}; plan: `rltune plan` estimate",
             "",
             f"  {'phase':<11} {'measured':>10} {'plan':>10} {'measured/plan':>14} {'time':>8}  what"]
    over = []
    for name, p in report["phases"].items():
        est = p["plan"]
        ratio = f"{p['measured'] / est:.2f}" if est else "-"
        if est and p["measured"] > 1.15 * est:
            over.append(f"{name} {(p['measured'] / est - 1) * 100:.0f}%")
        lines.append(f"  {name:<11} {fmt_bytes(p['measured']):>10} {fmt_bytes(est) if est else '-':>10} "
                     f"{ratio:>14} {p['seconds']:>7.1f}s  {p['what']}")
    lines.append("")
    if report["plan_error"]:
        lines.append(report["plan_error"])
    if over:
        lines.append("the plan underestimates: " + ", ".join(over) + " above its estimate")
    peak = max(p["measured"] for p in report["phases"].values())
    lines.append(f"peak over the step: {fmt_bytes(peak)}. Nothing was written: no checkpoint, no final/ model, "
                 f"no run directory ({output_dir} untouched)")
    return "\n".join(lines)


__all__ = ["dry_run", "check_configs", "reduced", "Meter", "PHASES"]
