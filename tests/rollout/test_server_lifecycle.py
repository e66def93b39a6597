"""A rollout server never outlives the trainer (issue 28): started behind `server_guard`, it and
the process it spawned (as vLLM's engine core) are gone within a bounded time after a normal stop,
an exception, SIGINT, SIGTERM or SIGKILL of the trainer. A stand-in server (fake_server.py) keeps
these fast; tests/vllm/test_vllm_server.py starts the real `vllm serve`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rltune.rollout.server import ServerError, ServerProcess, call, free_port

FAKE = Path(__file__).with_name("fake_server.py")
GONE_WITHIN_S = 20.0   # the guard's SIGTERM grace (10 s) plus slack


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie is gone for our purpose (its parent has not reaped it yet)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], within: float = GONE_WITHIN_S) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return
        time.sleep(0.1)
    raise AssertionError(f"still running after {within} s: {[p for p in pids if _alive(p)]}")


def _pids(pidfile: Path) -> list[int]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if pidfile.exists() and pidfile.read_text().endswith("\n"):
            return [int(x) for x in pidfile.read_text().split()]
        time.sleep(0.05)
    raise AssertionError("the fake server wrote no pids")


def _server(tmp_path: Path, mode: str = "ok", timeout: float = 30.0) -> tuple[ServerProcess, Path]:
    port = free_port()
    pidfile = tmp_path / "pids"
    proc = ServerProcess([sys.executable, str(FAKE), str(port), str(pidfile), mode], f"http://127.0.0.1:{port}",
                         tmp_path / "server.log", startup_timeout_s=timeout)
    return proc, pidfile


def test_start_waits_for_health_and_stop_ends_the_whole_group(tmp_path):
    proc, pidfile = _server(tmp_path)
    proc.start()
    pids = _pids(pidfile)
    guard = proc.guard.pid
    assert all(_alive(p) for p in pids) and call(proc.base_url, "GET", "/health") == {"ok": True}
    proc.stop()
    _wait_gone(pids + [guard], within=5)
    proc.stop()   # idempotent


def test_a_server_that_exits_at_start_is_an_error_with_its_log(tmp_path):
    proc, _ = _server(tmp_path, mode="exit")
    with pytest.raises(ServerError) as e:
        proc.start()
    assert "exited with code 3" in str(e.value) and "cannot load the model" in str(e.value)
    assert not proc.alive


def test_a_request_the_server_never_answers_fails_within_its_timeout(tmp_path):
    proc, _ = _server(tmp_path, mode="hang")
    proc.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(ServerError) as e:
            call(proc.base_url, "GET", "/slow", timeout_s=1.0, log=proc.log_path)
        assert time.monotonic() - t0 < 10
        assert "/slow failed" in str(e.value) and "fake server: listening" in str(e.value)   # the log tail
    finally:
        proc.stop()


def test_a_server_that_is_down_is_a_clear_error():
    with pytest.raises(ServerError) as e:
        call(f"http://127.0.0.1:{free_port()}", "GET", "/health", timeout_s=2.0)
    assert "GET http://127.0.0.1:" in str(e.value) and "/health failed" in str(e.value)


TRAINER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from rltune.rollout.server import ServerProcess
    proc = ServerProcess([sys.executable, {fake!r}, sys.argv[1], sys.argv[2]], "http://127.0.0.1:" + sys.argv[1],
                         {log!r}, startup_timeout_s=30)
    proc.start()
    print("ready", flush=True)
    if sys.argv[3] == "raise":
        raise RuntimeError("the trainer failed")
    time.sleep(3600)
""")


