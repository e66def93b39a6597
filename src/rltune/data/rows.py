"""The checks every source's rows get (a data file's, an `hf:` dataset's) and the error they raise.

Below the sources: data.hub (`hf:` datasets) and data.datasets (files, builtin tasks and the
`load_prompts` dispatch) import from here, never the other way (tests/test_import_layers.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from ..errors import UserError


class DataError(UserError):
    """Unusable data. `problem` names the file and the line or row; `fix` says what to do.
    `str(err)` is the full user-facing text."""

    exit_code = 2

    def __init__(self, problem: str, fix: Optional[str] = None):
        self.problem, self.fix = problem, fix
        super().__init__(problem + (f"\n  fix: {fix}" if fix else ""))


_SURROGATE = None


def clean_value(value):
    """`value` with each lone UTF-16 surrogate in its strings (JSON's unpaired "\\ud800" escapes) replaced
    by U+FFFD, through lists and dicts (chat messages): no tokenizer takes them (a TypeError at the
    first step), and no UTF-8 log either. Linear in the value's size; valid text comes back as it is."""
    global _SURROGATE
    if isinstance(value, str):
        if _SURROGATE is None:
            import re

            _SURROGATE = re.compile("[\ud800-\udfff]")
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, list):
        return [clean_value(v) for v in value]
    if isinstance(value, dict):
        return {clean_value(k) if isinstance(k, str) else k: clean_value(v) for k, v in value.items()}
    return value


def _fail(spec: str, where: str, problem: str, fix: str) -> DataError:
    kind = "dataset" if spec.startswith("hf:") else "data file"
    return DataError(f"{kind} {spec}{', ' + where if where else ''}: {problem}", fix)


def _json_type(v: Any) -> str:
    return {list: "array", dict: "object", str: "string", bool: "boolean", type(None): "null"}.get(type(v), "number")


_MESSAGE_FIX = 'write the prompt as text ("{k}": "2+3=") or as chat messages ("{k}": [{{"role": "user", "content": "2+3="}}])'


def prompt_problem(value: Any, prompt_key: str, fmt: str) -> Optional[tuple[str, str]]:
    """(problem, fix) when a row's prompt is not usable text or chat messages; None when it is."""
    k = prompt_key
    if value is None:
        return f"no {k!r} (missing or null)", "remove the row or fill in its prompt"
    if isinstance(value, str):
        if not value.strip():
            return f"empty {k!r}", "remove the row or fill in its prompt"
        return None
    if isinstance(value, bool) or isinstance(value, (int, float)):
        shown = json.dumps(value)
        if fmt == "parquet":
            return (f"{k!r} is a {type(value).__name__} ({shown}), not text",
                    f"store the column as strings (e.g. df[{k!r}] = df[{k!r}].astype(str)) and save again")
        if fmt == "hf":
            return (f"{k!r} is a {type(value).__name__} ({shown}), not text",
                    f"set data.prompt_key to a text column, or convert it (ds.map(lambda r: {{{k!r}: str(r[{k!r}])}})) "
                    "and save_to_disk")
        return f"{k!r} is a {'boolean' if isinstance(value, bool) else 'number'} ({shown}), not text", \
            f'write it as a string: "{k}": "{value if not isinstance(value, bool) else shown}"'
    if isinstance(value, (list, tuple)):
        if not value:
            return f"{k!r} is an empty list", "remove the row, or give its chat messages"
        kinds = {type(m) for m in value}
        if kinds <= {int, float}:
            return (f"{k!r} is a list of numbers ({_short(value)}): token ids are not accepted",
                    _MESSAGE_FIX.format(k=k))
        for j, m in enumerate(value, 1):
            if not isinstance(m, dict):
                return (f"message {j} of {k!r} is a {_json_type(m)} ({_short(m)}); a list prompt must be chat messages",
                        _MESSAGE_FIX.format(k=k))
            for field in ("role", "content"):
                if not isinstance(m.get(field), str):
                    return (f"message {j} of {k!r} has no text {field!r} ({_short(m)})",
                            'give every message a "role" (system | user | assistant) and a "content" string')
        return None
    return f"{k!r} is a {_json_type(value)} ({_short(value)}), not text", _MESSAGE_FIX.format(k=k)


def _short(v: Any) -> str:
    s = json.dumps(v, ensure_ascii=False, default=str)
    return s if len(s) <= 50 else s[:47] + "..."


def check_prompts(rows: list[dict], where: list[str], prompt_key: str, spec: str, fmt: str) -> None:
    """The first row whose prompt is unusable (and how many more there are), as a DataError."""
    first, more = None, 0
    for row, w in zip(rows, where):
        p = prompt_problem(row.get(prompt_key), prompt_key, fmt)
        if p is None:
            continue
        if first is None:
            first = (w, p)
        else:
            more += 1
    if first is not None:
        (w, (problem, fix)) = first
        if more:
            problem += f" (and {more} more row{'s' if more > 1 else ''} like it)"
        raise _fail(spec, w, problem, fix)


def check_rows(rows: list[dict], where: list[str], prompt_key: str, spec: str, fmt: str) -> None:
    """The checks every source's rows get (a data file's, an hf: dataset's): some rows, the prompt
    column present, every prompt text or chat messages. Raises DataError."""
    if not rows:
        raise _fail(spec, "", "no rows", f"add rows with a {prompt_key!r} field")
    if fmt != "csv" and not any(prompt_key in r for r in rows):
        cols = list(dict.fromkeys(k for r in rows[:100] for k in r))
        raise _fail(spec, "", f"no column {prompt_key!r} (columns: {', '.join(cols) or 'none'})",
                    "set data.prompt_key to the column that holds the prompt")
    check_prompts(rows, where, prompt_key, spec, fmt)


def missing_file_reason(p: Path) -> str:
    """Why a path that `exists()` denies is not there: a symlink loop, a dangling link, or absent."""
    if p.is_symlink():
        try:
            target = os.readlink(p)
        except OSError:
            return "is a symbolic link that cannot be read"
        try:
            p.resolve(strict=True)
        except RuntimeError:
            return f"is a symbolic link loop (via `{target}`)"
        except OSError as e:
            import errno

            if e.errno == errno.ELOOP:
                return f"is a symbolic link loop (via `{target}`)"
        return f"is a symbolic link to `{target}`, which does not exist"
    return "does not exist"
