"""Load a recipe: YAML with line marks -> presets merged under -> `key=value` overrides ->
schema validation. Every schema error becomes a Finding that names file:line:col, the dotted
key, what is wrong and a fix; all of them are reported together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

from pydantic import BaseModel, ValidationError

from rltune.errors import RecipeInputError
from rltune.recipe import introspect as ins
from rltune.recipe.findings import Finding
from rltune.recipe.presets import deep_merge, load_preset_with_locs, unknown_preset
from rltune.recipe.schema import Recipe
from rltune.recipe.yamlio import parse_value, parse_yaml, read_yaml_text

_KEY_RE = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*$")

# example values for the fix of a missing required key
_EXAMPLES = {
    "model": "model:\n      policy: builtin:tiny-llama",
    "data": "data:\n      train: builtin:arithmetic",
    "model.policy": "policy: builtin:tiny-llama   (or a local HF directory / hub id)",
    "data.train": "train: builtin:arithmetic   (or path/to/prompts.jsonl)",
}


@dataclass
class LoadResult:
    """A loaded recipe: the validated `recipe` (None when the schema rejects it), the schema
    `findings`, the merged plain `data` before validation, and where every key came from."""

    source: str
    data: dict
    recipe: Optional[Recipe]
    findings: list = field(default_factory=list)
    locs: dict = field(default_factory=dict)      # dotted path -> (file, line, col)
    origins: dict = field(default_factory=dict)   # dotted path -> "recipe" | "preset:NAME" | "override"
    presets: list = field(default_factory=list)
    overrides: dict = field(default_factory=dict)  # dotted path -> raw "key=value"
    base_dir: Optional[Path] = None                # the recipe's directory (relative presets, data, rewards)
    partial: Optional[Recipe] = None               # schema rejected it: the recipe without the bad entries
    dropped: set = field(default_factory=set)      # keys removed or reset for `partial` (and did-you-means)

    def where(self, path: str) -> tuple:
        """(file, line, col) of `path`, else of its nearest parent, else the recipe's 1:1."""
        parts = str(path).split(".") if path else []
        while parts:
            p = ".".join(parts)
            if p in self.locs:
                return self.locs[p]
            parts.pop()
        return (self.source, 1, 1)

    def locate(self, path: str) -> tuple:
        """(line, col) of `path` (or of its nearest parent)."""
        return self.where(path)[1:]

    def origin(self, path: str) -> str:
        parts = str(path).split(".")
        while parts:
            p = ".".join(parts)
            if p in self.origins:
                return self.origins[p]
            parts.pop()
        return "default"

    def override_for(self, path: str) -> Optional[str]:
        """The `key=value` override that set `path` (or a key under or above it), if any."""
        for key, text in self.overrides.items():
            if key == path or key.startswith(path + ".") or path.startswith(key + "."):
                return text
        return None

    def user_set(self, path: str) -> bool:
        """True when the user wrote `path` itself in the recipe, or on the command line
        (directly or inside an override of a whole section); not when a preset or a default did."""
        if self.origins.get(path) in ("recipe", "override"):
            return True
        parts = str(path).split(".")[:-1]
        while parts:
            if ".".join(parts) in self.overrides:
                return True
            parts.pop()
        return False


def parse_override(text: str) -> tuple:
    """`actor.lr=2e-6` -> ("actor.lr", 2e-06)."""
    if "=" not in text:
        raise RecipeInputError(f"override `{text}` is not key=value", fix="write e.g. `actor.lr=2e-6` (dotted key, then =, then a YAML value)")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not _KEY_RE.match(key):
        raise RecipeInputError(f"override `{text}`: `{key}` is not a dotted key", fix="write e.g. `actor.lr=2e-6` or `algorithm.kl.coef=0.05`")
    try:
        return key, parse_value(raw.strip())
    except RecipeInputError as e:
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise RecipeInputError(f"override `{shown}`: {e.problem}", fix=e.fix) from None


