"""What a rollout server receives, and what the trainer receives from it, is untrusted (issue 45).

- Only the trainer reaches the server: every route answers 401 without the run's secret
  (server_auth.RequireSecret, here around a stand-in ASGI app under uvicorn, as vLLM runs it;
  tests/vllm/test_vllm_server.py checks the real server's RL routes);
- a server rltune starts proves it is that server before it is sent anything: a port already in
  use is refused before the child starts, an impostor answering the identity route is refused
  and never sees the secret;
- the server's log is never written through a link, and a new run starts a new one;
- request_timeout_s bounds a whole request (a server trickling its answer is cut off);
- an attached server's answers are checked before they are trained on (server_checks.py);
- wildcard hosts need rollout.server.allow_remote (lint server-remote-access)."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rltune.rollout.server import NotOurServer, ServerError, ServerProcess, call, free_port, prove_identity
from rltune.rollout.server_auth import IDENTITY_ROUTE, RequireSecret, identity_proof, new_secret

FAKE = Path(__file__).with_name("fake_server.py")
SECRET = new_secret()


# ------------------------------------------------------------------ the middleware


async def _inner(scope, receive, send):
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b'{"reached": true}'})


def _asgi(path: str, method: str = "POST", headers=(), kind: str = "http", query: bytes = b""):
    sent = []

    async def send(msg):
        sent.append(msg)

    async def receive():
        return {"type": "http.request", "body": b""}

    scope = {"type": kind, "path": path, "method": method, "headers": list(headers), "query_string": query}
    asyncio.run(RequireSecret(_inner, secret=SECRET)(scope, receive, send))
    return sent


@pytest.mark.parametrize("path", ["/collective_rpc", "/pause", "/update_weights", "/weight_checker", "/health",
                                  "/v1/models", "/inference/v1/generate", "/metrics", "/anything/else"])
@pytest.mark.parametrize("auth", [None, b"Bearer wrong", b"Bearer " + SECRET.encode()[:-1], SECRET.encode()])
def test_every_route_refuses_a_request_without_the_secret(path, auth):
    sent = _asgi(path, headers=[(b"authorization", auth)] if auth else [])
    assert sent[0]["status"] == 401 and b"reached" not in sent[-1].get("body", b"")
    ok = _asgi(path, headers=[(b"Authorization", b"Bearer " + SECRET.encode())])
    assert ok[0]["status"] == 200 and ok[-1]["body"] == b'{"reached": true}'


def test_a_websocket_without_the_secret_is_closed_and_the_identity_route_proves_the_secret():
    assert _asgi("/v1/realtime", kind="websocket") == [{"type": "websocket.close", "code": 1008}]
    nonce = "n" * 32
    sent = _asgi(IDENTITY_ROUTE, method="GET", query=f"nonce={nonce}".encode())
    assert sent[0]["status"] == 200 and json.loads(sent[-1]["body"])["proof"] == identity_proof(SECRET, nonce)
    assert _asgi(IDENTITY_ROUTE, method="GET", query=b"nonce=short")[0]["status"] == 400
    with pytest.raises(RuntimeError, match="no secret"):
        RequireSecret(_inner, secret="")


def test_the_launcher_refuses_to_start_without_a_secret():
    env = {k: v for k, v in os.environ.items() if k != "RLTUNE_SERVER_SECRET"}
    res = subprocess.run([sys.executable, "-m", "rltune.rollout.server_launch", "--model", "x"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "RLTUNE_SERVER_SECRET is not set" in res.stderr and "fix:" in res.stderr


UVICORN_APP = """
import sys, uvicorn
from rltune.rollout.server_auth import RequireSecret
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            await send({"type": m["type"] + ".complete"})
            if m["type"] == "lifespan.shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"reached": true}'})
