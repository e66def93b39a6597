"""Load prompt rows from a file, an `hf:` dataset (data.hub) or a builtin task.

Layers: rows.py (the row checks, DataError) < hub.py (`hf:` sources) < this module (files, builtin
tasks, the `load_prompts` dispatch).

A row is a dict: the prompt column (text, or a list of chat messages) plus any extra
columns, which are handed to reward functions as keyword arguments (e.g. `answer`).
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .hub import load_hf_rows
# the row checks and DataError are rows.py's (hub.py uses them too); DataError and
# missing_file_reason are re-exported here for the callers of data.datasets
from .rows import DataError, _fail, _json_type, check_rows, missing_file_reason  # noqa: F401

FORMATS = {".jsonl": "jsonl", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
LOADERS = FORMATS  # the extensions data.train / data.eval accept
BUILTIN_TASKS = ("arithmetic", "calculator", "guess")   # the last two: rollout.env episodes (docs/agents.md)
SCAN_BYTES = 16_000_000  # `validate` reads at most this much of a data file (train reads it all)


@dataclass(frozen=True)
class PromptSet:
    rows: list[dict]
    prompt_key: str
    source: str

    def __len__(self) -> int:
        return len(self.rows)


def arithmetic_rows(n: int, digits: int, seed: int, split: str, chat: bool = False) -> list[dict]:
    """N-digit addition problems with their answers; train and eval are disjoint.

    Plain models get `12+34=`; chat models get a question that asks for the bare number.
    """
    lo, hi = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1
    pairs = [(a, b) for a in range(lo, hi + 1) for b in range(lo, hi + 1)]
    if len(pairs) <= 20000:
        rng = random.Random(1234 + digits)  # the split does not depend on the run's seed
        rng.shuffle(pairs)
        n_eval = max(1, len(pairs) // 5)
        pool = pairs[:n_eval] if split == "eval" else pairs[n_eval:]
        rng = random.Random(seed)
        rows = [pool[i % len(pool)] for i in range(n)] if n > len(pool) else rng.sample(pool, n)
    else:  # large spaces: sample, keeping eval pairs out of train by parity of a hash
        rng = random.Random(seed + (7 if split == "eval" else 0))
        rows, want = [], 0 if split == "eval" else 1
        while len(rows) < n:
            a, b = rng.randint(lo, hi), rng.randint(lo, hi)
            if (a * 31 + b) % 5 == 0 and want == 0 or (a * 31 + b) % 5 != 0 and want == 1:
                rows.append((a, b))
    if chat:
        return [{"prompt": f"What is {a}+{b}? Answer with just the number.", "answer": str(a + b)}
                for a, b in rows]
    return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a, b in rows]


def _decode(raw: bytes, spec: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise _fail(spec, f"line {line}", f"byte 0x{raw[e.start]:02x} at column {col} is not UTF-8 text",
                    f"save the file as UTF-8 (from Latin-1 / Windows-1252: "
                    f"`iconv -f cp1252 -t utf-8 {spec} > fixed{os.path.splitext(spec)[1]}`) and point the recipe at it") from None
    return text[1:] if text.startswith("\ufeff") else text  # a byte-order mark is not part of the data


def _json_problem(e: json.JSONDecodeError) -> str:
    return f"not valid JSON at column {e.colno}: {e.msg}"


def _jsonl_rows(text: str, spec: str) -> tuple[list[dict], list[str]]:
    rows, where = [], []
    lines = text.split("\n")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            last = n == len(lines) or all(not x.strip() for x in lines[n:])
            raise _fail(spec, f"line {n}", _json_problem(e) + (" (the file may be cut off)" if last else ""),
                        'each line must be one complete JSON object, e.g. {"prompt": "2+3=", "answer": "5"}: '
                        "check the quotes, commas and braces on this line") from None
        if not isinstance(obj, dict):
            raise _fail(spec, f"line {n}", f"a JSON {_json_type(obj)}, not an object",
                        'write one JSON object per line, e.g. {"prompt": "2+3=", "answer": "5"}')
        rows.append(obj)
        where.append(f"line {n}")
    return rows, where


def _json_rows(text: str, spec: str) -> tuple[list[dict], list[str]]:
    stripped = text.lstrip()
    if not stripped.startswith("["):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg == "Extra data":  # several objects: JSON Lines in a .json file
                return _jsonl_rows(text, spec)
            raise _fail(spec, f"line {e.lineno}", _json_problem(e),
                        "check the quotes, commas and brackets there; a .json data file is a list of objects "
                        '([{"prompt": ...}, ...]) or one object per line') from None
        if isinstance(obj, dict) and obj and all(isinstance(v, list) for v in obj.values()) \
                and len({len(v) for v in obj.values()}) == 1:  # columns: {"prompt": [...], "answer": [...]}
            n = len(next(iter(obj.values())))
            return [{k: v[i] for k, v in obj.items()} for i in range(n)], [f"row {i + 1}" for i in range(n)]
        if isinstance(obj, dict):
            return _jsonl_rows(text, spec)
        raise _fail(spec, "", f"a JSON {_json_type(obj)}, not a list of objects",
                    'write a list of objects ([{"prompt": "2+3=", "answer": "5"}, ...]) or one object per line (.jsonl)')
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise _fail(spec, f"line {e.lineno}", _json_problem(e),
                    "check the quotes, commas and brackets there (a .json data file is a list of objects)") from None
    rows = []
    for i, item in enumerate(obj):
        if not isinstance(item, dict):
            raise _fail(spec, f"row {i + 1}", f"a JSON {_json_type(item)}, not an object",
                        'every item of the list must be an object, e.g. {"prompt": "2+3=", "answer": "5"}')
        rows.append(item)
    return rows, [f"row {i + 1}" for i in range(len(rows))]


def _csv_rows(text: str, spec: str, prompt_key: str, partial: bool) -> tuple[list[dict], list[str]]:
    """CSV cells are text: every value is a string (an empty cell is None), as written."""
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))  # long prompts are fine
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise _fail(spec, "", "no header line", f"start the file with a header line naming the columns, e.g. `{prompt_key},answer`")
        names = [h.strip() for h in header]
        if prompt_key not in names:
            first = text.split("\n", 1)[0].rstrip("\r")
            for sep, label in ((";", "`;`"), ("\t", "tabs"), ("|", "`|`")):
                if sep in first and prompt_key in [c.strip().strip('"') for c in first.split(sep)]:
                    raise _fail(spec, "line 1", f"the columns are separated by {label} (header `{first[:80]}`); "
                                "rltune reads comma-separated CSV",
                                "save it comma-separated (a spreadsheet's \"CSV UTF-8 (comma delimited)\"), "
                                'or as .jsonl with one {"prompt": ..., "answer": ...} object per line')
            raise _fail(spec, "", f"no column {prompt_key!r} (columns: {', '.join(names) or 'none'})",
                        "set data.prompt_key to the column that holds the prompt")
        rows, where = [], []
        start = reader.line_num + 1
        for cells in reader:
            n, start = start, reader.line_num + 1
            if not cells or (len(cells) == 1 and not cells[0].strip()):
                continue
            if len(cells) > len(names):
                raise _fail(spec, f"line {n}", f"{len(cells)} fields, but the header has {len(names)}",
                            'quote values that contain a comma ("a, b"), or add the missing column to the header')
            rows.append({k: (cells[i] if i < len(cells) and cells[i] != "" else None) for i, k in enumerate(names)})
            where.append(f"line {n}")
    except csv.Error as e:
        raise _fail(spec, f"line {reader.line_num}", f"not valid CSV: {e}",
                    "check the quotes on this line: a quoted value must end with a quote") from None
    if partial and rows:
        rows, where = rows[:-1], where[:-1]  # a row cut off by the scan limit
    return rows, where


def _parquet_rows(path: Path, spec: str, prompt_key: str, schema_only: bool) -> tuple[list[dict], list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(str(path))
        if prompt_key not in schema.names:
            raise _fail(spec, "", f"no column {prompt_key!r} (columns: {', '.join(schema.names)})",
                        "set data.prompt_key to the column that holds the prompt")
        t = schema.field(prompt_key).type
        ok = pa.types.is_string(t) or pa.types.is_large_string(t) or (
            (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_struct(t.value_type))
        if not ok:
            raise _fail(spec, "", f"column {prompt_key!r} has type {t}; prompts must be text (or chat messages)",
                        f"store the column as strings (e.g. df[{prompt_key!r}] = df[{prompt_key!r}].astype(str)) and save again")
        if schema_only:
            return [], []
        rows = pq.read_table(str(path)).to_pylist()
    except DataError:
        raise
    except Exception as err:  # noqa: BLE001 - pyarrow's errors become a user message
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise _fail(spec, "", f"could not be read as parquet: {first[:300]}",
                    "check that the file is complete and really parquet (e.g. save it again with pandas' to_parquet)") from None
    return rows, [f"row {i + 1}" for i in range(len(rows))]


def read_rows(path: Path, spec: str, prompt_key: str = "prompt", *,
              max_bytes: Optional[int] = None) -> tuple[list[dict], list[str]]:
    """The rows of a data file and where each one is ("line 3", "row 3"), checked: UTF-8, the
    format's syntax, the prompt column present and every prompt text or chat messages.

    `max_bytes`: read at most this much (a quick check, as `validate` does): the rows found in
    that part; JSON arrays and parquet data are then not read at all (parquet: its schema is).
    Raises DataError naming the file, the line or row, and a fix."""
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise _fail(spec, "", f"unsupported extension {path.suffix or '(none)'!r}",
                    "use one of " + ", ".join(FORMATS) + " (a .jsonl file holds one JSON object per line)")
    try:
        size = path.stat().st_size
        if size == 0:
            raise DataError(f"data file {spec} is empty", f"add rows with a {prompt_key!r} field")
        if fmt == "parquet":
            rows, where = _parquet_rows(path, spec, prompt_key, schema_only=max_bytes is not None)
            if max_bytes is not None:
                return rows, where
        else:
            partial = max_bytes is not None and size > max_bytes
            if partial and fmt == "json":
                return [], []
            with open(path, "rb") as fh:
                raw = fh.read(max_bytes) if partial else fh.read()
            if partial:  # keep whole lines; a character cut in half is not an encoding error
                cut = raw.rfind(b"\n")
                if cut < 0:
                    return [], []  # one line longer than the scan limit: train reads it whole
                raw = raw[:cut + 1]
            text = _decode(raw, spec)
            if fmt == "jsonl":
                rows, where = _jsonl_rows(text, spec)
            elif fmt == "json":
                rows, where = _json_rows(text, spec)
            else:
                rows, where = _csv_rows(text, spec, prompt_key, partial)
    except OSError as e:
        raise _fail(spec, "", f"cannot be read: {e.strerror or e}", "check the file's permissions") from None
    check_rows(rows, where, prompt_key, spec, fmt)
    return rows, where


def resolve_data_path(spec: str, base_dir: Optional[Path] = None) -> Optional[Path]:
    """The file a data spec names: as given (absolute, or relative to the current directory), else
    relative to the recipe's directory (train looks in the same places). None when neither exists.
    (`hf:` specs: data.hub.resolve_hf_spec.)"""
    p = Path(spec).expanduser()
    if os.path.lexists(p):
        return p
    if not p.is_absolute() and base_dir is not None and os.path.lexists(Path(base_dir) / p):
        return Path(base_dir) / p
    return None


def load_prompts(spec: str, prompt_key: str = "prompt", *, size: int = 2000, digits: int = 1,
                 seed: int = 0, split: str = "train", chat: bool = False, options: dict | None = None) -> PromptSet:
    key = f"data.{split}"
    from ..envs import DATA, adapter, prefix_of

    eco = prefix_of(spec, DATA)
    if eco:   # a library's tasks (rltune/envs), generated or read by its adapter
        rows = adapter(eco[0], DATA).rows(eco[1], dict(options or {}), size, seed, split)
        return PromptSet(_aligned(rows), "prompt", spec)
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_TASKS:
            raise DataError(f"{key}: unknown builtin data {spec!r}",
                            "use one of: " + ", ".join("builtin:" + t for t in BUILTIN_TASKS))
        if name == "arithmetic":
            return PromptSet(arithmetic_rows(size, digits, seed, split, chat), "prompt", spec)
        from ..agents.builtin import calculator_rows, guess_rows

        split_seed = seed * 2 + (1 if split == "eval" else 0)        # train and eval draw apart
        rows = calculator_rows(size, split_seed, digits if digits >= 2 else 3) if name == "calculator" else guess_rows(size, split_seed)
        return PromptSet(rows, "prompt", spec)
    if spec.startswith("hf:"):
        try:
            rows, _ = load_hf_rows(spec, prompt_key, key=key)
        except DataError as e:
            raise DataError(f"{key}: {e.problem}", e.fix) from None
        return PromptSet(_aligned(rows), prompt_key, spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise DataError(f"{key}: data file {spec} {missing_file_reason(path)}",
                        f"check {key} in the recipe (a relative path is read from the current directory, "
                        "then from the recipe's directory)")
    if path.is_dir():
        raise DataError(f"{key}: {spec} is a directory, not a data file",
                        "give a " + ", ".join(FORMATS) + f" file, or hf:{spec} for a dataset directory (save_to_disk or data files)")
    try:
        rows, _ = read_rows(path, spec, prompt_key)
    except DataError as e:
        raise DataError(f"{key}: {e.problem}", e.fix) from None
    return PromptSet(_aligned(rows), prompt_key, spec)


def _aligned(rows: list[dict]) -> list[dict]:
    """Every row with every column (a reward function gets each column as an aligned list), its
    strings free of lone surrogates (rows.clean_value)."""
    from .rows import clean_value

    keys = list(dict.fromkeys(k for r in rows for k in r))
    return [clean_value(r if len(r) == len(keys) else {k: r.get(k) for k in keys}) for r in rows]