def _set_path(data: dict, key: str, value: Any, text: str) -> None:
    parts = key.split(".")
    cur: Any = data
    for i, p in enumerate(parts[:-1]):
        if isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
            continue
        if not isinstance(cur, dict):
            break
        nxt = cur.get(p)
        if nxt is None:
            nxt = cur[p] = {}
        cur = nxt
    last = parts[-1]
    if isinstance(cur, list) and last.isdigit() and int(last) < len(cur):
        cur[int(last)] = value
    elif isinstance(cur, dict):
        cur[last] = value
    else:
        parent = ".".join(parts[:-1])
        raise RecipeInputError(f"override `{text}`: `{parent}` is a value, not a section", fix=f"set `{parent}=...` itself, or remove its value from the recipe")


def _drop_union_tags(loc: Sequence, data: Any) -> list:
    """Keep the loc elements that index real data or name schema keys (pydantic adds union
    tags such as 'list[str]' that are neither)."""
    out: list = []
    cur = data
    for el in loc:
        if isinstance(cur, dict) and el in cur:
            out.append(el)
            cur = cur[el]
        elif isinstance(cur, list) and isinstance(el, int) and 0 <= el < len(cur):
            out.append(el)
            cur = cur[el]
        elif isinstance(el, str) and el in ins.valid_keys(tuple(map(str, out))):
            out.append(el)  # a missing key
            cur = None
    return out


