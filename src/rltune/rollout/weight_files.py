"""The weight files the `vllm-server` engine's `rltune_file` transfer writes (trainer side): where
they go, how they are named (with the trainer's pid), and the sweep that removes those a killed
trainer left (docs/rollout-server.md)."""

from __future__ import annotations

import os
import tempfile


def weights_dir() -> str:
    """Where weight files go: /dev/shm where there is one (RAM), else the temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def weight_file_prefix(pid: int | None = None) -> str:
    """Weight files carry the trainer's pid: a trainer killed outright (SIGKILL, OOM) leaves its
    file behind (up to SYNC_BUCKET_BYTES, in RAM on /dev/shm); the server's guard removes it
    (server_guard.py, RLTUNE_WEIGHT_FILES) and the next run sweeps those of dead trainers."""
    return f"rltune-weights-{os.getpid() if pid is None else int(pid)}-"


def sweep_weight_files(directory: str | None = None) -> list[str]:
    """Remove the weight files that trainers of this user which are no longer running left in
    `directory` (default weights_dir()); returns their names. A file whose pid is alive, owned
    by another user, or not a regular file stays."""
    import re
    import stat

    directory = directory or weights_dir()
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = re.fullmatch(r"rltune-weights-(\d{1,10})-[A-Za-z0-9_]+\.safetensors", name)
        if not m:
            continue
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                continue
            try:
                os.kill(int(m.group(1)), 0)
                continue          # its trainer runs (or the pid is someone else's now): leave it
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            os.unlink(path)
            removed.append(name)
        except OSError:
            continue
    return removed
