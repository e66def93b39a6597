"""Walk the schema by dotted path: field info, bounds, allowed values, defaults, did-you-mean.

Used by the loader (error messages), `presets apply` (defaults) and docgen.
"""

from __future__ import annotations

import difflib
import typing
from functools import lru_cache
from typing import Any, Optional

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from rltune.recipe.schema import Recipe

_NONE = type(None)


def unwrap_model(annotation) -> Optional[type[BaseModel]]:
    """The BaseModel class behind `X`, `Optional[X]`, else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    args = [a for a in typing.get_args(annotation) if a is not _NONE]
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)) and len(args) == 1:
        return unwrap_model(args[0])
    return None


def model_at(parts) -> Optional[type[BaseModel]]:
    """The section model at a dotted path (() = Recipe)."""
    m: type[BaseModel] = Recipe
    for p in parts:
        fi = m.model_fields.get(str(p))
        if fi is None:
            return None
        sub = unwrap_model(fi.annotation)
        if sub is None:
            return None
        m = sub
    return m


def field_at(path: str) -> Optional[FieldInfo]:
    parts = path.split(".")
    m = model_at(parts[:-1])
    if m is None:
        return None
    return m.model_fields.get(parts[-1])


@lru_cache(maxsize=1)
def all_paths() -> tuple[str, ...]:
    """Every dotted path in the schema (sections and leaves)."""
    out = []

    def walk(m, prefix):
        for name, fi in m.model_fields.items():
            p = f"{prefix}{name}"
            out.append(p)
            sub = unwrap_model(fi.annotation)
            if sub is not None:
                walk(sub, p + ".")

    walk(Recipe, "")
    return tuple(out)


def bounds(fi: FieldInfo) -> dict:
    b = {}
    for m in fi.metadata:
        for k in ("ge", "gt", "le", "lt"):
            v = getattr(m, k, None)
            if v is not None:
                b[k] = v
    return b


def bounds_text(fi: FieldInfo) -> str:
    b = bounds(fi)
    if not b:
        return ""
    lo = f"[{b['ge']}" if "ge" in b else (f"({b['gt']}" if "gt" in b else "(-inf")
    hi = f"{b['le']}]" if "le" in b else (f"{b['lt']})" if "lt" in b else "inf)")
    return f"{lo}, {hi}"


def literal_values(annotation) -> list:
    """Allowed values of a Literal (possibly inside Optional)."""
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    for a in typing.get_args(annotation):
        v = literal_values(a)
        if v:
            return v
    return []


def type_text(annotation) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is _NONE:
        return "null"
    if origin is typing.Literal:
        return " | ".join(repr(a) if not isinstance(a, str) else a for a in args)
    if origin is typing.Union or (origin is not None and origin.__name__ == "UnionType"):
        return " | ".join(type_text(a) for a in args)
    if origin in (list, tuple, dict):
        inner = ", ".join(type_text(a) for a in args if a is not Ellipsis)
        return f"{origin.__name__}[{inner}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def default_of(path: str) -> Any:
    fi = field_at(path)
    if fi is None or fi.is_required():
        return None
    d = fi.get_default(call_default_factory=True)
    if isinstance(d, BaseModel):
        return d.model_dump()
    return d


def suggest_key(parent: tuple, key: str) -> Optional[str]:
    """Did-you-mean for an unknown key `key` under section `parent`: a dotted path or None."""
    m = model_at(parent)
    prefix = ".".join(map(str, parent))
    if m is not None:
        close = difflib.get_close_matches(key, list(m.model_fields), n=1, cutoff=0.6)
        if close:
            return f"{prefix}.{close[0]}" if prefix else close[0]
    full = f"{prefix}.{key}" if prefix else key
    paths = all_paths()
    # the same key in another section (actor.group_size -> algorithm.group_size)
    same = [p for p in paths if p.rsplit(".", 1)[-1] == key and p != full]
    if same:
        return same[0]
    close = difflib.get_close_matches(full, list(paths), n=1, cutoff=0.75)
    return close[0] if close else None


def valid_keys(parent: tuple) -> list[str]:
    m = model_at(parent)
    return list(m.model_fields) if m is not None else []
