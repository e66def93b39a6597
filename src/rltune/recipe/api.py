"""lint() and check(): the entry points `rltune validate` and `rltune train` use."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Union

from rltune.recipe.findings import Finding, sort_findings, strictify
from rltune.recipe.loader import LoadResult, load_recipe
from rltune.recipe.rules import RULES, Ctx, run_rules
from rltune.recipe.schema import Recipe


def lint(result_or_recipe: Union[LoadResult, Recipe], *, strict: bool = False, hardware=None) -> list[Finding]:
    """Run the playbook rules (`hardware`: an rltune.plan.Hardware the memory-budget rule checks
    against; None = what the recipe says). Honours `lint.waive`: a waived warning or info is still reported,
    with severity "info", waived=True and the reason. Errors cannot be waived: a waived error stays
    an error and rule `waived-error` names the waiver. Returns [] when the recipe did not validate."""
    if isinstance(result_or_recipe, LoadResult):
        res: Optional[LoadResult] = result_or_recipe
        recipe = res.recipe
    else:
        res, recipe = None, result_or_recipe
    if recipe is None:
        return []
    waive = recipe.lint.waive
    out = []
    for rl, hit in run_rules(recipe, Ctx(res, hardware)):
        if res is not None:
            file, line, col = res.where(hit.path)
        else:
            file, line, col = "", 0, 0
        message = hit.message
        ov = res.override_for(hit.path) if res is not None else None
        if ov:
            message += f" (from the override `{ov}`)"
        f = Finding(file=file, line=line, column=col, rule=rl.id, severity=hit.severity or rl.severity,
                    path=hit.path, message=message, fix=hit.fix)
        if rl.id in waive and f.severity != "error":
            f.severity, f.waived, f.waive_reason = "info", True, waive[rl.id]
        out.append(f)
    if strict:
        out = strictify(out)
    return sort_findings(out)


def check(path: Union[str, Path], overrides: Iterable[str] = (), strict: bool = False,
          extra_presets: Iterable[str] = (), files: bool = False) -> tuple:
    """Load + validate + lint: (recipe or None, findings). Errors mean: do not train.

    `files`: also check that the data, model and reward files the recipe names exist and that its
    data files can be read (rule `input`; what `rltune validate` does unless `--skip-files`).
    Raises rltune.errors.RecipeInputError (exit code 2) when the file cannot be read.
    """
    res = load_recipe(path, overrides, extra_presets)
    findings = list(res.findings) + lint(res)
    if files:
        from rltune.recipe.files import check_files

        findings += check_files(res)
    if strict:
        findings = strictify(findings)
    return res.recipe, sort_findings(findings)


def rule_table() -> list[dict]:
    """The rules as rows (id, severity, condition, why) for docs."""
    return [{"id": r.id, "severity": r.severity, "condition": r.condition, "why": r.why} for r in RULES.values()]
