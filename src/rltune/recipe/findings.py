"""Findings (one lint or schema problem) and their output formats. No pydantic import."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Optional

SEVERITIES = ("error", "warning", "info")
FORMATS = ("text", "json", "github")


@dataclass
class Finding:
    file: str
    line: int
    column: int
    rule: str
    severity: str  # "error" | "warning" | "info"
    path: str
    message: str
    fix: str
    waived: bool = False
    waive_reason: Optional[str] = None

    def to_dict(self) -> dict:
        d = {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "rule": self.rule,
            "severity": self.severity,
            "path": self.path,
            "message": self.message,
            "fix": self.fix,
        }
        if self.waived:
            d["waived"] = True
        return d

    @property
    def label(self) -> str:
        if self.waived:
            return f"{self.rule} (waived: {self.waive_reason})"
        return self.rule


def sort_findings(findings: Iterable[Finding]) -> list[Finding]:
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: (f.file, f.line, f.column, order.get(f.severity, 9), f.rule))


def strictify(findings: Iterable[Finding]) -> list[Finding]:
    """`--strict`: warnings become errors (waived findings stay info)."""
    out = []
    for f in findings:
        if f.severity == "warning" and not f.waived:
            f = Finding(**{**f.__dict__, "severity": "error"})
        out.append(f)
    return out


def count(findings: Iterable[Finding]) -> dict:
    c = {s: 0 for s in SEVERITIES}
    for f in findings:
        c[f.severity] = c.get(f.severity, 0) + 1
    return c


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def _gh_escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_escape_prop(s: str) -> str:
    return _gh_escape_data(s).replace(":", "%3A").replace(",", "%2C")


_GH_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def format_text_line(f: Finding) -> tuple[str, str]:
    """(`file:line:col: severity rule: message`, `    fix: ...`)."""
    where = f"{f.file}:{f.line}:{f.column}" if f.line else f"{f.file}"
    head = f"{where}: {f.severity} {f.label}: {f.message}"
    return head, (f"    fix: {f.fix}" if f.fix else "")


def format_findings(findings: Iterable[Finding], fmt: str = "text") -> str:
    """Render findings as compiler-style text, a JSON list, or GitHub annotations."""
    findings = list(findings)
    if fmt == "json":
        return json.dumps([f.to_dict() for f in findings], indent=2)
    if fmt == "github":
        lines = []
        for f in findings:
            props = f"file={_gh_escape_prop(f.file)},line={max(f.line, 1)},col={max(f.column, 1)},title={_gh_escape_prop(f.label)}"
            body = f.message + (f" (fix: {f.fix})" if f.fix else "")
            lines.append(f"::{_GH_LEVEL.get(f.severity, 'notice')} {props}::{_gh_escape_data(body)}")
        return "\n".join(lines)
    if fmt == "text":
        lines = []
        for f in findings:
            head, fix = format_text_line(f)
            lines.append(head)
            if fix:
                lines.append(fix)
        return "\n".join(lines)
    raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
