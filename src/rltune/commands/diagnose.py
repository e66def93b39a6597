"""`rltune diagnose RUN_DIR`: re-run the health detectors over a run's metrics, name the most
likely cause and the recipe changes that address it (docs/health.md). No torch import.

Exit codes: 0 healthy, 1 problems (any warning or error event), 2 unreadable input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from rltune.errors import RecipeInputError

CAUSES = {
    "critic_nan": "critic lr too high or reward normalisation broken",
    "actor_nan": "non-finite actor loss: lr too high, gradients unclipped or fp16 overflow",
    "reward_nan": "a reward function returns NaN/Inf",
    "skipped_step": "non-finite loss or gradient: lr too high, gradients unclipped or fp16 overflow",
    "kl_spike": "an unstable update: clip gradients (0.5-1.0), lower the lr and the clip range, check precision, add warmup",
    "grad_spike": "an unstable update: clip gradients (0.5-1.0), lower the lr and the clip range, check precision, add warmup",
    "reward_collapse": "reward hacking / reward-model overfitting: enter the anti-overfit stage",
    "reward_hacking": "reward hacking / reward-model overfitting: enter the anti-overfit stage",
    "kl_high": "the KL penalty is too weak for this lr: the policy drifts from the reference",
    "reward_swing": "actor lr too high (keep the critic lr)",
    "grad_clip": "actor lr too high: gradients are clipped on most steps",
    "entropy_collapse": "the policy became near-deterministic",
    "length_collapse": "responses collapsed in length: check the reward for a length bias",
    "length_runaway": "responses run into rollout.max_new_tokens",
    "stale_weights": "the rollout engine generates with stale weights",
    "sync_slow": "device mesh / engine placement is wrong",
}
REPEAT_SHOWN = 3   # text output: a kind that fired more often shows its first and last event only


def _err(msg: str, code: int = 2) -> int:
    print(f"rltune diagnose: {msg}", file=sys.stderr)
    return code


def analyse(run_dir, maps: Sequence[str] = (), source: Optional[str] = None) -> dict:
    """The diagnosis as a dict (what --format json prints), plus private keys for the caller."""
    from rltune.monitor.detectors import Event, HealthMonitor, rank_key, verdict_event
    from rltune.monitor.importers import read_log
    from rltune.monitor.runlog import load_recipe, read_events

    log = read_log(run_dir, source, maps)   # rltune's metrics.jsonl, or a trl/verl/openrlhf log
    recipe, raw, rnotes = load_recipe(run_dir, log)
    mon = HealthMonitor(recipe, run_dir=None, enabled=True, write=False)
    events: list[Event] = []
    for row in log.iter_rows():   # one row at a time: a 200k-step log never exists as dicts
        events.extend(mon.observe(row))
    tuned = [Event.from_dict(d) for d in read_events(run_dir) if d.get("kind") == "autotune"]
    timeline = sorted(events + tuned, key=lambda e: (e.step, 0 if e.kind != "autotune" else 1))
    top = verdict_event(events)
    verdict = None
    also = []
    if top is not None:
        verdict = {"kind": top.kind, "step": top.step, "severity": top.severity,
                   "summary": f"{top.message} -> {CAUSES.get(top.kind, top.kind)}",
                   "cause": CAUSES.get(top.kind, top.kind),
                   "changes": dict(top.changes), "advice": list(top.advice)}
        seen = {top.kind}
        for e in sorted((e for e in events if e.severity in ("warning", "error")), key=rank_key):
            if e.kind not in seen:
                seen.add(e.kind)
                also.append({"kind": e.kind, "step": e.step, "changes": dict(e.changes)})
    steps = log.steps
    return {
        "run_dir": str(run_dir),
        "metrics": str(log.path),
        "steps": len(steps),
        "first_step": steps[0],
        "last_step": steps[-1],
        "notes": log.notes + rnotes,
        "healthy": verdict is None,
        "events": [{"step": e.step, "kind": e.kind, "severity": e.severity, "message": e.message,
                    "advice": list(e.advice), "numbers": e.numbers, "changes": e.changes} for e in timeline],
        "repeated": repeated(timeline),
        "verdict": verdict,
        "also": also,
        "_raw_recipe": raw,
        "_recipe": recipe,
    }


def repeated(events, more_than: int = REPEAT_SHOWN) -> list[dict]:
    """Kinds that fired more than `more_than` times: {"kind", "severity", "count", "first_step",
    "last_step"} (the text output shows only their first and last event)."""
    by_kind: dict[str, list] = {}
    for e in events:
        by_kind.setdefault(e.kind, []).append(e)
    out = []
    for kind, es in by_kind.items():
        if len(es) > more_than:
            sev = max((e.severity for e in es), key=lambda s: ("info", "warning", "error").index(s)
                      if s in ("info", "warning", "error") else -1)
            out.append({"kind": kind, "severity": sev, "count": len(es),
                        "first_step": es[0].step, "last_step": es[-1].step})
    return sorted(out, key=lambda r: r["first_step"])


def shown_events(d: dict) -> list[dict]:
    """The timeline the text output prints: every event of a kind that fired at most
    REPEAT_SHOWN times; the first and the last of a kind that fired more often."""
    rep = {r["kind"] for r in d.get("repeated", [])}
    first: dict[str, dict] = {}
    last: dict[str, dict] = {}
    for e in d["events"]:
        if e["kind"] in rep:
            first.setdefault(e["kind"], e)
            last[e["kind"]] = e
    keep = {id(e) for e in list(first.values()) + list(last.values())}
    return [e for e in d["events"] if e["kind"] not in rep or id(e) in keep]


SOURCE_TAG = "# source: "   # first lines of RUN_DIR/recipe.yaml: the recipe file the run was started from


# Keys a patch may carry: knobs of the learning itself. Everything else - the model, the data, the
# reward code, paths, trackers, presets, waivers - decides what code runs, what is read or where
# things are written, and is never taken from a run directory (it may be someone else's).
PATCH_SAFE = ("algorithm.", "actor.", "critic.", "train.", "health.", "autotune.", "rollout.temperature",
              "rollout.top_p", "rollout.top_k", "rollout.batch_size", "rollout.max_new_tokens",
              "rollout.mask_truncated", "reward.normalize", "reward.clip",
              "reward.on_error", "reward.overlong", "trainer.max_steps", "trainer.save_every", "trainer.eval_every",
              "trainer.keep_checkpoints", "trainer.precision", "trainer.seed")
MAX_HEADER_LINE = 64 * 1024


def patch_safe(key: str) -> bool:
    """Whether a run directory may set `key` in a patch (a learning knob, nothing that loads code,
    models or data, or names a path). An entry ending in "." is a section; others are keys."""
    return any(key.startswith(k) if k.endswith(".") else (key == k or key.startswith(k + "."))
               for k in PATCH_SAFE)


def _recipe_header(run_dir) -> list[str]:
    p = Path(run_dir)
    rp = p / "recipe.yaml" if p.is_dir() else p.parent / "recipe.yaml"
    try:
        if not rp.is_file():
            return []
        with open(rp, encoding="utf-8", errors="replace") as f:
            return [f.readline(MAX_HEADER_LINE) for _ in range(5)]
    except OSError:
        return []


def recipe_source(run_dir) -> Optional[Path]:
    """The user's recipe file named by RUN_DIR/recipe.yaml's `# source: PATH` header, if it still exists."""
    for line in _recipe_header(run_dir):
        if line.startswith(SOURCE_TAG):
            try:
                src = Path(line[len(SOURCE_TAG):].strip())
                return src if src.is_file() else None
            except (OSError, ValueError):
                return None
    return None


def run_overrides(run_dir) -> tuple[list[str], Optional[str]]:
    """The `key=value` overrides the run was started with (RUN_DIR/recipe.yaml's `# overrides:`
    header), and a note when that header cannot be read."""
    import shlex

    from rltune.train.rundir import OVERRIDES_TAG

    for line in _recipe_header(run_dir):
        if line.startswith(OVERRIDES_TAG):
            try:
                return shlex.split(line[len(OVERRIDES_TAG):]), None
            except ValueError as e:
                return [], f"the run's `# overrides:` header is unreadable ({e}): ignored"
    return [], None


def sort_overrides(overrides: Sequence[str]) -> tuple[dict, list[str], list[str]]:
    """({key: value} safe to write in, refused (code/model/data/path keys), unreadable)."""
    from rltune.recipe.loader import parse_override

    safe, refused, bad = {}, [], []
    for o in overrides:
        try:
            key, value = parse_override(o)
        except RecipeInputError:
            bad.append(o)
            continue
        if patch_safe(key):
            safe[key] = value
        else:
            refused.append(o)
    return safe, refused, bad


def patch_source(out_path, source: Path, changes: dict, overrides: Optional[dict] = None,
                 force: bool = False) -> tuple[Path, list]:
    """Write the user's recipe `source` with the `overrides` (already sorted: safe keys only) and
    then `changes` edited in place (comments and layout kept), then lint the result: (path, its
    error and warning findings)."""
    import yaml

    from rltune.outputs import write_output
    from rltune.recipe.yamlio import edit_yaml_text, read_yaml_text

    out_path = Path(out_path)
    text = read_yaml_text(source, str(source))
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None
    if not isinstance(doc, dict) or not ({"model", "data", "reward", "preset"} & set(doc)):
        raise RecipeInputError("is not a recipe (no model/data/reward section), so it cannot be patched; it is named "
                               "by the run's recipe.yaml `# source:` header", file=str(source),
                               fix="edit your recipe by hand with the changes shown above")
    edits = dict(overrides or {})
    edits.update(changes)
    text = edit_yaml_text(text, edits)
    from rltune.commands.validate import check_text

    findings = check_text(text, str(out_path), source.parent)
    write_output(out_path, text, force=force)
    return out_path, findings


def write_patch(out_path, raw: Optional[dict], changes: dict, force: bool = False) -> tuple[Path, str]:
    """Write the run's resolved recipe with `changes` applied (when the run does not name its
    source file); validated when the full recipe is known."""
    import copy

    import yaml

    from rltune.recipe.schema import Recipe

    out_path = Path(out_path)
    if raw is None:
        doc: dict = {}
        header = ("# rltune diagnose: recipe changes only (the run directory had no recipe.yaml);\n"
                  "# merge these keys into your recipe.\n")
    else:
        doc = copy.deepcopy(raw)
        header = "# rltune diagnose: the run's recipe with the recommended changes applied\n"
    for key, value in changes.items():
        node = doc
        parts = key.split(".")
        for p in parts[:-1]:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[parts[-1]] = value
    if raw is not None:
        Recipe.model_validate(doc)   # keep it valid: raises on a bad change (a bug, not user input)
        named = received_code(doc)
        if named:
            header += ("# CHECK before training: these come from the run directory and load code, models or data:\n"
                       + "".join(f"#   {k}: {v}\n" for k, v in named))
    from rltune.outputs import write_output

    write_output(out_path, header + yaml.safe_dump(doc, sort_keys=False), force=force)
    return out_path, ("full" if raw is not None else "changes-only")


def received_code(doc: dict) -> list[tuple[str, str]]:
    """(key, value) of a run recipe's settings that load code or models from outside rltune
    (reward functions that are not builtin, a reward model, a policy that is not builtin,
    trust_remote_code), for the patch's warning."""
    out = []
    reward, model = doc.get("reward") or {}, doc.get("model") or {}
    for spec in reward.get("functions") or []:
        if not str(spec).startswith("builtin:"):
            out.append(("reward.functions", str(spec)))
    for key, value in (("reward.model", reward.get("model")), ("model.policy", model.get("policy")),
                       ("model.critic", model.get("critic")), ("model.reference", model.get("reference"))):
        if value and not str(value).startswith("builtin:"):
            out.append((key, str(value)))
    if model.get("trust_remote_code"):
        out.append(("model.trust_remote_code", "true"))
    return out


