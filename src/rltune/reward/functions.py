"""Loading the reward functions a recipe names (`builtin:NAME`, `module:function`,
`path/to/file.py:function`): the only user code a recipe can run. Below `reward` and
`reward.isolate`, which both use it."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Callable

from ..errors import UserError
from .builtins import BUILTIN_REWARDS


class RewardError(UserError):
    """A reward that cannot be loaded or computed (message is user-facing)."""


EXIT_FIX = ("reward code must not end the process: raise an exception (or return 0.0) instead of"
            " calling sys.exit()/exit()")
ERROR_FIX = "fix the function, or set reward.on_error: zero to score such samples 0"


def reward_file_path(target: str, base_dir: Path | None = None) -> Path:
    """The file of a `path/to/file.py:function` spec: as given (absolute, or relative to the
    current directory), else relative to the recipe's directory (`validate` looks there too)."""
    path = Path(target).expanduser()
    if not path.is_absolute() and base_dir is not None and not path.exists():
        path = Path(base_dir) / path
    return path


def load_reward_function(spec: str, base_dir: Path | None = None) -> Callable:
    """Resolve `builtin:NAME`, `module:function` or `path/to/file.py:function`."""
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_REWARDS:
            raise RewardError(f"unknown builtin reward {spec!r}; available: "
                              + ", ".join("builtin:" + n for n in BUILTIN_REWARDS))
        return BUILTIN_REWARDS[name]
    if ":" not in spec:
        raise RewardError(f"reward function {spec!r} must be builtin:NAME, module:function or file.py:function")
    target, func_name = spec.rsplit(":", 1)
    if target.endswith(".py"):
        path = reward_file_path(target, base_dir)
        if not path.exists():
            raise RewardError(f"reward file {target} does not exist (from reward.functions: {spec})")
        mod_name = f"rltune_user_reward_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        try:
            module_spec.loader.exec_module(module)
        except SystemExit as err:
            raise RewardError(f"importing reward file {target} called sys.exit({err.code!r})\n  fix: {EXIT_FIX}") from None
        except Exception as err:  # noqa: BLE001
            raise RewardError(f"importing reward file {target} failed: {type(err).__name__}: {err}") from err
    else:
        try:
            module = importlib.import_module(target)
        except SystemExit as err:
            raise RewardError(f"importing reward module {target!r} called sys.exit({err.code!r})\n  fix: {EXIT_FIX}") from None
        except Exception as err:  # noqa: BLE001
            raise RewardError(f"cannot import reward module {target!r}: {type(err).__name__}: {err}") from err
    fn = getattr(module, func_name, None)
    if not callable(fn):
        import difflib

        funcs = [n for n, v in vars(module).items() if not n.startswith("_") and inspect.isfunction(v)
                 and v.__module__ == module.__name__]
        close = difflib.get_close_matches(func_name, funcs, n=3, cutoff=0.6)
        defines = ", ".join(f"`{n}`" for n in funcs[:12]) + (f" and {len(funcs) - 12} more" if len(funcs) > 12 else "")
        raise RewardError(f"{target} has no function {func_name!r} (from reward.functions: {spec}; it defines "
                          + (f"the functions {defines})" if funcs else "no functions)")
                          + (f"\n  fix: did you mean {' or '.join(f'`{target}:{c}`' for c in close)}?" if close else ""))
    return fn
