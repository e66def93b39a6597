"""`rltune launch slurm|k8s`: a job for an existing scheduler that runs `rltune train` on N nodes.

rltune writes no scheduler. It writes what the scheduler runs (docs/scale.md):

- **slurm**: an sbatch script. One task per node (`srun --ntasks-per-node 1`); each runs
  `python -m rltune train RECIPE ... --nnodes N --nproc P --rdzv-endpoint HEAD:PORT --resume auto`,
  torchrun's c10d rendezvous on the job's first node. NCCL's async error handling is on (a dead
  or stalled rank ends the job within trainer.collective_timeout_s); a step interrupted by
  preemption (SIGTERM: every rank saves the same step, exit 130) requeues the job, and the
  requeued job resumes from that checkpoint. Submitted with `sbatch`, or printed (`--dry-run`).
- **k8s**: a Kubeflow PyTorchJob manifest (Master + Workers), each pod the same command with the
  operator's MASTER_ADDR / MASTER_PORT as the rendezvous; printed, for `kubectl apply -f -`.

Standard library only: the recipe is loaded (and linted) to name the job and its run directory,
nothing heavy is imported.

What a recipe, an override or an option holds never becomes a command of its own (the recipe, or
the run directory it names, may come from someone else): in the script's shell lines every value
is shell-quoted; an #SBATCH line is read by sbatch, not the shell, and cannot be quoted, so its
values are checked (no newline, control character, space, quote, backslash, `#` or `%`) and
refused with the option or key named; the job name is made of safe characters; --env names are
names. A k8s object name is a DNS-1035 label, and a `$` in a value is `$$` (the kubelet expands
`$(VAR)` in a container's command). The script is written as outputs.write_output writes: never
through a link, `--script PATH` replaces a file only with --force.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

SBATCH = """#!/bin/bash
# rltune launch slurm: {nodes} node(s) x {procs} rank(s), written by rltune; docs/scale.md
#SBATCH --job-name={name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
{gpus}#SBATCH --output={log}
#SBATCH --open-mode=append
#SBATCH --requeue
{extra}set -uo pipefail

# the rendezvous: torchrun's c10d store on the job's first node
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
PORT=${{RLTUNE_RDZV_PORT:-29400}}
# a dead or stalled rank ends the job (trainer.collective_timeout_s), not hangs it
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
{env}
srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\
  {command} --rdzv-endpoint "$HEAD:$PORT"
code=$?
# preempted or cancelled with SIGTERM: every rank saved the same step and exited 130; run again
# (--resume auto continues from that checkpoint)
if [ "$code" -eq 130 ]; then
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$code"
"""


def train_command(python: str, recipe_path: str, overrides: list[str], nodes: int, procs: int) -> list[str]:
    """What every node runs (without the rendezvous endpoint, which the scheduler knows)."""
    return [python, "-m", "rltune", "train", recipe_path, *overrides, "--nnodes", str(nodes), "--nproc", str(procs),
            "--resume", "auto"]


def _refuse(problem: str, fix: str):
    from rltune.errors import RecipeInputError

    raise RecipeInputError(problem, fix=fix)


# what an #SBATCH value may not hold: sbatch ends the value at a space, reads `#` as a comment and
# quotes and backslashes as its own syntax, expands `%` in file names; a newline (or any control or
# separator character) would end the line, and what follows would be a line of the script
_NOT_IN_DIRECTIVE = set(" \t\"'\\#%")
_SLURM_TIME = re.compile(r"(\d+-)?\d+(:\d+){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)


def _bad_char(value: str) -> str | None:
    for c in value:
        if c in _NOT_IN_DIRECTIVE or c.isspace() or unicodedata.category(c)[0] in "CZ":
            return c
    return None


def directive_value(value: str, what: str, fix: str) -> str:
    """`value` as it may stand in an #SBATCH line, or a RecipeInputError (exit 2) naming `what`."""
    if not value:
        _refuse(f"{what} is empty", fix)
    c = _bad_char(value)
    if c is not None:
        c = {" ": "a space", "\n": "a newline", "\t": "a tab"}.get(c, repr(c))
        _refuse(f"{what} {value!r} holds {c}, which an #SBATCH line cannot hold (it would end the value, or "
                "the line, and what follows would be read as something else)", fix)
    return value


