"""Stage and hardware presets: YAML fragments of a recipe in `rltune/presets/` (package data).

Each file opens with a comment whose first line says when to use it. No pydantic import.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Optional

from rltune.errors import RecipeInputError
from rltune.recipe.yamlio import parse_yaml, read_yaml_text

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"


def list_presets() -> list[str]:
    """Names of the shipped presets, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str, base_dir: Optional[Path] = None) -> Path:
    """The file of a preset: a shipped NAME, or a path to a .yaml file (relative to base_dir)."""
    if name.endswith((".yaml", ".yml")):
        p = Path(name)
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        if p.is_file():
            return p
        why = "not found" if not p.is_dir() else "is a directory"
        if not p.exists() and p.is_symlink():
            from rltune.data.datasets import missing_file_reason

            why = missing_file_reason(p)
        raise RecipeInputError(f"preset file `{name}` {why} (looked for {p.resolve() if not p.is_symlink() else p})",
                               fix="give a path relative to the recipe, or a preset name: " + ", ".join(list_presets()))
    p = PRESET_DIR / f"{name}.yaml"
    if p.is_file():
        return p
    raise unknown_preset(name)


def did_you_mean(name: str, names: list[str]) -> str:
    """"did you mean `X`? " for the closest of `names`, or "" (the start of a fix line)."""
    close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.5)
    return f"did you mean `{close[0]}`? " if close else ""


def unknown_preset(name: str, file: Optional[str] = None, line: int = 0, column: int = 0) -> RecipeInputError:
    names = list_presets()
    fix = did_you_mean(name, names) + "available presets: " + ", ".join(names)
    return RecipeInputError(f"unknown preset `{name}`", file=file, line=line, column=column, fix=fix)


def load_preset_with_locs(name: str, base_dir: Optional[Path] = None) -> tuple[dict, dict, Path]:
    """(data, {dotted path: (file, line, col)}, file) of a preset. A preset is one level: it may
    not name other presets (the recipe lists them all, in order), so there are no chains or cycles."""
    path = preset_path(name, base_dir)
    text = read_yaml_text(path, str(path), "preset")
    data, locs = parse_yaml(text, str(path), what="preset")
    if not isinstance(data, dict):
        raise RecipeInputError("a preset must be a mapping of recipe sections", file=str(path), line=1, column=1,
                               fix="write it like a recipe fragment, e.g. `actor: {lr: 1.0e-6}`")
    if "preset" in data:
        inner = data["preset"]
        inner_names = [inner] if isinstance(inner, str) else (list(inner) if isinstance(inner, list) else [])
        shown = ", ".join(map(str, inner_names)) if inner_names else repr(inner)
        chain = ", ".join([str(n) for n in inner_names] + [name])
        _, line, col = locs.get("preset", (None, 1, 1))
        raise RecipeInputError(
            f"a preset cannot name other presets (`preset: {shown}` in preset `{name}`): presets are "
            "merged one level deep, in the order the recipe lists them",
            file=str(path), line=line, column=col,
            fix=f"delete `preset:` from {path.name} and list them all in the recipe instead: "
                f"`preset: [{chain}]` (later ones win)")
    return data, locs, path


def load_preset(name: str) -> dict:
    """The preset's values as a nested dict (a recipe fragment)."""
    return load_preset_with_locs(name)[0]


def preset_comment(name: str) -> list[str]:
    """The leading comment lines of a preset, without '# '."""
    out = []
    for line in preset_path(name).read_text(encoding="utf-8").splitlines():
        s = line.strip()
        if not s.startswith("#"):
            break
        out.append(s.lstrip("#").strip())
    return out


def preset_summary(name: str) -> str:
    """The one-line when-to-use (first comment line)."""
    lines = [ln for ln in preset_comment(name) if ln]
    return lines[0] if lines else ""


def deep_merge(base: dict, top: dict) -> dict:
    """A new dict: `top` over `base`; mappings merge recursively, everything else is replaced."""
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def flatten(d: dict, prefix: str = "") -> dict:
    """{dotted path: leaf value} (lists are leaves)."""
    out = {}
    for k, v in d.items():
        p = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, p + "."))
        else:
            out[p] = v
    return out
