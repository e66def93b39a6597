"""`rltune train RECIPE --dry-run`: build every engine exactly as a run does, run two steps of the
smallest real work at the recipe's worst case, and print the peak memory of each phase beside
`rltune plan`'s estimate for the same sequence lengths.

The steps are the loop's own `train_step` (loop.py) on the recipe with smaller batches, so the same
code runs: the memory-relevant sizes stay as the recipe has them (rollout.batch_size sequences
per generation call, train.micro_batch_size sequences per forward/backward pass, the engines, ZeRO
stage, precision), only the amount of work shrinks to two steps with one optimizer update each, of
the fewest whole generation calls that fill one micro-batch per rank (train.batch_size =
lcm(rollout.batch_size, micro_batch_size x world), ppo_epochs 1, updates_per_step 1). What the
real peak needs and a single short step would miss:
  - the longest sequences: every generation call takes the data's longest prompts (ranked by
    characters, the longest candidates tokenized as the run encodes them), and no response ends
    before rollout.max_new_tokens (EOS and stop strings held back). The plan column is the
    plan at those lengths; `rltune plan` counts data.max_prompt_length, which the data may never reach.
  - a second step: the first update creates the optimizer state, and what the CPU allocator keeps
    resident after a pass shows from the second on (docs/plan.md). Each phase's figure is the
    larger of the two steps.
Nothing is written: no run directory, train.log, metrics, checkpoint or final/.
Before anything is built, the models' config.json files are read and checked as `rltune plan` reads
them (`check_configs`): one that is unusable (not a regular file, too large, not JSON, a size that is
not a whole number within bounds) stops the dry run with exit 2 and a message naming the file and field.

Memory per phase, on one device (the largest over ranks):
- CUDA: torch.cuda.max_memory_allocated, reset (reset_peak_memory_stats) as each phase begins;
  the plan column leaves out the CUDA context (outside torch's allocator) and replaces the plan's
  BLAS-workspace constant by the workspaces measured in this process before the engines are built;
- CPU: the process's resident-set high-water mark (VmHWM in /proc/self/status), reset as each
  phase begins by writing "5" to /proc/self/clear_refs (Linux >= 4.0). Where that is refused
  the numbers are the cumulative peak since the process started, and the report says so. The
  plan's CPU runtime constant (the imports' resident memory on the reference machine) is replaced
  by this process's resident memory before the engines are built, and the report says by how much.
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

STEPS = 2       # the second shows the optimizer state and the allocator's retention
CANDIDATES = 256   # the prompts longest in characters that are tokenized to find the longest in tokens
PHASES = ("setup", "rollout", "experience", "update", "sync")
WHAT = {"setup": "engines built",
        "rollout": "steps 1-2: generation and reward",
        "experience": "steps 3-7: reference / behaviour / value passes, advantages",
        "update": "step 8: the optimizer update (forward, backward, optimizer step)",
        "sync": "step 9: weight sync actor -> rollout engine, metrics"}


def reduced(recipe: Recipe, world: int) -> Recipe:
    """The recipe for one dry-run step: same engines and per-pass sizes, the least work."""
    r = recipe
    per_update = math.lcm(r.rollout.batch_size, r.train.micro_batch_size * world)
    return r.model_copy(update={
        "train": r.train.model_copy(update={"batch_size": per_update, "updates_per_step": 1, "ppo_epochs": 1}),
        "trainer": r.trainer.model_copy(update={"max_steps": STEPS, "save_every": 0, "eval_every": 0}),
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
        self.peaks[phase] = max(self.peaks.get(phase, 0), int(peak))     # the larger over the steps
        self.seconds[phase] = max(self.seconds.get(phase, 0.0), time.perf_counter() - self._t)
        self.begin()


def runtime_rss(recipe: Recipe) -> int | None:
    """CPU: this process's resident memory once it has imported what the plan's runtime constant
    measured (plan/estimate.py), peft for LoRA, vLLM where the rollout engine may be vLLM. None
    where /proc is missing."""
    import importlib

    from ..plan.estimate import CPU_RUNTIME_MODULES

    modules = list(CPU_RUNTIME_MODULES) + ["peft"] * (recipe.model.lora is not None)
    modules += ["vllm"] * (recipe.rollout.engine != "hf")
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a missing optional module: the run will not import it either
            pass
    return _vm_rss()


def blas_workspaces(device: str) -> int:
    """CUDA: the bytes torch's allocator holds for cuBLAS / cuBLASLt workspaces once a forward and a
    backward (autograd's thread has its own handle) ran a bf16 and an fp32 linear with a bias (the Lt
    path): what the plan's BLAS workspaces item stands for, measured in this process."""
    import torch
    import torch.nn.functional as F

    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.ones(64, 64, device=device, dtype=dtype, requires_grad=True)
        F.linear(x, x, torch.zeros(64, device=device, dtype=dtype)).sum().backward()
        del x
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.memory_allocated(device) - before)


