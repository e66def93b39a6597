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
            # write only what changes the effective value: a value equal to what a preset the recipe
            # names or the default already gives is not written (it would only add noise, or infos)
            if path in merged_before:
                if merged_before[path] == value:
                    continue
                old = f"{_show(merged_before[path])} (from a preset)"
            else:
                default = ins.default_of(path)
                if default == value:
                    continue
                old = f"unset (default {_show(default)})"
        else:
            if current == value:
                continue
            old = _show(current)
        _set_in(doc, parts, value)
        changes.append((path, old, _show(value)))
    buf = io.StringIO()
    y.dump(doc, buf)
    text_out = buf.getvalue()
    if changes:
        dropped = _drop_stale_waivers(doc, res, text_out, Path(recipe_path).resolve().parent)
        if dropped:
            changes.extend(dropped)
            _drop_waiver_comments(doc, [c[0] for c in changes if not c[0].startswith("lint.waive.")])
            buf = io.StringIO()
            y.dump(doc, buf)
            text_out = buf.getvalue()
    return text_out, changes, skipped


def _drop_waiver_comments(doc, paths) -> None:
    """A changed key's end-of-line comment that points at lint.waive ("far above the playbook range:
    see lint.waive") explained the old value and the waiver just removed: drop it with them."""
    for path in paths:
        parts = path.split(".")
        parent = _get_in(doc, parts[:-1]) if len(parts) > 1 else doc
        ca = getattr(parent, "ca", None)
        if ca is None or parts[-1] not in ca.items:
            continue
        tok = ca.items[parts[-1]][2] if len(ca.items[parts[-1]]) > 2 else None
        if tok is not None and "lint.waive" in getattr(tok, "value", ""):
            ca.items[parts[-1]][2] = None


def _fired(res) -> set:
    """Ids of the rules that report something on a loaded recipe (waived findings included)."""
    from rltune.recipe.api import lint

    return {f.rule for f in lint(res)}


def _drop_stale_waivers(doc, before, merged_text: str, base_dir: Path) -> list:
    """Remove from `doc` each lint.waive entry whose rule fired on the recipe before the preset and no
    longer fires on the merged one (the preset fixed what was waived: the waiver, and its reason, are
    stale). Returns the change lines [(lint.waive.RULE, reason, why removed)]."""
    from rltune.recipe.loader import load_recipe_text

    lint_doc = doc.get("lint") if isinstance(doc, dict) else None
    waive = lint_doc.get("waive") if isinstance(lint_doc, dict) else None
    if not isinstance(waive, dict) or not waive:
        return []
    try:
        after = load_recipe_text(merged_text, source="<merged>", base_dir=base_dir)
    except RecipeInputError:
        return []
    if after.recipe is None:
        return []
    fired_before, fired_after = _fired(before), _fired(after)
    out = []
    for rid in list(waive):
        if rid in fired_before and rid not in fired_after:
            reason = waive[rid]
            del waive[rid]
            out.append((f"lint.waive.{rid}", _show(reason) if reason is not None else "null",
                        f"removed (`{rid}` no longer fires on the merged recipe)"))
    if out and not waive:
        del lint_doc["waive"]
        if not lint_doc:
            del doc["lint"]
    return out


def run_apply(name: str, recipe: str, out: Optional[str], force: bool = False) -> int:
    from rltune.recipe.api import lint
    from rltune.recipe.findings import count, format_text_line, sort_findings
    from rltune.recipe.loader import load_recipe_text

    load_preset_with_locs(name)  # unknown or unreadable preset, a preset naming presets: RecipeInputError, exit 2
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
