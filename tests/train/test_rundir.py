"""The run directory as a contract (issue 11): one run per directory (a lock; an old run moved
aside, never mixed), changed recipe keys take effect or are refused, final/ is atomic and
re-exported when a kill lost it, every checkpoint broken is refused, storage failures and a
second Ctrl-C are named, the resume hint is the full command."""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainlib import ROOT, cli_env, read_metrics, run_inproc, tiny_recipe

# tiny PPO, a checkpoint every step, linear LR decay (so the schedule factor is visible)
BASE = dict(trainer__max_steps=2, trainer__save_every=1, trainer__keep_checkpoints=3, trainer__seed=5,
            trainer__eval_every=0, actor__lr_schedule="linear", actor__min_lr_ratio=0.5,
            critic__lr_schedule="linear", critic__min_lr_ratio=0.5)


def _quiet_main(*args) -> int:
    from rltune.cli import main

    try:
        main([str(a) for a in args])
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    finally:
        logging.getLogger("rltune").handlers.clear()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-step PPO run: checkpoints step 1 and 2, final/. Started with an override that
    repeats the recipe's seed (the recipe, and so its hash, is the same as without it)."""
    tmp = tmp_path_factory.mktemp("finished")
    path = tiny_recipe(tmp, "tiny-ppo.yaml", **BASE)
    assert _quiet_main("train", path, "trainer.seed=5") == 0
    return tmp / "run"


def _copy(finished: Path, tmp_path: Path, **overrides) -> tuple[Path, Path]:
    """A copy of the finished run (another output_dir) and its recipe."""
    shutil.copytree(finished, tmp_path / "run")
    return tiny_recipe(tmp_path, "tiny-ppo.yaml", **(BASE | overrides)), tmp_path / "run"


def _ckpts(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


# ------------------------------------------------------------------ recipe changes on resume


def test_allow_recipe_change_takes_effect(finished, tmp_path, capfd):
    from rltune.engine.roles import lr_factor

    path, run_dir = _copy(finished, tmp_path)
    res = run_inproc(capfd, "train", path, "trainer.max_steps=4", "actor.lr=0.015", "critic.lr=0.045",
                     "algorithm.kl.coef=0.05", "algorithm.clip_range=0.15", "algorithm.entropy_coef=0.001",
                     "--allow-recipe-change")
    assert res.returncode == 0, res.stderr[-3000:]
    m = {x["step"]: x for x in read_metrics(run_dir)}
    assert sorted(m) == [1, 2, 3, 4]
    for step in (3, 4):  # the new base lr times the factor of the update that step made (0-based: step - 1)
        f = lr_factor(step - 1, 2, 4, "linear", 0.5)
        assert m[step]["actor/lr"] == pytest.approx(0.015 * f, rel=1e-6), step
        assert m[step]["critic/lr"] == pytest.approx(0.045 * f, rel=1e-6), step
        assert m[step]["kl_coef"] == pytest.approx(0.05)
    knobs = json.loads((run_dir / "checkpoints" / "step-00000004" / "state.json").read_text())["knobs"]
    assert knobs["clip_range"] == pytest.approx(0.15) and knobs["entropy_coef"] == pytest.approx(0.001)
    assert knobs["actor_lr"] == pytest.approx(0.015) and knobs["kl_coef"] == pytest.approx(0.05)
    assert "taking effect now" in res.stderr and "actor.lr: 0.01 -> 0.015" in res.stderr


def test_keys_fixed_for_a_run_are_refused_even_with_the_flag(finished, tmp_path, capfd):
    path, run_dir = _copy(finished, tmp_path)
    before = (run_dir / "metrics.jsonl").read_bytes()
    res = run_inproc(capfd, "train", path, "trainer.max_steps=3", "trainer.seed=6", "--allow-recipe-change")
    assert res.returncode == 1
    assert "cannot change on resume" in res.stderr and "trainer.seed: 5 -> 6" in res.stderr
    assert "--resume never" in res.stderr and "Traceback" not in res.stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == before


def test_copied_run_dir_raising_max_steps_is_not_a_change(finished, tmp_path, capfd):
    path, run_dir = _copy(finished, tmp_path)  # trainer.output_dir differs from the checkpoint's
    res = run_inproc(capfd, "train", path, "trainer.max_steps=3")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "changed" not in res.stderr and "max_steps" not in res.stderr.split("resumed from")[0]
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2, 3]


