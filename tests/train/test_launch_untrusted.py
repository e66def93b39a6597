"""`rltune launch slurm|k8s` with values from a recipe or a received run directory (issue 45,
items 4 and 5): nothing they hold becomes a shell command or an #SBATCH line of its own.

- shell parts of the sbatch script are shell-quoted; #SBATCH directive values (a line the shell
  never reads, sbatch parses it) are checked and refused with the option or key named;
- k8s object names are DNS-1035 labels, and `$(...)` in a value is not expanded by the kubelet;
- node, GPU and rank counts are positive (exit 2);
- the script is never written through a link, and `--script PATH` replaces a file only with --force.
These run the CLI only (no training): the sbatch shim runs the script with `srun` logging its
command instead of running it."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import yaml

from trainlib import cli_env, run_cli, tiny_recipe

SHIMS = {
    # runs the script at once in $SHIM_CWD, as a job would, and says what sbatch says
    "sbatch": """#!/bin/bash
export SLURM_JOB_ID=4242 SLURM_NNODES=2 SLURM_JOB_NODELIST="node[1-2]"
cd "$SHIM_CWD" && bash "$1" > "$SHIM_CWD/job.out" 2>&1
echo "Submitted batch job 4242"
""",
    "scontrol": """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then echo 127.0.0.1; fi
""",
    # the command, one argument a line, instead of running it
    "srun": """#!/bin/bash
while [ "${1#--}" != "$1" ]; do shift; done
printf '%s\\n' "$@" > "$SHIM_CWD/srun.args"
""",
}


def _recipe(d, **overrides):
    """tiny-ppo with batch sizes that divide over every world size launched here (2, 3, 12, 16 ranks):
    launch lints at nodes x procs per node (issue 46 item 3), and these tests are about the script."""
    return tiny_recipe(d, "tiny-ppo.yaml", rollout__batch_size=48, train__batch_size=192, train__micro_batch_size=4,
                       **overrides)


def _env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in SHIMS.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    return cli_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SHIM_CWD=str(cwd))


def _pwned(tmp_path):
    return [p for p in tmp_path.rglob("*") if p.name.startswith("PWNED")]


def _directives(script: str) -> list[str]:
    """The #SBATCH lines sbatch reads: those before the first line that is not a comment."""
    out = []
    for line in script.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            out.append(line)
    return out