@pytest.mark.parametrize("how", ["raise", "SIGINT", "SIGTERM", "SIGKILL"])
def test_the_server_does_not_outlive_its_trainer(tmp_path, how):
    """A trainer process that starts a server, then raises or is sent a signal: the server and
    its child are gone within GONE_WITHIN_S (SIGTERM and SIGKILL run no Python cleanup at all:
    the guard sees the trainer's end of the pipe close)."""
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER.format(tests=str(FAKE.parent), fake=str(FAKE), log=str(tmp_path / "server.log")))
    port, pidfile = free_port(), tmp_path / "pids"
    # Ctrl-C as an interactive trainer gets it: a shell without job control (a CI job started in
    # the background) hands its children SIGINT ignored, and Python then never raises KeyboardInterrupt
    trainer = subprocess.Popen([sys.executable, str(script), str(port), str(pidfile),
                                "raise" if how == "raise" else "wait"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert trainer.stdout.readline().strip() == "ready", trainer.stderr.read()
        pids = _pids(pidfile)
        if how != "raise":
            trainer.send_signal(getattr(signal, how))
        trainer.wait(timeout=60)
        _wait_gone(pids)
    finally:
        if trainer.poll() is None:
            trainer.kill()


def test_an_attached_server_that_is_down_is_a_clear_error_at_start(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
    from trainlib import run_cli, tiny_recipe

    url = f"http://127.0.0.1:{free_port()}"
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", rollout__engine="vllm-server", rollout__server={"url": url})
    res = run_cli("train", path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert f"rollout.server.url {url} does not answer GET /health\n  fix: start the server" in res.stderr


TRAINER_WITH_WEIGHTS = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, {tests!r})
    from rltune.rollout.server import ServerProcess
    prefix = os.path.join({shm!r}, "rltune-weights-%d-" % os.getpid())
    proc = ServerProcess([sys.executable, {fake!r}, sys.argv[1], sys.argv[2]], "http://127.0.0.1:" + sys.argv[1],
                         {log!r}, env=dict(os.environ, RLTUNE_WEIGHT_FILES=prefix), startup_timeout_s=30)
    proc.start()
    with open(prefix + "abc123.safetensors", "wb") as f:   # a sync in progress
        f.write(b"x" * 4096)
    print("ready", prefix, flush=True)
    time.sleep(3600)
""")


def test_a_killed_trainers_weight_file_is_removed_by_the_guard(tmp_path):
    """Issue 45 item 8: a SIGKILLed trainer left its weight file (up to 512 MiB, in RAM on
    /dev/shm) until a reboot; the guard, which sees the trainer die, removes it."""
    shm = tmp_path / "shm"
    shm.mkdir()
    other = shm / "rltune-weights-1-keep.safetensors"   # another trainer's: not touched
    other.write_bytes(b"y")
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER_WITH_WEIGHTS.format(tests=str(FAKE.parent), fake=str(FAKE), shm=str(shm),
                                                  log=str(tmp_path / "server.log")))
    port, pidfile = free_port(), tmp_path / "pids"
    trainer = subprocess.Popen([sys.executable, str(script), str(port), str(pidfile)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = trainer.stdout.readline().split()
        assert line and line[0] == "ready", trainer.stderr.read()
        assert len(list(shm.glob(f"rltune-weights-{trainer.pid}-*"))) == 1
        pids = _pids(pidfile)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=60)
        _wait_gone(pids)
        deadline = time.monotonic() + 10
        while list(shm.glob(f"rltune-weights-{trainer.pid}-*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(shm.glob(f"rltune-weights-{trainer.pid}-*")) == [] and other.exists()
    finally:
        if trainer.poll() is None:
            trainer.kill()


def test_a_new_run_sweeps_the_weight_files_of_dead_trainers(tmp_path):
    from rltune.rollout.vllm_server import sweep_weight_files

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f"rltune-weights-{dead.pid}-a1b2c3.safetensors"
    mine = tmp_path / f"rltune-weights-{os.getpid()}-d4e5f6.safetensors"   # a live trainer's (this one)
    other = tmp_path / "rltune-weights-notes.txt"
    for f in (left, mine, other):
        f.write_bytes(b"x")
    link = tmp_path / f"rltune-weights-{dead.pid}-link.safetensors"
    link.symlink_to(other)
    assert sweep_weight_files(str(tmp_path)) == [left.name]
    assert not left.exists() and mine.exists() and other.exists() and link.is_symlink()