def test_recipe_change_classification():
    from rltune.train.resume import FIXED, check_changes, recipe_changes
    from rltune.train.setup import TrainError

    old = {"trainer": {"max_steps": 2, "output_dir": "a", "seed": 1}, "actor": {"lr": 0.1}, "logging": {"x": 1}}
    new = {"trainer": {"max_steps": 9, "output_dir": "b", "seed": 1, "new_key": None}, "actor": {"lr": 0.1},
           "logging": {"x": 2}}
    assert recipe_changes(old, new) == []          # bookkeeping and keys new to the schema are no change
    changes = recipe_changes(old, {**new, "actor": {"lr": 0.2}})
    assert [str(c) for c in changes] == ["actor.lr: 0.1 -> 0.2"]
    check_changes(changes, True, Path("step-1"), Path("run"))
    with pytest.raises(TrainError, match="--allow-recipe-change"):
        check_changes(changes, False, Path("step-1"), Path("run"))
    for key in ("model.policy", "algorithm.name", "algorithm.group_size", "train.batch_size", "actor.zero_stage",
                "trainer.precision", "trainer.seed"):
        assert key in FIXED
    # the world size may change: a resume re-partitions (docs/scale.md)
    assert recipe_changes(old, {**new, "trainer": {**new["trainer"], "nproc": 4, "nnodes": 2}}) == []


# ------------------------------------------------------------------ one run per directory


def test_resume_never_moves_the_old_run_aside(finished, tmp_path, capfd):
    path, run_dir = _copy(finished, tmp_path)
    res = run_inproc(capfd, "train", path, "trainer.max_steps=1", "--resume", "never")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "moved them to" in res.stderr and str(run_dir / "previous") in res.stderr
    assert _ckpts(run_dir) == ["step-00000001"]            # only the new run's
    old = next((run_dir / "previous").iterdir())
    assert sorted(p.name for p in (old / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]
    assert [m["step"] for m in read_metrics(old)] == [1, 2] and (old / "final").is_dir()
    assert [m["step"] for m in read_metrics(run_dir)] == [1]
    # the next --resume auto continues the new run, not the old one's higher step
    res = run_inproc(capfd, "train", path, "trainer.max_steps=2")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in res.stderr and "step-00000001 at step 1" in res.stderr
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2]


def test_resume_from_an_earlier_checkpoint_moves_the_later_ones_aside(finished, tmp_path, capfd):
    path, run_dir = _copy(finished, tmp_path)
    res = run_inproc(capfd, "train", path, "--resume", run_dir / "checkpoints" / "step-00000001")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "checkpoints after step-00000001" in res.stderr
    old = next((run_dir / "previous").iterdir())
    assert (old / "checkpoints" / "step-00000002").is_dir() and (old / "final").is_dir()
    assert _ckpts(run_dir) == ["step-00000001", "step-00000002"] and (run_dir / "final" / "manifest.json").exists()


def test_every_checkpoint_corrupt_is_refused_and_history_kept(finished, tmp_path, capfd):
    path, run_dir = _copy(finished, tmp_path)
    for ck in (run_dir / "checkpoints").iterdir():
        victim = max(ck.rglob("*.pt"), key=lambda p: p.stat().st_size)
        victim.write_bytes(victim.read_bytes()[:100])
    before = (run_dir / "metrics.jsonl").read_bytes()
    res = run_inproc(capfd, "train", path, "trainer.max_steps=3")
    assert res.returncode == 1
    assert "no usable checkpoint" in res.stderr and "--resume never" in res.stderr and "Traceback" not in res.stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == before
    assert _ckpts(run_dir) == ["step-00000001", "step-00000002"] and not (run_dir / "previous").exists()