def healthy_line(d: dict) -> str:
    """The text output's last line when no warning or error fired: "no detector fired" only when
    nothing did; else what the table above lists (info events, autotune's changes)."""
    if not d["events"]:
        return f"[green bold]Healthy[/]: no detector fired over {d['steps']} steps."
    counts: dict[str, int] = {}
    for e in d["events"]:
        counts[e["kind"]] = counts.get(e["kind"], 0) + 1
    n = len(d["events"])
    sev = sorted({e["severity"] for e in d["events"]})
    what = (f"{n} {sev[0]} event" if len(sev) == 1 else f"{n} event") + ("s" if n > 1 else "")
    kinds = ", ".join(k + (f" ×{c:,}" if c > 1 else "") for k, c in counts.items())
    return (f"[green bold]No problem found[/] over {d['steps']} steps: {what} ({kinds}), "
            "none a warning or an error.")


def _print_text(d: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 120, highlight=False)
    con.print(f"[bold]rltune diagnose[/] {escape(d['metrics'])}: {d['steps']} steps "
              f"({d['first_step']}..{d['last_step']})")
    for n in d["notes"]:
        con.print(f"  [dim]note: {escape(n)}[/]")
    if d["events"]:
        t = Table(title="Health events", title_justify="left", show_lines=False)
        t.add_column("step", justify="right")
        t.add_column("severity")
        t.add_column("kind")
        t.add_column("what happened", overflow="fold")
        colour = {"error": "red", "warning": "yellow", "info": "cyan"}
        for e in shown_events(d):
            c = colour.get(e["severity"], "white")
            t.add_row(str(e["step"]), f"[{c}]{e['severity']}[/]", e["kind"], escape(e["message"]))
        con.print(t)
        for r in d.get("repeated", []):
            con.print(f"  {r['kind']} ×{r['count']:,} between steps {r['first_step']:,} and "
                      f"{r['last_step']:,} (first, last shown)")
    v = d["verdict"]
    if v is None:
        con.print(healthy_line(d))
        return
    con.print(f"\n[bold]Most likely cause[/] (step {v['step']}, {v['kind']}): {escape(v['cause'])}")
    con.print(f"  {escape(next(e['message'] for e in d['events'] if e['kind'] == v['kind'] and e['step'] == v['step']))}")
    if v["advice"]:
        con.print("[bold]Change[/]:")
        for line in v["advice"]:
            con.print(f"  - {escape(line)}")
    if v["changes"]:
        con.print("[bold]Recipe patch[/] (--patch OUT.yaml writes it): "
                  + ", ".join(f"{k}={json.dumps(x)}" for k, x in v["changes"].items()))
    if d["also"]:
        con.print("[bold]Also seen[/]: " + ", ".join(f"{a['kind']} (step {a['step']})" for a in d["also"]))


