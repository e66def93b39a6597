"""Reading other tools' training logs for `rltune diagnose --from trl|verl|openrlhf PATH`.

A log is turned into records (one dict of numbers per logged step) by a line reader that knows the
shapes these tools write, then each record's keys are renamed to rltune's metric names through the
tool's table below; keys without an equivalent are dropped and counted in a note. No torch import.

Record shapes read (any of them, in any file; docs/health.md lists the keys):
- a JSON document: TRL/HF `trainer_state.json` (its `log_history`) or a list of metric dicts;
- JSON lines: one metric dict per line (W&B-style exports, verl's file logger `{"step", "data"}`);
- verl's console logger: `step:12 - actor/pg_loss:0.123 - critic/vf_loss:0.456 - ...`;
- a printed Python dict: `{'loss': 0.01, 'grad_norm': 0.3, 'reward': 0.5, 'epoch': 0.1}` (the HF
  Trainer's console line under TRL; numpy/tensor reprs such as `np.float64(0.5)` are unwrapped);
- a tqdm bar with a postfix: `Episode [1/1]:  5%|...| 12/240 [10:00<3:10:00, policy_loss=0.01, kl=0.002]`
  (OpenRLHF's console; a new postfix is a new step).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterable, Iterator, Optional

from rltune.monitor.keymaps import FORMATS, TOOL_MAPS, is_num, lookup
from rltune.monitor.runlog import RunLog, RunLogError, _Table, metrics_path, parse_maps, read_metrics


# where each tool keeps the step; bookkeeping keys that are neither a metric nor "ignored"
STEP_KEYS = {
    "trl": ("step", "global_step", "train/global_step", "_step"),
    "verl": ("step", "training/global_step", "_step"),
    "openrlhf": ("global_step", "train/global_step", "step", "_step"),
}
PREFIXES = {"trl": ("train/",), "verl": (), "openrlhf": ("train/",)}   # logger prefixes (W&B, TensorBoard)
BOOKKEEPING = {"step", "global_step", "train/global_step", "training/global_step", "_step", "_runtime",
               "_timestamp", "epoch", "train/epoch", "training/epoch", "total_flos", "consumed_samples", "episode"}

# keys only that tool writes (after the prefix is removed): auto-detection scores them
SIGNATURES = {
    "trl": {"completions/mean_length", "completion_length", "reward_std", "frac_reward_zero_std",
            "learning_rate", "clip_ratio/region_mean", "objective/kl", "objective/scores",
            "sampling/importance_sampling_ratio/max", "num_tokens", "completions/clipped_ratio"},
    "verl": {"critic/score/mean", "critic/rewards/mean", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl",
             "response_length/mean", "timing_s/gen", "critic/vf_loss", "training/global_step", "actor/kl_loss"},
    "openrlhf": {"policy_loss", "actor_lr", "response_length", "total_length", "return", "critic_loss",
                 "act_loss", "gen_len", "tot_len", "ppo_clip_ratio", "glen", "tlen", "act_lr"},
}
# rltune's own metrics.jsonl: keys none of the tools above write
NATIVE_MARKERS = {"reward/mean", "reward/std", "response/length_mean", "actor/loss", "critic/loss",
                  "health/skipped_steps", "timing/sync_ms", "timing/rollout_s"}
SNIFF_RECORDS = 200
SNIFF_BYTES = 4 << 20


def accepted() -> str:
    return ("rltune's metrics.jsonl, or with --from: " + ", ".join(FORMATS)
            + " (JSON lines, trainer_state.json, verl `step:N - key:value` lines, printed metric dicts,"
              " tqdm postfixes)")


# ------------------------------------------------------------------ line reader

_VERL = re.compile(r"(?:^|\s)step:\s*(\d+)\s+-\s+(.*)$")
_KEY = re.compile(r"""(['"])([^'"\n]+?)\1\s*:\s*""")
_NUM = re.compile(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf|NaN|Infinity)")
_TQDM = re.compile(r"\d+%\|[^|\n]*\|\s*\d+/\S+\s*\[(?P<inside>[^\]]*)\]")


def _num(text: str) -> Optional[float]:
    """A number from a value's text: `0.5`, `nan`, `-inf`, `5e-7`, `np.float64(0.5)`,
    `tensor(0.5, device='cuda:0')`; None for anything else (strings, lists)."""
    t = text.strip().rstrip(",").strip()
    if not t or t[0] in "'\"[{":
        return None
    try:
        return float(t)
    except ValueError:
        pass
    m = re.fullmatch(r"[A-Za-z_][\w.]*\(\s*(" + _NUM.pattern + r")\s*(?:,.*)?\)", t, re.S)
    if m:
        try:
            return float(m.group(1))
        except ValueError:
            return None
    return None


def _dict_line(s: str) -> Optional[dict]:
    """A printed Python dict `{'k': v, ...}` (or JSON) anywhere in the line."""
    a, b = s.find("{"), s.rfind("}")
    if a < 0 or b <= a:
        return None
    body = s[a:b + 1]
    try:
        d = json.loads(body)
        return d if isinstance(d, dict) else None
    except (ValueError, RecursionError):
        pass
    keys = list(_KEY.finditer(body))
    out = {}
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(body) - 1
        v = _num(body[m.end():end])
        if v is not None:
            out[m.group(2)] = v
    return out or None


def _verl_line(s: str) -> Optional[dict]:
    m = _VERL.search(s)
    if not m:
        return None
    out: dict = {"step": int(m.group(1))}
    for part in m.group(2).split(" - "):
        k, sep, v = part.strip().rpartition(":")
        x = _num(v) if sep else None
        if k and x is not None:
            out[k.strip()] = x
    return out if len(out) > 1 else None


def _tqdm_segment(s: str) -> Optional[tuple[str, dict]]:
    """(bar description, postfix numbers) of a tqdm bar line with a `key=value` postfix."""
    if "%|" not in s:
        return None
    m = None
    for m in _TQDM.finditer(s):
        pass
    if m is None or "=" not in m.group("inside"):
        return None
    desc = s[max(0, m.start() - 200):m.start()].strip()
    out = {}
    for part in m.group("inside").split(","):
        k, sep, v = part.partition("=")
        x = _num(v) if sep else None
        if x is not None and k.strip():
            out[k.strip()] = x
    return (desc, out) if out else None


MAX_SEGMENT = 1 << 20   # a log line (or a tqdm redraw) is short; a longer run of bytes is skipped


def _segments(path: Path, max_bytes: Optional[int] = None, block: int = 1 << 20) -> Iterator[str]:
    """The file's lines, split at \\n and at \\r (tqdm redraws a bar in place), read by blocks.
    Only the new block is searched for a break, and a segment longer than MAX_SEGMENT is
    dropped as it grows: a log without newlines is read in linear time and bounded memory."""
    pending: list[bytes] = []       # the current segment's pieces, from earlier blocks
    pending_len, skipping, done = 0, False, 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(block)
            if not chunk:
                break
            done += len(chunk)
            parts = _BREAK.split(chunk)
            for p in parts[:-1]:     # each of these ends a segment
                if not skipping:
                    yield b"".join(pending + [p]).decode("utf-8", errors="replace")
                pending, pending_len, skipping = [], 0, False
            tail = parts[-1]
            if not skipping:
                pending.append(tail)
                pending_len += len(tail)
                if pending_len > MAX_SEGMENT:
                    pending, pending_len, skipping = [], 0, True
            if max_bytes is not None and done >= max_bytes:
                return   # a sample: the partial last line is left out
    last = b"".join(pending)
    if last and not skipping:
        yield last.decode("utf-8", errors="replace")


_BREAK = re.compile(rb"[\r\n]")


def iter_records(path: Path, max_bytes: Optional[int] = None) -> Iterator[tuple[str, dict]]:
    """(shape, record) for every metric record in the file, in file order; shape is one of
    "json", "verl-console", "dict-line", "tqdm" (tqdm records carry "_bar": the bar's description)."""
    with open(path, "rb") as f:
        head = f.read(1)
        while head and head.isspace():
            head = f.read(1)
    if (path.suffix == ".json" or head == b"[") and path.stat().st_size < (64 << 20):
        try:
            doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
        except (ValueError, RecursionError):
            doc = None
        if doc is not None:
            recs = doc.get("log_history") if isinstance(doc, dict) else doc
            if isinstance(recs, list):
                for d in recs:
                    if isinstance(d, dict):
                        yield "json", d
                return
            if isinstance(doc, dict):
                yield "json", doc
                return
    for seg in _segments(path, max_bytes):
        s = seg.strip()
        if not s:
            continue
        if s[0] == "{" and s[-1] == "}":
            try:
                d = json.loads(s)
            except (ValueError, RecursionError):
                d = None
            if isinstance(d, dict):
                if isinstance(d.get("data"), dict):   # verl's file logger
                    d = {**d["data"], **{k: v for k, v in d.items() if k != "data"}}
                yield "json", d
                continue
        d = _verl_line(s)
        if d:
            yield "verl-console", d
            continue
        t = _tqdm_segment(s)
        if t:
            yield "tqdm", {"_bar": t[0], **t[1]}
            continue
        d = _dict_line(s)
        if d:
            yield "dict-line", d


def _strip(d: dict, prefixes: Iterable[str]) -> dict:
    if not prefixes:
        return d
    out = {}
    for k, v in d.items():
        for p in prefixes:
            if isinstance(k, str) and k.startswith(p) and len(k) > len(p):
                k = k[len(p):] if k[len(p):] not in d else k
                break
        out[k] = v
    return out


# ------------------------------------------------------------------ detection


def _sample(path: Path) -> list[tuple[str, dict]]:
    """The first SNIFF_RECORDS records (from at most the first SNIFF_BYTES of a line log)."""
    out = []
    try:
        for rec in iter_records(path, max_bytes=SNIFF_BYTES):
            out.append(rec)
            if len(out) >= SNIFF_RECORDS:
                break
    except OSError as e:
        raise RunLogError(f"{path}: cannot read: {e.strerror or e}") from None
    return out


def detect(records: list[tuple[str, dict]]) -> tuple[Optional[str], str]:
    """("native" | a tool | None, why) from sampled records."""
    keys: set[str] = set()
    shapes = set()
    for shape, d in records:
        shapes.add(shape)
        keys.update(k for k in d if isinstance(k, str))
    if not records:
        return None, "no metric records"
    if keys & NATIVE_MARKERS and shapes == {"json"}:
        return "native", "rltune metric names"
    plain = keys | {k[len("train/"):] for k in keys if k.startswith("train/")}
    scores = {t: sorted(plain & SIGNATURES[t]) for t in FORMATS}
    if "verl-console" in shapes and all(len(v) < 2 for t, v in scores.items() if t != "verl"):
        return "verl", ", ".join(["`step:N - key:value` lines"] + scores["verl"][:3])
    best = max(scores.values(), key=len)
    winners = [t for t, s in scores.items() if len(s) == len(best)]
    if len(best) >= 2 and len(winners) == 1:
        return winners[0], ", ".join(best[:4])
    return None, (f"keys {', '.join(sorted(keys)[:6])}" if keys else "no metric keys")


# ------------------------------------------------------------------ import


def map_record(d: dict, tool: str, mapping: dict) -> tuple[dict, set[str]]:
    """(our row, their keys left unmapped) for one record; the row has "step" when the log had one."""
    d = _strip(d, PREFIXES.get(tool, ()))
    row: dict = {}
    used: set[str] = set()
    for key in STEP_KEYS.get(tool, ("step",)):
        v = d.get(key)
        if is_num(v) and math.isfinite(v):
            row["step"] = int(v)
            break
    for ours, cands in mapping.items():
        hit = lookup(d, cands)
        if hit is not None:
            used.add(hit[0])
            row[ours] = float(hit[1])
    left = {k for k, v in d.items()
            if isinstance(k, str) and is_num(v) and k not in used and k not in BOOKKEEPING
            and not k.startswith("_")}
    # the other candidates of a key we mapped (e.g. verl's actor/ppo_kl when actor/kl_loss won) are used too
    left -= {k for cands in mapping.values() for k, _ in cands if any(k2 in used for k2, _ in cands)}
    return row, left


def import_log(path: Path, tool: str, maps=(), why: Optional[str] = None) -> RunLog:
    mapping = {k: list(v) for k, v in TOOL_MAPS[tool].items()}
    mapping.update(parse_maps(maps))   # --map OUR=THEIRS on top (user maps win)
    table = _Table(None)
    notes: list[str] = []
    if why:
        notes.append(f"read as a log of {tool} (detected from {why}); pass --from to choose another format")
    unmapped: dict[str, int] = {}
    seen_keys: set[str] = set()
    n_records = 0
    bars: dict[bool, list[dict]] = {True: [], False: []}   # tqdm: True = per-micro-batch bars
    pending: Optional[dict] = None
    last_post: Optional[tuple] = None
    n_post = 0

    def flush(row):
        if row is not None and len(row) > (1 if "step" in row else 0):
            table.add(row)

    for shape, d in iter_records(path):
        n_records += 1
        if shape == "tqdm":
            kind = str(d.pop("_bar", "")).lower().startswith("train epoch")
            if not bars[kind] or bars[kind][-1] != d:   # a redraw of the same postfix is the same step
                bars[kind].append(d)
            continue
        seen_keys.update(k for k in d if isinstance(k, str))
        row, left = map_record(d, tool, mapping)
        for k in left:
            unmapped[k] = unmapped.get(k, 0) + 1
        if len(row) <= (1 if "step" in row else 0):
            continue   # a summary line (train_runtime, ...) or another tool's record
        if shape == "dict-line" and "step" not in row and len(row) < 2:
            continue   # one matching key in a printed dict: a config dump, not a metrics line
        same = "step" in row and row["step"] == (pending or {}).get("step")
        evals = "step" not in row and all(k.startswith("eval/") for k in row)
        if pending is not None and (same or evals):
            pending.update(row)   # the same step logged in parts (train + eval lines): one row
            continue
        flush(pending)
        pending = row
    flush(pending)
    if table.steps:   # steps came from records: progress bars are only progress
        bars = {True: [], False: []}
    micro = not bars[False] and bool(bars[True])
    for d in bars[False] or bars[True]:
        seen_keys.update(d)
        post = tuple(sorted(d.items()))
        if post == last_post:
            continue   # the bar redrawn with the same postfix: the same step
        last_post = post
        row, left = map_record(d, tool, mapping)
        if len(row) <= (1 if "step" in row else 0):
            continue   # a bar of something else (a tokenizer, vLLM's generation)
        for k in left:
            unmapped[k] = unmapped.get(k, 0) + 1
        n_post += 1
        row["step"] = row.get("step", n_post)
        flush(row)
    if micro:
        notes.append("only per-micro-batch progress bars found: each step shown is a micro-batch update")
    if n_post and not micro:
        notes.append(f"steps numbered by progress-bar postfix ({n_post} distinct updates)")
    if not table.steps:
        raise RunLogError(_no_metric(path, tool, n_records, seen_keys, mapping))
    if unmapped:
        names = sorted(unmapped, key=lambda k: (-unmapped[k], k))
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        notes.append(f"{len(names)} {tool} key(s) have no rltune equivalent and were ignored ({shown});"
                     " --map OUR=THEIRS reads one")
    return table.finish(path, notes)


def _no_metric(path: Path, tool: str, n_records: int, keys: set[str], mapping: dict) -> str:
    wanted = list(dict.fromkeys(c for cands in mapping.values() for c, _ in cands[:1]))[:8]
    keys = {k for k in keys if k not in BOOKKEEPING}
    if not n_records:
        return (f"{path}: no metric records found for --from {tool} (expected JSON lines, a"
                f" trainer_state.json, `step:N - key:value` lines, printed metric dicts or tqdm"
                f" postfixes); fix: point at the log file the trainer wrote, accepted: {accepted()}")
    other, _ = detect([("json", {k: 1.0 for k in keys})])
    hint = (f"; it looks like a {other} log: use --from {other}" if other not in (None, "native", tool)
            else "; fix: --map OUR=THEIRS for the keys it has (e.g. --map reward/mean=THEIR_REWARD_KEY)")
    return (f"{path}: {n_records} record(s) but no metric rltune reads as a {tool} log (looked for"
            f" {', '.join(wanted)}, ...; found {', '.join(sorted(keys)[:8]) or 'no numeric keys'}){hint}")


def _log_file(run_dir) -> Path:
    """The file to read: the path itself, or in a directory its metrics.jsonl / trainer_state.json,
    else the one log-like file it holds."""
    p = Path(run_dir)
    try:
        return metrics_path(p)
    except RunLogError as e:
        if not p.is_dir() or "no metrics.jsonl" not in str(e):   # a broken link, a loop: as named
            raise
        found = sorted(x for x in p.iterdir() if x.is_file()
                       and x.suffix in (".jsonl", ".json", ".log", ".txt", ".out") and x.name != "events.jsonl")
        if len(found) == 1:
            return found[0]
        names = ", ".join(x.name for x in found[:5]) if found else "no .jsonl/.json/.log/.txt file"
        raise RunLogError(f"{p}: no metrics.jsonl in this directory ({names}); point at the log file"
                          f" itself, e.g. rltune diagnose {p}/train.log --from verl") from None


def read_log(run_dir, source: Optional[str] = None, maps=()) -> RunLog:
    """What `diagnose` reads: rltune's metrics.jsonl, or another tool's log (`source`, or detected
    when neither `source` nor `maps` is given)."""
    if source is not None and source not in FORMATS:
        raise RunLogError(f"--from {source!r}: unknown source; use one of {', '.join(FORMATS)}")
    if source is None and maps:
        return read_metrics(run_dir, parse_maps(maps))
    path = _log_file(run_dir)
    if source is not None:
        return import_log(path, source, maps)
    sample = _sample(path)
    kind, why = detect(sample)
    if kind == "native" or (not sample and not _has_text(path)):
        return read_metrics(path)   # (an empty file: read_metrics says "no metric records")
    if kind is not None:
        return import_log(path, kind, why=why)
    keys = {k for _, d in sample for k in d if isinstance(k, str)}
    if all(shape == "json" for shape, _ in sample) and keys & _OURS:
        return read_metrics(path)   # rltune names, few of them
    raise RunLogError(f"{path}: not a log format rltune diagnose recognises ({why}); accepted: {accepted()};"
                      " fix: pass --from trl|verl|openrlhf, or --map OUR=THEIRS")


def _has_text(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return bool(f.read(SNIFF_BYTES).strip())
    except OSError:
        return False


_OURS = {k for m in TOOL_MAPS.values() for k in m} | NATIVE_MARKERS
