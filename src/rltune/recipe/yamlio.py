"""Safe YAML loading that keeps file:line:column for every key and rejects duplicate keys.

No pydantic import (`rltune presets list` uses it on its own).
"""

from __future__ import annotations

import re
from typing import Any, Optional

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from rltune.errors import RecipeInputError

# Loc = (file, line, column), 1-based
Loc = tuple


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads `1e-6` as a float (YAML 1.1 needs a dot: `1.0e-6`)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)

_MERGE = "tag:yaml.org,2002:merge"
_MAX_DEPTH = 64
MAX_BYTES = 1_000_000    # a recipe is a few KB; anything near this is the wrong file
MAX_VALUES = 100_000     # keys + values after alias expansion (a recipe has a few hundred)


def too_big(size: int, file: str, what: str = "recipe") -> RecipeInputError:
    """The error for a recipe or preset file over MAX_BYTES (checked before it is read)."""
    return RecipeInputError(
        f"the {what} is {size / 1e6:.1f} MB; a {what} may be at most {MAX_BYTES // 1_000_000} MB "
        "(a recipe is a few KB)", file=file,
        fix="check that this is the right file: prompts and other data belong in a data file "
            "(data.train: path/to/prompts.jsonl), not in the recipe")


def read_yaml_text(path, shown: str, what: str = "recipe") -> str:
    """The text of a recipe or preset file: size-capped before reading, UTF-8 with the line and
    column of a bad byte. `shown` is how the message names the file."""
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise too_big(size, shown, what)
        raw = path.read_bytes()
    except OSError as e:
        raise RecipeInputError(f"cannot read {what} file `{shown}`: {e.strerror or e}",
                               fix="check the file's permissions") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise RecipeInputError(f"the {what} is not UTF-8 text (byte 0x{raw[e.start]:02x})", file=shown, line=line,
                               column=col, fix=f"save the {what} as UTF-8 YAML") from None


def _check_size(text: str, file: str, what: str) -> None:
    if len(text) > MAX_BYTES or (len(text) * 4 > MAX_BYTES and len(text.encode("utf-8", "replace")) > MAX_BYTES):
        raise too_big(len(text.encode("utf-8", "replace")), file, what)


def _check_expansion(root, file: Optional[str]) -> None:
    """Refuse a document whose aliases expand to more than MAX_VALUES nodes ("billion laughs")
    before anything is expanded: the expanded size of every node is computed once (memoised on
    the node), so this costs one pass over the nodes as written."""
    sizes: dict = {}
    aliased = [0]

    def size(n, depth: int) -> int:
        key = id(n)
        if key in sizes:
            aliased[0] += 1
            return sizes[key]
        if depth > _MAX_DEPTH:
            raise RecipeInputError("YAML nesting too deep (a recursive anchor?)", file=file,
                                   line=n.start_mark.line + 1, column=n.start_mark.column + 1,
                                   fix="remove the self-referencing alias")
        if isinstance(n, MappingNode):
            total = 1 + sum(size(k, depth + 1) + size(v, depth + 1) for k, v in n.value)
        elif isinstance(n, SequenceNode):
            total = 1 + sum(size(c, depth + 1) for c in n.value)
        else:
            total = 1
        if total > MAX_VALUES:
            line, col = n.start_mark.line + 1, n.start_mark.column + 1
            if aliased[0]:
                raise RecipeInputError(
                    f"YAML aliases expand to more than {MAX_VALUES:,} values here (aliases `*name` "
                    "repeated inside each other: a \"billion laughs\" file?)", file=file, line=line, column=col,
                    fix="write the values out instead of nesting aliases; a recipe holds a few hundred values")
            raise RecipeInputError(f"more than {MAX_VALUES:,} values in one document; a recipe holds a few hundred",
                                   file=file, line=line, column=col,
                                   fix="check that this is the right file: data belongs in a data file (data.train)")
        sizes[key] = total
        return total

    size(root, 0)


def _first_tab_line(text: str):
    for i, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip(" ")
        if stripped.startswith("\t"):
            return i, len(line) - len(stripped) + 1
    return None


def _yaml_error(e: yaml.YAMLError, text: str, file: str) -> RecipeInputError:
    tab = _first_tab_line(text)
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line = mark.line + 1 if mark is not None else 1
    col = mark.column + 1 if mark is not None else 1
    if tab is not None and (mark is None or tab[0] <= line):
        return RecipeInputError(
            "a tab character is used for indentation; YAML allows only spaces",
            file=file, line=tab[0], column=tab[1],
            fix="replace the tab with spaces (2 per level); set your editor to insert spaces in .yaml files")
    problem = getattr(e, "problem", None) or str(e)
    context = getattr(e, "context", None)
    what = f"not valid YAML: {problem}" + (f" ({context})" if context else "")
    src_lines = text.splitlines()
    snippet = ""
    if 0 < line <= len(src_lines):
        snippet = f"\n    {src_lines[line - 1]}\n    {' ' * (col - 1)}^"
    return RecipeInputError(
        what + snippet, file=file, line=line, column=col,
        fix="check the indentation and the `key: value` syntax on this line or the one before it "
            "(quote values that contain ': ' or start with a special character such as '{', '[', '*', '&', '!')")


