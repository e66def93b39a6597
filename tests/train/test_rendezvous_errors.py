"""Rendezvous mistakes stop `rltune train` at once with one message and the fix (exit 3), before
torchrun starts: a port already taken on the node that opens the rendezvous (torchrun would wait
for a store that never answers and fail minutes later under a page of C++ frames), a host that
does not resolve, an endpoint that is not HOST:PORT. docs/scale.md."""

from __future__ import annotations

import os
import socket
import time

import pytest

from rltune.train.launch import rendezvous_problem
from trainlib import cli_env, run_cli, tiny_recipe


@pytest.fixture
def taken_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _train(tmp_path, *args):
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", trainer__max_steps=1)
    t0 = time.monotonic()
    res = run_cli("train", path, "--nproc", "2", *args, timeout=120, env=cli_env())
    return res, time.monotonic() - t0


def test_port_in_use_is_refused_at_once_with_the_fix(tmp_path, taken_port):
    res, seconds = _train(tmp_path, "--rdzv-endpoint", f"127.0.0.1:{taken_port}")
    assert res.returncode == 3, res.stderr[-2000:]
    assert f"port {taken_port} on 127.0.0.1 is in use" in res.stderr and "fix: choose a free port" in res.stderr
    assert "Traceback" not in res.stderr and "frame #" not in res.stderr
    assert "launching" not in res.stderr          # torchrun never started
    assert seconds < 60
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("endpoint,says", [("no-such-host.invalid:29500", "does not resolve"),
                                           ("127.0.0.1", "is not HOST:PORT"),
                                           ("127.0.0.1:99999", "is not HOST:PORT")])
def test_bad_endpoint_is_refused_at_once(tmp_path, endpoint, says):
    res, _ = _train(tmp_path, "--rdzv-endpoint", endpoint)
    assert res.returncode == 3, res.stderr[-2000:]
    assert says in res.stderr and "fix:" in res.stderr and "Traceback" not in res.stderr


def test_port_check_only_where_this_node_opens_the_rendezvous(taken_port):
    """Several node agents may share a host (the first to bind opens the rendezvous): without a
    node rank, a multi-node run does not check the port; node rank 0, or one node, does."""
    args = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{taken_port}"]
    assert rendezvous_problem(args, 2) is None
    assert "is in use" in rendezvous_problem(args + ["--node-rank", "0"], 2)
    assert rendezvous_problem(args + ["--node-rank", "1"], 2) is None
    assert "is in use" in rendezvous_problem(args, 1)


@pytest.mark.parametrize("text,says", [(None, "no such file"), ("# only a comment\n", "no host in it"),
                                       ("node1 slots=8\nnode2 8\n", "line 2: 'node2 8' is not `HOST slots=N`")])
def test_deepspeed_hostfile_mistakes_name_the_file_and_line(tmp_path, text, says):
    hostfile = tmp_path / "hostfile"
    if text is not None:
        hostfile.write_text(text)
    res, _ = _train(tmp_path, "--launcher", "deepspeed", "--hostfile", str(hostfile))
    assert res.returncode == 2, res.stderr[-2000:]
    assert says in res.stderr and "Traceback" not in res.stderr and "launching" not in res.stderr


def _hostfile(tmp_path, text):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(text)
    return hostfile


def _ds_train(tmp_path, hostfile, *args, env=None):
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", trainer__max_steps=1)
    return run_cli("train", path, "--nproc", "2", "--launcher", "deepspeed", "--hostfile", str(hostfile), *args,
                   timeout=120, env=env or cli_env())


def _one_message(res, *says):
    assert res.returncode == 2, res.stderr[-3000:]
    for s in says:
        assert s in res.stderr, res.stderr[-3000:]
    assert "fix:" in res.stderr and "Traceback" not in res.stderr
    assert "launching" not in res.stderr and "resume from" not in res.stderr     # nothing started: nothing to resume


def test_deepspeed_hostfile_host_not_reachable_over_ssh_is_one_message(tmp_path):
    """The DeepSpeed launcher checks `ssh HOST hostname` itself, and failing, printed two
    tracebacks and then rltune's resume hint for a job that never started (issue 45, 11d)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"     # an ssh that reaches nothing (as here: no ssh server), wherever ssh is installed
    ssh.write_text("#!/bin/sh\necho 'ssh: connect to host localhost port 22: Connection refused' >&2\nexit 255\n")
    ssh.chmod(0o755)
    env = cli_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    res = _ds_train(tmp_path, _hostfile(tmp_path, "localhost slots=2\n"), env=env)
    _one_message(res, "localhost is not reachable over ssh", "Connection refused")


def test_deepspeed_hostfile_without_ssh_or_pdsh_is_one_message(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = cli_env(PATH=str(bin_dir))     # no ssh, no pdsh
    res = _ds_train(tmp_path, _hostfile(tmp_path, "localhost slots=2\n"), env=env)
    _one_message(res, "`ssh` is not on PATH")
    # ssh that works, two hosts: the launcher starts them with pdsh
    ssh = bin_dir / "ssh"
    ssh.write_text("#!/bin/sh\necho node\n")
    ssh.chmod(0o755)
    res = _ds_train(tmp_path, _hostfile(tmp_path, "node1 slots=2\nnode2 slots=2\n"), "--nnodes", "2", env=env)
    _one_message(res, "`pdsh` is not on PATH")


def test_node_rank_out_of_range_or_without_an_endpoint_is_refused():
    args = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29500"]
    assert "a node rank is 0 to 1" in rendezvous_problem(args + ["--node-rank", "2"], 2)
    assert "a node rank is 0 to 1" in rendezvous_problem(args + ["--node-rank", "-1"], 2)
    assert "needs --rdzv-endpoint" in rendezvous_problem(["--node-rank", "1"], 2)


def test_node_rank_takes_the_static_rendezvous():
    """torchrun's c10d rendezvous ignores --node-rank (torch.distributed.run: `rank` goes to the
    rendezvous only for the static backend): with a node rank, the launcher runs the static one."""
    from types import SimpleNamespace

    from rltune.train.launch import launch_command

    recipe = SimpleNamespace(trainer=SimpleNamespace(launcher="torchrun", nproc=1, nnodes=2,
                                                     rendezvous_timeout_s=60.0))
    args = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:29500"]
    cmd = launch_command(recipe, "r.yaml", [], "auto", False, False, args + ["--node-rank", "1"])
    assert cmd[cmd.index("--rdzv-backend") + 1] == "static" and cmd[cmd.index("--node-rank") + 1] == "1"
    assert cmd[cmd.index("--rdzv-conf") + 1] == "timeout=60"
    cmd = launch_command(recipe, "r.yaml", [], "auto", False, False, args)
    assert cmd[cmd.index("--rdzv-backend") + 1] == "c10d" and "--node-rank" not in cmd
