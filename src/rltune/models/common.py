"""What model loading and the SmolLM2 builder share: the error type, the cache, atomic builds."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..errors import UserError


class ModelSpecError(UserError):
    """A model spec that cannot be resolved or loaded (message is user-facing)."""

    exit_code = 2


BUILTINS = ("tiny-llama", "tiny-qwen2", "smollm2-135m-instruct")


def cache_dir() -> Path:
    root = os.environ.get("RLTUNE_CACHE") or os.path.join(Path.home(), ".cache", "rltune")
    return Path(root)


def _atomic_build(target: Path, build) -> Path:
    """Run `build(tmp_dir)` and rename the result into place (safe with several ranks)."""
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race
            if not (target / "config.json").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