def _start(path: Path, *extra, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rltune", "train", str(path), *map(str, extra)],
                            env=env or cli_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(cond, proc: subprocess.Popen, timeout: float = 300) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_second_run_into_the_same_directory_is_refused(tmp_path, capfd):
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", trainer__max_steps=500, trainer__save_every=1,
                       trainer__eval_every=0)
    run_dir = tmp_path / "run"
    proc = _start(path)
    try:
        _wait_for(lambda: (run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text(), proc)
        res = run_inproc(capfd, "train", path, "--resume", "never")
        assert res.returncode == 1
        assert "in use by another rltune run" in res.stderr and f"pid {proc.pid} " in res.stderr
        assert "fix:" in res.stderr and "Traceback" not in res.stderr
        assert not (run_dir / "previous").exists()  # the running run's files were left alone
    finally:
        proc.kill()
        proc.communicate()
    # the killed run's lock is stale: taken over with a warning
    res = run_inproc(capfd, "train", path, "trainer.max_steps=1")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "taking over the lock" in res.stderr and f"pid {proc.pid} " in res.stderr
    assert not (run_dir / ".lock").exists()


def test_lock_unit(tmp_path):
    from rltune.train.rundir import RunLock
    from rltune.train.setup import TrainError

    first = RunLock(tmp_path)
    assert first.acquire() is None
    with pytest.raises(TrainError, match=f"in use by another rltune run \\(pid {os.getpid()} "):
        RunLock(tmp_path).acquire()
    first.release()
    assert not (tmp_path / ".lock").exists()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / ".lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    lock = RunLock(tmp_path)
    assert f"left by pid {dead.pid}" in lock.acquire()
    lock.release()
    (tmp_path / ".lock").write_text(json.dumps({"pid": 1, "host": "elsewhere"}))
    with pytest.raises(TrainError, match="delete .*\\.lock"):
        RunLock(tmp_path).acquire()


def test_a_lock_naming_a_live_process_that_is_no_rltune_run_is_taken_over(tmp_path):
    # a received run directory's .lock naming pid 1 (alive, not rltune) used to advise `kill -INT 1`;
    # no run holds the flock, so the lock is stale: taken over with a warning that says why
    from rltune.train.rundir import RunLock

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for pid in (sleeper.pid,):   # (pid 1 in the report; its command line here is not ours to know)
            (tmp_path / ".lock").write_text(json.dumps({"pid": pid, "host": os.uname().nodename}))
            lock = RunLock(tmp_path)
            warning = lock.acquire()
            assert f"names pid {pid}, which is not an rltune run" in warning, warning
            assert "kill" not in warning
            lock.release()
    finally:
        sleeper.kill()
        sleeper.wait()


# ------------------------------------------------------------------ final/ is atomic and resumable


def test_final_export_lost_to_a_kill_is_exported_again(finished, tmp_path, capfd):
    path, run_dir = _copy(finished, tmp_path)
    # SIGKILL while final/ was written: no final/, a partial final.tmp/
    shutil.rmtree(run_dir / "final")
    (run_dir / "final.tmp").mkdir()
    (run_dir / "final.tmp" / "model.safetensors").write_bytes(b"\0" * 100)
    res = run_inproc(capfd, "train", path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (run_dir / "final" / "model.safetensors").exists(), res.stderr[-2000:]
    assert "final export" in res.stderr and "exporting it again" in res.stderr
    from rltune.train.checkpoint import final_problem, verify

    assert final_problem(run_dir / "final", 2) is None and not (run_dir / "final.tmp").exists()
    # a final/ with a truncated file is not complete either
    model = run_dir / "final" / "model.safetensors"
    model.write_bytes(model.read_bytes()[:1000])
    assert "truncated" in verify(run_dir / "final")
    res = run_inproc(capfd, "train", path)
    assert res.returncode == 0 and "exporting it again" in res.stderr
    assert final_problem(run_dir / "final", 2) is None
    res = run_inproc(capfd, "train", path)
    assert res.returncode == 0 and "nothing to do" in res.stderr


# ------------------------------------------------------------------ storage failures


@contextmanager
def _tmpfs(where: Path, options: str):
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (chmod does not stop root)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_disk_full_names_path_and_space_and_keeps_the_previous_checkpoint(finished, tmp_path, capfd):
    from rltune.train.checkpoint import verify

    manifest = json.loads((finished / "checkpoints" / "step-00000001" / "manifest.json").read_text())
    size = sum(f["size"] for f in manifest["files"].values())
    run_dir = tmp_path / "run"
    with _tmpfs(run_dir, f"size={int(size * 1.6) // 1024}k"):  # room for one checkpoint, not two
        path = tiny_recipe(tmp_path, "tiny-ppo.yaml", **BASE)
        res = run_inproc(capfd, "train", path)
        assert res.returncode == 1
        assert "no space left on device" in res.stderr and f"{run_dir / 'checkpoints'}" in res.stderr
        assert "needed" in res.stderr and "free there" in res.stderr and "fix: free at least" in res.stderr
        assert "step-00000001 is intact" in res.stderr and "rltune train" in res.stderr
        assert "probably a bug" not in res.stderr and "Traceback" not in res.stderr
        assert _ckpts(run_dir) == ["step-00000001"] and verify(run_dir / "checkpoints" / "step-00000001") is None


def test_read_only_run_dir_is_named(tmp_path, capfd):
    run_dir = tmp_path / "run"
    with _tmpfs(run_dir, "ro,size=64k"):
        path = tiny_recipe(tmp_path, "tiny-grpo.yaml", trainer__max_steps=1)
        res = run_inproc(capfd, "train", path)
    assert res.returncode == 1
    assert f"cannot write to the run directory {run_dir}: read-only file system" in res.stderr
    assert "fix:" in res.stderr and "probably a bug" not in res.stderr and "Traceback" not in res.stderr


def test_read_only_during_a_save_keeps_the_previous_checkpoint(tmp_path, capfd, monkeypatch):
    from rltune.train import checkpoint as ckpt

    calls = []
    real = ckpt.rng_state

    def failing(gen, *rest):
        calls.append(1)
        if len(calls) == 2:  # the second checkpoint: the disk went read-only meanwhile
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        return real(gen, *rest)

    monkeypatch.setattr(ckpt, "rng_state", failing)
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", trainer__max_steps=2, trainer__save_every=1, trainer__eval_every=0)
    res = run_inproc(capfd, "train", path)
    run_dir = tmp_path / "run"
    assert res.returncode == 1
    assert f"could not write checkpoint step 2 to {run_dir / 'checkpoints'}: read-only file system" in res.stderr
    assert "step-00000001 is intact" in res.stderr and "fix: make" in res.stderr
    assert "probably a bug" not in res.stderr
    assert _ckpts(run_dir) == ["step-00000001"] and ckpt.verify(run_dir / "checkpoints" / "step-00000001") is None


def test_storage_problem_classification(tmp_path):
    from rltune.train.rundir import storage_problem

    assert storage_problem(OSError(errno.ENOSPC, "x"), tmp_path) == "no space left on device"
    assert storage_problem(OSError(errno.EROFS, "x"), tmp_path) == "read-only file system"
    zip_err = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 512 vs 400")
    assert storage_problem(zip_err, tmp_path, needed=1 << 60) == "no space left on device"
    assert storage_problem(RuntimeError("shape mismatch"), tmp_path) is None
    assert storage_problem(OSError(errno.ENOENT, "x"), tmp_path) is None


# ------------------------------------------------------------------ Ctrl-C twice, the resume hint


def test_second_ctrl_c_abandons_the_save_and_the_hint_resumes_the_same_run(tmp_path, capfd):
    run_dir = tmp_path / "my run"  # a space: the hint must quote it
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", trainer__max_steps=50, trainer__save_every=1, trainer__eval_every=0)
    proc = _start(path, f"trainer.output_dir={run_dir}", "trainer.keep_checkpoints=5",
                  env=cli_env(RLTUNE_FAULTS="slow_save@2"))
    partial = run_dir / "checkpoints" / ".tmp-step-00000002"
    _wait_for(lambda: (partial / "rng-rank0.pt").exists(), proc)  # inside the save of step 2
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "press Ctrl-C again to abort the save" in err
    assert "the save of checkpoint step 2 was abandoned" in err
    assert "a resume continues from the last complete checkpoint" in err and "step-00000001 (step 1)" in err
    assert "Traceback" not in err
    assert _ckpts(run_dir) == ["step-00000001"]  # the partial temp dir is gone
    hint = err.split("resume with: ")[-1].splitlines()[0]
    args = shlex.split(hint)
    assert args[:3] == ["rltune", "train", str(path)]
    assert f"trainer.output_dir={run_dir}" in args and "trainer.keep_checkpoints=5" in args
    assert args[-2:] == ["--resume", "auto"]
    res = run_inproc(capfd, *args[1:], "trainer.max_steps=2")  # the hint continues the same run
    assert res.returncode == 0, res.stderr[-3000:]
    assert "step-00000001 at step 1" in res.stderr
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2]


def test_resume_hint_quotes_every_argument():
    from rltune.train.rundir import resume_hint

    hint = resume_hint(["r.yaml", "trainer.output_dir=a b", "--nproc", "2", "--resume", "never",
                        "--allow-recipe-change"], Path("r.yaml"))
    assert hint == "rltune train r.yaml 'trainer.output_dir=a b' --nproc 2 --resume auto"


# ------------------------------------------------------------------ paths that are not what they seem


def test_resume_path_messages(tmp_path):
    from rltune.train.resume import choose_checkpoint
    from rltune.train.rundir import prepare
    from rltune.train.setup import TrainError

    log = logging.getLogger("test")
    with pytest.raises(TrainError, match="does not exist"):
        choose_checkpoint(tmp_path, str(tmp_path / "nope"), log)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(TrainError, match="symlink loop"):
        choose_checkpoint(tmp_path, str(loop), log)
    with pytest.raises(TrainError, match="symlink loop"):
        prepare(loop)
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrainError, match="is a file"):
        choose_checkpoint(tmp_path, str(tmp_path / "file"), log)
    half = tmp_path / "checkpoints" / "step-00000003"
    half.mkdir(parents=True)
    with pytest.raises(TrainError, match="did not finish"):
        choose_checkpoint(tmp_path, str(half), log)