def job_name(output_dir: str) -> str:
    """rltune-BASENAME of the run directory, in characters safe anywhere (a directive, a file name)."""
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(output_dir).name).strip("-.") or "run"
    return f"rltune-{base}"[:63]


def k8s_name(output_dir: str, nodes: int) -> str:
    """A DNS-1035 label (lower case letters, digits, '-'; a letter first, none of '-' last), short
    enough that the operator's pod and service names (NAME-worker-I) are labels too."""
    base = re.sub(r"[^a-z0-9]+", "-", Path(output_dir).name.lower()).strip("-") or "run"
    limit = 63 - len(f"-worker-{max(nodes - 2, 0)}")
    return f"rltune-{base}"[:limit].rstrip("-")


def _check_counts(nodes: int, procs: int | None, gpus: int) -> None:
    for what, n, least in (("--nodes", nodes, 1), ("--procs-per-node", procs, 1), ("--gpus-per-node", gpus, 0)):
        if n is not None and (not isinstance(n, int) or n < least):
            _refuse(f"{what} {n} must be at least {least}", f"e.g. {what} {max(least, 1)}")


def _env_lines(env: list[str]) -> str:
    out = []
    for e in env:
        name, eq, value = e.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            _refuse(f"--env {e!r} is not NAME=VALUE (NAME: letters, digits and '_', not a digit first)",
                    "e.g. --env NCCL_SOCKET_IFNAME=ib0")
        out.append(f"export {name}={shlex.quote(value)}")
    return "\n".join(out)


def sbatch_script(recipe_path: str, overrides: list[str], name: str, run_dir: Path, nodes: int, procs: int,
                  gpus: int, partition: str | None, time_limit: str | None, account: str | None,
                  env: list[str]) -> str:
    """The script; every value checked (directives) or shell-quoted (the rest) - RecipeInputError
    (exit 2) for one a directive cannot hold."""
    _check_counts(nodes, procs, gpus)
    directive_value(name, "the job name", "set trainer.output_dir to a directory whose name is letters, digits, "
                    "'-', '_' or '.'")
    log = run_dir / "slurm-%j.out"
    directive_value(str(run_dir), "trainer.output_dir, as an absolute path,",
                    "set trainer.output_dir to a path without spaces, quotes, control characters, '#', '%' or "
                    "backslashes (the job's log, #SBATCH --output, is written there)")
    if time_limit and not _SLURM_TIME.fullmatch(time_limit):
        _refuse(f"--time {time_limit!r} is not a Slurm time limit",
                "e.g. --time 24:00:00, --time 1-12:00:00 (days-hours:minutes:seconds) or --time 90 (minutes)")
    extra = ""
    for key, value in (("partition", partition), ("time", time_limit), ("account", account)):
        if value is not None:
            directive_value(value, f"--{key}", f"give --{key} as the cluster names it: letters, digits, "
                            "'-', '_', '.', ',' (no spaces, quotes, '#' or '%')")
            extra += f"#SBATCH --{key}={value}\n"
    return SBATCH.format(
        name=name, nodes=nodes, procs=procs, log=log, extra=extra,
        gpus=f"#SBATCH --gpus-per-node={gpus}\n" if gpus else "",
        env=_env_lines(env),
        command=shlex.join(train_command(sys.executable, str(Path(recipe_path).resolve()), overrides, nodes, procs)))


