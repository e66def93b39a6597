"""`rltune train RECIPE --dry-run`: build every engine exactly as a run does, run two steps of the
smallest real work at the recipe's worst case, and print the peak memory of each phase beside
`rltune plan`'s estimate for the same sequence lengths.

The steps are the loop's own `train_step` (loop.py) on the recipe with smaller batches, so the same
code runs: the memory-relevant sizes stay as the recipe has them (rollout.batch_size sequences
per generation call, train.micro_batch_size sequences per forward/backward pass, the engines, ZeRO
stage, precision), only the amount of work shrinks to two steps with one optimizer update each, of
the fewest whole generation calls that fill one micro-batch per rank (train.batch_size =
lcm(rollout.batch_size, micro_batch_size x world), ppo_epochs 1, updates_per_step 1; with
train.max_tokens_per_micro_batch, micro-batches of the rows the budget holds at the longest sequence,
`Recipe.micro_rows`). What the
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

Memory per pass, under each phase (`Meter.region`): the loop wraps each pass in `region(name)`, named
as the plan groups its items ("generation", "reward pass", "reference pass", "behaviour pass", "value
pass", "actor pass", "actor step", "critic pass", "critic step"); a no-op outside a dry run. A pass's
figure is its peak above the memory in use as it began (CUDA: max_memory_allocated reset at its start
minus memory_allocated then; CPU: VmHWM reset minus VmRSS then); the phase's peak read before the
reset is kept, so the phase figures are unchanged. The larger of the two steps, but an optimizer step's
from the second (the first creates the optimizer state, resident in the plan). Beside it the plan's
items of that group (`plan_groups`; a forward + backward pass also its role's gradients). A pass the
plan counts that did not run, or any pass where VmHWM cannot be reset: no figure, and why.
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
from .dryrun_report import format_report

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
    # train.micro_batch_size rows, or one micro-batch the size of train.max_tokens_per_micro_batch at
    # the longest sequence: max(1, budget // (data.max_prompt_length + response tokens)) rows
    rows = r.micro_rows
    per_update = math.lcm(r.rollout.batch_size, rows * world)
    return r.model_copy(update={
        "train": r.train.model_copy(update={"batch_size": per_update, "micro_batch_size": rows,
                                            "updates_per_step": 1, "ppo_epochs": 1}),
        "trainer": r.trainer.model_copy(update={"max_steps": STEPS, "save_every": 0, "eval_every": 0}),
    })


class Meter:
    """Peak memory since the last mark, per phase (bytes), and per pass within a phase (`region`)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.device = device
        self.cumulative = False   # CPU only: VmHWM could not be reset
        self.peaks: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.groups: dict[str, dict] = {}   # pass -> its phase and each run's figures (`region`)
        self._highs = [0]         # the running peaks of the phase and the open regions, read before a reset
        self._ran: list[str] = []    # the passes run in the current phase
        self._t = time.perf_counter()

    @property
    def measure(self) -> str:
        if self.cuda:
            return "torch.cuda.max_memory_allocated, reset at each phase"
        if self.cumulative:
            return "peak RSS (VmHWM), cumulative since start: /proc/self/clear_refs could not reset it"
        return "peak RSS (VmHWM), reset at each phase"

    def begin(self) -> None:
        self._reset()
        self._highs, self._ran = [0], []
        self._t = time.perf_counter()

    def mark(self, phase: str) -> None:
        """`phase` just ended: record its peak and time, start the next one."""
        peak = max(self._highs[0], self._peak())
        self.peaks[phase] = max(self.peaks.get(phase, 0), int(peak))     # the larger over the steps
        self.seconds[phase] = max(self.seconds.get(phase, 0.0), time.perf_counter() - self._t)
        for name in self._ran:
            self.groups[name]["phase"] = phase
        self.begin()

    @contextlib.contextmanager
    def region(self, name: str):
        """A pass inside the current phase, named as the plan groups its items. Each run records its
        peak above the memory in use as it began (its working memory; None where the counter cannot
        be reset), its absolute peak, and what it still held as it ended. The counter is reset for
        the pass; what it read until then is kept for the phase (and any enclosing pass), so the
        phase's figure stays whole."""
        self._fold(self._peak())
        start = self._in_use()
        measurable = self._reset() and start is not None
        self._highs.append(0)
        t = time.perf_counter()
        try:
            yield
        finally:
            peak = self._peak()
            end = self._in_use()
            self._fold(peak)
            peak = self._highs.pop()
            g = self.groups.setdefault(name, {"phase": None, "runs": []})
            g["runs"].append({"above": max(0, peak - start) if measurable else None, "peak": peak,
                              "held": end - start if measurable and end is not None else None,
                              "seconds": time.perf_counter() - t})
            if name not in self._ran:
                self._ran.append(name)

    def _fold(self, peak: int) -> None:
        self._highs = [max(h, int(peak)) for h in self._highs]

    def _reset(self) -> bool:
        """Start the peak counter afresh; False where it cannot be (CPU: clear_refs refused)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return True
        if not self.cumulative:
            try:
                Path("/proc/self/clear_refs").write_text("5")   # resets VmHWM to the current RSS
            except OSError:
                self.cumulative = True
        return not self.cumulative

    def _peak(self) -> int:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device))
        return _vm_hwm()

    def _in_use(self) -> int | None:
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.device)
            return int(torch.cuda.memory_allocated(self.device))
        return _vm_rss()


def runtime_rss(recipe: Recipe) -> int | None:
    """CPU: this process's resident memory once it has imported what the plan's runtime constant
    measured (plan/estimate.py), peft for LoRA, vLLM where the rollout engine may be vLLM. None
    where /proc is missing."""
    import importlib

    from ..lean_imports import import_stack
    from ..plan.estimate import CPU_RUNTIME_MODULES

    import_stack()   # as the run imports them
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
    """The rollout engine of a dry run: every response runs to rollout.max_new_tokens. The hf
    engine's calls run in the meter's region "generation" (vLLM's run in its own processes)."""

    def __init__(self, engine, region=None):
        from .update import no_region

        self._engine = engine
        self._region = region if region is not None and engine.name == "hf" else no_region

    def generate(self, prompt_ids, sampling):
        import dataclasses

        full = dataclasses.replace(sampling, min_new_tokens=sampling.max_new_tokens, stop=())
        with self._region("generation"):
            return self._engine.generate(prompt_ids, full)

    def __getattr__(self, name):
        return getattr(self._engine, name)


class InRegion:
    """The reward model of a dry run: its calls run in the meter's region "reward pass"."""

    def __init__(self, model, region):
        self._model, self._region = model, region

    def __call__(self, *args, **kwargs):
        with self._region("reward pass"):
            return self._model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._model, name)