def _fmt_input(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."


def _yaml_text(v: Any) -> str:
    """A value as it would be written in YAML: true, null, "16", 1.0e-06."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, str):
        import json

        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, float):
        from rltune.recipe.rules import num

        return num(v)
    return _fmt_input(v)


_TYPE_NAMES = {"bool_type": "true or false", "int_type": "a whole number", "float_type": "a number",
               "string_type": "text"}
_WHAT = {bool: "the boolean", str: "the string", int: "the number", float: "the number",
         list: "the list", dict: "the mapping"}


def _type_problem(typ: str, loc: Sequence, inp: Any) -> Optional[tuple]:
    """(message tail, fix) for a value of the wrong type (strict schema: nothing is coerced)."""
    if typ not in _TYPE_NAMES or not loc:
        return None
    key = str(loc[-1])
    path = ".".join(map(str, loc))
    name = key if not key.isdigit() else None
    what = _WHAT.get(type(inp), "")
    got = f"{what} {_yaml_text(inp)}".strip()
    message = f"expected {_TYPE_NAMES[typ]}, got {got}"
    if isinstance(inp, bool) and typ != "bool_type":
        message += " (YAML reads unquoted yes/no/on/off/true/false as booleans)"

    def write(v: str) -> str:
        return f"`{name}: {v}`" if name else f"`{v}`"

    fix = None
    if typ == "bool_type":
        fix = f"write {write('true')} or {write('false')}, without quotes"
    elif typ in ("int_type", "float_type") and isinstance(inp, str):
        try:
            parsed = parse_value(inp.strip())
        except RecipeInputError:
            parsed = None
        if isinstance(parsed, (int, float)) and not isinstance(parsed, bool) and (typ == "float_type" or isinstance(parsed, int)):
            fix = f"write the number without quotes: {write(_yaml_text(parsed))}"
    elif typ == "int_type" and isinstance(inp, float) and inp.is_integer():
        fix = f"write a whole number: {write(str(int(inp)))}"
    elif typ == "string_type" and isinstance(inp, (int, float)) and not isinstance(inp, bool):
        fix = f"quote it to make it text: {write(_yaml_text(str(inp)))}"
    if fix is None:
        fix = f"write {_TYPE_NAMES[typ]}"
        fi = ins.field_at(path) if name else None
        if fi is not None:
            bt = ins.bounds_text(fi)
            if bt:
                fix += f" in {bt}"
            d = None if fi.is_required() else fi.get_default(call_default_factory=True)
            if isinstance(d, (bool, int, float, str)):
                fix += f", e.g. {write(_yaml_text(d))} (the default)"
            if fi.description:
                fix += f" — {fi.description}"
    return message, fix


def _field_hint(path: str) -> str:
    fi = ins.field_at(path)
    if fi is None:
        return ""
    parts = []
    vals = ins.literal_values(fi.annotation)
    if vals:
        parts.append("one of: " + ", ".join(map(str, vals)))
    else:
        parts.append(ins.type_text(fi.annotation))
    bt = ins.bounds_text(fi)
    if bt:
        parts.append(f"in {bt}")
    if not fi.is_required():
        d = fi.get_default(call_default_factory=True)
        if not hasattr(d, "model_dump"):
            parts.append(f"default {d!r}")
    hint = "; ".join(parts)
    if fi.description:
        hint += f" — {fi.description}"
    return hint


def _schema_finding(err: dict, res: LoadResult) -> Finding:
    loc = _drop_union_tags(err.get("loc", ()), res.data)
    path = ".".join(map(str, loc))
    typ = err.get("type", "")
    msg = err.get("msg", "")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    inp = err.get("input")
    label = f"`{path}`" if path else "the recipe"
    if typ == "missing":
        parent = ".".join(map(str, loc[:-1]))
        message = f"required key {label} is missing"
        ex = _EXAMPLES.get(path)
        fix = f"add under `{parent}`: {ex}" if parent and ex else (f"add {ex}" if ex else f"add `{loc[-1]}:` ({_field_hint(path)})")
    elif typ == "extra_forbidden":
        parent = tuple(map(str, loc[:-1]))
        key = str(loc[-1]) if loc else ""
        message = f"unknown key {label}"
        sug = ins.suggest_key(parent, key)
        keys = ins.valid_keys(parent)
        if sug:
            fix = f"did you mean `{sug}`?"
        else:
            where_ = f"`{'.'.join(parent)}`" if parent else "the top level"
            fix = f"remove it; keys allowed in {where_}: {', '.join(keys)}"
    elif typ in ("model_type", "model_attributes_type", "dict_type"):
        message = f"{label} must be a section (a mapping of keys), got {_fmt_input(inp)}"
        keys = ins.valid_keys(tuple(map(str, loc)))
        fix = f"write `{loc[-1] if loc else ''}:` then indented keys" + (f" ({', '.join(keys[:6])}, ...)" if keys else "")
    elif typ == "literal_error":
        message = f"{label}: {msg} (got {_fmt_input(inp)})"
        fi = ins.field_at(path)
        vals = ins.literal_values(fi.annotation) if fi is not None else []
        import difflib
        close = difflib.get_close_matches(str(inp), [str(v) for v in vals], n=1, cutoff=0.5)
        fix = (f"did you mean `{close[0]}`? " if close else "") + ("use one of: " + ", ".join(map(str, vals)) if vals else "")
    elif _type_problem(typ, loc, inp) is not None:
        tail, fix = _type_problem(typ, loc, inp)
        message = f"{label}: {tail}"
    else:
        got = _fmt_input(inp)
        message = f"{label}: {msg}" + ("" if got in msg else f" (got {got})")
        hint = _field_hint(path)
        if typ in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            fi = ins.field_at(path)
            fix = f"set {path} in {ins.bounds_text(fi)}" if fi is not None else msg
            if fi is not None and fi.description:
                fix += f" — {fi.description}"
        elif hint:
            fix = f"expected {hint}"
        else:
            fix = "see `rltune schema` or docs/recipe.md for this key"
    file, line, col = res.where(path)
    ov = res.override_for(path) if path else None
    if ov:
        message += f" (from the override `{ov}`)"
    return Finding(file=file, line=line, column=col, rule="schema", severity="error", path=path,
                   message=message, fix=fix)


def _dedupe(findings: Iterable[Finding]) -> list[Finding]:
    out, seen = [], {}
    for f in findings:
        key = (f.path, f.rule)
        if key in seen and f.rule == "schema":
            prev = seen[key]
            if f.message not in prev.message:  # union members: say both
                prev.message += f"; or {f.message.split(': ', 1)[-1]}"
            continue
        seen[key] = f
        out.append(f)
    return out


def _load(text: str, source: str, overrides: Iterable[str] = (), extra_presets: Iterable[str] = (),
          base_dir: Optional[Path] = None) -> LoadResult:
    data, locs = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise RecipeInputError(
            "the top level of a recipe must be a mapping of sections, not "
            + {type(None): "an empty document", list: "a list", str: "a plain string", bool: "a boolean",
               int: "a number", float: "a number"}.get(type(data), type(data).__name__),
            file=source, line=1, column=1,
            fix="start with `model:`, `data:`, `reward:` sections; see `rltune recipes show minimal`")
    origins = {p: "recipe" for p in locs}
    res = LoadResult(source=source, data=data, recipe=None, locs=dict(locs), origins=origins, base_dir=base_dir)

    # overrides (before presets, so `preset=NAME` works; they still win over presets)
    for i, text_ in enumerate(overrides, 1):
        key, value = parse_override(text_)
        _set_path(data, key, value, text_)
        res.overrides[key] = text_
        # the key itself (and anything under it) now comes from the command line
        for p in [q for q in res.origins if q == key or q.startswith(key + ".")]:
            res.origins[p] = "override"
        res.origins[key] = "override"

    # presets, merged under the recipe in order (a later preset wins over an earlier one)
    names = data.get("preset")
    if names is None:
        names = []
    elif isinstance(names, str):
        names = [names]
    elif not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        file, line, col = res.where("preset")
        raise RecipeInputError("`preset` must be a name or a list of names", file=file, line=line, column=col,
                               fix="write `preset: cold-start` or `preset: [1x40gb, cold-start]`")
    n_own = len(names)
    names = list(names) + list(extra_presets)
    if names:
        under: dict = {}
        under_locs: dict = {}
        for idx, name in enumerate(names):
            try:
                pdata, plocs, ppath = load_preset_with_locs(name, base_dir)
            except RecipeInputError as e:
                file, line, col = None, 0, 0
                if idx < n_own:
                    own = data.get("preset")
                    file, line, col = res.where(f"preset.{idx}" if isinstance(own, list) else "preset")
                if e.problem.startswith("unknown preset"):
                    raise unknown_preset(name, file, line, col) from None
                if e.file is None and file is not None:  # e.g. a preset file not found: say where it was named
                    raise RecipeInputError(e.problem, file=file, line=line, column=col, fix=e.fix) from None
                raise
            under = deep_merge(under, pdata)
            for p, l in plocs.items():
                under_locs[p] = (l, f"preset:{name}")
        res.presets = names
        merged = deep_merge(under, data)
        data.clear()
        data.update(merged)
        if extra_presets:
            data["preset"] = names
        for p, (l, origin) in under_locs.items():
            if p not in res.locs:
                res.locs[p] = l
                res.origins[p] = origin

    try:
        res.recipe = Recipe.model_validate(data)
    except ValidationError as e:
        errors = e.errors(include_url=False)
        res.findings = _dedupe(_schema_finding(err, res) for err in errors)
        res.partial, res.dropped = _salvage(data, errors)
    return res


def _salvage(data: dict, errors: list, rounds: int = 5) -> tuple:
    """The recipe with every rejected entry removed (an unknown key dropped, a bad value back to
    its default), so that the lint rules can still check the rest: (Recipe or None, dropped
    paths). An unknown key's did-you-mean counts as dropped (the user meant to set it)."""
    import copy

    doc, dropped = copy.deepcopy(data), set()
    for _ in range(rounds):
        for err in errors:
            loc = [str(x) for x in _drop_union_tags(err.get("loc", ()), doc) if isinstance(x, str)]
            if not loc:
                return None, dropped   # a problem with the whole recipe: nothing to lint
            if err.get("type") == "extra_forbidden":
                sug = ins.suggest_key(tuple(loc[:-1]), loc[-1])
                if sug:
                    dropped.add(sug)
            elif err.get("type") == "missing":
                return None, dropped   # a required key: no default to fall back on
            else:
                dropped.add(".".join(loc))
            cur = doc
            for p in loc[:-1]:
                cur = cur.get(p) if isinstance(cur, dict) else None
            if isinstance(cur, dict):
                cur.pop(loc[-1], None)
        try:
            return Recipe.model_validate(doc), dropped
        except ValidationError as e:
            errors = e.errors(include_url=False)
    return None, dropped


class _Tracked:
    """A read-only view of a recipe that records the dotted keys read through it."""

    __slots__ = ("_obj", "_path", "_reads")

    def __init__(self, obj, path: str, reads: set):
        object.__setattr__(self, "_obj", obj)
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_reads", reads)

    def __getattr__(self, name: str):
        obj, path = self._obj, self._path
        attr = getattr(type(obj), name, None)
        if isinstance(attr, property):   # derived (has_critic): record what it reads
            return attr.fget(self)
        full = f"{path}.{name}" if path else name
        if name in type(obj).model_fields:
            value = getattr(obj, name)
            if isinstance(value, BaseModel):
                return _Tracked(value, full, self._reads)
            self._reads.add(full)
            return value
        self._reads.add(path)   # model_fields_set and the like: the whole section
        return getattr(obj, name)


def _touches(reads: set, dropped: set) -> bool:
    return any(r == d or not r or d.startswith(r + ".") or r.startswith(d + ".") for r in reads for d in dropped)


def lint_partial(res: LoadResult) -> list:
    """Lint findings for a recipe the schema rejected, over what could still be checked (see
    _salvage): a rule that read a dropped key says nothing (it would judge a default the user
    did not choose). [] when the recipe validated (lint() covers it) or nothing could be kept."""
    if res.recipe is not None or res.partial is None:
        return []
    from rltune.recipe.rules import RULES, Ctx

    ctx, waive, out = Ctx(res), res.partial.lint.waive, []
    for rl in RULES.values():
        reads: set = set()
        hits = list(rl.fn(_Tracked(res.partial, "", reads), ctx) or ())
        if not hits or _touches(reads, res.dropped):
            continue
        for hit in hits:
            file, line, col = res.where(hit.path)
            ov = res.override_for(hit.path)
            f = Finding(file=file, line=line, column=col, rule=rl.id, severity=hit.severity or rl.severity,
                        path=hit.path, message=hit.message + (f" (from the override `{ov}`)" if ov else ""), fix=hit.fix)
            if rl.id in waive and f.severity != "error":
                f.severity, f.waived, f.waive_reason = "info", True, waive[rl.id]
            out.append(f)
    return out


def load_recipe(path: Union[str, Path], overrides: Iterable[str] = (), extra_presets: Iterable[str] = ()) -> LoadResult:
    """Load, merge presets and overrides, validate. Raises RecipeInputError for unreadable input."""
    source = str(path)
    p = Path(path)
    if not p.exists():
        if p.is_symlink():
            from rltune.data.datasets import missing_file_reason

            raise RecipeInputError(f"recipe file `{source}` {missing_file_reason(p)}",
                                   fix="point the link at an existing recipe, or give the file's real path")
        raise RecipeInputError(f"recipe file `{source}` not found", fix="check the path; shipped examples: `rltune recipes list`, copy one with `rltune recipes copy minimal`")
    if p.is_dir():
        raise RecipeInputError(f"`{source}` is a directory, not a recipe file", fix="give a .yaml file, e.g. one made with `rltune recipes copy minimal`")
    text = read_yaml_text(p, source)
    return _load(text, source, overrides, extra_presets, base_dir=p.parent)


def load_recipe_text(text: str, source: str = "<recipe>", overrides: Iterable[str] = (),
                     extra_presets: Iterable[str] = (), base_dir: Optional[Path] = None) -> LoadResult:
    """Like load_recipe, from a string."""
    return _load(text, source, overrides, extra_presets, base_dir=base_dir)
