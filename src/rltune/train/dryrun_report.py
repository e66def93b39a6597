"""The text report of `rltune train --dry-run` (dryrun.py builds the report's dict): the work
it ran, the peak memory per phase and per pass beside the plan's, and what to read into them."""

from __future__ import annotations


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
    lines.append(f"under each phase, its passes (the plan's item groups): the peak above the memory in use as the "
                 f"pass began, the larger of the {w['steps']} steps (an optimizer step: the second); plan: the "
                 f"group's items (a forward + backward pass also its gradients, which its backward allocates)")
    lines += ["", f"  {'phase / pass':<16} {'measured':>10} {'plan':>10} {'measured/plan':>14} {'time':>8}  what"]
    over, over_pass, notes = [], [], []
    for name, p in report["phases"].items():
        est = p["plan"]
        ratio = f"{p['measured'] / est:.2f}" if est else "-"
        if est and p["measured"] > 1.15 * est:
            over.append(f"{name} {(p['measured'] / est - 1) * 100:.0f}%")
        lines.append(f"  {name:<16} {fmt_bytes(p['measured']):>10} {fmt_bytes(est) if est else '-':>10} "
                     f"{ratio:>14} {p['seconds']:>7.1f}s  {p['what']}")
        for g, q in p.get("groups", {}).items():
            got, est = q["measured"], q["plan"]
            ratio = f"{got / est:.2f}" if got is not None and est else "-"
            if got is not None and est and got > 1.15 * est:
                over_pass.append(f"{g} {(got / est - 1) * 100:.0f}%")
            if got is None:
                what = f"not measured: {q['why']}"
            elif report["plan_error"]:
                what = q["what"]
            elif est is None:
                what = f"{q['what']}: the plan has no item for it"
            else:
                what = " + ".join(q["plan_items"])
            seconds = f"{q['seconds']:>7.1f}s" if q["seconds"] is not None else f"{'-':>8}"
            lines.append(f"    {g:<14} {_size(got):>10} {_size(est):>10} {ratio:>14} {seconds}  {what}")
            if got is not None and q["plan_phases"] and name not in q["plan_phases"]:
                notes.append(f"{g} ran in the {name} phase ({q['what']}); the plan counts it in "
                             f"{' and '.join(q['plan_phases'])}")
            first = q["runs"][0] if q["runs"] else None
            if g.endswith(" step") and got is not None and first is not None and first > got:
                notes.append(f"{g}: {_size(first)} in the first step, which also created the optimizer state (the "
                             f"plan's `{g[:-len(' step')]} optimizer state`, resident in every phase)")
    lines.append("")
    if report["plan_error"]:
        lines.append(report["plan_error"])
    if over:
        lines.append("the plan underestimates: " + ", ".join(over) + " above its estimate")
    if over_pass:
        lines.append("by pass: " + ", ".join(over_pass) + " above the plan's items")
    lines += notes
    if report["device"] == "cpu" and any(p.get("groups") for p in report["phases"].values()):
        lines.append("on CPU a pass's figure is the resident memory it added: memory an earlier pass freed and the "
                     "allocator kept serves it again without raising RSS")
    for what in report.get("plan_leaves_out") or []:
        lines.append(f"the plan leaves out {what}")
    peak = max(p["measured"] for p in report["phases"].values())
    if report.get("plan_at_limits") and n["prompt_tokens"] < n["max_prompt_length"]:
        lines.append(f"`rltune plan` counts prompts of data.max_prompt_length {n['max_prompt_length']} tokens, "
                     f"which this data never reaches: {fmt_bytes(report['plan_at_limits'])} at that length")
    lines.append(f"peak over the steps: {fmt_bytes(peak)}. Nothing was written: no checkpoint, no final/ model, "
                 f"no run directory ({output_dir} untouched)")
    return "\n".join(lines)


def _size(n: int | None) -> str:
    """A pass's bytes: KiB below 1 MiB, a tenth of a MiB below 10 MiB (passes of small models)."""
    from ..plan.budget import fmt_bytes

    if n is None:
        return "-"
    if n < 1 << 20:
        return f"{n / 1024:.0f} KiB"
    if n < 10 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return fmt_bytes(n)


__all__ = ["format_report"]
