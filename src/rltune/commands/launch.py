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
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
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


def sbatch_script(recipe_path: str, overrides: list[str], name: str, run_dir: Path, nodes: int, procs: int,
                  gpus: int, partition: str | None, time_limit: str | None, account: str | None,
                  env: list[str]) -> str:
    extra = "".join(f"#SBATCH --{k}={v}\n" for k, v in (("partition", partition), ("time", time_limit),
                                                         ("account", account)) if v)
    return SBATCH.format(
        name=name, nodes=nodes, procs=procs, log=run_dir / "slurm-%j.out", extra=extra,
        gpus=f"#SBATCH --gpus-per-node={gpus}\n" if gpus else "",
        env="\n".join(f"export {shlex.quote(e)}" for e in env),
        command=shlex.join(train_command(sys.executable, str(Path(recipe_path).resolve()), overrides, nodes, procs)))


def pytorchjob(recipe_path: str, overrides: list[str], name: str, nodes: int, procs: int, gpus: int, image: str) -> str:
    """A Kubeflow PyTorchJob (kubeflow.org/v1): one Master and nodes-1 Workers, one pod per node."""
    cmd = train_command("python", recipe_path, overrides, nodes, procs) + ["--rdzv-endpoint", "$(MASTER_ADDR):$(MASTER_PORT)"]

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
        image: str | None = None, env: list[str] | None = None, script: str | None = None) -> int:
    from rltune.commands.validate import check_all
    from rltune.errors import UserError
    from rltune.recipe import format_findings, has_errors

    procs = procs or max(gpus, 1)
    if nodes < 1 or procs < 1:
        raise UserError("--nodes and --procs-per-node must be at least 1")
    recipe, findings = check_all(recipe_path, overrides)
    if recipe is None or has_errors(findings):   # the job would only fail on the cluster
        print(format_findings([f for f in findings if f.severity == "error"], "text"), file=sys.stderr)
        return 2
    name = f"rltune-{Path(recipe.trainer.output_dir).name or 'run'}"[:63]
    if target == "k8s":
        if not image:
            raise UserError("rltune launch k8s needs --image: a container image with rltune installed")
        print(pytorchjob(recipe_path, overrides, name.lower().replace("_", "-"), nodes, procs, gpus, image), end="")
        return 0
    for e in env or []:
        if "=" not in e:
            raise UserError(f"--env {e!r} is not NAME=VALUE")
    run_dir = Path(recipe.trainer.output_dir).resolve()
    text = sbatch_script(recipe_path, overrides, name, run_dir, nodes, procs, gpus, partition, time_limit,
                         account, env or [])
    if dry_run:
        print(text, end="")
        return 0
    path = Path(script) if script else run_dir / "slurm" / f"{name}.sbatch"
    path.parent.mkdir(parents=True, exist_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if shutil.which("sbatch") is None:
        raise UserError(f"wrote {path}, but `sbatch` is not on PATH here\n  fix: run `sbatch {path}` on the "
                        "cluster's login node (or use --dry-run to print the script)")
    done = subprocess.run(["sbatch", str(path)], capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        raise UserError(f"sbatch {path} failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    print(f"rltune: submitted {path}; the job's log: {run_dir}/slurm-<jobid>.out", file=sys.stderr)
    return 0
