"""Reading a run back: metrics.jsonl (also a crashed run's, or another tool's log through a key
mapping), events.jsonl and the resolved recipe. No torch import."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from array import array
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


_MISSING = float("nan")   # a gap in a series
_BIG = 1e100              # |values| beyond this are no metric: read as +-inf (a log someone sent may hold
                          # 1e308, whose sums and squares overflow the statistics)
MAX_LINE = 8 << 20        # a metrics line is a few KB; longer ones are skipped, never held whole


def _value(v) -> Optional[float]:
    """A JSON value as a metric: floats and ints (not bools); beyond +-_BIG as +-inf; else None."""
    if type(v) is float:
        return v if -_BIG <= v <= _BIG or v != v else math.copysign(math.inf, v)
    if type(v) is int:
        return float(v) if -_BIG <= v <= _BIG else math.copysign(math.inf, v)
    return None


class RunLog:
    """A run's metrics, one row per step, sorted by step, stored by column, sparsely.

    A 200 MB metrics.jsonl has ~200k rows of ~40 numbers: as dicts that is gigabytes. Each key
    keeps the row positions that logged it and their values (`array`s), so memory and time are
    linear in the numbers the file holds, also for a log whose keys change from row to row (a
    dense table per key was quadratic there). Only numbers are kept (what the detectors and the
    plot read). `iter_rows()` rebuilds one dict at a time."""

    def __init__(self, path: Path, steps: array, columns: dict[str, tuple[array, array]],
                 notes: Optional[list[str]] = None):
        self.path = path
        self._steps = steps
        self._cols = columns          # key -> (row positions, ascending; values)
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
        return key in self._cols and len(self._cols[key][0]) > 0

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of the steps that logged `key`; non-finite values as NaN."""
        if key not in self._cols:
            return [], []
        idx, vals = self._cols[key]
        fin, steps = math.isfinite, self._steps
        return [steps[i] for i in idx], [v if fin(v) else _MISSING for v in vals]

    def values(self, key: str) -> list[float]:
        """The logged values of `key` as they are (inf stays inf)."""
        return list(self._cols[key][1]) if key in self._cols else []

    def iter_rows(self) -> Iterator[dict]:
        # one cursor per key that still has entries: each entry is visited once
        cursors = [(k, idx, vals) for k, (idx, vals) in self._cols.items() if len(idx)]
        pos = {k: 0 for k, _, _ in cursors}
        by_row: dict[int, list] = {}
        for k, idx, _ in cursors:
            by_row.setdefault(idx[0], []).append(k)
        for i, s in enumerate(self._steps):
            row = {"step": s}
            for k in by_row.pop(i, ()):
                idx, vals = self._cols[k]
                j = pos[k]
                row[k] = vals[j]
                pos[k] = j + 1
                if j + 1 < len(idx):
                    by_row.setdefault(idx[j + 1], []).append(k)
            yield row

    @property
    def rows(self) -> list[dict]:
        """Every row as a dict (small logs and tests; large ones: iter_rows())."""
        return list(self.iter_rows())


class _Table:
    """Builds a RunLog row by row; a repeated step merges into the earlier row (the last value wins).
    Entries are kept as (row, key, value) triples: linear in what the file holds."""

    def __init__(self, mapping: Optional[dict]):
        self.mapping = mapping or {}
        self.steps = array("q")
        self.index: dict[int, int] = {}
        self.key_ids: dict[str, int] = {}
        self.e_row, self.e_key, self.e_val = array("q"), array("q"), array("d")
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
        nums = {}
        for k, v in d.items():
            x = _value(v)
            if x is not None and k != "step" and isinstance(k, str):
                nums[k] = x
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
        else:
            self.dup += 1
        ids = self.key_ids
        for k, v in nums.items():
            kid = ids.get(k)
            if kid is None:
                kid = ids[k] = len(ids)
            self.e_row.append(i)
            self.e_key.append(kid)
            self.e_val.append(v)

    def finish(self, path: Path, notes: list[str]) -> RunLog:
        steps = self.steps
        rank = list(range(len(steps)))                     # row position -> its place in step order
        if not self.ordered:
            order = sorted(range(len(steps)), key=steps.__getitem__)
            steps = array("q", (steps[i] for i in order))
            for new, old in enumerate(order):
                rank[old] = new
        # entries grouped by key, in step order; a repeated (row, key) keeps its last value
        names = list(self.key_ids)
        per_key: list[dict[int, float]] = [{} for _ in names]
        for r, k, v in zip(self.e_row, self.e_key, self.e_val):
            per_key[k][rank[r]] = v
        cols = {}
        for name, entries in zip(names, per_key):
            idx = sorted(entries)
            cols[name] = (array("q", idx), array("d", (entries[i] for i in idx)))
        if self.dup:
            notes.append(f"{self.dup} repeated step(s) merged (a resumed run appends; the last value wins)")
        return RunLog(path, steps, cols, notes)


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
                return regular_file(p / name)
            problem = path_problem(p / name) if os.path.lexists(p / name) else None
            if problem:
                raise RunLogError(problem)
        raise RunLogError(f"{p}: no metrics.jsonl in this directory (rltune train writes RUN_DIR/metrics.jsonl;"
                          " point at another tool's log file with --from trl|verl|openrlhf)")
    return regular_file(p)


