"""The recipe: schema, loading (YAML with line marks, presets, overrides), lint rules.

Public API (imported lazily so that `import rltune.recipe` stays cheap):

    Finding, LoadResult, RecipeInputError
    load_recipe(path, overrides=(), extra_presets=()) -> LoadResult
    lint(result_or_recipe) -> list[Finding]
    check(path, overrides=(), strict=False, files=False) -> (Recipe | None, list[Finding])
    format_findings(findings, fmt)          # "text" | "json" | "github"
    load_preset(name) -> dict, list_presets() -> list[str]
    Recipe, batch_plan

No torch, transformers or deepspeed import anywhere under this package.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Finding": "rltune.recipe.findings",
    "format_findings": "rltune.recipe.findings",
    "has_errors": "rltune.recipe.findings",
    "RecipeInputError": "rltune.errors",
    "UserError": "rltune.errors",
    "LoadResult": "rltune.recipe.loader",
    "load_recipe": "rltune.recipe.loader",
    "load_recipe_text": "rltune.recipe.loader",
    "parse_override": "rltune.recipe.loader",
    "lint": "rltune.recipe.api",
    "check": "rltune.recipe.api",
    "load_preset": "rltune.recipe.presets",
    "list_presets": "rltune.recipe.presets",
    "deep_merge": "rltune.recipe.presets",
    "Recipe": "rltune.recipe.schema",
    "batch_plan": "rltune.recipe.schema",
    "RULES": "rltune.recipe.rules",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'rltune.recipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