def test_a_recipe_output_dir_with_a_newline_runs_nothing(tmp_path):
    """output_dir "run\\ntouch PWNED\\n" used to become a line of the script (and cut off the
    #SBATCH lines after it): it is refused, naming the key, with the fix; no script, no file."""
    bad = str(tmp_path / "run\ntouch PWNED\n")
    path = _recipe(tmp_path, trainer__output_dir=bad)
    env = _env(tmp_path)
    for extra in (["--dry-run"], []):
        res = run_cli("launch", "slurm", path, "--nodes", "2", *extra, env=env)
        assert res.returncode == 2, (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
        assert "trainer.output_dir" in res.stderr and "fix:" in res.stderr and "Traceback" not in res.stderr
        assert "#SBATCH" not in res.stdout
    assert not _pwned(tmp_path) and not (tmp_path / "cwd" / "job.out").exists()
    # the same through an override (a value on the command line, or in a received recipe)
    path = _recipe(tmp_path)
    res = run_cli("launch", "slurm", path, "--nodes", "2", f"trainer.output_dir={bad}", env=env)
    assert res.returncode == 2 and "trainer.output_dir" in res.stderr, res.stderr[-2000:]
    assert not _pwned(tmp_path)


@pytest.mark.parametrize("opt,value", [("--partition", "gpu\ntouch PWNED"), ("--partition", "gpu debug"),
                                       ("--time", "24:00:00\n#SBATCH --uid=0"), ("--time", "1 day"),
                                       ("--account", "me#x"), ("--account", "a'b"),
                                       ("--partition", "gpu\r"), ("--account", "x\u2028touch PWNED")])
def test_directive_values_a_directive_cannot_hold_are_refused(tmp_path, opt, value):
    path = _recipe(tmp_path)
    env = _env(tmp_path)
    for extra in (["--dry-run"], []):
        res = run_cli("launch", "slurm", path, "--nodes", "2", opt, value, *extra, env=env)
        assert res.returncode == 2, (res.returncode, res.stdout[-2000:])
        assert opt in res.stderr and "fix:" in res.stderr and "Traceback" not in res.stderr
        assert "#SBATCH" not in res.stdout
    assert not (tmp_path / "run" / "slurm").exists() and not _pwned(tmp_path)


def test_shell_values_are_quoted_and_every_directive_kept(tmp_path):
    """A recipe path, overrides and --env values full of shell syntax: the script passes
    `bash -n`, keeps every #SBATCH line, runs (under the shims) without creating anything, and
    srun gets each value as one argument, unchanged."""
    d = tmp_path / "a dir $(touch PWNED1) `touch PWNED2`; touch PWNED3 'q\"'"
    d.mkdir()
    out = tmp_path / "out$(touch${IFS}PWNED4)"
    path = _recipe(d, trainer__output_dir=str(out))
    env = _env(tmp_path)
    weird = "x $(touch PWNED5); `touch PWNED6` \"'\n touch PWNED7"
    res = run_cli("launch", "slurm", path, "--nodes", "2", "--gpus-per-node", "8", "--partition", "gpu,debug",
                  "--time", "1-12:00:00", "--account", "proj-1.a", f"logging.wandb_project={weird}",
                  "--env", f"NCCL_DEBUG={weird}", "--env", "EMPTY=", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    script = next((out / "slurm").glob("*.sbatch"))
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    directives = _directives(text)
    for want in ("--job-name=", "--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", f"--output={out}/",
                 "--open-mode=append", "--requeue", "--partition=gpu,debug", "--time=1-12:00:00",
                 "--account=proj-1.a"):
        assert any(line.startswith(f"#SBATCH {want}") for line in directives), (want, directives)
    assert not _pwned(tmp_path), (_pwned(tmp_path), (tmp_path / "cwd" / "job.out").read_text())
    args = (tmp_path / "cwd" / "srun.args").read_text()
    assert str(path.resolve()) + "\n" in args and f"logging.wandb_project={weird}\n" in args
    job = (tmp_path / "cwd" / "job.out").read_text()
    assert "not a valid identifier" not in job and "command not found" not in job, job


def test_env_names_must_be_names(tmp_path):
    path = _recipe(tmp_path)
    for bad in ("A;touch PWNED=1", "1X=2", "X Y=1", "=1", "NOEQUALS"):
        res = run_cli("launch", "slurm", path, "--nodes", "2", "--env", bad, "--dry-run")
        assert res.returncode == 2, (bad, res.returncode, res.stdout[-500:])
        assert "--env" in res.stderr and "fix:" in res.stderr and "#SBATCH" not in res.stdout


@pytest.mark.parametrize("target", ["slurm", "k8s"])
@pytest.mark.parametrize("args", [["--nodes", "0"], ["--nodes", "-2"], ["--nodes", "2", "--gpus-per-node", "-8"],
                                  ["--nodes", "2", "--procs-per-node", "0"],
                                  ["--nodes", "2", "--procs-per-node", "-1"]])
def test_counts_must_be_positive(tmp_path, target, args):
    path = _recipe(tmp_path)
    extra = ["--dry-run"] if target == "slurm" else ["--image", "img:1"]
    res = run_cli("launch", target, path, *args, *extra)
    assert res.returncode == 2, (res.returncode, res.stdout[-1000:])
    assert "#SBATCH" not in res.stdout and "PyTorchJob" not in res.stdout and "Traceback" not in res.stderr
    assert args[-2] in res.stderr


DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


@pytest.mark.parametrize("run_name", ["My_Run.v2 (copy)", "run\ntouch PWNED", "-x-", "\u00e9t\u00e9_2024", "x" * 200,
                                      "___"])
def test_k8s_names_are_valid_and_values_not_expanded(tmp_path, run_name):
    d = tmp_path / "r$(HOME)"
    d.mkdir()
    path = _recipe(d, trainer__output_dir=str(tmp_path / run_name))
    res = run_cli("launch", "k8s", path, "--nodes", "12", "--image", "img:1", "logging.wandb_project=$(SECRET)")
    assert res.returncode == 0, res.stderr[-2000:]
    job = yaml.safe_load(res.stdout)
    name = job["metadata"]["name"]
    assert DNS_1035.fullmatch(name) and len(name + "-worker-10") <= 63, name
    cmd = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    assert str(path).replace("$", "$$") in cmd and "logging.wandb_project=$$(SECRET)" in cmd
    assert cmd[-2:] == ["--rdzv-endpoint", "$(MASTER_ADDR):$(MASTER_PORT)"]


# ------------------------------------------------------------------ item 5: where the script goes


def test_the_script_is_never_written_through_a_link(tmp_path):
    """A received run directory whose slurm/NAME.sbatch (or slurm/ itself) is a link: refused,
    the file it points at unchanged."""
    path = _recipe(tmp_path)
    env = _env(tmp_path)
    victim = tmp_path / "victim.sh"
    victim.write_text("mine\n")
    slurm = tmp_path / "run" / "slurm"
    slurm.mkdir(parents=True)
    (slurm / "rltune-run.sbatch").symlink_to(victim)
    res = run_cli("launch", "slurm", path, "--nodes", "2", env=env)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "link" in res.stderr and "fix:" in res.stderr and "Submitted" not in res.stdout
    assert victim.read_text() == "mine\n"
    (slurm / "rltune-run.sbatch").unlink()
    (slurm / "rltune-run.sbatch").symlink_to(tmp_path / "nowhere.sh")      # dangling
    res = run_cli("launch", "slurm", path, "--nodes", "2", env=env)
    assert res.returncode == 2 and not (tmp_path / "nowhere.sh").exists(), res.stderr[-2000:]
    # slurm/ itself a link to another directory
    (slurm / "rltune-run.sbatch").unlink()
    slurm.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    slurm.symlink_to(elsewhere)
    res = run_cli("launch", "slurm", path, "--nodes", "2", env=env)
    assert res.returncode == 2 and "link" in res.stderr, res.stderr[-2000:]
    assert list(elsewhere.iterdir()) == []


def test_script_path_replaces_a_file_only_with_force(tmp_path):
    path = _recipe(tmp_path)
    env = _env(tmp_path)
    mine = tmp_path / "job.sh"
    mine.write_text("mine\n")
    res = run_cli("launch", "slurm", path, "--nodes", "2", "--script", mine, env=env)
    assert res.returncode == 2 and "exists" in res.stderr and "--force" in res.stderr, res.stderr[-2000:]
    assert mine.read_text() == "mine\n" and "Submitted" not in res.stdout
    link = tmp_path / "link.sh"
    link.symlink_to(mine)
    res = run_cli("launch", "slurm", path, "--nodes", "2", "--script", link, "--force", env=env)
    assert res.returncode == 2 and "link" in res.stderr and mine.read_text() == "mine\n", res.stderr[-2000:]
    res = run_cli("launch", "slurm", path, "--nodes", "2", "--script", mine, "--force", env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "#SBATCH --nodes=2" in mine.read_text() and "Submitted batch job 4242" in res.stdout
    # the default path is rltune's own: a second launch rewrites it without --force
    for _ in range(2):
        res = run_cli("launch", "slurm", path, "--nodes", "3", env=env)
        assert res.returncode == 0, res.stderr[-2000:]
    assert "#SBATCH --nodes=3" in (tmp_path / "run" / "slurm" / "rltune-run.sbatch").read_text()
