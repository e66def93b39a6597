"""`rltune schema`: the recipe's JSON Schema."""

from __future__ import annotations

from typing import Optional

from rltune.recipe.jsonschema import SCHEMA_URI, recipe_json_schema, schema_text  # noqa: F401


def run(output: Optional[str] = None, force: bool = False) -> int:
    from rltune.outputs import write_output

    text = schema_text()
    if output:
        write_output(output, text, force=force, retry=f"rltune schema --output {output}")
        print(f"wrote {output}")
    else:
        print(text, end="")
    return 0