uvicorn.run(RequireSecret(app), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def test_a_started_server_proves_its_identity_and_answers_the_trainer_only(tmp_path):
    """ServerProcess with a secret: it waits until the server proves it holds the secret (and
    refuses a request without it); `call` with the secret reaches it, without it gets 401."""
    pytest.importorskip("uvicorn")
    port = free_port()
    script = tmp_path / "app.py"
    script.write_text(UVICORN_APP)
    secret = new_secret()
    proc = ServerProcess([sys.executable, str(script), str(port)], f"http://127.0.0.1:{port}", tmp_path / "s.log",
                         env=dict(os.environ, RLTUNE_SERVER_SECRET=secret), startup_timeout_s=60, secret=secret)
    proc.start()
    try:
        assert call(proc.base_url, "POST", "/collective_rpc", {"method": "save_sharded_state"}, secret=secret) == {
            "reached": True}
        for route in ("/collective_rpc", "/pause", "/update_weights", "/health"):
            with pytest.raises(ServerError, match="HTTP 401"):
                call(proc.base_url, "POST", route, {})
            with pytest.raises(ServerError, match="HTTP 401"):
                call(proc.base_url, "POST", route, {}, secret=new_secret())
        assert prove_identity(proc.base_url, secret)
        with pytest.raises(NotOurServer):
            prove_identity(proc.base_url, new_secret())
    finally:
        proc.stop()


# ------------------------------------------------------------------ impostors


class _Impostor(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def _answer(self):
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        body = b'{"ok": true, "proof": "0000"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def impostor():
    _Impostor.seen = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Impostor)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1], _Impostor.seen
    srv.shutdown()
    srv.server_close()


def test_a_fixed_port_already_in_use_is_refused_before_the_server_starts(tmp_path, impostor):
    port, seen = impostor
    proc = ServerProcess([sys.executable, str(FAKE), str(port), str(tmp_path / "pids")], f"http://127.0.0.1:{port}",
                         tmp_path / "s.log", secret=SECRET, startup_timeout_s=30)
    with pytest.raises(ServerError) as e:
        proc.start()
    assert f"port {port} on 127.0.0.1 is already in use" in str(e.value) and "rollout.server.port: null" in str(e.value)
    assert proc.guard is None and not (tmp_path / "pids").exists() and seen == []


def test_an_impostor_on_the_port_is_refused_and_never_sees_the_secret(tmp_path, impostor, monkeypatch):
    """A process that took the server's port between the check and the start (or an attached
    url answered by something else) cannot prove it holds the secret: refused, sent nothing else."""
    import rltune.rollout.server as server_mod

    port, seen = impostor
    with pytest.raises(NotOurServer, match="is not the server rltune started"):
        prove_identity(f"http://127.0.0.1:{port}", SECRET)
    assert [p.split("?")[0] for p, _ in seen] == [IDENTITY_ROUTE] and all(a is None for _, a in seen)
    # the start-up wait: the port was free when checked, the impostor took it before the server
    monkeypatch.setattr(server_mod, "port_in_use", lambda host, port: False)
    proc = ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], f"http://127.0.0.1:{port}",
                         tmp_path / "s.log", secret=SECRET, startup_timeout_s=30)
    t0 = time.monotonic()
    with pytest.raises(ServerError, match="is not the server rltune started"):
        proc.start()
    assert time.monotonic() - t0 < 15 and not proc.alive
    assert {p.split("?")[0] for p, _ in seen} == {IDENTITY_ROUTE} and all(a is None for _, a in seen)


def test_credentials_in_the_url_are_refused_not_dropped(impostor):
    port, seen = impostor
    with pytest.raises(ServerError) as e:
        call(f"http://user:hunter2@127.0.0.1:{port}", "GET", "/health")
    assert "holds credentials" in str(e.value) and "hunter2" not in str(e.value) and seen == []


# ------------------------------------------------------------------ the log


def test_the_log_is_never_written_through_a_link_and_each_run_starts_a_fresh_one(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "rollout-server.log").symlink_to(victim)
    port = free_port()
    proc = ServerProcess([sys.executable, str(FAKE), str(port), str(tmp_path / "pids")], f"http://127.0.0.1:{port}",
                         run / "rollout-server.log", startup_timeout_s=30)
    with pytest.raises(ServerError, match="is a link .* never writes through a link"):
        proc.start()
    assert victim.read_text() == "precious\n" and proc.guard is None
    (run / "rollout-server.log").unlink()
    (run / "rollout-server.log").write_text("an older run's server log\n")
    proc.start()
    try:
        text = (run / "rollout-server.log").read_text()
        assert "older run" not in text and "fake server: listening" in text
        assert (run / "rollout-server.log").stat().st_mode & 0o077 == 0
    finally:
        proc.stop()


# ------------------------------------------------------------------ a whole-request deadline


class _Trickle(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "40")
        self.end_headers()
        for _ in range(40):   # one byte every 0.5 s: each read is quick, the answer takes 20 s
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:
                return
            time.sleep(0.5)

    def log_message(self, *args):
        pass


