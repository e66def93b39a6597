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
from pathlib import Path


from ..errors import UserError


class ServerError(UserError):
    """A rollout server did not start, answer or accept a request (message is user-facing). Not a
    RuntimeError: the training loop reads a RuntimeError as a failed collective ("another rank
    died"), which a server that closed its connection is not."""


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


MAX_ANSWER_BYTES = 256 << 20   # one answer; a server sending more is refused, not buffered


def call(base_url: str, method: str, route: str, body: dict | None = None, timeout_s: float = 60.0,
         log: Path | None = None, secret: str | None = None) -> dict:
    """One JSON request; the decoded JSON answer ({} for an empty one). `timeout_s` bounds the
    whole request (connect, send, every byte of the answer), not one socket read: a server that
    trickles its answer is cut off at the deadline. `secret`: sent as `Authorization: Bearer`
    (server_auth.py). Any failure (refused, closed, timed out, an HTTP error status, an answer
    that is not JSON) raises ServerError naming the request, with the server's last log lines
    when `log` is given."""
    import http.client
    import threading
    from urllib.parse import urlsplit

    url = base_url.rstrip("/") + route
    parts = urlsplit(url)
    if parts.username or parts.password:
        raise ServerError(f"{method} {_public(url)}: the URL holds credentials (user:password@), which rltune does not "
                          "send\n  fix: remove them from rollout.server.url; the server's secret goes in the variable "
                          "rollout.server.secret_env names (docs/rollout-server.md)")
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = cls(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)
    cut: list[bool] = []
    socks: list = []   # the connection's socket (http.client drops conn.sock once the answer owns it)

    def deadline() -> None:   # the whole request's time is up: unblock whatever read is waiting
        cut.append(True)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout_s, deadline)
    timer.daemon = True
    timer.start()
    status, reason, raw = 0, "", b""
    try:
        conn.connect()
        socks.append(conn.sock)
        if cut:   # the deadline passed while connecting
            raise TimeoutError("timed out")
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        status, reason = resp.status, resp.reason
        raw = resp.read(MAX_ANSWER_BYTES + 1)
    except (OSError, http.client.HTTPException) as err:   # refused, reset, closed, timed out
        why = ("timed out: no whole answer within the deadline" if cut or isinstance(err, TimeoutError)
               else _why(err))
        raise ServerError(_failure(f"{method} {url} failed: {why} (timeout {timeout_s:g} s)", log)) from None
    finally:
        timer.cancel()
        conn.close()
    if cut:
        raise ServerError(_failure(f"{method} {url} failed: timed out: no whole answer within the deadline "
                                   f"(timeout {timeout_s:g} s)", log))
    if len(raw) > MAX_ANSWER_BYTES:
        raise ServerError(_failure(f"{method} {url} answered more than {MAX_ANSWER_BYTES >> 20} MiB", log))
    if status >= 400:
        detail = raw[:2000].decode("utf-8", "replace")
        raise ServerError(_failure(f"{method} {url} answered HTTP {status}: {detail}", log))
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        raise ServerError(_failure(f"{method} {url} answered something that is not JSON: {raw[:200]!r}", log)) from None


def _why(err: BaseException) -> str:
    import http.client

    if isinstance(err, ConnectionRefusedError):
        return "connection refused: nothing listens there (the server is not running)"
    if isinstance(err, (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected,
                        http.client.IncompleteRead)):
        return f"the server closed the connection ({type(err).__name__}): it stopped or died"
    return str(err) or type(err).__name__


def _public(url: str) -> str:
    """`url` with any password written as ***."""
    from urllib.parse import urlsplit, urlunsplit

    p = urlsplit(url)
    if p.password is None and p.username is None:
        return url
    host = p.hostname or ""
    if p.port:
        host += f":{p.port}"
    return urlunsplit((p.scheme, f"***@{host}", p.path, p.query, p.fragment))


def keep_log(log: Path | None) -> Path | None:
    """A private copy of a server's log, outside the run directory (a run that fails at start
    removes the directory it created, with the log an error points to); None without one."""
    import shutil
    import tempfile

    if log is None or not Path(log).is_file():
        return None
    try:
        fd, kept = tempfile.mkstemp(prefix="rltune-server-failed-", suffix=".log")
        with open(log, "rb") as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return Path(kept)
    except OSError:
        return None


def failed_start(err: ServerError, log: Path | None) -> ServerError:
    """`err` (a failed start) naming a kept copy of the server's log instead of `log`."""
    kept = keep_log(log)
    if kept is None:
        return err
    text = str(err).replace(f"({log}):", f"({kept}, kept: the run directory's copy goes with a failed start):")
    if str(kept) not in text:
        text += f"\n  the server's whole log: {kept}"
    return ServerError(text)


def _failure(what: str, log: Path | None) -> str:
    tail = log_tail(log)
    return f"{what}\n  the server's last log lines ({log}):\n{_indent(tail)}" if tail else what


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def healthy(base_url: str, timeout_s: float = 2.0, secret: str | None = None) -> bool:
    """Whether GET /health answers 200 now."""
    try:
        call(base_url, "GET", "/health", timeout_s=timeout_s, secret=secret)
        return True
    except ServerError:
        return False


class NotOurServer(ServerError):
    """Something answers at the server's address, but it cannot prove it holds the secret."""


