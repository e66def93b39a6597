"""The run directory as a contract: one run owns it (a lock), a new run never mixes with an
old one (the old one is moved aside), storage failures are named, and an interrupted run says
the exact command that continues it.

RUN_DIR/
  .lock                  pid, host and start time of the run using the directory (held with flock)
  recipe.yaml            the resolved recipe of the run
  train.log              the log
  metrics.jsonl, events.jsonl, eval.json
  checkpoints/step-N/    atomic checkpoints (checkpoint.py); .tmp-step-N/ is a save in progress
  final/                 the final policy (from_pretrained), written atomically with a manifest
  previous/TIMESTAMP/    older runs that a new run (`--resume never`) moved aside
"""

from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import socket
import time
from pathlib import Path

from .setup import TrainError

LOCK = ".lock"
PREVIOUS = "previous"
# what a run writes at the top of its directory (anything else - a reward file, a user's
# notes - stays where it is when an old run is moved aside)
ARTIFACTS = ("checkpoints", "final", "final.tmp", "final.old", "metrics.jsonl", "events.jsonl", "eval.json",
             "recipe.yaml", "train.log", "tb", "wandb", "mlruns", "run.png", "rollout-server.log")
# the run's files of a name per rank (rollout.engine vllm-server: rollout-server-rank1.log, ...)
ARTIFACT_GLOBS = ("rollout-server-rank*.log",)


def artifacts(run_dir: Path) -> tuple[str, ...]:
    """ARTIFACTS and the names in `run_dir` that ARTIFACT_GLOBS match (links too: never followed)."""
    found = sorted({p.name for g in ARTIFACT_GLOBS for p in run_dir.glob(g)}) if run_dir.is_dir() else []
    return ARTIFACTS + tuple(found)
# the files that make a directory hold a run (recipe.yaml and train.log alone: a run that
# stopped before its first step)
RUN_MARKERS = ("checkpoints", "final", "metrics.jsonl", "events.jsonl", "eval.json")

STORAGE_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                  errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                  errno.EPERM: "operation not permitted"}


def absolute_run_dir(recipe):
    """`recipe` with trainer.output_dir made absolute, once, at the start of a run: every path the
    run writes (the run directory, checkpoints, final/, the trackers' directories) derives from it,
    so an environment, reward function or agent that calls os.chdir moves none of them."""
    out = os.path.abspath(os.path.expanduser(recipe.trainer.output_dir))
    if out == recipe.trainer.output_dir:
        return recipe
    return recipe.model_copy(update={"trainer": recipe.trainer.model_copy(update={"output_dir": out})})


