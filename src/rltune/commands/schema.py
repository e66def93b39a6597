"""`rltune schema`: the recipe's JSON Schema."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from rltune.recipe.jsonschema import SCHEMA_URI, recipe_json_schema, schema_text  # noqa: F401


def run(output: Optional[str] = None) -> int:
    text = schema_text()
    if output:
        Path(output).write_text(text, encoding="utf-8")
        print(f"wrote {output}")
    else:
        print(text, end="")
    return 0
