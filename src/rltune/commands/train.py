"""`rltune train RECIPE [key=value ...]`: validate (errors stop it), then train or launch ranks."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def run(recipe_path: str, overrides: list[str], resume: str = "auto", allow_recipe_change: bool = False,
        quiet: bool = False, strict: bool = False, nproc: int | None = None, nnodes: int | None = None,
        launcher: str | None = None, launcher_args: list[str] | None = None,
        command: list[str] | None = None, dry_run: bool = False, fmt: str = "text") -> int:
    """`command`: the user's arguments after `rltune train` (the resume hint repeats them);
    built from the other arguments when not given. `dry_run`: build the engines, run one small
    step, print peak memory per phase beside the plan (train/dryrun.py) as `fmt` (text | json)."""
    from rltune.commands.validate import check_all
    from rltune.recipe import format_findings, has_errors
    from rltune.train.rundir import COMMAND_ENV

    if "RLTUNE_LAUNCHED" in os.environ and COMMAND_ENV in os.environ:
        command = None  # a rank started by the launcher: the user's command is in the environment
    elif command is None:
        command = [str(recipe_path), *overrides]
        for flag, value in (("--nproc", nproc), ("--nnodes", nnodes), ("--launcher", launcher)):
            if value is not None:
                command += [flag, str(value)]
        command += list(launcher_args or [])
        command += ["--quiet"] * quiet + ["--strict"] * strict
    if fmt not in ("text", "json"):
        print(f"rltune: --format {fmt}: expected text or json", file=sys.stderr)
        return 2
    if fmt != "text" and not dry_run:
        print("rltune: --format applies to --dry-run only (a run writes metrics.jsonl)", file=sys.stderr)
        return 2

    if nproc is not None:
        overrides = list(overrides) + [f"trainer.nproc={nproc}"]
    if nnodes is not None:
        overrides = list(overrides) + [f"trainer.nnodes={nnodes}"]
    if launcher is not None:
        overrides = list(overrides) + [f"trainer.launcher={launcher}"]
    recipe, findings = check_all(recipe_path, overrides, strict=strict)
    is_child = "RLTUNE_LAUNCHED" in os.environ
    shown = [f for f in findings if f.severity in ("error", "warning")]
    if shown and not is_child:
        print(format_findings(shown, "text"), file=sys.stderr)
    if recipe is None or has_errors(findings):
        import shlex

        again = shlex.join(["rltune", "validate", str(recipe_path), *overrides])
        print(f"rltune: {recipe_path}: the recipe has errors; not training (see `{again}`)", file=sys.stderr)
        return 1
    world = recipe.trainer.nproc * recipe.trainer.nnodes
    if world > 1 and not is_child and "LOCAL_RANK" not in os.environ:
        import json

        from rltune.train.launch import launch

        saved = os.environ.get(COMMAND_ENV)
        os.environ[COMMAND_ENV] = json.dumps(command)  # the ranks print it in their resume hint
        try:
            child = ["--dry-run", "--format", fmt] if dry_run else []
            return launch(recipe, recipe_path, overrides, resume, allow_recipe_change, quiet, launcher_args or [],
                          child)
        finally:
            if saved is None:
                os.environ.pop(COMMAND_ENV, None)
            else:
                os.environ[COMMAND_ENV] = saved
    from rltune.lean_imports import import_stack

    import_stack()   # before any model: without the optional packages nothing here uses
    if dry_run:
        from rltune.train.dryrun import dry_run as run_dry

        try:
            return run_dry(recipe, Path(recipe_path), fmt=fmt, quiet=quiet)
        except KeyboardInterrupt:
            print("rltune: interrupted", file=sys.stderr)
            return 130
    from rltune.train.run import train

    try:
        return train(recipe, Path(recipe_path), resume=resume, allow_recipe_change=allow_recipe_change, quiet=quiet,
                     command=command, overrides=overrides)
    except KeyboardInterrupt:
        print("rltune: interrupted", file=sys.stderr)
        return 130
