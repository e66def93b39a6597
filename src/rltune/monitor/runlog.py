"""Reading a run back: metrics.jsonl (also a crashed run's, or another tool's log through a key
mapping), events.jsonl and the resolved recipe. No torch import."""

from __future__ import annotations

import errno
import json
import math
import os
from array import array
from itertools import compress
from pathlib import Path
from typing import Iterator, Optional

from rltune.monitor.keymaps import TOOL_MAPS, apply_mapping, is_num


class RunLogError(Exception):
    """Input that cannot be read (missing directory/file, no metrics); exit code 2."""


def parse_maps(maps=(), source: Optional[str] = None) -> dict[str, list[tuple[str, float]]]:
    """--from trl|verl|openrlhf plus --map OUR=THEIRS (repeatable; user maps win)."""
    out: dict[str, list[tuple[str, float]]] = {}
    if source:
        if source not in TOOL_MAPS:
            raise RunLogError(f"--from {source!r}: unknown source; use one of {', '.join(TOOL_MAPS)}")
        out.update({k: list(v) for k, v in TOOL_MAPS[source].items()})
    for m in maps or ():
        if m in TOOL_MAPS:   # `--map trl` as a shorthand for --from trl
            out.update({k: list(v) for k, v in TOOL_MAPS[m].items()})
            continue
        ours, sep, theirs = str(m).partition("=")
        if not sep or not ours.strip() or not theirs.strip():
            raise RunLogError(f"--map {m!r}: expected OUR_KEY=THEIR_KEY, e.g. reward/mean=rewards/mean")
        out[ours.strip()] = [(theirs.strip(), 1.0)]
    return out


_MISSING = float("nan")   # a step that did not log a key (its `present` byte is 0)
_BIG = 1e308              # ints beyond float range are not metrics