def prove_identity(base_url: str, secret: str, timeout_s: float = 5.0, what: str = "the rollout server") -> bool:
    """Ask the server at `base_url` to prove it holds `secret` (server_auth.py), sending no
    secret: GET /rltune/identity with a fresh nonce, its HMAC checked here. True: proven;
    False: nothing answered (not up yet, down). A wrong, missing or malformed proof raises
    NotOurServer: the address is answered by another process, which is sent nothing else."""
    import hmac
    import secrets

    from .server_auth import IDENTITY_ROUTE, identity_proof

    nonce = secrets.token_hex(16)
    try:
        answer = call(base_url, "GET", f"{IDENTITY_ROUTE}?nonce={nonce}", timeout_s=timeout_s)
    except ServerError as err:
        first = str(err).splitlines()[0]
        if " answered HTTP " not in first and "not JSON" not in first and "more than" not in first:
            return False   # refused, timed out, closed: nobody answers (yet)
        answer = {"error": first}
    proof = answer.get("proof") if isinstance(answer, dict) else None
    if isinstance(proof, str) and hmac.compare_digest(proof.encode(), identity_proof(secret, nonce).encode()):
        return True
    raise NotOurServer(f"{what} at {base_url} is not the server rltune started: it did not prove it holds this run's "
                       f"secret (GET {IDENTITY_ROUTE} answered {str(answer)[:200]}); nothing else was sent to it")


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on (host, port): a bind fails, or a connect succeeds."""
    import ipaddress

    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn binds: TIME_WAIT is no owner
        try:
            s.bind((host, port))
        except OSError:
            return True
    probe = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
    try:
        with socket.create_connection((probe, port), timeout=1.0):
            return True
    except OSError:
        return False


def open_log(path: Path) -> int:
    """A fresh log file at `path`, opened for writing without following a link: a regular file
    there (an older run's log) is replaced; a link, FIFO or device is refused (a received run
    directory's `rollout-server.log -> ~/.bashrc` must not be written through)."""
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise ServerError(f"{path} is a link (to {os.readlink(path)}); rltune writes the server's log there and never "
                              f"writes through a link\n  fix: remove the link ({path}), or set trainer.output_dir to "
                              "another directory")
        if not stat.S_ISREG(st.st_mode):
            raise ServerError(f"{path} is not a regular file; rltune writes the server's log there\n  fix: remove it, "
                              "or set trainer.output_dir to another directory")
        os.unlink(path)   # a fresh log per run (a hard link's other names keep the old content)
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                       | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as err:
        raise ServerError(f"cannot create the server's log {path}: {err.strerror or err}\n  fix: make "
                          f"{path.parent} writable, or set trainer.output_dir to another directory") from None


class ServerProcess:
    """A server command run behind `server_guard`; `start()` returns once GET /health answers."""

    def __init__(self, cmd: list[str], base_url: str, log_path: Path, env: dict | None = None,
                 startup_timeout_s: float = 600.0, secret: str | None = None):
        self.cmd, self.base_url, self.log_path = list(cmd), base_url, Path(log_path)
        self.env = env
        self.secret = secret   # the server must prove it holds it before it is sent anything
        self.startup_timeout_s = float(startup_timeout_s)
        self.guard: subprocess.Popen | None = None
        self._pipe_w: int | None = None

    def start(self) -> "ServerProcess":
        from urllib.parse import urlsplit

        parts = urlsplit(self.base_url)
        if parts.port and port_in_use(parts.hostname or "127.0.0.1", parts.port):
            raise ServerError(f"port {parts.port} on {parts.hostname} is already in use (another server, another "
                              "user's, or a stale one): rltune will not start its server beside it, nor train "
                              f"against it\n  fix: rollout.server.port: null (a free port), another port, or stop "
                              f"what listens there (`ss -ltnp 'sport = :{parts.port}'` names it)")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open_log(self.log_path)
        read_fd, self._pipe_w = os.pipe()
        os.set_inheritable(self._pipe_w, False)
        try:
            self.guard = subprocess.Popen(
                [sys.executable, "-m", "rltune.rollout.server_guard", str(read_fd), "--", *self.cmd],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                pass_fds=(read_fd,))
        finally:
            os.close(log)
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
                raise failed_start(ServerError(_failure(
                    f"the rollout server exited with code {code} before it answered {self.base_url}/health "
                    f"(command: {' '.join(self.cmd[:3])} ...)", self.log_path)), self.log_path)
            if self.secret is None:
                if healthy(self.base_url):
                    return
            elif self._proven():
                return
            time.sleep(0.5)
        self.stop()
        raise failed_start(ServerError(_failure(f"the rollout server did not answer {self.base_url}/health within "
                                                f"rollout.server.startup_timeout_s ({self.startup_timeout_s:g} s)",
                                                self.log_path)), self.log_path)

    def _proven(self) -> bool:
        """The server answers, proves it holds the secret, refuses a request without it, and is
        healthy. An address answered by another process stops the start at once."""
        try:
            if not prove_identity(self.base_url, self.secret, timeout_s=2.0):
                return False
        except NotOurServer as err:
            self.stop()
            raise ServerError(_failure(str(err), self.log_path)) from None
        try:
            call(self.base_url, "GET", "/health", timeout_s=5.0)
        except ServerError as err:
            if "answered HTTP 401" not in str(err):
                return False
        else:
            self.stop()
            raise ServerError(f"the rollout server at {self.base_url} answered GET /health without the secret: its "
                              "routes are open to anyone who reaches it (rltune's --middleware was not applied)\n  "
                              "fix: a vLLM whose API server takes --middleware (docs/rollout-server.md)")
        return healthy(self.base_url, secret=self.secret)

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


__all__ = ["NotOurServer", "ServerError", "ServerProcess", "call", "free_port", "healthy", "log_tail",
           "open_log", "port_in_use", "prove_identity"]
