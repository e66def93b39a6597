"""`rltune recipes [list | show NAME | copy NAME [DEST] [--force]]`: the shipped example recipes.

They are the top-level recipes/ of the repository; `src/rltune/recipes` links to it, so a wheel
carries them as package data and an editable install reads them in place. Names are the file
names without `.yaml`, with the sub-directory for the experiments (`experiments/lr-too-high`).
"""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

from rltune.errors import RecipeInputError
from rltune.outputs import write_output

RECIPE_DIR = Path(__file__).resolve().parent.parent / "recipes"
_SCHEMA_LINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)\s*$")


def names() -> list[str]:
    """Names of the shipped recipes, top level first, then sub-directories."""
    if not RECIPE_DIR.is_dir():
        return []
    files = sorted(RECIPE_DIR.rglob("*.yaml"), key=lambda p: (len(p.relative_to(RECIPE_DIR).parts), str(p.with_suffix(""))))
    return [p.relative_to(RECIPE_DIR).with_suffix("").as_posix() for p in files]


def recipe_path(name: str) -> Path:
    name = name[:-5] if name.endswith(".yaml") else name
    if name in names():
        return RECIPE_DIR / f"{name}.yaml"
    from rltune.recipe.presets import did_you_mean

    raise RecipeInputError(f"unknown recipe `{name}`",
                           fix=did_you_mean(name, names()) + "shipped recipes: " + ", ".join(names())
                           + " (`rltune recipes list` describes them)")


def summary(name: str) -> str:
    """The first sentence of the recipe's leading comment (the `$schema` line skipped)."""
    words = []
    for line in recipe_path(name).read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        text = line[1:].strip()
        if _SCHEMA_LINE.match(line):
            continue
        if not text or line.startswith("#  "):   # a blank comment or an indented example ends it
            break
        words.append(text)
    first = " ".join(words)
    end = first.find(". ")
    return first[:end + 1] if end >= 0 else first


def run_list() -> int:
    all_names = names()
    width = max((len(n) for n in all_names), default=0)
    for n in all_names:
        lines = textwrap.wrap(summary(n), width=max(40, 100 - width)) or [""]
        print(f"{n:<{width}}  {lines[0]}")
        for more in lines[1:]:
            print(f"{'':<{width}}  {more}")
    print("\nshow one: rltune recipes show NAME; copy one to edit: rltune recipes copy NAME [DEST];"
          " run one: rltune train DEST")
    return 0


def run_show(name: str) -> int:
    print(recipe_path(name).read_text(encoding="utf-8"), end="")
    return 0


def _retarget_schema(text: str, src: Path, dest: Path) -> tuple[str, str]:
    """Point a relative `$schema` comment at the same file from DEST, or drop it when that file
    is not there (an installed wheel has no schema/ directory). Returns (text, note)."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        m = _SCHEMA_LINE.match(line)
        if not m or "://" in m.group(1) or os.path.isabs(m.group(1)):
            continue
        schema = (src.resolve().parent / m.group(1)).resolve()
        if schema.is_file():
            where = dest.resolve().parent
            # relative inside the checkout that holds the schema (it moves with it), else absolute
            ref = os.path.relpath(schema, where) if where.is_relative_to(schema.parent.parent) else str(schema)
            lines[i] = f"# yaml-language-server: $schema={Path(ref).as_posix()}\n"
            return "".join(lines), ""
        del lines[i]
        return "".join(lines), ("dropped the `$schema` comment (no schema file here): for editor completion run "
                                "`rltune schema --output recipe.schema.json` and start the recipe with "
                                "`# yaml-language-server: $schema=recipe.schema.json`")
    return text, ""


def run_copy(name: str, dest: str | None = None, force: bool = False) -> int:
    src = recipe_path(name)
    target = Path(dest) if dest else Path(src.name)
    if target.is_dir():
        target = target / src.name
    text, note = _retarget_schema(src.read_text(encoding="utf-8"), src, target)
    # the usage comments name the shipped path: name the copy instead
    shipped = f"recipes/{src.relative_to(RECIPE_DIR).as_posix()}"
    text = "".join(ln.replace(shipped, str(target)) if ln.startswith("#") else ln
                   for ln in text.splitlines(keepends=True))
    write_output(target, text, force=force, retry=f"rltune recipes copy {name} {target}")
    print(f"wrote {target} (from the shipped recipe `{name}`); run it: rltune train {target}")
    if note:
        print(f"note: {note}")
    return 0