class RunLog:
    """A run's metrics, one row per step, sorted by step, stored by column.

    A 200 MB metrics.jsonl has ~200k rows of ~40 numbers: as dicts that is gigabytes, as columns
    (`array('d')` per key plus a bytearray saying which steps logged it) ~70 MB. Only numbers are
    kept (what the detectors and the plot read). `iter_rows()` rebuilds one dict at a time."""

    def __init__(self, path: Path, steps: array, columns: dict[str, array], present: dict[str, bytearray],
                 notes: Optional[list[str]] = None):
        self.path = path
        self._steps = steps
        self._cols = columns
        self._present = present
        self.notes = notes if notes is not None else []

    def __len__(self) -> int:
        return len(self._steps)

    @property
    def steps(self) -> list[int]:
        return list(self._steps)

    @property
    def keys(self) -> list[str]:
        return list(self._cols)

    def has(self, key: str) -> bool:
        p = self._present.get(key)
        return p is not None and 1 in p

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the steps that logged `key`; non-finite values as NaN."""
        if key not in self._cols:
            return [], []
        fin = math.isfinite
        return (list(compress(self._steps, self._present[key])),
                [v if fin(v) else _MISSING for v in compress(self._cols[key], self._present[key])])

    def values(self, key: str) -> list[float]:
        """The logged values of `key` as they are (inf stays inf)."""
        return list(compress(self._cols[key], self._present[key])) if key in self._cols else []

    def iter_rows(self) -> Iterator[dict]:
        items = [(k, self._cols[k], self._present[k]) for k in self._cols]
        for i, s in enumerate(self._steps):
            row = {"step": s}
            for k, col, pres in items:
                if pres[i]:
                    row[k] = col[i]
            yield row

    @property
    def rows(self) -> list[dict]:
        """Every row as a dict (small logs and tests; large ones: iter_rows())."""
        return list(self.iter_rows())


class _Table:
    """Builds a RunLog row by row; a repeated step merges into the earlier row (the last value wins)."""

    def __init__(self, mapping: Optional[dict]):
        self.mapping = mapping or {}
        self.steps = array("q")
        self.index: dict[int, int] = {}
        self.cols: dict[str, tuple[array, bytearray]] = {}   # key -> (values, present)
        self.max_step: Optional[int] = None
        self.ordered = True
        self.dup = 0

    def add(self, d: dict) -> None:
        if isinstance(d.get("data"), dict):   # {"step": N, "data": {...}} (verl's file logger)
            d = {**d["data"], **{k: v for k, v in d.items() if k != "data"}}
        if self.mapping:
            d = apply_mapping(d, self.mapping)
            if not any(k in d for k in self.mapping):
                return   # e.g. a trainer's end-of-run summary line
        s = d.get("step")
        # numbers as json gives them (a bool is not one; an int beyond float range is dropped)
        nums = {k: v for k, v in d.items() if type(v) is float or (type(v) is int and -_BIG < v < _BIG)}
        nums.pop("step", None)
        if not nums:
            return
        if not is_num(s) or not -2**62 < s < 2**62:   # no step (or NaN, inf, absurd): the next one
            s = (self.max_step + 1) if self.max_step is not None else 1
        s = int(s)
        i = self.index.get(s)
        if i is None:
            i = len(self.steps)
            self.index[s] = i
            if self.max_step is not None and s < self.max_step:
                self.ordered = False
            self.max_step = s if self.max_step is None else max(self.max_step, s)
            self.steps.append(s)
            take = nums.pop
            for k, (col, pres) in self.cols.items():   # usually the same keys as the rows before
                v = take(k, None)
                if v is None:
                    col.append(_MISSING)
                    pres.append(0)
                else:
                    col.append(v)
                    pres.append(1)
        else:
            self.dup += 1
        n = len(self.steps)
        for k, v in nums.items():   # new keys, or a repeated step
            if k not in self.cols:
                self.cols[k] = (array("d", [_MISSING]) * n, bytearray(n))
            col, pres = self.cols[k]
            col[i] = v
            pres[i] = 1

    def finish(self, path: Path, notes: list[str]) -> RunLog:
        steps = self.steps
        cols = {k: c for k, (c, _) in self.cols.items()}
        present = {k: p for k, (_, p) in self.cols.items()}
        if not self.ordered:
            order = sorted(range(len(steps)), key=steps.__getitem__)
            steps = array("q", (steps[i] for i in order))
            cols = {k: array("d", (c[i] for i in order)) for k, c in cols.items()}
            present = {k: bytearray(p[i] for i in order) for k, p in present.items()}
        if self.dup:
            notes.append(f"{self.dup} repeated step(s) merged (a resumed run appends; the last value wins)")
        return RunLog(path, steps, cols, present, notes)


def path_problem(p: Path) -> Optional[str]:
    """Why `p` cannot be opened (symlink loop, broken link, permission), or None when it can / is
    simply absent."""
    try:
        os.stat(p)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return (f"{p}: symlink loop (following the link leads back to itself); "
                    "fix: point the link at the real run directory or file")
        if os.path.islink(p):
            return f"{p}: broken symlink (its target {os.readlink(p)} does not exist)"
        if e.errno in (errno.EACCES, errno.EPERM):
            return f"{p}: permission denied"
        if e.errno == errno.ENOTDIR:
            return f"{p}: a parent of this path is a file, not a directory"
    return None


def metrics_path(run_dir) -> Path:
    p = Path(run_dir)
    if not p.exists():
        raise RunLogError(path_problem(p) or f"{p}: no such run directory or file")
    if p.is_dir():
        for name in ("metrics.jsonl", "trainer_state.json"):
            if (p / name).exists():
                return p / name
            problem = path_problem(p / name) if os.path.lexists(p / name) else None
            if problem:
                raise RunLogError(problem)
        raise RunLogError(f"{p}: no metrics.jsonl in this directory (rltune train writes RUN_DIR/metrics.jsonl;"
                          " point at another tool's log file with --from trl|verl|openrlhf)")
    return p


def _parse_line(raw: bytes):
    try:
        return json.loads(raw)
    except UnicodeDecodeError:   # a stray non-UTF-8 byte: read the rest of the line
        try:
            return json.loads(raw.decode("utf-8", errors="replace"))
        except ValueError:
            return _BAD
    except ValueError:
        return _BAD


_BAD = object()


def _line_list(nums: list[int], shown: int = 5) -> str:
    head = ", ".join(str(n) for n in nums[:shown])
    return f"line {head}" if len(nums) == 1 else f"lines {head}" + (", ..." if len(nums) > shown else "")


def read_metrics(run_dir, mapping: Optional[dict] = None) -> RunLog:
    """Rows sorted by step (a repeated step merges, the last value wins: a resumed run may repeat
    steps). The file is read one line at a time; only numbers are kept, by column."""
    path = metrics_path(run_dir)
    notes: list[str] = []
    table = _Table(mapping)
    try:
        if path.suffix == ".json":
            _read_json_doc(path, table)
        else:
            bad: list[int] = []        # line numbers that are not a JSON object
            pending: Optional[int] = None   # the last bad line, until a good one follows it
            with open(path, "rb") as f:
                for i, raw in enumerate(f, 1):
                    if not raw.strip():
                        continue
                    if pending is not None:
                        bad.append(pending)
                        pending = None
                    d = _parse_line(raw)
                    if isinstance(d, dict):
                        table.add(d)
                    else:
                        pending = i
            if pending is not None:
                notes.append(f"{path.name} line {pending}: truncated last line skipped"
                             " (the run stopped mid-write)")
            if bad:
                notes.append(f"{path.name}: {len(bad)} unreadable line(s) skipped"
                             f" ({_line_list(bad)}: not a JSON object)")
    except OSError as e:
        raise RunLogError(f"{path}: cannot read: {e.strerror or e}") from None
    if not table.steps:
        hint = "" if mapping else " (metrics from another tool? use --from trl|verl|openrlhf or --map OUR=THEIRS)"
        raise RunLogError(f"{path}: no metric records{hint}")
    return table.finish(path, notes)


def _read_json_doc(path: Path, table: _Table) -> None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except ValueError as e:
        raise RunLogError(f"{path}: not valid JSON ({e})") from None
    if isinstance(doc, dict) and isinstance(doc.get("log_history"), list):   # TRL/HF trainer_state.json
        records = doc["log_history"]
    elif isinstance(doc, list):
        records = doc
    else:
        raise RunLogError(f"{path}: expected a list of metric records or a trainer_state.json")
    for d in records:
        if isinstance(d, dict):
            table.add(d)


def read_events(run_dir) -> list[dict]:
    """events.jsonl (next to the metrics), read one line at a time."""
    p = Path(run_dir)
    p = p / "events.jsonl" if p.is_dir() else p.parent / "events.jsonl"
    out = []
    if p.is_file():
        with open(p, "rb") as f:
            for raw in f:
                d = _parse_line(raw) if raw.strip() else None
                if isinstance(d, dict) and "step" in d:
                    out.append(d)
    return out


def load_recipe(run_dir, log=None):
    """(Recipe, raw dict or None, notes). Falls back to the schema defaults, seeded with the lr and
    KL coefficient the log shows, when RUN_DIR/recipe.yaml is absent or invalid. `log`: a RunLog
    (or a list of metric dicts)."""
    from rltune.recipe.schema import Recipe

    notes: list[str] = []
    p = Path(run_dir)
    rp = p / "recipe.yaml" if p.is_dir() else p.parent / "recipe.yaml"
    if rp.exists():
        import yaml
        try:
            raw = yaml.safe_load(rp.read_text(encoding="utf-8"))
            return Recipe.model_validate(raw), raw, notes
        except Exception as e:  # noqa: BLE001 - any problem: fall back, say so
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            notes.append(f"{rp.name} could not be read ({first}); advice uses the schema defaults")
    else:
        problem = path_problem(rp) if os.path.lexists(rp) else None
        notes.append(f"{problem or 'no recipe.yaml in the run directory'}: advice uses the schema defaults"
                     " (and the lr / KL coefficient the log shows)")
    raw = {"model": {"policy": "unknown"}, "data": {"train": "unknown"}}
    if log is None:
        log = []
    if isinstance(log, RunLog):
        values, has = log.values, log.has
    else:
        rows = list(log)

        def values(key):
            return [r[key] for r in rows if is_num(r.get(key))]

        def has(key):
            return any(key in r for r in rows)

    def peak(key):
        vals = [v for v in values(key) if math.isfinite(v) and v > 0]
        return max(vals) if vals else None

    seeded: dict = {}
    if has("critic/loss"):
        seeded.setdefault("algorithm", {})["name"] = "ppo"
    lr = peak("actor/lr")
    if lr is not None and lr <= 1:
        seeded["actor"] = {"lr": lr}
    clr = peak("critic/lr")
    if clr is not None and clr <= 1:
        seeded["critic"] = {"lr": clr}
    kc = next((v for v in values("kl_coef") if math.isfinite(v) and 0 <= v <= 10), None)
    if kc is not None:
        seeded.setdefault("algorithm", {})["kl"] = {"coef": kc}
    try:
        return Recipe.model_validate({**raw, **seeded}), None, notes
    except Exception:  # noqa: BLE001
        return Recipe.model_validate(raw), None, notes
