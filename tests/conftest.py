"""Fixtures every test directory shares: the CLI run in-process."""

from __future__ import annotations

import pytest


@pytest.fixture
def cli_streams(capsys, monkeypatch):
    """cli_streams(*args) -> (exit code, stdout, stderr), running rltune.cli.main in-process with
    plain, wide output (no colour, 200 columns) and without RLTUNE_DEBUG tracebacks."""
    from rltune.cli import main

    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("RLTUNE_DEBUG", raising=False)

    def _run(*args):
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out = capsys.readouterr()
        return code, out.out, out.err

    return _run


@pytest.fixture
def cli(cli_streams):
    """cli(*args) -> (exit code, stdout + stderr)."""

    def _run(*args):
        code, out, err = cli_streams(*args)
        return code, out + err

    return _run