def _print_patch(p: dict) -> None:
    from rltune.recipe.findings import Finding, format_findings

    content = {"source": f"{p['source']} with the changed keys edited in place",
               "full": "the run's resolved recipe (the run does not name its recipe file)",
               "changes-only": "changes only: no recipe.yaml in the run"}[p["content"]]
    print(f"wrote {p['path']} ({len(p['changes'])} change(s); {content})")
    if p.get("overrides"):
        print("  with the run's command-line overrides written in: " + " ".join(p["overrides"]))
    if p.get("overrides_shown"):
        print("  the run was started with command-line overrides, NOT written in (they come from the run "
              "directory): " + " ".join(p["overrides_shown"]) + "\n  to write in its learning knobs: "
              "add --apply-overrides")
    if p.get("overrides_refused"):
        print("  never taken from a run directory (they load code, models or data, or name paths): "
              + " ".join(p["overrides_refused"]))
    if p.get("received_code"):
        print("  CHECK before training: the run's recipe loads code or models you did not write: "
              + ", ".join(f"{k}={v}" for k, v in p["received_code"]))
    if p["findings"]:
        print(format_findings([Finding(**f) for f in p["findings"]], "text"))
    if p["changes"]:
        import shlex

        cmd = shlex.join(["rltune", "train", p["path"], f"trainer.output_dir={p['run_dir']}", "--allow-recipe-change"])
        print(f"  next: {cmd} (continues "
              "the run with the new values), or a new trainer.output_dir (starts over)")