def test_request_timeout_bounds_the_whole_request_not_one_read():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Trickle)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        t0 = time.monotonic()
        with pytest.raises(ServerError, match="timed out"):
            call(f"http://127.0.0.1:{srv.server_address[1]}", "GET", "/trickle", timeout_s=2.0)
        assert time.monotonic() - t0 < 5
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_server_that_closes_the_connection_says_so():
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen()

    def close_at_once():
        conn, _ = lsock.accept()
        conn.recv(65536)
        conn.close()

    threading.Thread(target=close_at_once, daemon=True).start()
    with pytest.raises(ServerError, match="closed the connection"):
        call(f"http://127.0.0.1:{lsock.getsockname()[1]}", "POST", "/inference/v1/generate", {}, timeout_s=5.0)
    lsock.close()
    with pytest.raises(ServerError, match="connection refused: nothing listens there"):
        call(f"http://127.0.0.1:{free_port()}", "GET", "/health", timeout_s=2.0)


def test_a_server_that_dies_mid_run_is_named_not_blamed_on_another_rank():
    """Before: ServerError was a RuntimeError, so the training loop's handler for failed
    collectives read 'Connection reset by peer' in it as another rank's death (in a one-process
    run), and anything else as 'probably a bug'. Now it is a user-facing error of its own."""
    from rltune.engine.distributed import peer_failure
    from rltune.errors import UserError

    err = ServerError("POST http://127.0.0.1:1/inference/v1/generate failed: the server closed the connection "
                      "(ConnectionResetError): it stopped or died\n  the server's last log lines: Connection reset by peer")
    assert isinstance(err, UserError) and not isinstance(err, RuntimeError) and peer_failure(err) is None


def test_a_failed_start_keeps_the_log_its_error_points_to(tmp_path):
    """A run that fails at start removes the run directory it created, with rollout-server.log:
    the error names a kept copy instead."""
    import re
    import shutil

    run = tmp_path / "run"
    port = free_port()
    proc = ServerProcess([sys.executable, str(FAKE), str(port), str(tmp_path / "pids"), "exit"],
                         f"http://127.0.0.1:{port}", run / "rollout-server.log", startup_timeout_s=30)
    with pytest.raises(ServerError) as e:
        proc.start()
    shutil.rmtree(run)   # what the failed run's clean-up does
    kept = re.search(r"\((/\S+rltune-server-failed-\S+\.log), kept", str(e.value))
    assert kept and "cannot load the model" in Path(kept.group(1)).read_text()
    Path(kept.group(1)).unlink()


def test_server_devices_that_do_not_exist_are_refused_before_the_server_starts(tmp_path):
    from rltune.models import resolve_model_dir
    from rltune.models.loading import load_tokenizer
    from rltune.recipe.schema import Recipe
    from rltune.rollout.vllm_server import VLLMServerRollout

    d = resolve_model_dir("builtin:tiny-llama")
    r = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                               "reward": {"functions": ["builtin:exact_answer"]},
                               "rollout": {"engine": "vllm-server", "server": {"devices": [0, 4095]}}})
    with pytest.raises(ServerError) as e:
        VLLMServerRollout(d, load_tokenizer(d), r.rollout, max_len=128, log_dir=tmp_path)
    assert "rollout.server.devices names CPU core 4095, which does not exist here" in str(e.value)
    assert "fix: set rollout.server.devices" in str(e.value)
    assert not (tmp_path / "rollout-server.log").exists()   # refused before a server started


def test_the_launcher_listens_on_loopback_unless_told_and_always_adds_the_guard():
    from rltune.rollout.server_auth import MIDDLEWARE
    from rltune.rollout.server_launch import serve_args

    assert serve_args(["--model", "m"]) == ["--model", "m", "--host", "127.0.0.1", "--middleware", MIDDLEWARE]
    assert serve_args(["--host", "10.0.0.7", "--model", "m"]) == ["--host", "10.0.0.7", "--model", "m", "--middleware",
                                                             MIDDLEWARE]
    assert serve_args(["--host=::1"]) == ["--host=::1", "--middleware", MIDDLEWARE]


def test_the_launcher_finds_vllm_026s_server_module_where_032s_package_is_missing(monkeypatch):
    """vLLM 0.26 has no vllm.entrypoints.launchers package: asking find_spec for a module under it
    raises instead of answering None (found on the H200); the launcher takes that as 'not there' and
    goes on to 0.26's server module."""
    import importlib.util

    from rltune.rollout import server_launch

    real = importlib.util.find_spec

    def find_spec(name, *args):
        if name.startswith("vllm.entrypoints.launchers"):
            raise ModuleNotFoundError("No module named 'vllm.entrypoints.launchers'")
        if name == server_launch.LEGACY:
            return object()
        return real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert server_launch._exists(server_launch.ENTRY) is False
    assert server_launch._exists(server_launch.LEGACY) is True
