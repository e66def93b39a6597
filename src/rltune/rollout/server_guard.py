"""`python -m rltune.rollout.server_guard FD -- COMMAND...`: run a rollout server that cannot
outlive the trainer that started it.

The trainer starts this guard with the read end `FD` of a pipe whose write end only the trainer
holds. The guard starts COMMAND (`vllm serve ...`) in a process group of its own, so the server
and every process it spawns (vLLM's engine core, its workers) can be ended together, and then
waits for whichever comes first:

- EOF on FD: the trainer closed the pipe, or died (the kernel closes a dead process's files,
  SIGKILL included): the group gets SIGTERM, then SIGKILL after GRACE_S;
- SIGTERM / SIGINT to the guard: the same;
- the server exits by itself: the guard ends the rest of its group and exits with its code.

The server is also started with the parent-death signal SIGTERM (Linux), so a guard that is
itself killed takes the server down with it. When the group is gone, the guard removes the
trainer's weight files (RLTUNE_WEIGHT_FILES: their path prefix, `/dev/shm/rltune-weights-PID-`):
a trainer killed outright leaves one behind otherwise, in RAM until a reboot. Standard library
only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 10.0   # SIGTERM -> SIGKILL


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM this process when its parent (the guard) dies (Linux prctl); pin it to
    the CPU cores RLTUNE_SERVER_CPUS lists (rollout.server.devices on a CPU)."""
    cpus = os.environ.get("RLTUNE_SERVER_CPUS")
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the pipe still ends the server
        pass


def stop_group(pgid: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM the process group, then SIGKILL what is left after `grace_s` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)   # anyone left in the group?
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def remove_weight_files(prefix: str | None) -> None:
    """Remove this user's regular files whose path starts with `prefix` (the trainer's weight
    files; weight_files.weight_file_prefix)."""
    import stat

    if not prefix or not os.path.basename(prefix).startswith("rltune-weights-"):
        return
    directory, start = os.path.split(prefix)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(start) and name.endswith(".safetensors")):
            continue
        path = os.path.join(directory, name)
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                os.unlink(path)
        except OSError:
            pass


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m rltune.rollout.server_guard FD -- COMMAND...", file=sys.stderr)
        return 2
    fd = int(argv[0])
    proc = subprocess.Popen(argv[2:], start_new_session=True, preexec_fn=_die_with_parent)
    lock, stopped = threading.RLock(), []

    def stop(*_args) -> None:
        with lock:   # a second caller waits until the group is gone
            if not stopped:
                stop_group(proc.pid)
                stopped.append(True)
                remove_weight_files(os.environ.get("RLTUNE_WEIGHT_FILES"))

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def watch_parent() -> None:
        try:
            while os.read(fd, 1):   # the trainer never writes: this returns b"" at EOF only
                pass
        except OSError:
            pass
        stop()

    threading.Thread(target=watch_parent, daemon=True).start()
    code = proc.wait()
    stop()   # the server's own children (engine core, workers) go with it
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
