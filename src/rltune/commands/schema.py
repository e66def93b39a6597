"""`rltune schema`: the recipe's JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

SCHEMA_URI = "https://json-schema.org/draft/2020-12/schema"


def recipe_json_schema() -> dict:
    from rltune.recipe.schema import Recipe

    s = Recipe.model_json_schema()
    s.pop("title", None)
    return {"$schema": SCHEMA_URI, "title": "rltune recipe", **s}


def schema_text() -> str:
    return json.dumps(recipe_json_schema(), indent=2, ensure_ascii=False) + "\n"


def run(output: Optional[str] = None) -> int:
    text = schema_text()
    if output:
        Path(output).write_text(text, encoding="utf-8")
        print(f"wrote {output}")
    else:
        print(text, end="")
    return 0
