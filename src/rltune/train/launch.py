"""Start N ranks through an existing launcher (torchrun or the DeepSpeed launcher).

rltune writes no scheduler: `--nproc`, `--nnodes`, `--hostfile` and rendezvous options are
passed through to the launcher, which starts `python -m rltune train ...` on every rank.
"""

from __future__ import annotations

import os
import subprocess
import sys

from .torchrun import RENDEZVOUS_FAILED


def launch_command(recipe, recipe_path: str, overrides: list[str], resume: str, allow_recipe_change: bool,
                   quiet: bool, launcher_args: list[str], extra: list[str] = ()) -> list[str]:
    """`extra`: more `rltune train` options for every rank (e.g. --dry-run)."""
    t = recipe.trainer
    child = ["train", str(recipe_path), *overrides, "--resume", resume, *extra]
    if allow_recipe_change:
        child.append("--allow-recipe-change")
    if quiet:
        child.append("--quiet")
    if t.launcher == "deepspeed":
        # the launcher of this interpreter's DeepSpeed; ranks read LOCAL_RANK from the
        # environment (--no_local_rank: no `--local_rank=N` argument in front of ours)
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(t.nproc),
               "--num_nodes", str(t.nnodes), "--no_local_rank", *launcher_args, "--module", "rltune"]
    else:
        # torchrun itself (train/torchrun.py: a failed rank is one line, not torch's traceback)
        cmd = [sys.executable, "-m", "rltune.train.torchrun", "--nproc_per_node", str(t.nproc),
               "--nnodes", str(t.nnodes), *launcher_args]
        if t.nnodes == 1 and not any(a.startswith("--rdzv") or a.startswith("--master") for a in launcher_args):
            cmd.append("--standalone")
        elif "--rdzv-backend" in launcher_args:   # c10d: a node that never joins stops the job, with a message
            cmd += ["--rdzv-conf", f"join_timeout={t.rendezvous_timeout_s:g}"]
        cmd += ["-m", "rltune"]
    return cmd + child


def launch(recipe, recipe_path, overrides, resume, allow_recipe_change, quiet, launcher_args, extra=()) -> int:
    cmd = launch_command(recipe, recipe_path, overrides, resume, allow_recipe_change, quiet, launcher_args, extra)
    env = dict(os.environ, RLTUNE_LAUNCHED="1")
    if not _has_cuda():
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(recipe.trainer.nproc, 1))))
    print("rltune: launching " + " ".join(cmd), file=sys.stderr)
    try:
        code = subprocess.call(cmd, env=env)
    except FileNotFoundError as err:
        from rltune.errors import UserError

        raise UserError(f"launcher {cmd[0]!r} not found: {err}; install it or set trainer.launcher: torchrun") from err
    except KeyboardInterrupt:  # the launcher forwards the signal; the ranks save and exit
        return 130
    if code not in (0, 130, RENDEZVOUS_FAILED):
        from pathlib import Path

        from .rundir import resume_hint

        print("rltune: the job stopped because a rank failed (its own message, or the line above, says how); "
              f"resume from the last checkpoint with: {resume_hint(None, Path(recipe_path))}", file=sys.stderr)
    return code


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False