def test_run_recipe_names_its_source_for_diagnose_patch(finished):
    """RUN/recipe.yaml starts with `# source: <the user's recipe>`: `diagnose --patch` edits that
    file (comments kept) instead of writing the resolved recipe."""
    first = (finished / "recipe.yaml").read_text().splitlines()[0]
    assert first.startswith("# source: /") and first.endswith(".yaml")
    from rltune.commands.diagnose import recipe_source

    src = recipe_source(finished)
    assert src is not None and src.parent == finished.parent.resolve() and src.is_file()
    # ... and the command's key=value overrides, which diagnose --patch shows (and writes in with --apply-overrides)
    from rltune.commands.diagnose import run_overrides

    assert (finished / "recipe.yaml").read_text().splitlines()[1] == "# overrides: trainer.seed=5"
    assert run_overrides(finished) == (["trainer.seed=5"], None)


@pytest.mark.parametrize("name", ["recipe.yaml", "train.log", "metrics.jsonl", ".lock"])
def test_a_link_in_the_run_directory_is_never_written_through(tmp_path, capfd, name):
    # a received run directory whose recipe.yaml / train.log is a link: resuming into it overwrote or
    # appended to the file outside (issue 25, item 2); the run now stops before writing, naming the link
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours\n")
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", trainer__max_steps=1, trainer__eval_every=0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / name).symlink_to(victim)
    res = run_inproc(capfd, "train", path)
    assert res.returncode != 0 and f"{run_dir / name} is a link" in res.stderr and "fix:" in res.stderr, res.stderr[-2000:]
    assert victim.read_text() == "not yours\n" and "Traceback" not in res.stderr


