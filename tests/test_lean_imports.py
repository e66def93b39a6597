"""`lean_imports.import_stack()`: a training process imports transformers and DeepSpeed without the
optional packages they would import only because they are installed (mlflow, scikit-learn, scipy;
mlflow brings pandas), and those packages stay importable afterwards (logging.mlflow, a reward
function's own imports). Each check runs in a fresh interpreter: this one has imported them all."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from rltune.lean_imports import HIDDEN, hidden

PROBE = """
import json, sys
from rltune.lean_imports import import_stack
import_stack()
from transformers import AutoModelForCausalLM
import transformers.models.llama.modeling_llama, deepspeed.runtime.engine
loaded = sorted(m for m in ("mlflow", "sklearn", "scipy", "pandas") if sys.modules.get(m) is not None)
importable = {}
for name in ("mlflow", "sklearn", "scipy"):
    try:
        __import__(name)
        importable[name] = True
    except ImportError:
        importable[name] = False
print(json.dumps({"loaded": loaded, "importable": importable}))
"""


def test_the_stack_imports_without_the_optional_packages_and_they_import_afterwards():
    installed = {n: importlib.util.find_spec(n) is not None for n in HIDDEN}
    if not any(installed.values()):
        pytest.skip("none of mlflow, scikit-learn, scipy is installed: nothing to hide")
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["loaded"] == [], got           # none of them (nor pandas, through mlflow) came in
    assert got["importable"] == installed     # and each installed one imports when asked for


def test_hidden_restores_only_what_it_hid():
    name = "rltune_no_such_module_xyz"
    with hidden([name, "json"]):
        assert sys.modules[name] is None and importlib.util.find_spec(name) is None
        with pytest.raises(ImportError):
            __import__(name)
        assert sys.modules["json"] is json     # imported before: left alone
    assert name not in sys.modules and sys.modules["json"] is json


STALE = """
import json, sys
from transformers.utils import import_utils
assert import_utils.is_scipy_available() and import_utils.is_sklearn_available()   # cached: installed
from rltune.lean_imports import import_stack
import_stack()                      # transformers.loss and the candidate generator import in here
print(json.dumps({"scipy_checked": import_utils.is_scipy_available(), "loaded": "scipy" in sys.modules}))
"""


def test_answers_cached_before_the_window_do_not_break_the_import():
    # an earlier `is_scipy_available()` (True, cached) would make transformers import the hidden scipy
    if importlib.util.find_spec("scipy") is None or importlib.util.find_spec("sklearn") is None:
        pytest.skip("scipy / scikit-learn not installed")
    out = subprocess.run([sys.executable, "-c", STALE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"scipy_checked": True, "loaded": False}   # answered truly again afterwards