def _vm_hwm() -> int:
    text = Path("/proc/self/status").read_text()
    found = re.search(r"^VmHWM:\s+(\d+)\s+kB", text, re.M)
    if found is None:  # not Linux: the peak as resource reports it (kB on Linux, bytes on macOS)
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    return int(found.group(1)) * 1024


def plan_phases(recipe: Recipe, dist, runtime_here: int | None = None
                ) -> tuple[dict[str, int] | None, str | None, int | None, dict[str, dict]]:
    """`rltune plan`'s per-phase estimate on this run's hardware, or (None, why not). On CPU, with
    `runtime_here`, the plan's runtime constant is replaced by it; the constant is returned too, and
    the plan's passes (`plan_groups`)."""
    try:
        from ..plan import Hardware, estimate

        if dist.device.startswith("cuda"):
            import torch

            hw = Hardware(device="cuda", gpus=dist.world_size,
                          mem_bytes=torch.cuda.get_device_properties(dist.local_rank).total_memory)
        else:
            hw = Hardware(device="cpu")
        plan = estimate(recipe, hw)
        phases, constant = comparable(plan, dist.device.startswith("cuda"), runtime_here)
        return phases, None, constant, plan_groups(plan)
    except Exception as err:  # noqa: BLE001 - the measurement stands without the estimate
        return None, f"no plan estimate: {type(err).__name__}: {err}", None, {}


def plan_groups(plan) -> dict[str, dict]:
    """The plan's passes as the dry run measures them: per item group ("actor pass", "reference
    pass", ...) the sum of its items, their names and the phases they count in. A training pass
    ("actor pass", "critic pass") also counts its role's gradients, which the plan lists apart
    (group-less, in the update phase): DeepSpeed drops them at every optimizer step (engine.zero_grad
    sets them to None), so each pass's backward allocates them again, above what was in use as it
    began."""
    out: dict[str, dict] = {}
    grads = [it for it in plan.items if not it.group and it.name in ("actor gradients", "critic gradients")]
    for it in [it for it in plan.items if it.group] + grads:
        group = it.group or it.name.replace(" gradients", " pass")
        g = out.setdefault(group, {"plan": 0, "items": [], "phases": list(it.phases)})
        g["plan"] += it.bytes
        g["items"].append(it.name)
    return out


# what each measured pass is in the loop (the `region` names, the plan's item groups)
PASSES = {"generation": "step 1: the hf engine's generate calls",
          "reward pass": "step 2: the reward model's scoring",
          "reference pass": "step 3: reference log-probs",
          "behaviour pass": "step 4: the actor's log-probs before the update",
          "value pass": "step 5: the critic's values",
          "actor pass": "step 8: the actor's forward + backward over its micro-batches",
          "actor step": "step 8: the actor's optimizer step",
          "critic pass": "step 8: the critic's forward + backward over its micro-batches",
          "critic step": "step 8: the critic's optimizer step"}