def regular_file(p: Path) -> Path:
    """`p` when it is a regular file (a link to one is fine); a device, FIFO or socket behind the
    name (e.g. a metrics.jsonl -> /dev/zero in a run directory someone sent) is refused."""
    try:
        mode = os.stat(p).st_mode
    except OSError as e:
        raise RunLogError(path_problem(p) or f"{p}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise RunLogError(f"{p}: not a regular file (a device, a pipe or a socket); rltune reads logs from files")
    return p


def _parse_line(raw: bytes):
    try:
        return json.loads(raw)
    except UnicodeDecodeError:   # a stray non-UTF-8 byte: read the rest of the line
        try:
            return json.loads(raw.decode("utf-8", errors="replace"))
        except (ValueError, RecursionError):
            return _BAD
    except (ValueError, RecursionError):   # RecursionError: a crafted, deeply nested line
        return _BAD


def bounded_lines(f, limit: int = MAX_LINE) -> Iterator[tuple[bytes, bool]]:
    """(line, whole) for each line of binary file `f`, never holding more than `limit` bytes of
    one: a longer line comes back once, cut (whole False), and the rest of it is skipped."""
    while True:
        raw = f.readline(limit)
        if not raw:
            return
        if len(raw) == limit and not raw.endswith(b"\n"):
            while True:   # skip to the end of this line
                more = f.readline(limit)
                if not more or more.endswith(b"\n"):
                    break
            yield raw, False
            continue
        yield raw, True


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
                for i, (raw, whole) in enumerate(bounded_lines(f), 1):
                    if not raw.strip():
                        continue
                    if pending is not None:
                        bad.append(pending)
                        pending = None
                    d = _parse_line(raw) if whole else _BAD
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


MAX_JSON_DOC = 256 << 20   # a trainer_state.json: one document, read whole


def _read_json_doc(path: Path, table: _Table) -> None:
    size = path.stat().st_size
    if size > MAX_JSON_DOC:
        raise RunLogError(f"{path}: {size} bytes is more than a trainer_state.json holds ({MAX_JSON_DOC})")
    try:
        doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except RecursionError:
        raise RunLogError(f"{path}: not a metrics document (JSON nested too deeply)") from None
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


SEVERITIES = ("info", "warning", "error")


def _event(d) -> Optional[dict]:
    """An events.jsonl record as the readers use it, or None: an int step, a kind, a severity,
    a message; `numbers`/`changes` dicts. A file someone sent may hold anything."""
    if not isinstance(d, dict):
        return None
    step, kind = d.get("step"), d.get("kind")
    if type(step) is not int or not isinstance(kind, str) or not kind or d.get("severity") not in SEVERITIES:
        return None
    out = dict(d)
    out["message"] = d["message"] if isinstance(d.get("message"), str) else ""
    for key in ("numbers", "changes"):
        if key in out and not isinstance(out[key], dict):
            out.pop(key)
    return out


def read_events(run_dir) -> list[dict]:
    """events.jsonl (next to the metrics), read one line at a time; malformed records skipped."""
    p = Path(run_dir)
    p = p / "events.jsonl" if p.is_dir() else p.parent / "events.jsonl"
    out = []
    try:
        if not p.is_file():
            return out
        with open(p, "rb") as f:
            for raw, whole in bounded_lines(f):
                e = _event(_parse_line(raw)) if whole and raw.strip() else None
                if e is not None:
                    out.append(e)
    except OSError:
        return out
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
        from rltune.recipe.yamlio import parse_yaml, read_yaml_text
        try:
            regular_file(rp)
            # size-capped, alias bombs refused before expansion, no custom tags: a sent run's recipe is data
            raw, _ = parse_yaml(read_yaml_text(rp, str(rp)), str(rp))
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