def parse_yaml(text: str, file: str, *, what: str = "recipe") -> tuple[Any, dict]:
    """Parse YAML text: (plain data, {dotted path: (file, line, col)}).

    Raises RecipeInputError for empty input, YAML syntax errors, tabs and duplicate keys.
    """
    if not text.strip() or all(not ln.strip() or ln.lstrip().startswith("#") for ln in text.splitlines()):
        raise RecipeInputError(
            f"the {what} is empty", file=file,
            fix="a recipe needs at least model.policy, data.train and a reward; start from `rltune recipes copy minimal`")
    _check_size(text, file, what)
    loader = _Loader(text)
    locs: dict = {}
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as e:
            raise _yaml_error(e, text, file) from None
        _check_expansion(node, file)

        def where(n):
            return (file, n.start_mark.line + 1, n.start_mark.column + 1)

        def build(n, path: str, depth: int):
            if depth > _MAX_DEPTH:
                raise RecipeInputError("YAML nesting too deep (a recursive anchor?)", file=file,
                                       line=n.start_mark.line + 1, column=n.start_mark.column + 1,
                                       fix="remove the self-referencing alias")
            if isinstance(n, MappingNode):
                out: dict = {}
                seen: dict = {}
                merges = []
                for kn, vn in n.value:
                    if kn.tag == _MERGE:
                        merges.append(vn)
                        continue
                    if not isinstance(kn, ScalarNode):
                        raise RecipeInputError("a key must be a plain name, not a list or mapping",
                                               file=file, line=kn.start_mark.line + 1,
                                               column=kn.start_mark.column + 1,
                                               fix="write `name: value`")
                    key = loader.construct_object(kn)
                    key = key if isinstance(key, str) else str(key)
                    dotted = f"{path}.{key}" if path else key
                    if key in seen:
                        first = seen[key]
                        raise RecipeInputError(
                            f"duplicate key `{dotted}` (first defined at line {first[1]}); "
                            "YAML would silently keep only the last one",
                            file=file, line=kn.start_mark.line + 1, column=kn.start_mark.column + 1,
                            fix=f"keep one `{key}:` and delete the other")
                    seen[key] = where(kn)
                    locs[dotted] = where(kn)
                    out[key] = build(vn, dotted, depth + 1)
                for mn in merges:  # `<<: *anchor` fills keys not given explicitly
                    subs = mn.value if isinstance(mn, SequenceNode) else [mn]
                    for sub in subs:
                        if not isinstance(sub, MappingNode):
                            raise RecipeInputError("`<<` must merge a mapping", file=file,
                                                   line=sub.start_mark.line + 1,
                                                   column=sub.start_mark.column + 1,
                                                   fix="merge an anchored mapping: `<<: *name`")
                        merged = build(sub, path, depth + 1)
                        for k, v in merged.items():
                            out.setdefault(k, v)
                return out
            if isinstance(n, SequenceNode):
                items = []
                for i, item in enumerate(n.value):
                    locs[f"{path}.{i}"] = where(item)
                    items.append(build(item, f"{path}.{i}", depth + 1))
                return items
            return loader.construct_object(n)

        try:
            data = build(node, "", 0)
        except yaml.YAMLError as e:  # e.g. a bad !!tag
            raise _yaml_error(e, text, file) from None
    finally:
        loader.dispose()
    return data, locs


def parse_value(text: str) -> Any:
    """Parse one override value as YAML (`1e-6`, `[0, 1]`, `null`, `true`, `bf16`).

    Raises RecipeInputError (no file) for a value whose aliases expand too far."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, None)
        return loader.construct_document(node)
    except yaml.YAMLError:
        return text  # not YAML at all: keep the raw string, the schema judges it
    finally:
        loader.dispose()


def _flow(value: Any) -> str:
    """One value as YAML on one line (flow style): 5.0e-07, true, [0, 1], {coef: 0.05}."""
    if isinstance(value, float):
        from rltune.recipe.rules import num

        return num(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def edit_yaml_text(text: str, changes: dict) -> str:
    """`text` with each dotted key of `changes` set, comments and layout kept: a value written
    in the text is replaced where it stands; a key the text lacks is added at the end of its
    section (the section is added at the end of the file when it is missing too)."""
    for key, value in changes.items():
        node = yaml.compose(text, Loader=_Loader)
        parts = key.split(".")
        i = 0
        while i < len(parts) and isinstance(node, MappingNode):
            hit = next(((k, v) for k, v in node.value if isinstance(k, ScalarNode) and k.value == parts[i]), None)
            if hit is None:
                break
            last_key, node = hit[0], hit[1]
            i += 1
        if i == len(parts) and node.start_mark.index >= last_key.end_mark.index:   # written here: replace
            start, end = node.start_mark.index, node.end_mark.index
            if not isinstance(node, ScalarNode) and node.flow_style is False:   # a block list or mapping
                start = last_key.end_mark.index + text[last_key.end_mark.index:].index(":") + 1
                text = text[:start] + " " + _flow(value) + "\n" + text[end:].lstrip("\n")
            else:
                text = text[:start] + _flow(value) + text[end:]
            continue
        # add the missing part under the deepest section written (the top level when none is)
        section = node if i and isinstance(node, MappingNode) and node.flow_style is False and node.value else None
        rest = parts[i:]
        if section is None and i:   # an empty or flow section, or a value where a section should be
            raise RecipeInputError(f"cannot add `{key}` to this recipe in place (`{'.'.join(parts[:i])}` is not a block section)",
                                   fix=f"add `{key}` by hand")
        indent = section.value[0][0].start_mark.column if section is not None else 0
        lines = []
        for depth, part in enumerate(rest):
            tail = f" {_flow(value)}" if depth == len(rest) - 1 else ""
            lines.append(" " * (indent + 2 * depth) + f"{part}:{tail}")
        if section is None:
            text = text + ("" if text.endswith("\n") else "\n") + "\n".join(lines) + "\n"
            continue
        end = section.value[-1][1].end_mark.index
        if end and text[end - 1] != "\n":
            nl = text.find("\n", end)
            end = len(text) if nl < 0 else nl + 1
        if end == len(text) and not text.endswith("\n"):
            text += "\n"
            end = len(text)
        text = text[:end] + "\n".join(lines) + "\n" + text[end:]
    return text