def pass_figures(meter: Meter) -> dict[str, dict]:
    """Each measured pass: its phase, and its peak above the memory in use as it began, the larger
    over its runs like the phases' figures, but an optimizer step ("actor step") from its runs after
    the first: the first creates the optimizer state (Adam's moments), which the plan counts as
    resident in every phase, not as the step's. None where the counter could not be reset. The
    absolute peak, what it still held as it ended and its time: over ranks, the largest; `runs`:
    this rank's figure of each run."""
    from .collective import global_max

    names = list(meter.groups)
    rows, flat = {}, []
    for name in names:
        g = meter.groups[name]
        runs = g["runs"][1:] if name.endswith(" step") and len(g["runs"]) > 1 else g["runs"]
        best = max(runs, key=lambda r: -1 if r["above"] is None else r["above"])
        rows[name] = {"phase": g["phase"], "runs": [r["above"] for r in g["runs"]]}
        flat += [best["above"], max(r["peak"] for r in g["runs"]), best["held"],
                 max(r["seconds"] for r in g["runs"])]
    flat = global_max([-math.inf if x is None else float(x) for x in flat])   # every rank ran the same passes
    known = (lambda x: None if x == -math.inf else int(x))   # noqa: E731
    for i, name in enumerate(names):
        measured, peak, held, seconds = flat[4 * i:4 * i + 4]
        rows[name].update(measured=known(measured), peak=known(peak), held=known(held), seconds=round(seconds, 3))
    return rows


def group_rows(measured: dict[str, dict], planned: dict[str, dict], recipe: Recipe) -> dict[str, dict[str, dict]]:
    """Per phase, its passes: the measured ones in the order they ran, then the plan's passes of
    that phase that did not run in the dry run's steps (measured None and why)."""
    out: dict[str, dict[str, dict]] = {p: {} for p in PHASES}
    cant = ("VmHWM could not be reset (/proc/self/clear_refs refused): a pass's peak cannot be told "
            "from the phase's")
    for name, m in measured.items():
        plan = planned.get(name)
        out[m["phase"] or "sync"][name] = {
            "measured": m["measured"], "plan": plan["plan"] if plan else None,
            "plan_items": plan["items"] if plan else [], "plan_phases": plan["phases"] if plan else [],
            "peak": m["peak"], "held": m["held"], "seconds": m["seconds"], "runs": m["runs"],
            "what": PASSES.get(name, name), "why": cant if m["measured"] is None else None}
    for name, plan in planned.items():
        phase = next((p for p in plan["phases"] if p in PHASES), None)
        if name in measured or phase is None:
            continue
        why = "it did not run in the dry run's steps"
        if name == "behaviour pass":
            why = (f"step 4 did not run: the dry run makes one optimizer update per step; the recipe's "
                   f"{recipe.optimizer_updates_per_step} per step need it before the first")
        out[phase][name] = {"measured": None, "plan": plan["plan"], "plan_items": plan["items"],
                            "plan_phases": plan["phases"], "peak": None, "held": None, "seconds": None,
                            "runs": [], "what": PASSES.get(name, name), "why": why}
    return out


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
            c.rollout = FullLength(c.rollout, meter.region)
            if getattr(c.rewards, "reward_model", None) is not None:
                c.rewards.reward_model = InRegion(c.rewards.reward_model, meter.region)
            gen = torch.Generator().manual_seed((small.trainer.seed or 0) + 17)
            knobs = initial_knobs(c)
            for step in range(1, STEPS + 1):
                m = train_step(c, step, knobs, gen, mark=meter.mark, region=meter.region)
                meter.mark("sync")
        finally:
            close = getattr(c.rollout, "close", None)
            if close is not None:
                close()
    peaks = dict(zip(PHASES, (int(x) for x in global_max([float(meter.peaks[p]) for p in PHASES]))))
    prompt_tokens = int(global_max([float(longest.prompt_tokens)])[0])
    passes = pass_figures(meter)
    if not dist.is_main:
        return 0
    at_lengths = recipe.model_copy(update={"data": recipe.data.model_copy(
        update={"max_prompt_length": max(8, prompt_tokens)})})
    plan, why, constant, planned = plan_phases(at_lengths, dist, runtime_here)
    limits, _, _, _ = plan_phases(recipe, dist, runtime_here)
    groups = group_rows(passes, planned, recipe)
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
                       "what": WHAT[p] if p != "setup" else f"{WHAT[p]}: {', '.join(_roles(c))}",
                       "groups": groups[p]} for p in PHASES},
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


__all__ = ["dry_run", "check_configs", "reduced", "Meter", "PHASES", "plan_groups", "pass_figures"]