def test_resume_of_a_finished_run_builds_nothing(finished, tmp_path, capfd, monkeypatch):
    """`--resume auto` on a finished, complete run says there is nothing to do before any engine is
    built (the quickstart's engines cost 18 s and 2.7 GB) and changes no file of the run."""
    import rltune.train.setup as setup

    path, run_dir = _copy(finished, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}

    def no_build(*a, **k):
        raise AssertionError("engines built for a run with nothing left to do")

    monkeypatch.setattr(setup, "build", no_build)
    res = run_inproc(capfd, "train", path, "--resume", "auto")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "already finished at step 2" in res.stderr and "nothing to do" in res.stderr
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*") if p.name != "train.log"} == \
        {p: t for p, t in before.items() if p.name != "train.log"}
    # with final/ gone the engines are built again and the export redone (the test above)
    shutil.rmtree(run_dir / "final")
    res = run_inproc(capfd, "train", path, "--resume", "auto")
    assert res.returncode != 0 and "engines built for a run" in res.stderr, res.stderr[-2000:]


def test_a_reward_function_that_changes_directory_moves_nothing(tmp_path, capfd, monkeypatch):
    # issue 45 item 6: a relative trainer.output_dir was re-read against the working directory at
    # every write, so a reward function that called os.chdir sent checkpoints and final/ there
    # while train.log (opened at the start) stayed
    work, other = tmp_path / "work", tmp_path / "other"
    work.mkdir(), other.mkdir()
    (tmp_path / "rew.py").write_text(
        "import os\n"
        f"def wander(prompts, completions, **kw):\n    os.chdir({str(other)!r})\n    return [0.0] * len(prompts)\n")
    path = tiny_recipe(tmp_path, reward={"functions": [f"{tmp_path / 'rew.py'}:wander"]}, trainer__max_steps=2,
                       trainer__save_every=1, trainer__eval_every=0, trainer__output_dir="runs/rel")
    monkeypatch.chdir(work)
    res = run_inproc(capfd, "train", path)
    assert res.returncode == 0, res.stderr[-3000:]
    run = work / "runs" / "rel"
    assert (run / "train.log").is_file() and (run / "final").is_dir(), sorted(os.listdir(run))
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step-")), \
        sorted(os.listdir(run / "checkpoints"))
    assert not any(other.iterdir()), sorted(str(p) for p in other.rglob("*"))