def _run_root(run_dir) -> Path:
    p = Path(run_dir)
    return p if p.is_dir() else p.parent


def run(run_dir, fmt: str = "text", patch=None, maps: Sequence[str] = (), source: Optional[str] = None,
        apply_overrides: bool = False, force: bool = False) -> int:
    """Entry point for `rltune diagnose RUN_DIR [--format text|json] [--patch OUT.yaml]
    [--map OUR=THEIRS ...] [--from trl|verl|openrlhf]`; returns the exit code."""
    from rltune.monitor.runlog import RunLogError

    if fmt not in ("text", "json"):
        return _err(f"--format {fmt!r}: use text or json")
    try:
        d = analyse(run_dir, maps, source)
    except RunLogError as e:
        return _err(str(e))
    raw = d.pop("_raw_recipe")
    d.pop("_recipe")
    if patch is not None:
        from rltune.outputs import check_output

        changes = {k: v for k, v in (d["verdict"]["changes"] if d["verdict"] else {}).items() if patch_safe(k)}
        source = recipe_source(run_dir)
        listed, note = run_overrides(run_dir) if source is not None else ([], None)
        if note:
            d["notes"].append(note)
        safe, refused, bad = sort_overrides(listed)
        if bad:
            d["notes"].append("unreadable overrides in the run's `# overrides:` header, ignored: " + " ".join(bad))
        written = [o for o in listed if o not in refused and o not in bad] if apply_overrides else []
        findings: list = []
        received: list = []
        try:
            check_output(patch, force, retry=f"rltune diagnose {run_dir} --patch {patch}")
            if source is not None:
                path, findings = patch_source(patch, source, changes, safe if apply_overrides else {}, force=force)
                kind = "source"
            else:
                path, kind = write_patch(patch, raw, changes, force=force)
                received = received_code(raw) if raw else []
        except OSError as e:
            return _err(f"--patch {patch}: cannot write: {e.strerror or e}")
        except RecipeInputError as e:
            return _err(f"--patch {patch}: {e}", code=e.exit_code)
        d["patch"] = {"path": str(path), "content": kind, "changes": changes, "run_dir": str(_run_root(run_dir)),
                      "source": str(source) if source else None, "overrides": written,
                      "overrides_shown": [] if apply_overrides else [o for o in listed if o not in refused and o not in bad],
                      "overrides_refused": refused, "received_code": received,
                      "findings": [f.to_dict() for f in findings]}
    if fmt == "json":
        print(json.dumps(d, indent=2, default=str))
    else:
        _print_text(d)
        if patch is not None:
            _print_patch(d["patch"])
    return 0 if d["verdict"] is None else 1