def _vm_rss() -> int | None:
    try:
        found = re.search(r"^VmRSS:\s+(\d+)\s+kB", Path("/proc/self/status").read_text(), re.M)
    except OSError:   # not Linux
        return None
    return int(found.group(1)) * 1024 if found else None


class LongestPrompts:
    """The sampler of a dry run: every call hands out the data's longest prompts (in tokens, as
    the run encodes them: chat template, left-truncation to data.max_prompt_length)."""

    def __init__(self, c, batch_size: int):
        from .prompts import encode_prompt, prompt_text

        rows, key = c.train_set.rows, c.train_set.prompt_key
        by_chars = sorted(range(len(rows)), key=lambda i: -len(str(prompt_text(rows[i], key))))
        candidates = by_chars[:max(CANDIDATES, batch_size)]
        tokens = {i: len(encode_prompt(rows[i], c.tokenizer, c.recipe.data, key)) for i in candidates}
        longest = sorted(candidates, key=lambda i: -tokens[i])[:batch_size]
        self.batch_size = batch_size
        self.indices = (longest * batch_size)[:batch_size]    # fewer rows than a call: repeated
        self.prompt_tokens = max(tokens[i] for i in longest)
        self.searched = len(candidates)

    def next_batch(self) -> list[int]:
        return list(self.indices)


class FullLength:
    """The rollout engine of a dry run: every response runs to rollout.max_new_tokens."""

    def __init__(self, engine):
        self._engine = engine

    def generate(self, prompt_ids, sampling):
        import dataclasses

        full = dataclasses.replace(sampling, min_new_tokens=sampling.max_new_tokens, stop=())
        return self._engine.generate(prompt_ids, full)

    def __getattr__(self, name):
        return getattr(self._engine, name)


def _vm_hwm() -> int:
    text = Path("/proc/self/status").read_text()
    found = re.search(r"^VmHWM:\s+(\d+)\s+kB", text, re.M)
    if found is None:  # not Linux: the peak as resource reports it (kB on Linux, bytes on macOS)
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    return int(found.group(1)) * 1024


def plan_phases(recipe: Recipe, dist, runtime_here: int | None = None
                ) -> tuple[dict[str, int] | None, str | None, int | None]:
    """`rltune plan`'s per-phase estimate on this run's hardware, or (None, why not). On CPU, with
    `runtime_here`, the plan's runtime constant is replaced by it; the constant is returned too."""
    try:
        from ..plan import Hardware, estimate

        if dist.device.startswith("cuda"):
            import torch

            hw = Hardware(device="cuda", gpus=dist.world_size,
                          mem_bytes=torch.cuda.get_device_properties(dist.local_rank).total_memory)
        else:
            hw = Hardware(device="cpu")
        phases, constant = comparable(estimate(recipe, hw), dist.device.startswith("cuda"), runtime_here)
        return phases, None, constant
    except Exception as err:  # noqa: BLE001 - the measurement stands without the estimate
        return None, f"no plan estimate: {type(err).__name__}: {err}", None


def comparable(plan, cuda: bool, here: int | None) -> tuple[dict[str, int], int | None]:
    """The plan's phases as the dry run's measure sees them, and the plan constant replaced.
    CUDA: torch's allocator cannot see the CUDA context (left out); the plan's BLAS workspaces are
    replaced by `here`, the ones measured in this process. CPU: the runtime constant is replaced
    by `here`, this process's resident memory before the engines were built."""
    phases = dict(plan.phases)
    if cuda:
        outside = sum(it.bytes for it in plan.items if it.name == "CUDA context")
        constant = next((it.bytes for it in plan.items if it.name == "BLAS workspaces"), None)
    else:
        outside = 0
        constant = next((it.bytes for it in plan.items if it.name.startswith("runtime")), None)
    swap = (here - constant) if here is not None and constant is not None else 0
    return {k: v - outside + swap for k, v in phases.items()}, constant


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

    with process_group(recipe.trainer.device, recipe.trainer.collective_timeout_s) as dist:
        return _dry_run(recipe, recipe_path, fmt, quiet, dist)


