from __future__ import annotations

import textwrap

import pytest


@pytest.fixture
def write(tmp_path):
    """write(text, name="recipe.yaml") -> path of a recipe file in tmp_path."""

    def _write(text: str, name: str = "recipe.yaml") -> str:
        p = tmp_path / name
        p.write_text(textwrap.dedent(text), encoding="utf-8")
        return str(p)

    return _write
