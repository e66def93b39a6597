"""`rltune plan RECIPE [key=value ...] [--gpus N --gpu-mem SIZE | --device cpu] [--times RUN_DIR]
[--format text|json]`. `--times`: the step time of each placement of the rollout engine, from a
run's measured phase times (plan/placement.py).

Exit 0: the plan fits (or the capacity is unknown); 1: over capacity, or the recipe has schema
errors; 2: unreadable input (file, YAML, flags, a policy whose size cannot be known). No torch.
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional

from rltune.errors import RecipeInputError


def _err(msg: str) -> int:
    print(f"rltune plan: {msg}", file=sys.stderr)
    return 2


def _hardware(recipe, gpus, gpu_mem, device, notes: list):
    """Hardware from the flags, the recipe, or this machine; never None (the plan needs a device)."""
    from rltune.plan import Hardware, _cuda_present, hardware_for

    hw = hardware_for(recipe, gpus=gpus, gpu_mem=gpu_mem, device=device)
    if hw is not None:
        return hw
    ranks = recipe.trainer.nproc * recipe.trainer.nnodes
    if _cuda_present():
        notes.append("GPU memory unknown: give --gpu-mem SIZE (and --gpus N) to check the budget against it")
        return Hardware("cuda", gpus=ranks)
    notes.append(f"trainer.device {recipe.trainer.device}: no GPU on this machine, so planned for CPU "
                 "(predicted peak RSS per process); --gpus N --gpu-mem SIZE plans for GPUs")
    return Hardware("cpu", gpus=ranks)


def run(args: List[str], overrides: List[str], *, gpus: Optional[int] = None, gpu_mem: Optional[str] = None,
        device: Optional[str] = None, fmt: str = "text", times: Optional[str] = None) -> int:
    from rltune.commands.validate import input_finding, split_args
    from rltune.recipe.findings import format_text_line

    if fmt not in ("text", "json"):
        return _err(f"unknown --format {fmt!r}; use text or json")
    if device not in (None, "cpu", "cuda"):
        return _err(f"unknown --device {device!r}; use cpu or cuda")
    from rltune.plan import MAX_GPUS

    if gpus is not None and not 1 <= gpus <= MAX_GPUS:
        return _err(f"--gpus {gpus}: must be from 1 to {MAX_GPUS:,}")
    files, trailing = split_args(args)
    if len(files) != 1:
        return _err("give one recipe file\n  fix: rltune plan recipes/quickstart.yaml [key=value ...] "
                    "[--gpus N --gpu-mem 80GB | --device cpu]")
    path = files[0]
    from rltune.recipe.loader import load_recipe

    try:
        res = load_recipe(path, list(overrides) + trailing)
    except RecipeInputError as e:
        head, fix = format_text_line(input_finding(e, path))
        print(head + ("\n" + fix if fix else ""), file=sys.stderr)
        return 2
    if res.recipe is None:
        for f in res.findings:
            head, fix = format_text_line(f)
            print(head + ("\n" + fix if fix else ""), file=sys.stderr)
        print(f"{path}: the recipe has errors (rltune validate {path}); no plan", file=sys.stderr)
        return 1
    recipe = res.recipe
    from rltune.plan import ArchUnknown, estimate

    notes: list = []
    try:
        hw = _hardware(recipe, gpus, gpu_mem, device, notes)
    except ValueError as e:      # --gpu-mem that cannot be read
        return _err(f"--gpu-mem: {e}")
    try:
        plan = estimate(recipe, hw)
    except ArchUnknown as e:     # and ConfigError: a model's config.json is unusable (file, field, fix)
        return _err(str(e))
    plan.notes = notes + plan.notes
    placement = None
    if times is not None:   # step time per placement of the rollout engine, from a run's phase times
        import os

        from rltune.plan.placement import PhaseTimes, TimesError, step_times

        try:
            phase_times = PhaseTimes.from_run(times)
        except TimesError as e:
            return _err(f"--times {times}: {e}")
        devices, unit = (plan.world, "GPU") if plan.device != "cpu" else (os.cpu_count() or 1, "CPU core")
        placement = (phase_times, devices, unit, recipe.rollout.tensor_parallel_size, recipe.trainer.nnodes)
    if fmt == "json":
        extra = {}
        if placement is not None:
            t, devices, unit, tp, _ = placement
            extra["placement"] = {"devices": devices, "unit": unit, "phase_times": vars(t), **step_times(t, devices, tp)}
        print(json.dumps({"recipe": path, **plan.to_dict(), **extra}, indent=2))
    else:
        out = render(plan, path)
        if placement is not None:
            from rltune.plan.placement import render as render_placement

            t, devices, unit, tp, nodes = placement
            out += [""] + render_placement(t, devices, unit, source=f"{times}/metrics.jsonl", tp=tp, nodes=nodes)
        print("\n".join(out))
    return 1 if plan.fits is False else 0


def render(plan, path: str) -> list:
    """The plan as text lines: header, item table by phase, totals, KV cache, notes, proposals."""
    from rltune.plan import PHASES
    from rltune.plan.budget import fmt_bytes

    cpu = plan.device == "cpu"
    where = (f"cpu, {plan.world} process(es): peak RSS per process" if cpu
             else f"{plan.world} GPU(s)" + (f" of {fmt_bytes(plan.capacity)}" if plan.capacity else "")
             + ", per device (rank 0)")
    out = [f"plan: {path} on {where}", f"model: {plan.arch.describe()}",
           f"rollout engine: {plan.engine} ({plan.kv.get('engine_choice', '')})", ""]
    w = max([len(i.name) for i in plan.items] + [20])
    out.append(f"  {'item':<{w}} {'size':>10}   " + " ".join(f"{p:>10}" for p in PHASES))
    for it in plan.items:
        marks = " ".join(f"{('x' if p in it.phases else ''):>10}" for p in PHASES)
        out.append(f"  {it.name:<{w}} {fmt_bytes(it.bytes):>10}   {marks}")
    out.append(f"  {'phase total':<{w}} {'':>10}   " + " ".join(f"{fmt_bytes(plan.phases[p]):>10}" for p in PHASES))
    out.append("")
    peak = f"peak: {fmt_bytes(plan.peak)} in the {plan.peak_phase} phase"
    if plan.capacity is not None:
        verdict = "fits" if plan.fits else "DOES NOT FIT"
        peak += f" of {fmt_bytes(plan.capacity)}: {verdict}, headroom {fmt_bytes(plan.headroom)}"
    out.append(peak)
    kv = plan.kv
    if kv.get("bytes") is not None:
        out.append(f"KV cache ({plan.engine}): {fmt_bytes(kv['bytes'])} = {kv['tokens']:,} tokens x "
                   f"{kv['per_token_bytes']:,} B, {kv['sequences']:,} concurrent sequence(s) of the longest length")
    a = plan.activations
    out.append(f"actor activations per micro-batch, by actor.gradient_checkpointing: "
               f"false {fmt_bytes(a['without_checkpointing'])}, full {fmt_bytes(a['with_checkpointing'])}, "
               f"selective {fmt_bytes(a['selective'])} (the recipe: {a['checkpointing'] or 'false'})")
    notes = [i for i in plan.items if i.note]
    if notes:
        out.append("")
        out.append("how each item is counted:")
        out += [f"  {i.name}: {i.note}" for i in notes]
    if plan.notes:
        out.append("")
        out += [f"note: {n}" for n in plan.notes]
    if plan.proposals:
        out.append("")
        out.append("changes that fit, best first:")
        out += [f"  {k}. {p.as_fix(plan.capacity)}" for k, p in enumerate(plan.proposals, 1)]
    elif plan.fits is False:
        out.append("")
        out.append("no single change rltune knows makes it fit: use more GPUs (--gpus), larger cards, or a smaller model")
    out.append("formulas and sources: docs/plan.md")
    return out
