"""Start N ranks through an existing launcher (torchrun or the DeepSpeed launcher).

rltune writes no scheduler: `--nproc`, `--nnodes`, `--hostfile` and rendezvous options are
passed through to the launcher, which starts `python -m rltune train ...` on every rank.
"""

from __future__ import annotations

import errno
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
        args = list(launcher_args)
        static = _arg(args, "--node-rank") is not None and "--rdzv-backend" in args
        if static:
            # torchrun's c10d rendezvous ignores --node-rank (it numbers the nodes as they join);
            # its static rendezvous takes it: node rank 0 serves the store at the endpoint
            args[args.index("--rdzv-backend") + 1] = "static"
        cmd = [sys.executable, "-m", "rltune.train.torchrun", "--nproc_per_node", str(t.nproc),
               "--nnodes", str(t.nnodes), *args]
        if t.nnodes == 1 and not any(a.startswith("--rdzv") or a.startswith("--master") for a in args):
            cmd.append("--standalone")
        elif static:   # the store waits this long for every node (then: one line, train/torchrun.py)
            cmd += ["--rdzv-conf", f"timeout={max(1, round(t.rendezvous_timeout_s))}"]
        elif "--rdzv-backend" in args:   # c10d: a node that never joins stops the job, with a message
            cmd += ["--rdzv-conf", f"join_timeout={t.rendezvous_timeout_s:g}"]
        cmd += ["-m", "rltune"]
    return cmd + child


def _arg(args: list[str], *names: str) -> str | None:
    for i, a in enumerate(args[:-1]):
        if a in names:
            return args[i + 1]
    return None


def rendezvous_problem(launcher_args: list[str], nnodes: int) -> str | None:
    """Before torchrun starts: what would make its rendezvous fail, as rltune's message (or None).
    - the endpoint's host does not resolve (every node);
    - the endpoint's port is taken on this host, where this node is the one that opens it: one
      node, or `--node-rank 0` (without a node rank, several agents may share a host, as in the
      tests, and the first to bind is the host: nothing to check). torchrun would otherwise wait
      for a store that never answers and fail minutes later under a page of C++ frames."""
    import socket

    endpoint = _arg(launcher_args, "--rdzv-endpoint")
    node_rank = _arg(launcher_args, "--node-rank", "--node_rank")
    if node_rank is not None and not (node_rank.isdigit() and int(node_rank) < max(nnodes, 1)):
        return (f"--node-rank {node_rank}: a node rank is 0 to {max(nnodes, 1) - 1} (--nnodes {nnodes})\n  fix: give "
                "each node its own rank, 0 on the node that --rdzv-endpoint names")
    if node_rank is not None and nnodes > 1 and not endpoint:
        return (f"--node-rank {node_rank} needs --rdzv-endpoint HOST:PORT: node rank 0 serves the rendezvous there\n"
                "  fix: add --rdzv-endpoint NODE0:29500 on every node (NODE0: the address of the node with rank 0)")
    if not endpoint:
        return None
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return (f"--rdzv-endpoint {endpoint!r} is not HOST:PORT\n  fix: e.g. --rdzv-endpoint node0.cluster:29500 "
                "(a host every node reaches, a free port on it)")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError as err:
        return (f"the rendezvous host {host!r} (--rdzv-endpoint {endpoint}) does not resolve: {err}\n"
                "  fix: use a name or address of the first node that every node resolves (e.g. its IP address)")
    if not (nnodes == 1 or _arg(launcher_args, "--node-rank", "--node_rank") == "0"):
        return None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as torch's store: TIME_WAIT is free
            try:
                probe.bind(addr)
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    return (f"port {port} on {host} is in use: the rendezvous (--rdzv-endpoint {endpoint}) needs it "
                            f"free on this node, which opens it\n  fix: choose a free port (--rdzv-endpoint "
                            f"{host}:OTHER_PORT on every node), or stop what holds it (`ss -ltnp 'sport = :{port}'`: "
                            "another job, or an earlier run still running)")
                return None   # not an address of this host (another node opens it), or torchrun's to report
    return None


def hostfile_problem(launcher_args: list[str]) -> str | None:
    """The DeepSpeed launcher's hostfile (`HOST slots=N` per line, # comments): missing or malformed,
    as rltune's message naming the file and line (the launcher would fail with a traceback)."""
    import re
    from pathlib import Path

    name = _arg(launcher_args, "--hostfile")
    if not name:
        return None
    path = Path(name)
    if not path.is_file():
        return f"--hostfile {name}: no such file\n  fix: write one line per host, `HOST slots=N` (N: ranks on it)"
    hosts = 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            if i > 100_000:
                return f"{name}: more than 100,000 lines; a hostfile has one line per host"
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            if not re.fullmatch(r"[A-Za-z0-9_.:\-\[\]]+\s+slots=[1-9][0-9]{0,4}", text):
                return (f"{name}, line {i}: {text[:80]!r} is not `HOST slots=N`\n  fix: one host per line, e.g. "
                        "`node1 slots=8` (DeepSpeed's hostfile format)")
            hosts += 1
    if not hosts:
        return f"{name}: no host in it\n  fix: one line per host, `HOST slots=N`"
    return None


