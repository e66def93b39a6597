"""Health events: the record each detector emits, and events.jsonl (append, resume-truncate)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Event:
    step: int
    kind: str
    severity: str          # "info" | "warning" | "error"
    message: str
    numbers: dict = field(default_factory=dict)
    advice: list = field(default_factory=list)
    changes: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Event":
        return cls(step=int(d.get("step", 0)), kind=str(d.get("kind", "")),
                   severity=str(d.get("severity", "info")), message=str(d.get("message", "")),
                   numbers=dict(d.get("numbers") or {}), advice=list(d.get("advice") or []),
                   changes=dict(d.get("changes") or {}))

    def __str__(self) -> str:
        """The live console line: message, rule id, then each fix line (as events.jsonl holds them)."""
        fixes = "".join(f"\n    fix: {line}" for line in self.advice)
        return f"[Health] step {self.step} {self.severity}: {self.message} [{self.kind}]{fixes}"


def append_events(run_dir, events) -> None:
    if run_dir is None or not events:
        return
    p = Path(run_dir) / "events.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a", encoding="utf-8") as f:
        for e in events:
            d = e.to_dict() if hasattr(e, "to_dict") else dict(e)
            f.write(json.dumps(d, default=str) + "\n")


def truncate_events_after(run_dir, step: int) -> None:
    """Resume support: drop events of steps after `step` (they are replayed)."""
    if run_dir is None:
        return
    p = Path(run_dir) / "events.jsonl"
    if not p.exists():
        return
    keep = []
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if int(d.get("step", 0)) <= step:
            keep.append(line)
    tmp = p.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(x + "\n" for x in keep), encoding="utf-8")
    os.replace(tmp, p)
