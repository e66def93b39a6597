"""`rltune presets [list | show NAME | apply NAME RECIPE [--output OUT]]`."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Optional

from rltune.errors import RecipeInputError
from rltune.recipe.presets import flatten, list_presets, load_preset_with_locs, preset_path, preset_summary


def run_list() -> int:
    names = list_presets()
    width = max((len(n) for n in names), default=0)
    for n in names:
        print(f"{n:<{width}}  {preset_summary(n)}")
    print("\nshow one: rltune presets show NAME; apply one: rltune presets apply NAME RECIPE --output OUT;"
          " or add `preset: NAME` to a recipe")
    return 0


def run_show(name: str) -> int:
    path = preset_path(name)  # RecipeInputError (exit 2) lists the available ones
    print(path.read_text(encoding="utf-8"), end="")
    return 0


def _yaml():
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.indent(mapping=2, sequence=4, offset=2)
    y.width = 4096
    return y


def _show(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        from rltune.recipe.rules import num

        return num(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return str(v)


def _set_in(doc, parts, value) -> None:
    from ruamel.yaml.comments import CommentedMap

    cur = doc
    for p in parts[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            nxt = CommentedMap()
            cur[p] = nxt
        cur = nxt
    cur[parts[-1]] = value


def _get_in(doc, parts):
    cur = doc
    for p in parts:
        if not isinstance(cur, dict) or p not in cur:
            return KeyError
        cur = cur[p]
    return cur


def apply_preset_text(name: str, recipe_path: str) -> tuple:
    """(merged YAML text, changes [(path, old, new)], skipped [(path, why)])."""
    from rltune.recipe import introspect as ins
    from rltune.recipe.loader import load_recipe
    from rltune.recipe.schema import CRITIC_ALGOS

    res = load_recipe(recipe_path)  # clear errors for unreadable input before ruamel sees it
    merged_before = flatten(res.data)
    algo = (res.data.get("algorithm") or {}).get("name", "grpo") if isinstance(res.data.get("algorithm"), dict) else "grpo"
    y = _yaml()
    text = Path(recipe_path).read_text(encoding="utf-8")
    doc = y.load(text)
    preset_doc = y.load(preset_path(name).read_text(encoding="utf-8"))
    changes, skipped = [], []
    for path, value in flatten(dict(preset_doc)).items():
        parts = path.split(".")
        if parts[0] == "critic" and algo not in CRITIC_ALGOS:
            skipped.append((path, f"algorithm.name is {algo}, which has no critic"))
            continue
        current = _get_in(doc, parts)
        if current is KeyError:
            if path in merged_before:
                old = f"{_show(merged_before[path])} (from a preset)"
            else:
                old = f"unset (default {_show(ins.default_of(path))})"
        else:
            if current == value:
                continue
            old = _show(current)
        _set_in(doc, parts, value)
        changes.append((path, old, _show(value)))
    buf = io.StringIO()
    y.dump(doc, buf)
    return buf.getvalue(), changes, skipped


def run_apply(name: str, recipe: str, out: Optional[str], force: bool = False) -> int:
    from rltune.recipe.api import lint
    from rltune.recipe.findings import count, format_text_line, sort_findings
    from rltune.recipe.loader import load_recipe_text

    load_preset_with_locs(name)  # unknown or unreadable preset, a preset naming presets: RecipeInputError, exit 2
    if out:
        from rltune.outputs import check_output

        check_output(out, force, retry=f"rltune presets apply {name} {recipe} --output {out}")
    text, changes, skipped = apply_preset_text(name, recipe)
    log = sys.stdout if out else sys.stderr
    if out:
        from rltune.outputs import write_output

        write_output(out, text, force=force, retry=f"rltune presets apply {name} {recipe} --output {out}")
    else:
        sys.stdout.write(text)
    target = out or "<stdout>"
    print(f"applied preset {name} to {recipe}" + (f" -> {out}" if out else "") + ":", file=log)
    for path, old, new in changes:
        print(f"  {path}: {old} -> {new}", file=log)
    if not changes:
        print("  nothing changed (the recipe already has these values)", file=log)
    for path, why in skipped:
        print(f"  skipped {path}: {why}", file=log)
    base = Path(recipe).resolve().parent
    try:
        res = load_recipe_text(text, source=target, base_dir=base)
    except RecipeInputError as e:
        print(f"rltune: error: {e}", file=log)
        return 2
    findings = sort_findings(list(res.findings) + lint(res))
    for f in findings:
        head, fix = format_text_line(f)
        print(head, file=log)
        if fix:
            print(fix, file=log)
    c = count(findings)
    print(f"{target}: {'FAILED' if c['error'] else 'ok'} — {c['error']} error(s), {c['warning']} warning(s), {c['info']} info",
          file=log)
    return 1 if c["error"] else 0
