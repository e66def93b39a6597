"""Environments, tasks and rewards from the field's libraries, each behind one recipe prefix
(docs/agents.md, "Environments from the ecosystem"). Every adapter module is imported only when a
recipe names its prefix, and imports its library only then (`pip install 'rltune[envs]'`).

A data adapter (`data.train: PREFIX:NAME`) defines
    rows(name, options, size, seed, split) -> list[dict]      the prompt rows (a `prompt` column)
    data_problems(name, options) -> list[(problem, fix)]      for `validate`, before any model loads
An environment adapter (`rollout.env: PREFIX:NAME`) defines
    load_env(name, args, base_dir) -> a class or agent function rltune's episodes drive (agents/env.py)
    env_problems(name, args) -> list[(problem, fix)]          for `validate`
"""

from __future__ import annotations

import importlib

DATA = {"reasoning_gym": "rltune.envs.reasoning_gym", "verifiers": "rltune.envs.verifiers_env"}
ENVS = {"verifiers": "rltune.envs.verifiers_env", "openenv": "rltune.envs.openenv_env"}
INSTALL_FIX = "pip install 'rltune[envs]'"


# distribution -> (what it enables, its recipe form), for `rltune doctor`
LIBRARIES = {
    "reasoning-gym": "data.train: reasoning_gym:NAME and reward builtin:reasoning_gym",
    "math-verify": "reward builtin:math_verify",
    "verifiers": "rollout.env: verifiers:NAME",
    "openenv-core": "rollout.env: openenv:NAME",
}


def doctor_lines(version) -> list[tuple[str, str, str]]:
    """(name, status, detail) per library: installed with its version, or what installing it enables.
    `version(dist)` -> version or None (metadata only: nothing is imported)."""
    out = []
    for dist, enables in LIBRARIES.items():
        v = version(dist)
        out.append((dist, "ok", f"{dist} {v}: {enables}") if v else
                   (dist, "info", f"not installed: {enables} needs it ({INSTALL_FIX})"))
    return out


def prefix_of(spec: str, table: dict) -> tuple[str, str] | None:
    """(prefix, name) when `spec` is PREFIX:NAME for a prefix of `table`, else None."""
    prefix, sep, name = str(spec).partition(":")
    return (prefix, name) if sep and prefix in table else None


def generated(spec: str) -> bool:
    """A task source with a held-out split of its own: builtin:NAME or a library's tasks."""
    return str(spec).startswith("builtin:") or prefix_of(spec, DATA) is not None


def adapter(prefix: str, table: dict):
    return importlib.import_module(table[prefix])