def _dry_run(recipe: Recipe, recipe_path: Path, fmt: str, quiet: bool, dist) -> int:
    import torch

    from .collective import global_max
    from .loop import initial_knobs, train_step
    from .setup import build

    # console only: no train.log (nothing is written under trainer.output_dir)
    setup_logging(None, "quiet" if quiet else recipe.logging.console, dist.is_main)
    small = reduced(recipe, dist.world_size)
    LOG.info("dry run: building the engines, then %d steps with train.batch_size %d at the longest prompts and "
             "responses (nothing is written)", STEPS, small.train.batch_size)
    meter = Meter(dist.device)
    runtime_here = blas_workspaces(dist.device) if dist.device.startswith("cuda") else runtime_rss(recipe)
    # stdout carries the report alone (`--format json` stays parseable): what the engines print
    # there (DeepSpeed's memory lines) goes to stderr
    with contextlib.redirect_stdout(sys.stderr):
        meter.begin()
        c = build(small, dist, Path(recipe_path).parent)
        meter.mark("setup")
        try:
            c.sampler = longest = LongestPrompts(c, c.sampler.batch_size)
            c.rollout = FullLength(c.rollout)
            gen = torch.Generator().manual_seed((small.trainer.seed or 0) + 17)
            knobs = initial_knobs(c)
            for step in range(1, STEPS + 1):
                m = train_step(c, step, knobs, gen, mark=meter.mark)
                meter.mark("sync")
        finally:
            close = getattr(c.rollout, "close", None)
            if close is not None:
                close()
    peaks = dict(zip(PHASES, (int(x) for x in global_max([float(meter.peaks[p]) for p in PHASES]))))
    prompt_tokens = int(global_max([float(longest.prompt_tokens)])[0])
    if not dist.is_main:
        return 0
    at_lengths = recipe.model_copy(update={"data": recipe.data.model_copy(
        update={"max_prompt_length": max(8, prompt_tokens)})})
    plan, why, constant = plan_phases(at_lengths, dist, runtime_here)
    limits, _, _ = plan_phases(recipe, dist, runtime_here)
    report = {
        "recipe": str(recipe_path),
        "device": dist.device.split(":")[0],
        "world_size": dist.world_size,
        "measure": meter.measure,
        "cumulative": meter.cumulative,
        "work": {"steps": STEPS, "generation_calls": small.gen_calls_per_step,
                 "sequences_per_call": small.rollout.batch_size,
                 "micro_batch_size": small.train.micro_batch_size,
                 "micro_batches_per_rank": small.train.batch_size // dist.world_size // small.train.micro_batch_size,
                 "optimizer_updates": STEPS},
        "lengths": {"prompt_tokens": prompt_tokens, "prompts_searched": longest.searched,
                    "max_prompt_length": recipe.data.max_prompt_length,
                    "response_tokens": recipe.rollout.max_new_tokens},
        "plan_runtime": {"constant": constant, "here": runtime_here} if runtime_here is not None else None,
        "plan_at_limits": max(limits.values()) if limits else None,
        "phases": {p: {"measured": peaks[p], "plan": (plan or {}).get(p), "seconds": round(meter.seconds[p], 3),
                       "what": WHAT[p] if p != "setup" else f"{WHAT[p]}: {', '.join(_roles(c))}"} for p in PHASES},
        "plan_error": why,
        "plan_leaves_out": (["vLLM's engine on CPU beyond its import (its workers and start-up allocations: "
                             "docs/plan.md)"] if c.rollout.name == "vllm" and not dist.device.startswith("cuda") else []),
        "step": {k: (m[k] if math.isfinite(m[k]) else None)
                 for k in ("reward/mean", "kl", "actor/loss", "response/length_mean", "timing/sync_ms") if k in m},
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

    w, n = report["work"], report["lengths"]
    lines = [f"rltune dry run: {report['recipe']} on {report['device']} ({report['world_size']} rank(s)): "
             f"{w['steps']} steps, each {w['generation_calls']} generation call(s) of {w['sequences_per_call']} "
             f"sequences, {w['micro_batches_per_rank']} micro-batch(es) of {w['micro_batch_size']} per rank, "
             f"1 optimizer update",
             f"at the longest: prompts of {n['prompt_tokens']} tokens (the data's longest, of the "
             f"{n['prompts_searched']} longest in characters; data.max_prompt_length {n['max_prompt_length']}), "
             f"every response {n['response_tokens']} tokens (rollout.max_new_tokens)",
             f"peak memory per phase on one device, the larger of the {w['steps']} steps: {report['measure']}; "
             f"plan: `rltune plan` at these lengths"]
    rt = report.get("plan_runtime")
    if rt and rt["constant"] and report["device"] == "cuda":
        lines.append(f"  (without the CUDA context, which torch's allocator does not see; its BLAS workspaces "
                     f"{fmt_bytes(rt['constant'])} replaced by the {fmt_bytes(rt['here'])} measured in this process)")
    elif rt and rt["constant"]:
        lines.append(f"  (its CPU runtime constant {fmt_bytes(rt['constant'])} replaced by this process's "
                     f"{fmt_bytes(rt['here'])} resident before the engines were built)")
    lines += ["", f"  {'phase':<11} {'measured':>10} {'plan':>10} {'measured/plan':>14} {'time':>8}  what"]
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
    for what in report.get("plan_leaves_out") or []:
        lines.append(f"the plan leaves out {what}")
    peak = max(p["measured"] for p in report["phases"].values())
    if report.get("plan_at_limits") and n["prompt_tokens"] < n["max_prompt_length"]:
        lines.append(f"`rltune plan` counts prompts of data.max_prompt_length {n['max_prompt_length']} tokens, "
                     f"which this data never reaches: {fmt_bytes(report['plan_at_limits'])} at that length")
    lines.append(f"peak over the steps: {fmt_bytes(peak)}. Nothing was written: no checkpoint, no final/ model, "
                 f"no run directory ({output_dir} untouched)")
    return "\n".join(lines)


__all__ = ["dry_run", "check_configs", "reduced", "Meter", "PHASES"]
