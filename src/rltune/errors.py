"""User-facing errors: a message a person can act on, and an exit code.

No heavy imports here: `rltune.cli.main` imports this module on every start.
"""

from __future__ import annotations

from typing import Optional


class UserError(Exception):
    """An error caused by the user's input; `main()` prints its message, no traceback."""

    exit_code = 1


class RecipeInputError(UserError):
    """Input that cannot be read as a recipe: missing/empty file, bad YAML, duplicate key,
    a top level that is not a mapping, an unknown preset, a malformed override.

    `str(err)` is the full user-facing text (file:line:col, what is wrong, a fix).
    Exit code 2.
    """

    exit_code = 2

    def __init__(self, message: str, *, file: Optional[str] = None, line: int = 0,
                 column: int = 0, fix: Optional[str] = None):
        self.file = file
        self.line = line
        self.column = column
        self.fix = fix
        self.problem = message
        text = message
        if file:
            where = f"{file}:{line}:{column}" if line else str(file)
            text = f"{where}: {message}"
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)
