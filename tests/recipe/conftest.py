from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

@pytest.fixture
def write(tmp_path):
    """write(text, name="recipe.yaml") -> path of a recipe file in tmp_path."""

    def _write(text: str, name: str = "recipe.yaml") -> str:
        p = tmp_path / name
        p.write_text(textwrap.dedent(text), encoding="utf-8")
        return str(p)

    return _write


@pytest.fixture
def cli(capsys):
    """cli(*args) -> (exit code, stdout + stderr), running rltune.cli.main in-process."""
    from rltune.cli import main

    def _run(*args):
        code = 0
        try:
            main(list(args))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out = capsys.readouterr()
        return code, out.out + out.err

    return _run
