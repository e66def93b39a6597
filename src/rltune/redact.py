"""Secrets out of what a run directory keeps.

A run directory is shared (a colleague's `diagnose`, a bug report), so what rltune writes there
(RUN/recipe.yaml, every checkpoint's state.json) must not carry credentials the recipe or the
command line held: a password in a URL's user part (`https://user:PASS@host`, an MLflow or
database URI) and credential-like query parameters (`?token=...`, `api_key`, `password`,
`secret`, `sig`) become `***`. The value still shows which server a run logged to.
"""

from __future__ import annotations

import re
from typing import Any

MASK = "***"
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@")
_QUERY = re.compile(r"(?P<key>(?:^|[?&;])(?:[A-Za-z0-9_\-]*?)(?:token|password|passwd|pwd|secret|api[_-]?key|"
                    r"access[_-]?key|sig|signature|auth)[A-Za-z0-9_\-]*=)(?P<val>[^&;#\s]+)", re.IGNORECASE)


def redact_text(text: str) -> str:
    """`text` with URL passwords and credential query values replaced by ***."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m['key']}{MASK}", text) if "=" in text else text


def redact(value: Any) -> Any:
    """A copy of a recipe dict (or any JSON-like value) with every string passed through redact_text."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value