def pytorchjob(recipe_path: str, overrides: list[str], name: str, nodes: int, procs: int, gpus: int, image: str) -> str:
    """A Kubeflow PyTorchJob (kubeflow.org/v1): one Master and nodes-1 Workers, one pod per node.
    The kubelet expands `$(VAR)` in a container's command (`$$` is a `$`): every `$` of a value is
    doubled, the rendezvous endpoint alone is expanded."""
    cmd = [a.replace("$", "$$") for a in train_command("python", recipe_path, overrides, nodes, procs)]
    cmd += ["--rdzv-endpoint", "$(MASTER_ADDR):$(MASTER_PORT)"]

    def replica(count: int) -> dict:
        container = {"name": "pytorch", "image": image, "command": cmd,
                     "env": [{"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1"}]}
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        return {"replicas": count, "restartPolicy": "OnFailure", "template": {"spec": {"containers": [container]}}}

    specs = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
           "spec": {"pytorchReplicaSpecs": specs}}
    lines = ["# rltune launch k8s: apply with `kubectl apply -f -`; the recipe and the run directory",
             "# (trainer.output_dir) must be on a volume every pod mounts: add it to the containers", ""]
    return "\n".join(lines) + _yaml(job)


def _yaml(obj) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=False)


def run(target: str, recipe_path: str, overrides: list[str], nodes: int, procs: int | None, gpus: int,
        dry_run: bool, partition: str | None = None, time_limit: str | None = None, account: str | None = None,
        image: str | None = None, env: list[str] | None = None, script: str | None = None,
        force: bool = False) -> int:
    from rltune.commands.validate import check_all
    from rltune.errors import UserError
    from rltune.recipe import format_findings, has_errors

    _check_counts(nodes, procs, gpus)
    procs = procs or max(gpus, 1)
    # linted at the job's world size (nodes x procs), as each rank's `train --nnodes N --nproc P` will
    # lint it: a recipe valid at one rank may not divide over 32 (issue 46 item 3)
    at_world = list(overrides) + [f"trainer.nnodes={nodes}", f"trainer.nproc={procs}"]
    recipe, findings = check_all(recipe_path, at_world)
    shown = [f for f in findings if f.severity in ("error", "warning")]
    if shown:
        print(format_findings(shown, "text"), file=sys.stderr)
    if recipe is None or has_errors(findings):   # the job would only fail on the cluster
        again = shlex.join(["rltune", "validate", str(recipe_path), *at_world])
        print(f"rltune: {recipe_path}: the recipe has errors at {nodes} node(s) x {procs} rank(s) = world size "
              f"{nodes * procs}; nothing written or submitted (see `{again}`)", file=sys.stderr)
        return 1
    if target == "k8s":
        if not image:
            raise UserError("rltune launch k8s needs --image: a container image with rltune installed")
        print(pytorchjob(recipe_path, overrides, k8s_name(recipe.trainer.output_dir, nodes), nodes, procs, gpus,
                         image), end="")
        return 0
    name = job_name(recipe.trainer.output_dir)
    run_dir = Path(recipe.trainer.output_dir).resolve()
    text = sbatch_script(recipe_path, overrides, name, run_dir, nodes, procs, gpus, partition, time_limit,
                         account, env or [])
    if dry_run:
        print(text, end="")
        return 0
    if script:
        path = Path(script)
    else:
        slurm = run_dir / "slurm"
        if slurm.is_symlink() or (slurm.exists() and not slurm.is_dir()):
            what = f"a link (to {os.readlink(slurm)})" if slurm.is_symlink() else "not a directory"
            _refuse(f"{slurm} is {what}; rltune writes the job script in it and never writes through a link",
                    f"remove it ({slurm}), or give the script another place with --script PATH")
        path = slurm / f"{name}.sbatch"
    from rltune.outputs import write_output

    run_dir.mkdir(parents=True, exist_ok=True)
    # never through a link; --script PATH: an existing file only with --force; the default is rltune's own
    write_output(path, text, force=force, replace_ok=script is None)
    if shutil.which("sbatch") is None:
        raise UserError(f"wrote {path}, but `sbatch` is not on PATH here\n  fix: run `sbatch {path}` on the "
                        "cluster's login node (or use --dry-run to print the script)")
    done = subprocess.run(["sbatch", str(path)], capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise UserError(f"sbatch {path} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    print(f"rltune: submitted {path}; the job's log: {run_dir}/slurm-<jobid>.out", file=sys.stderr)
    return 0
