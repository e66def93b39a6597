"""Reading a run back: metrics.jsonl (also a crashed run's, or another tool's log through a key
mapping), events.jsonl and the resolved recipe. No torch import."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional


class RunLogError(Exception):
    """Input that cannot be read (missing directory/file, no metrics); exit code 2."""


# our key -> candidates (their key, scale); a key ending in "*" matches a prefix
MAPPINGS: dict[str, dict[str, list[tuple[str, float]]]] = {
    "trl": {
        "reward/mean": [("reward", 1.0)],
        "reward/std": [("reward_std", 1.0)],
        "kl": [("kl", 1.0)],
        "actor/entropy": [("entropy", 1.0)],
        "response/length_mean": [("completions/mean_length", 1.0), ("completion_length", 1.0)],
        "actor/grad_norm": [("grad_norm", 1.0)],
        "actor/lr": [("learning_rate", 1.0)],
        "actor/loss": [("loss", 1.0)],
        "actor/clipfrac": [("clip_ratio/region_mean", 1.0), ("clip_ratio", 1.0)],
        "eval/reward": [("eval_reward", 1.0)],
    },
    "verl": {
        "reward/mean": [("critic/score/mean", 1.0), ("critic/rewards/mean", 1.0)],
        "kl": [("actor/kl_loss", 1.0), ("critic/kl", 1.0), ("actor/ppo_kl", 1.0)],
        "kl_coef": [("actor/kl_coef", 1.0), ("critic/kl_coef", 1.0)],
        "actor/entropy": [("actor/entropy", 1.0), ("actor/entropy_loss", 1.0)],
        "actor/grad_norm": [("actor/grad_norm", 1.0)],
        "actor/loss": [("actor/pg_loss", 1.0)],
        "actor/clipfrac": [("actor/pg_clipfrac", 1.0)],
        "actor/lr": [("actor/lr", 1.0)],
        "critic/loss": [("critic/vf_loss", 1.0)],
        "critic/grad_norm": [("critic/grad_norm", 1.0)],
        "critic/explained_var": [("critic/vf_explained_var", 1.0)],
        "critic/lr": [("critic/lr", 1.0)],
        "response/length_mean": [("response_length/mean", 1.0)],
        "timing/rollout_s": [("timing_s/gen", 1.0)],
        "timing/train_s": [("timing_s/update_actor", 1.0)],
        "timing/sync_ms": [("timing_s/update_weights", 1000.0), ("timing_s/sync_weights", 1000.0)],
        "eval/reward": [("val-core/*", 1.0), ("val/test_score/*", 1.0)],
    },
}


def parse_maps(maps=(), source: Optional[str] = None) -> dict[str, list[tuple[str, float]]]:
    """--from trl|verl plus --map OUR=THEIRS (repeatable; user maps win)."""
    out: dict[str, list[tuple[str, float]]] = {}
    if source:
        if source not in MAPPINGS:
            raise RunLogError(f"--from {source!r}: unknown source; use one of {', '.join(MAPPINGS)}")
        out.update({k: list(v) for k, v in MAPPINGS[source].items()})
    for m in maps or ():
        if m in MAPPINGS:   # `--map trl` as a shorthand for --from trl
            out.update({k: list(v) for k, v in MAPPINGS[m].items()})
            continue
        ours, sep, theirs = str(m).partition("=")
        if not sep or not ours.strip() or not theirs.strip():
            raise RunLogError(f"--map {m!r}: expected OUR_KEY=THEIR_KEY, e.g. reward/mean=rewards/mean")
        out[ours.strip()] = [(theirs.strip(), 1.0)]
    return out


def _lookup(row: dict, cands: list[tuple[str, float]]):
    for key, scale in cands:
        if key.endswith("*"):
            pre = key[:-1]
            hits = [k for k in sorted(row) if k.startswith(pre) and isinstance(row[k], (int, float))]
            if hits:
                return row[hits[0]] * scale
        elif key in row and isinstance(row[key], (int, float)) and not isinstance(row[key], bool):
            return row[key] * scale
    return None


def apply_mapping(row: dict, mapping: dict) -> dict:
    if not mapping:
        return row
    theirs = {k for c in mapping.values() for k, _ in c}
    out = {k: v for k, v in row.items() if k not in theirs or k in mapping}
    for ours, cands in mapping.items():
        v = _lookup(row, cands)
        if v is not None:
            out[ours] = v
    return out


@dataclass
class RunLog:
    path: Path
    rows: list[dict]
    notes: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list[int]:
        return [r["step"] for r in self.rows]


def metrics_path(run_dir) -> Path:
    p = Path(run_dir)
    if not p.exists():
        raise RunLogError(f"{p}: no such run directory or file")
    if p.is_dir():
        for name in ("metrics.jsonl", "trainer_state.json"):
            if (p / name).exists():
                return p / name
        raise RunLogError(f"{p}: no metrics.jsonl in this directory (rltune train writes RUN_DIR/metrics.jsonl;"
                          " point at another tool's log file with --from trl|verl)")
    return p


def read_metrics(run_dir, mapping: Optional[dict] = None) -> RunLog:
    """Rows sorted by step (the last occurrence of a step wins: a resumed run may repeat steps)."""
    path = metrics_path(run_dir)
    notes: list[str] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise RunLogError(f"{path}: cannot read: {e.strerror or e}") from None
    raw: list[dict] = []
    if path.suffix == ".json":
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise RunLogError(f"{path}: not valid JSON ({e})") from None
        if isinstance(doc, dict) and isinstance(doc.get("log_history"), list):   # TRL/HF trainer_state.json
            raw = [d for d in doc["log_history"] if isinstance(d, dict)]
        elif isinstance(doc, list):
            raw = [d for d in doc if isinstance(d, dict)]
        else:
            raise RunLogError(f"{path}: expected a list of metric records or a trainer_state.json")
    else:
        lines = text.splitlines()
        bad = []
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except ValueError:
                if i == len(lines) or all(not x.strip() for x in lines[i:]):
                    notes.append(f"{path.name} line {i}: truncated last line skipped (the run stopped mid-write)")
                else:
                    bad.append(i)
                continue
            if isinstance(d, dict):
                raw.append(d)
        if bad:
            notes.append(f"{path.name}: {len(bad)} unreadable line(s) skipped (first: line {bad[0]})")
    rows: dict[int, dict] = {}
    dup = 0
    for i, d in enumerate(raw, 1):
        if isinstance(d.get("data"), dict):   # {"step": N, "data": {...}} (verl's file logger)
            d = {**d["data"], **{k: v for k, v in d.items() if k != "data"}}
        d = apply_mapping(d, mapping or {})
        s = d.get("step")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            s = (max(rows) + 1) if rows else 1
        s = int(s)
        if not any(isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in d.items() if k != "step"):
            continue
        if mapping and not any(k in d for k in mapping):
            continue   # e.g. a trainer's end-of-run summary line
        if s in rows:
            dup += 1
            rows[s].update(d)
        else:
            rows[s] = d
        rows[s]["step"] = s
    if dup:
        notes.append(f"{dup} repeated step(s) merged (a resumed run appends; the last value wins)")
    if not rows:
        hint = "" if mapping else " (metrics from another tool? use --from trl|verl or --map OUR=THEIRS)"
        raise RunLogError(f"{path}: no metric records{hint}")
    return RunLog(path, [rows[k] for k in sorted(rows)], notes)


def read_events(run_dir) -> list[dict]:
    p = Path(run_dir)
    p = p / "events.jsonl" if p.is_dir() else p.parent / "events.jsonl"
    out = []
    if p.exists():
        for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict) and "step" in d:
                out.append(d)
    return out


def load_recipe(run_dir, rows: Optional[list[dict]] = None):
    """(Recipe, raw dict or None, notes). Falls back to the schema defaults, seeded with the lr and
    KL coefficient the log shows, when RUN_DIR/recipe.yaml is absent or invalid."""
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
        notes.append("no recipe.yaml in the run directory: advice uses the schema defaults"
                     " (and the lr / KL coefficient the log shows)")
    raw = {"model": {"policy": "unknown"}, "data": {"train": "unknown"}}
    rows = rows or []

    def peak(key):
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) and r[key] > 0]
        return max(vals) if vals else None

    seeded: dict = {}
    if any("critic/loss" in r for r in rows):
        seeded.setdefault("algorithm", {})["name"] = "ppo"
    lr = peak("actor/lr")
    if lr is not None and lr <= 1:
        seeded["actor"] = {"lr": lr}
    clr = peak("critic/lr")
    if clr is not None and clr <= 1:
        seeded["critic"] = {"lr": clr}
    kc = next((r["kl_coef"] for r in rows if isinstance(r.get("kl_coef"), (int, float))
               and math.isfinite(r["kl_coef"]) and 0 <= r["kl_coef"] <= 10), None)
    if kc is not None:
        seeded.setdefault("algorithm", {})["kl"] = {"coef": kc}
    try:
        return Recipe.model_validate({**raw, **seeded}), None, notes
    except Exception:  # noqa: BLE001
        return Recipe.model_validate(raw), None, notes
