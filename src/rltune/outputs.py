"""Writing a file the user asked for (`--output`, a default output in a run directory) safely.

rltune never writes through a link it did not make, and never replaces a file the user did not
name for replacing:
  - a path that is a link (dangling or not) is refused, with the path named: writing through it
    would change a file elsewhere (a run directory someone sent you can hold such links);
  - an existing file is replaced only with `--force` (or where the path is rltune's own default
    output, e.g. RUN/plot.png, which a later call rewrites);
  - the new content goes to a temporary file beside the target and is renamed over it, so a
    failure leaves the old file whole and the rename itself never follows a link.
No heavy imports: `validate`, `presets`, `schema` use this.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Optional, Union

from .errors import RecipeInputError


def check_output(path: Union[str, Path], force: bool = False, retry: Optional[str] = None,
                 replace_ok: bool = False) -> Path:
    """Raise (exit 2, the path named, a fix) unless `path` may be written; returns it as a Path.
    `retry`: the command to run again with --force. `replace_ok`: rltune's own default output,
    replaced without --force (never a link)."""
    path = Path(path)
    if path.is_symlink():
        raise RecipeInputError(f"`{path}` is a link (to {os.readlink(path)}); rltune does not write through links",
                               fix="remove the link, or give another output path")
    if path.exists() and path.is_dir():
        raise RecipeInputError(f"`{path}` is a directory", fix="give a file path")
    if path.exists() and not (force or replace_ok):
        raise RecipeInputError(f"`{path}` exists; not overwriting it",
                               fix=f"give another path, or add --force{': ' + retry + ' --force' if retry else ''}")
    if path.exists() and not path.is_file():
        raise RecipeInputError(f"`{path}` is not a regular file", fix="give another output path")
    return path


def write_output(path: Union[str, Path], data: Union[str, bytes, Callable[[Path], None]], force: bool = False,
                 retry: Optional[str] = None, replace_ok: bool = False) -> Path:
    """Check `path` (above), then write `data` (text, bytes, or a function that writes a given
    path, e.g. a figure's savefig) to a temporary file beside it and rename it into place."""
    path = check_output(path, force, retry, replace_ok)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix or ".tmp", dir=path.parent)
    try:
        if callable(data):
            os.close(fd)
            data(Path(tmp))
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, 0o644 & ~_umask())
        check_output(path, force, retry, replace_ok)      # nothing appeared there meanwhile
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
