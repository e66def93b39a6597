"""The recipe's JSON Schema (for `rltune schema`, editors and docs/recipe.md). No torch."""

from __future__ import annotations

import json

SCHEMA_URI = "https://json-schema.org/draft/2020-12/schema"


def recipe_json_schema() -> dict:
    from rltune.recipe.schema import Recipe

    s = Recipe.model_json_schema()
    s.pop("title", None)
    return {"$schema": SCHEMA_URI, "title": "rltune recipe", **s}


def schema_text() -> str:
    return json.dumps(recipe_json_schema(), indent=2, ensure_ascii=False) + "\n"
