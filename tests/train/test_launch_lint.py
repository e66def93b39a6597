"""`rltune launch slurm|k8s` lints the recipe at the job's world size (issue 46 item 3).

Each rank runs `rltune train RECIPE --nnodes N --nproc P`, which lints at N x P ranks; launch used
to lint at the recipe's own trainer.nproc x nnodes (usually 1), so a recipe with two divisibility
errors at 4 x 8 ranks printed its script with exit 0 and the job failed on the cluster. Now the
findings are printed as `validate` prints them and nothing is written or submitted (exit 1)."""

from __future__ import annotations

import os

import pytest

from trainlib import cli_env, run_inproc, tiny_recipe

SBATCH = """#!/bin/bash
echo "$1" >> "$SHIM_LOG"
echo "Submitted batch job 4242"
"""


def _env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "sbatch").write_text(SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SHIM_LOG": str(tmp_path / "sbatch.log")}


def test_the_recipe_is_valid_at_one_rank(tmp_path, capfd):
    """The premise: tiny-ppo (rollout 16, train 64, micro 16) is clean at one rank."""
    path = tiny_recipe(tmp_path, "tiny-ppo.yaml")
    res = run_inproc(capfd, "validate", path, "--skip-files")
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize("extra", [["--dry-run"], []])
def test_slurm_lints_at_nodes_times_ranks_and_writes_nothing(tmp_path, capfd, extra):
    path = tiny_recipe(tmp_path, "tiny-ppo.yaml")
    res = run_inproc(capfd, "launch", "slurm", path, "--nodes", "4", "--gpus-per-node", "8", *extra,
                     env=_env(tmp_path))
    assert res.returncode == 1, (res.returncode, res.stderr[-3000:])
    assert res.stderr.count("error divisibility") == 2, res.stderr[-3000:]
    assert "world size 32" in res.stderr and "fix:" in res.stderr and "Traceback" not in res.stderr
    assert "nothing written or submitted" in res.stderr
    assert "#SBATCH" not in res.stdout and "Submitted" not in res.stdout
    assert not (tmp_path / "run").exists() and not (tmp_path / "sbatch.log").exists()


def test_a_recipe_override_does_not_hide_the_job_world_size(tmp_path, capfd):
    """trainer.nproc=1 on the command line: the job still runs 4 x 8 ranks (--nnodes/--nproc win)."""
    path = tiny_recipe(tmp_path, "tiny-ppo.yaml")
    res = run_inproc(capfd, "launch", "slurm", path, "--nodes", "4", "--procs-per-node", "8", "trainer.nproc=1",
                     "trainer.nnodes=1", "--dry-run")
    assert res.returncode == 1 and "world size 32" in res.stderr, res.stderr[-3000:]
    assert "#SBATCH" not in res.stdout


def test_k8s_lints_at_nodes_times_ranks(tmp_path, capfd):
    path = tiny_recipe(tmp_path, "tiny-ppo.yaml")
    res = run_inproc(capfd, "launch", "k8s", path, "--nodes", "4", "--gpus-per-node", "8", "--image", "img:1")
    assert res.returncode == 1, (res.returncode, res.stderr[-3000:])
    assert "error divisibility" in res.stderr and "world size 32" in res.stderr
    assert "PyTorchJob" not in res.stdout


def test_batch_sizes_that_divide_launch(tmp_path, capfd):
    path = tiny_recipe(tmp_path, "tiny-ppo.yaml", rollout__batch_size=32, train__batch_size=128,
                       train__micro_batch_size=4)
    res = run_inproc(capfd, "launch", "slurm", path, "--nodes", "4", "--gpus-per-node", "8", "--dry-run")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "--nnodes 4 --nproc 8" in res.stdout and "error" not in res.stderr