# ------------------------------------------------------------------ sizes and storage errors


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def free_bytes(path: Path) -> int | None:
    """Free space on the file system holding `path` (or its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def _read_only(path: Path) -> bool:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return bool(os.statvfs(p).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def storage_problem(err: BaseException, path: Path, needed: int | None = None) -> str | None:
    """What an exception raised while writing under `path` means for the user, when it is a
    storage failure (disk full, quota, read-only, permissions); None for anything else.
    torch.save reports a full disk as a RuntimeError from its zip writer."""
    if isinstance(err, OSError) and err.errno in STORAGE_ERRNOS:
        return STORAGE_ERRNOS[err.errno]
    text = str(err)
    zip_writer = isinstance(err, RuntimeError) and any(
        s in text for s in ("inline_container", "PytorchStreamWriter", "file write failed", "unexpected pos"))
    cause = err.__cause__ or err.__context__
    if not zip_writer and cause is not None and cause is not err:
        return storage_problem(cause, path, needed)
    if not zip_writer:
        return None
    if _read_only(path):
        return STORAGE_ERRNOS[errno.EROFS]
    free = free_bytes(path)
    if free is not None and (needed is None or free < needed):
        return STORAGE_ERRNOS[errno.ENOSPC]
    return "a write failed (the disk may be full or failing)"


def storage_message(what: str, path: Path, problem: str, needed: int | None, kept: str, again: str) -> str:
    """The user-facing text for a failed write: the path, the space needed, what is intact, the fix."""
    free = free_bytes(path)
    lines = [f"could not write {what} to {path}: {problem}"]
    if needed:
        lines[0] += f" (about {fmt_bytes(needed)} needed"
        lines[0] += f", {fmt_bytes(free)} free there)" if free is not None else ")"
    lines.append(f"  {kept}")
    if problem in (STORAGE_ERRNOS[errno.EROFS], STORAGE_ERRNOS[errno.EACCES], STORAGE_ERRNOS[errno.EPERM]):
        lines.append(f"  fix: make {path} writable (or set trainer.output_dir to a writable directory and "
                     f"continue with --resume PATH_TO_CHECKPOINT), then: {again}")
    else:
        room = f"at least {fmt_bytes(needed)}" if needed else "space"
        lines.append(f"  fix: free {room} on that disk (or lower trainer.keep_checkpoints, or set "
                     f"trainer.output_dir to a disk with room), then: {again}")
    return "\n".join(lines)


def checkpoint_estimate(engines: dict, precision: str, last_checkpoint: Path | None) -> int:
    """Bytes a checkpoint takes: the last one's size when there is one, else from the
    parameter count (weights + two Adam moments, + fp32 master weights in bf16/fp16)."""
    if last_checkpoint is not None:
        try:
            info = json.loads((last_checkpoint / "manifest.json").read_text())
            return sum(int(f["size"]) for f in info.get("files", {}).values())
        except (OSError, ValueError, KeyError, TypeError):
            pass
    n = 0
    for engine in engines.values():   # trainable parameters only (LoRA checkpoints hold the adapter)
        if engine is not None:
            n += sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters() if p.requires_grad)
    per = (2 + 4 + 8) if precision in ("bf16", "fp16") else (4 + 8)
    return int(n * per * 1.05) + (1 << 20)


# ------------------------------------------------------------------ the directory itself


def check_path(path: Path, what: str) -> None:
    """A symlink loop, a file where a directory should be: named, not 'not found'."""
    try:
        os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise TrainError(f"{what} {path} is a symlink to {os.readlink(path)!r}, which does not exist\n"
                             "  fix: point the link at a directory, or remove it") from None
        return
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise TrainError(f"{what} {path} is a symlink loop (it resolves back to itself)\n"
                             "  fix: remove or repoint the link (ls -l shows where it points)") from None
        if err.errno == errno.ENOTDIR:
            raise TrainError(f"{what} {path}: a part of this path is a file, not a directory\n"
                             "  fix: choose another path") from None
        raise


def prepare(run_dir: Path) -> None:
    """Create the run directory, with the path and the fix when it cannot be."""
    check_path(run_dir, "trainer.output_dir")
    if run_dir.exists() and not run_dir.is_dir():
        raise TrainError(f"trainer.output_dir {run_dir} is a file, not a directory\n"
                         "  fix: set trainer.output_dir to a directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        problem = storage_problem(err, run_dir) or err.strerror or str(err)
        raise TrainError(f"cannot create the run directory {run_dir} (trainer.output_dir): {problem}\n"
                         "  fix: set trainer.output_dir to a directory you can write") from None
    refuse_links(run_dir)


def refuse_links(run_dir: Path) -> None:
    """rltune never writes through a link it did not make: a run directory (perhaps received from
    someone else) whose recipe.yaml, train.log, metrics.jsonl, ... or .lock is a link would have the
    run overwrite or append to the file it points at. The directory itself may be a link (the
    user's own layout, e.g. runs -> /scratch/runs); what rltune writes inside it may not."""
    for name in artifacts(run_dir) + (LOCK, PREVIOUS):
        p = run_dir / name
        if p.is_symlink():
            raise TrainError(f"{p} is a link (to {os.readlink(p)}); rltune writes this file and never writes "
                             "through a link (it would change the file it points at)\n"
                             f"  fix: remove the link ({p}), or set trainer.output_dir to another directory")


def holds_run(run_dir: Path) -> bool:
    for name in RUN_MARKERS:
        p = run_dir / name
        if (p.is_dir() and any(p.iterdir())) or p.is_file():
            return True
    return False


def move_aside(run_dir: Path, names: tuple[str, ...] | None = None) -> Path | None:
    """Move an older run's files (default: `artifacts`) into RUN_DIR/previous/TIMESTAMP/ so that a
    new run owns the directory; returns where they went (None when there was nothing to move)."""
    names = artifacts(run_dir) if names is None else names
    items = [run_dir / n for n in names if (run_dir / n).exists() or (run_dir / n).is_symlink()]
    if not items:
        return None
    dest = _dated(run_dir)
    try:
        dest.mkdir(parents=True)
        for p in items:
            os.rename(p, dest / p.name)
    except OSError as err:
        raise TrainError(f"cannot move the previous run in {run_dir} aside to {dest}: "
                         f"{storage_problem(err, run_dir) or err}\n"
                         f"  fix: make {run_dir} writable, or move/delete its old files yourself") from None
    return dest


def move_checkpoints_after(run_dir: Path, step: int, ckpt_dir: str, prefix: str) -> Path | None:
    """Resuming from checkpoint `step` of this run: the later checkpoints (an abandoned
    continuation, or broken ones) and a final/ exported after `step` are moved aside, so that
    pruning and the next `--resume auto` never mix them with the continuation."""
    later = [p for p in (run_dir / ckpt_dir).glob(f"{prefix}*") if p.is_dir() and _step(p, prefix) > step]
    final = run_dir / "final"
    final_step = None
    try:
        final_step = int(json.loads((final / "manifest.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    move_final = final.exists() and ((final_step is not None and final_step > step) or (final_step is None and later))
    if not later and not move_final:
        return None
    dest = _dated(run_dir)
    (dest / ckpt_dir).mkdir(parents=True)
    for p in later:
        os.rename(p, dest / ckpt_dir / p.name)
    if move_final:
        os.rename(final, dest / final.name)
    return dest


def _dated(run_dir: Path) -> Path:
    """RUN_DIR/previous/YYYYmmdd-HHMMSS (with -2, -3 ... when taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, i = run_dir / PREVIOUS / stamp, 1
    while dest.exists():
        i += 1
        dest = run_dir / PREVIOUS / f"{stamp}-{i}"
    return dest


def _step(path: Path, prefix: str) -> int:
    try:
        return int(path.name[len(prefix):])
    except ValueError:
        return -1


# ------------------------------------------------------------------ the lock


def _proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks (Linux), to tell a reused pid from the owner."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    now = _proc_start(pid)
    return not (start and now and now != start)


def _is_rltune(pid: int) -> bool | None:
    """Whether the live process `pid` runs rltune (its command line names it); None where
    /proc cannot tell. A pid read from a .lock file is data: pid 1 is no run to signal."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            cmd = f.read(1 << 16)
    except (OSError, ValueError, OverflowError):
        return None
    return b"rltune" in cmd


class RunLock:
    """RUN_DIR/.lock: an flock held while the run lives (the kernel drops it when the process
    dies, even on SIGKILL), with the owner's pid, host and start time inside for the message.
    A lock left by a dead process on this host is taken over with a warning; one from another
    host is refused (its pid cannot be checked from here)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text() or "{}")
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def acquire(self) -> str | None:
        """Take the lock or raise TrainError naming the owner; returns a warning to log when a
        dead run's lock was taken over."""
        import fcntl

        me = {"pid": os.getpid(), "host": socket.gethostname(), "proc_start": _proc_start(os.getpid()),
              "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(20):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
            except OSError as err:
                problem = storage_problem(err, self.path.parent) or err.strerror or str(err)
                raise TrainError(f"cannot write to the run directory {self.path.parent}: {problem}\n"
                                 "  fix: set trainer.output_dir to a directory you can write") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise TrainError(self._in_use(self._read())) from None
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if not same_file:  # the owner removed it between our open and our flock: try again
                os.close(fd)
                continue
            owner, warning = self._read(), None
            pid = owner.get("pid")
            if isinstance(pid, int) and pid != me["pid"]:
                if owner.get("host") not in (None, me["host"]):
                    os.close(fd)
                    raise TrainError(self._in_use(owner, other_host=True))
                alive = _alive(pid, owner.get("proc_start"))
                rltune = _is_rltune(pid) if alive else False
                if alive and rltune is not False:
                    os.close(fd)
                    raise TrainError(self._in_use(owner, unknown=rltune is None))
                if alive:   # we hold the flock, so no run holds it: the pid is someone else's
                    warning = (f"taking over the lock {self.path}: it names pid {pid}, which is not an rltune run "
                               "(a reused pid, or a lock file from elsewhere), and no run holds the lock")
                else:
                    warning = (f"taking over the lock {self.path} left by pid {pid} (started "
                               f"{owner.get('started', '?')}), which is no longer running (killed?)")
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(me).encode())
            os.fsync(fd)
            self.fd = fd
            return warning
        raise TrainError(f"could not take the lock {self.path} (it keeps being replaced)\n"
                         "  fix: make sure no other rltune run uses this directory")

    def _in_use(self, owner: dict, other_host: bool = False, unknown: bool = False) -> str:
        who = f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')}"
        since = f", started {owner['started']}" if owner.get("started") else ""
        if other_host:
            return (f"the run directory {self.path.parent} is locked by {who}{since}: another rltune run may be "
                    f"using it (its pid cannot be checked from this host)\n"
                    f"  fix: wait for that run or set trainer.output_dir to another directory; if no run uses "
                    f"it any more, delete {self.path}")
        if unknown:   # alive, but /proc cannot say what it runs: no advice to signal it
            return (f"the run directory {self.path.parent} is locked by {who}{since}, which is running; "
                    f"whether it is an rltune run cannot be checked here\n"
                    f"  fix: wait for that run or set trainer.output_dir to another directory; if no run uses "
                    f"it, delete {self.path}")
        return (f"the run directory {self.path.parent} is in use by another rltune run ({who}{since})\n"
                f"  fix: wait for it to finish, stop it (kill -INT {owner.get('pid', 'PID')}: it saves a "
                f"checkpoint), or set trainer.output_dir to another directory")

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if self._read().get("pid") == os.getpid():
                self.path.unlink()
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


# ------------------------------------------------------------------ the command that continues a run

COMMAND_ENV = "RLTUNE_RESUME_ARGS"


def resume_hint(args: list[str] | None, recipe_path: Path) -> str:
    """`rltune train RECIPE key=value ... --nproc N --resume auto`, shell-quoted: the command the
    user started, with --resume auto (an interrupted run continues from its newest checkpoint)."""
    if args is None:
        env = os.environ.get(COMMAND_ENV)
        args = json.loads(env) if env else [str(recipe_path)]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--resume":
            skip = True
            continue
        if a.startswith("--resume=") or a == "--allow-recipe-change":
            continue  # the checkpoint holds the changed recipe: the flag is not needed again
        out.append(a)
    return shlex.join(["rltune", "train", *out, "--resume", "auto"])


OVERRIDES_TAG = "# overrides: "   # RUN_DIR/recipe.yaml's second line when the run had key=value overrides


__all__ = ["RunLock", "prepare", "holds_run", "move_aside", "move_checkpoints_after", "storage_problem",
           "storage_message", "checkpoint_estimate", "resume_hint", "check_path", "fmt_bytes", "tree_size"]