def _hostfile_hosts(name: str) -> list[str]:
    from pathlib import Path

    with Path(name).open(encoding="utf-8", errors="replace") as f:
        return [t.split()[0] for t in (line.split("#", 1)[0].strip() for line in f) if t]


def ssh_problem(launcher_args: list[str], nnodes: int) -> str | None:
    """With a hostfile the DeepSpeed launcher runs `ssh HOST hostname` on its first host (and
    `ssh HOST hostname -I` for the master address) before anything starts, and starts the ranks
    of several hosts with pdsh. A missing ssh or pdsh, or a host that ssh does not reach without a
    password, ended in two chained tracebacks (and rltune's resume hint for a job that never
    started): here, one message and the fix, before the launcher starts. Checks the hosts the job
    uses (the first --nnodes of the file, as the launcher takes them). After hostfile_problem."""
    import shutil

    name = _arg(launcher_args, "--hostfile")
    if not name:
        return None
    hosts = _hostfile_hosts(name)[:max(nnodes, 1)]
    alone = ("on one node, leave out --hostfile (`--launcher deepspeed --nproc N` needs no ssh); or use torchrun's "
             "rendezvous (`--rdzv-endpoint HOST:PORT` on every node)")
    if shutil.which("ssh") is None:
        return (f"--hostfile {name}: the DeepSpeed launcher reaches the hosts it lists over ssh, and `ssh` is not on "
                f"PATH here\n  fix: install an ssh client with passwordless login to every host in it; or, {alone}")
    if len(hosts) > 1 and shutil.which("pdsh") is None:
        return (f"--hostfile {name}: the DeepSpeed launcher starts the ranks of its {len(hosts)} hosts with pdsh, and "
                f"`pdsh` is not on PATH here\n  fix: install pdsh (e.g. `apt-get install pdsh`) on this node; or "
                "use torchrun's rendezvous (`--rdzv-endpoint HOST:PORT` on every node)")
    for host in hosts:
        cmd = ["ssh", "-o", "PasswordAuthentication=no", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host,
               "hostname"]
        try:
            done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:200]
        except subprocess.TimeoutExpired:
            done, why = None, "no answer in 30 s"
        except OSError as err:
            done, why = None, str(err)
        if done is None or done.returncode != 0:
            return (f"--hostfile {name}: host {host} is not reachable over ssh without a password ({why}); the "
                    f"DeepSpeed launcher starts its ranks that way\n  fix: set up passwordless ssh to every host in "
                    f"{name} (`ssh {host} hostname` must work without a prompt); or, {alone}")
    return None


def launch(recipe, recipe_path, overrides, resume, allow_recipe_change, quiet, launcher_args, extra=()) -> int:
    if recipe.trainer.launcher == "deepspeed":
        problem = hostfile_problem(launcher_args) or ssh_problem(launcher_args, recipe.trainer.nnodes)
        if problem:
            print(f"rltune: {problem}", file=sys.stderr)
            return 2
    if recipe.trainer.launcher == "torchrun":
        problem = rendezvous_problem(launcher_args, recipe.trainer.nnodes)
        if problem:
            print(f"rltune: {problem}", file=sys.stderr)
            return RENDEZVOUS_FAILED
    cmd = launch_command(recipe, recipe_path, overrides, resume, allow_recipe_change, quiet, launcher_args, extra)
    env = dict(os.environ, RLTUNE_LAUNCHED="1")
    if not _has_cuda():
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(recipe.trainer.nproc, 1))))
    restarts = 0 if "--dry-run" in extra else recipe.trainer.max_restarts
    for attempt in range(restarts + 1):
        if attempt:   # a fresh launcher, fresh processes and process groups: the last valid checkpoint goes on
            cmd = launch_command(recipe, recipe_path, overrides, "auto", allow_recipe_change, quiet, launcher_args,
                                 extra)
            print(f"rltune: restart {attempt}/{restarts} (trainer.max_restarts) from the last valid checkpoint",
                  file=sys.stderr)
        code = _call(cmd, dict(env, RLTUNE_ATTEMPT=str(attempt)))
        if code in (0, 130, RENDEZVOUS_FAILED, 2):    # done, interrupted, no rendezvous, bad input: not a crash
            break
    if code not in (0, 130, RENDEZVOUS_FAILED):
        from pathlib import Path

        from .rundir import resume_hint

        print("rltune: the job stopped because a rank failed (its own message, or the line above, says how); "
              f"resume from the last checkpoint with: {resume_hint(None, Path(recipe_path))}", file=sys.stderr)
    return code


def _call(cmd: list[str], env: dict) -> int:
    print("rltune: launching " + " ".join(cmd), file=sys.stderr)
    try:
        return subprocess.call(cmd, env=env)
    except FileNotFoundError as err:
        from rltune.errors import UserError

        raise UserError(f"launcher {cmd[0]!r} not found: {err}; install it or set trainer.launcher: torchrun") from err
    except KeyboardInterrupt:  # the launcher forwards the signal; the ranks save and exit
        return 130


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False
