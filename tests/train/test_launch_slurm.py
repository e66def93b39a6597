"""`rltune launch slurm` and `launch k8s` (issue 29, item 2). The sbatch script runs under a fake
`sbatch` / `srun` / `scontrol` (shell shims on PATH) on this machine with two "nodes", one rank
each: the job trains through torchrun's rendezvous on the first node and ends like a
`--nproc 2` run. The PyTorchJob manifest is checked for what the operator needs."""

from __future__ import annotations

import os

import yaml

from trainlib import cli_env, free_port, read_metrics, run_cli, tiny_recipe

SHIMS = {
    # runs the script at once, as a 2-node allocation would, and says what sbatch says
    "sbatch": """#!/bin/bash
export SLURM_JOB_ID=4242 SLURM_NNODES=2 SLURM_JOB_NODELIST="node[1-2]"
bash "$1" > "$(dirname "$1")/job.out" 2>&1
echo "Submitted batch job 4242"
""",
    # both "nodes" are this machine
    "scontrol": """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then echo 127.0.0.1; echo 127.0.0.1; fi
if [ "$1" = "requeue" ]; then echo "requeue $2" >> "$SHIM_LOG"; fi
""",
    # one task per node: the command once per node, in parallel, with its SLURM ids; the worst exit
    "srun": """#!/bin/bash
while [ "${1#--}" != "$1" ]; do shift; done
pids=()
for i in $(seq 0 $((SLURM_NNODES - 1))); do
  SLURM_PROCID=$i SLURM_NODEID=$i "$@" &
  pids+=($!)
done
code=0
for p in "${pids[@]}"; do wait "$p" || code=$?; done
echo "srun $*" >> "$SHIM_LOG"
exit $code
""",
}


def _shims(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in SHIMS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_the_sbatch_script_trains_on_two_nodes_under_a_slurm_shim(tmp_path):
    path = tiny_recipe(tmp_path, "tiny-ppo.yaml", rollout__do_sample=False, trainer__max_steps=2, trainer__eval_every=0)
    bin_dir = _shims(tmp_path)
    env = cli_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SHIM_LOG=str(tmp_path / "shim.log"),
                  RLTUNE_RDZV_PORT=str(free_port()))
    res = run_cli("launch", "slurm", path, "--nodes", "2", "--procs-per-node", "1", env=env, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Submitted batch job 4242" in res.stdout
    script = tmp_path / "run" / "slurm" / "rltune-run.sbatch"
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --requeue" in text and "--resume auto" in text
    out = (script.parent / "job.out").read_text()
    m = read_metrics(tmp_path / "run")
    assert [x["step"] for x in m] == [1, 2], out[-3000:]
    assert (tmp_path / "run" / "final" / "config.json").exists()
    log = (tmp_path / "shim.log").read_text()
    assert "--nnodes 2 --nproc 1" in log and "--rdzv-endpoint 127.0.0.1:" in log and "requeue" not in log


def test_dry_run_prints_the_script_and_a_bad_recipe_submits_nothing(tmp_path):
    # batch sizes that divide over 4 x 8 ranks: launch lints at the job's world size (tests/train/test_launch_lint.py)
    path = tiny_recipe(tmp_path, "tiny-ppo.yaml", rollout__batch_size=96, train__batch_size=384, train__micro_batch_size=4)
    res = run_cli("launch", "slurm", path, "--nodes", "4", "--gpus-per-node", "8", "--partition", "gpu",
                  "--env", "NCCL_SOCKET_IFNAME=ib0", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --gpus-per-node=8" in res.stdout and "#SBATCH --partition=gpu" in res.stdout
    assert "--nnodes 4 --nproc 8" in res.stdout and "export NCCL_SOCKET_IFNAME=ib0" in res.stdout
    assert not (tmp_path / "run" / "slurm").exists()
    res = run_cli("launch", "slurm", path, "--nodes", "2", "actor.lr=-1", "--dry-run")
    assert res.returncode == 1 and "actor.lr" in res.stderr and "#SBATCH" not in res.stdout


def test_k8s_prints_a_pytorchjob(tmp_path):
    path = tiny_recipe(tmp_path, "tiny-ppo.yaml", rollout__batch_size=96, train__batch_size=384, train__micro_batch_size=4)
    res = run_cli("launch", "k8s", path, "--nodes", "3", "--gpus-per-node", "8", "--image", "ghcr.io/me/rltune:1")
    assert res.returncode == 0, res.stderr
    job = yaml.safe_load(res.stdout)
    assert job["kind"] == "PyTorchJob"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 2
    c = specs["Worker"]["template"]["spec"]["containers"][0]
    assert c["image"] == "ghcr.io/me/rltune:1" and c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert c["command"][-2:] == ["--rdzv-endpoint", "$(MASTER_ADDR):$(MASTER_PORT)"] and "--nnodes" in c["command"]
    res = run_cli("launch", "k8s", path, "--nodes", "2")
    assert res.returncode == 1 and "--image" in res.stderr and "Traceback" not in res.stderr


