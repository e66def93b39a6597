"""`rltune validate RECIPE... [--strict] [--format text|json|github] [-o key=value ...]`."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from rltune.errors import RecipeInputError
from rltune.recipe.findings import FORMATS, Finding, count, format_findings, format_text_line

_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def split_args(args: List[str]) -> tuple:
    """Recipe paths and trailing `key=value` overrides (an existing file named a=b stays a file)."""
    files, overrides = [], []
    for a in args:
        if "=" in a and not os.path.exists(a):
            overrides.append(a)
        else:
            files.append(a)
    return files, overrides


def input_finding(e: RecipeInputError, path: str) -> Finding:
    return Finding(file=e.file or path, line=e.line or 0, column=e.column or 0, rule="input",
                   severity="error", path="", message=e.problem, fix=e.fix or "")


def _use_color() -> bool:
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


class _Out:
    def __init__(self, color: bool):
        self.console = None
        if color:
            from rich.console import Console

            self.console = Console(highlight=False, soft_wrap=True)

    def finding(self, f: Finding) -> None:
        head, fix = format_text_line(f)
        if self.console is None:
            print(head)
            if fix:
                print(fix)
            return
        from rich.markup import escape
        from rich.text import Text

        t = Text()
        t.append((f"{f.file}:{f.line}:{f.column}: " if f.line else f"{f.file}: "), style="bold")
        t.append(f.severity, style=_STYLE.get(f.severity, ""))
        t.append(f" {f.label}", style="dim" if f.waived else "bold")
        t.append(f": {f.message}")
        self.console.print(t)
        if fix:
            self.console.print(f"    [green]fix:[/green] {escape(f.fix)}")

    def line(self, s: str = "", style: str = "") -> None:
        if self.console is None:
            print(s)
        else:
            from rich.markup import escape

            self.console.print(f"[{style}]{escape(s)}[/{style}]" if style else escape(s))


def plan_lines(recipe) -> list:
    from rltune.recipe.schema import batch_plan

    p = batch_plan(recipe)
    w = recipe.trainer.nproc * recipe.trainer.nnodes
    tb, rb, mb = recipe.train.batch_size, recipe.rollout.batch_size, recipe.train.micro_batch_size
    per_rank = tb // w if w else tb
    micro = max(1, per_rank // mb)
    cut = f"{micro} micro-batch(es) of {mb}" + (" (gradient accumulation)" if micro > 1 else "")
    budget = recipe.train.max_tokens_per_micro_batch
    if budget is not None:
        cut = (f"micro-batches of at most {budget} tokens (train.max_tokens_per_micro_batch: "
               f"{recipe.micro_rows} of the longest sequence each)")
    lines = [
        f"batch plan: {recipe.algorithm.name}, world size {w}",
        f"  one step    {p['generation_calls_per_step']} generation call(s) x {rb} sequences "
        f"({p['prompts_per_generation_call']} prompts x {p['samples_per_prompt']} samples) = {p['sequences_per_step']} sequences",
        f"  one update  {tb} sequences = {w} rank(s) x {cut}",
        f"  per step    {p['optimizer_updates_per_step']} optimizer update(s) = {p['ppo_epochs']} ppo epoch(s) x "
        f"{p['updates_per_epoch']} update(s) per epoch (train.updates_per_step)"
        + ("; ratio 1 in every update: clipping is inactive" if p['optimizer_updates_per_step'] == 1 else ""),
        f"  ratio       train/rollout = {tb}/{rb} = {tb / rb:.3g} (golden ratio 4-8)",
    ]
    return lines


def is_template(path) -> bool:
    """The recipe's leading comment block says it is a template (`# TEMPLATE: ...`, as the shipped
    recipes/gsm8k-grpo-qwen.yaml and recipes/ppo-rm-8gpu.yaml do): it names files rltune does not ship."""
    import re

    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for ln in fh:
                ln = ln.strip()
                if not ln:
                    continue
                if not ln.startswith("#"):
                    return False
                if re.match(r"#\s*TEMPLATE\b", ln):
                    return True
    except OSError:
        return False
    return False


def template_note(findings: list, path) -> list:
    """In a template recipe, a data file not found says in the message itself how to check the recipe
    without its data: `rltune validate --skip-files PATH`."""
    missing = [f for f in findings if f.rule == "input" and f.severity == "error" and "data file `" in f.message
               and " not found" in f.message]
    if not missing or not is_template(path):
        return findings
    note = (f"; {path} is a template (its header says so): its data is not shipped. "
            f"Check the rest without it: rltune validate --skip-files {path}")
    for f in missing:
        f.message += note
    return findings


def check_all(path, overrides, strict: bool = False, files: bool = False, gpus=None, gpu_mem=None) -> tuple:
    """rltune.recipe.check, plus the lint rules over what the schema left when it rejected
    the recipe (loader.lint_partial): every problem in one run. (recipe or None, findings).
    `gpus` / `gpu_mem` (validate --gpus N --gpu-mem SIZE): the hardware rule memory-budget checks."""
    from rltune.recipe.api import lint
    from rltune.recipe.findings import sort_findings, strictify
    from rltune.recipe.loader import lint_partial, load_recipe

    res = load_recipe(path, overrides)
    hardware = None
    if res.recipe is not None and (gpus is not None or gpu_mem is not None):
        from rltune.plan import hardware_for

        hardware = hardware_for(res.recipe, gpus=gpus, gpu_mem=gpu_mem)
    findings = list(res.findings) + lint(res, hardware=hardware) + lint_partial(res)
    if files:
        from rltune.recipe.files import check_files

        findings += check_files(res)
        findings = template_note(findings, path)
    if strict:
        findings = strictify(findings)
    schema = [f for f in findings if f.rule == "schema"]   # schema problems first, then the rest
    return res.recipe, schema + sort_findings(f for f in findings if f.rule != "schema")


def check_text(text: str, source: str, base_dir=None) -> list:
    """The schema and lint errors and warnings of recipe `text` (files not checked)."""
    from rltune.recipe.api import lint
    from rltune.recipe.loader import lint_partial, load_recipe_text

    res = load_recipe_text(text, source, base_dir=base_dir)
    return [f for f in list(res.findings) + lint(res) + lint_partial(res) if f.severity in ("error", "warning")]


def run(args: List[str], overrides: List[str], *, strict: bool = False, fmt: str = "text",
        skip_files: bool = False, gpus: Optional[int] = None, gpu_mem: Optional[str] = None) -> int:
    """Exit 2 when a recipe, or a file it names (data, model, reward: rule `input`), cannot be
    read; else 1 with errors; else 0. `skip_files`: lint only (a template without its files).
    `gpus` / `gpu_mem`: the hardware the memory-budget rule checks the plan against."""
    if fmt not in FORMATS:
        print(f"rltune validate: unknown --format {fmt!r}; use one of: {', '.join(FORMATS)}", file=sys.stderr)
        return 2
    if gpus is not None:
        from rltune.plan import MAX_GPUS

        if not 1 <= gpus <= MAX_GPUS:
            print(f"rltune validate: --gpus {gpus}: must be from 1 to {MAX_GPUS:,}", file=sys.stderr)
            return 2
    if gpu_mem is not None:
        from rltune.plan import parse_size

        try:
            parse_size(gpu_mem)
        except ValueError as e:
            print(f"rltune validate: --gpu-mem: {e}", file=sys.stderr)
            return 2
    files, trailing = split_args(args)
    overrides = list(overrides) + trailing
    if not files:
        print("rltune validate: no recipe file given\n  fix: rltune validate recipes/minimal.yaml [key=value ...]",
              file=sys.stderr)
        return 2
    out = _Out(fmt == "text" and _use_color())
    all_findings: list = []
    unreadable = errors = False
    for i, path in enumerate(files):
        try:
            recipe, findings = check_all(path, overrides, strict=strict, files=not skip_files,
                                         gpus=gpus, gpu_mem=gpu_mem)
        except RecipeInputError as e:
            unreadable = True
            f = input_finding(e, path)
            all_findings.append(f)
            if fmt == "text":
                if i:
                    out.line()
                out.finding(f)
                out.line(f"{path}: cannot be read (exit 2)", "bold red")
            continue
        all_findings.extend(findings)
        c = count(findings)
        errors = errors or c["error"] > 0
        unreadable = unreadable or any(f.rule == "input" and f.severity == "error" for f in findings)
        if fmt != "text":
            continue
        if i:
            out.line()
        for f in findings:
            out.finding(f)
        if recipe is not None:
            if findings:
                out.line()
            for ln in plan_lines(recipe):
                out.line(ln, "dim")
        status = "FAILED" if c["error"] else "ok"
        out.line(f"{path}: {status} — {c['error']} error(s), {c['warning']} warning(s), {c['info']} info"
                 + (" (--strict)" if strict else ""),
                 "bold red" if c["error"] else ("yellow" if c["warning"] else "green"))
    if fmt == "json":
        print(format_findings(all_findings, "json"))
    elif fmt == "github":
        text = format_findings(all_findings, "github")
        if text:
            print(text)
    return 2 if unreadable else (1 if errors else 0)