def test_the_rollout_servers_logs_belong_to_the_run(tmp_path):
    """Issue 45.5: rollout-server.log (and a rank's rollout-server-rankR.log) are the run's files: a
    new run moves the old run's aside with the rest (a new server log never follows an old one in
    the same file), and a link of that name is refused before anything is written."""
    from rltune.errors import UserError
    from rltune.train.rundir import move_aside, refuse_links

    run = tmp_path / "run"
    run.mkdir()
    for name in ("metrics.jsonl", "rollout-server.log", "rollout-server-rank1.log", "notes.txt"):
        (run / name).write_text("old\n")
    dest = move_aside(run)
    assert sorted(p.name for p in dest.iterdir()) == ["metrics.jsonl", "rollout-server-rank1.log",
                                                      "rollout-server.log"]
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt", "previous"]
    outside = tmp_path / "elsewhere.log"
    outside.write_text("theirs\n")
    (run / "rollout-server-rank2.log").symlink_to(outside)
    with pytest.raises(UserError, match="rollout-server-rank2.log is a link"):
        refuse_links(run)
    assert outside.read_text() == "theirs\n"


def test_events_jsonl_exists_from_the_start(tmp_path):
    """Issue 46 item 9: the start-up lines name RUN_DIR/events.jsonl, so the run creates it (empty)
    with metrics.jsonl, not when the first event fires; a resumed run's events are kept."""
    from types import SimpleNamespace

    from rltune.recipe.schema import Recipe
    from rltune.train.run import _monitoring

    recipe = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                                    "reward": {"functions": ["builtin:exact_answer"]}})
    run = tmp_path / "run"
    _, _, sinks = _monitoring(recipe, run, SimpleNamespace(is_main=True, rank=0), None)
    for s in sinks:
        s.close()
    assert (run / "events.jsonl").is_file() and (run / "events.jsonl").read_text() == ""
    assert (run / "metrics.jsonl").is_file()
    (run / "events.jsonl").write_text('{"step": 1, "kind": "kl_level", "severity": "info", "message": "m"}\n')
    _, _, sinks = _monitoring(recipe, run, SimpleNamespace(is_main=True, rank=0), 1)
    for s in sinks:
        s.close()
    assert "kl_level" in (run / "events.jsonl").read_text()
    other = tmp_path / "rank1"
    _monitoring(recipe, other, SimpleNamespace(is_main=False, rank=1), None)
    assert not (other / "events.jsonl").exists()             # rank 0 writes the run's files
