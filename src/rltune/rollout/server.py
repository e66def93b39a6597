"""A rollout server's process and HTTP calls (docs/rollout-server.md).

`ServerProcess` starts a server command (`vllm serve ...`) behind `server_guard`, which keeps the
server from outliving the trainer on any exit path: a normal end or an exception (`stop`, also
registered with `atexit`), Ctrl-C and SIGTERM (the trainer's handlers end in `stop` too), and a
SIGKILL of the trainer (the guard reads EOF on a pipe only the trainer held and ends the server's
process group). Its output goes to a log file whose last lines every error quotes.

`call` is one JSON request with a timeout: a server that stops answering makes it fail with
`ServerError`, never hang. Standard library only (no vLLM or HTTP client import).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


class ServerError(RuntimeError):
    """A rollout server did not start, answer or accept a request (message is user-facing)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS picks it; another process could take it before
    the server binds it, which the server's start then reports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def route_address(url: str) -> str:
    """The address of this machine on the route to `url`'s host (what that host reaches us at):
    127.0.0.1 for a local server; otherwise the source address the OS picks (no packet is sent)."""
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or "127.0.0.1"
    if host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def log_tail(path: Path | None, lines: int = 20, max_bytes: int = 64 << 10) -> str:
    """The last `lines` lines of a log file (reading at most its last `max_bytes`), or ''."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def call(base_url: str, method: str, route: str, body: dict | None = None, timeout_s: float = 60.0,
         log: Path | None = None) -> dict:
    """One JSON request; the decoded JSON answer ({} for an empty one). Any failure (refused,
    timed out, an HTTP error status, an answer that is not JSON) raises ServerError naming the
    request, with the server's last log lines when `log` is given."""
    url = base_url.rstrip("/") + route
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as err:
        detail = err.read()[:2000].decode("utf-8", "replace")
        raise ServerError(_failure(f"{method} {url} answered HTTP {err.code}: {detail}", log)) from None
    except (urllib.error.URLError, OSError) as err:   # refused, reset, timed out
        why = getattr(err, "reason", err)
        raise ServerError(_failure(f"{method} {url} failed: {why} (timeout {timeout_s:g} s)", log)) from None
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        raise ServerError(_failure(f"{method} {url} answered something that is not JSON: {raw[:200]!r}", log)) from None


def _failure(what: str, log: Path | None) -> str:
    tail = log_tail(log)
    return f"{what}\n  the server's last log lines ({log}):\n{_indent(tail)}" if tail else what


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def healthy(base_url: str, timeout_s: float = 2.0) -> bool:
    """Whether GET /health answers 200 now."""
    try:
        call(base_url, "GET", "/health", timeout_s=timeout_s)
        return True
    except ServerError:
        return False


class ServerProcess:
    """A server command run behind `server_guard`; `start()` returns once GET /health answers."""

    def __init__(self, cmd: list[str], base_url: str, log_path: Path, env: dict | None = None,
                 startup_timeout_s: float = 600.0):
        self.cmd, self.base_url, self.log_path = list(cmd), base_url, Path(log_path)
        self.env = env
        self.startup_timeout_s = float(startup_timeout_s)
        self.guard: subprocess.Popen | None = None
        self._pipe_w: int | None = None

    def start(self) -> "ServerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        read_fd, self._pipe_w = os.pipe()
        os.set_inheritable(self._pipe_w, False)
        with open(self.log_path, "ab") as log:
            self.guard = subprocess.Popen(
                [sys.executable, "-m", "rltune.rollout.server_guard", str(read_fd), "--", *self.cmd],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                pass_fds=(read_fd,))
        os.close(read_fd)
        atexit.register(self.stop)
        self._wait_healthy()
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.guard.poll() is not None:
                code = self.guard.returncode
                self.stop()
                raise ServerError(_failure(f"the rollout server exited with code {code} before it answered "
                                           f"{self.base_url}/health (command: {' '.join(self.cmd[:3])} ...)",
                                           self.log_path))
            if healthy(self.base_url):
                return
            time.sleep(0.5)
        self.stop()
        raise ServerError(_failure(f"the rollout server did not answer {self.base_url}/health within "
                                   f"rollout.server.startup_timeout_s ({self.startup_timeout_s:g} s)", self.log_path))

    @property
    def alive(self) -> bool:
        return self.guard is not None and self.guard.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """End the server and everything it started (idempotent). Closing the pipe is what tells
        the guard; SIGTERM to the guard is the same request, SIGKILL the last resort."""
        if self._pipe_w is not None:
            try:
                os.close(self._pipe_w)
            except OSError:
                pass
            self._pipe_w = None
        guard, self.guard = self.guard, None
        if guard is None:
            return
        try:
            guard.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            guard.kill()
            guard.wait()
        atexit.unregister(self.stop)


__all__ = ["ServerError", "ServerProcess", "call", "free_port", "healthy", "log_tail"]
