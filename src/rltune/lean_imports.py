"""Import the training stack without the packages it pulls in only because they are installed.

Two dependencies import large optional packages at import time, for features rltune never uses:

- DeepSpeed's autotuner (`deepspeed.autotuning.autotuner`, imported by its runtime config) imports
  mlflow when it is installed, for its own result logging. mlflow in turn imports pandas and scipy.
- transformers' assisted generation (`transformers.generation.candidate_generator`, imported with
  every model class) imports `sklearn.metrics` when scikit-learn is installed (full mlflow
  installs it). It needs it only for assistant models with a learned confidence threshold.
- transformers' object-detection losses (`transformers.loss`, imported with `modeling_utils`)
  import `scipy.optimize` when scipy is installed, for their Hungarian matching.

With `rltune[tracking]` installed, these cost a training process ~200 MiB of resident memory
and ~1.5 s of start-up (docs/memory.md): more than a quickstart's activations. `import_stack()`
imports both dependencies with those packages hidden, once, before any model is built. They are
hidden only while the two import: afterwards `import mlflow` (logging.mlflow) or a reward function's
`import sklearn` works as usual. Nothing here imports anything heavy until `import_stack()` runs.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

# package: who imports it, for what rltune does not use
HIDDEN = {
    "mlflow": "DeepSpeed's autotuner (its own result logging)",
    "sklearn": "transformers' assisted generation (a learned confidence threshold)",
    "scipy": "transformers' object-detection losses (Hungarian matching)",
}


@contextmanager
def hidden(names):
    """While inside, `import NAME` raises ImportError and `importlib.util.find_spec(NAME)` is None
    for each of `names` not imported yet (a None entry in sys.modules); restored on exit."""
    added = [n for n in names if n not in sys.modules]
    for n in added:
        sys.modules[n] = None
    try:
        yield
    finally:
        for n in added:
            if n in sys.modules and sys.modules[n] is None:
                del sys.modules[n]


def _forget_checks() -> None:
    """transformers caches its `is_<package>_available()` answers: emptied on entering the window
    (an answer cached before it would make transformers import a hidden package) and on leaving
    (an answer cached inside it would say 'not installed' for good)."""
    from transformers.utils import import_utils

    for name in HIDDEN:
        check = getattr(import_utils, f"is_{name}_available", None)
        if hasattr(check, "cache_clear"):
            check.cache_clear()


def import_stack() -> None:
    """Import transformers' model and generation code and DeepSpeed with HIDDEN hidden (idempotent;
    once either is imported, its optional imports have happened or not, and nothing changes)."""
    with hidden(HIDDEN):
        _forget_checks()
        try:
            import transformers.generation.candidate_generator  # noqa: F401
            import transformers.modeling_utils  # noqa: F401
            try:
                import deepspeed  # noqa: F401
            except ImportError:   # not installed: the run says so where it builds an engine
                pass
        finally:
            _forget_checks()
