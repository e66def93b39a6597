"""Who may reach a rollout server rltune starts (docs/rollout-server.md, "Who may reach the server").

vLLM's dev and RL routes (`/collective_rpc`, `/pause`, `/update_weights`, `/weight_checker`, ...)
change the server's state and have no authentication of their own (vLLM's `--api-key` covers
only `/v1`, `/v2` and `/inference`). So every server rltune starts runs `RequireSecret`, a pure
ASGI middleware around vLLM's whole app, through vLLM's documented `--middleware` hook
(server_launch.py adds it):

- every request, on every route and every method (websockets too), must carry
  `Authorization: Bearer <secret>`, compared in constant time (`hmac.compare_digest`); anything
  else is answered 401 before vLLM sees it;
- the one exception, `GET /rltune/identity?nonce=N`, answers `{"proof": HMAC-SHA256(secret, N)}`:
  the trainer sends a fresh nonce before it sends the secret or anything else, so a process that
  took the port (another user's server, a stale one) cannot pass for the server rltune started,
  and never learns the secret.

The secret is a per-run random string the trainer passes to the server in the environment
variable RLTUNE_SERVER_SECRET (never in argv: a process's arguments are world-readable in /proc;
its environment is not). Standard library only: vLLM imports this module in its API server.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from urllib.parse import parse_qs

SECRET_ENV = "RLTUNE_SERVER_SECRET"
IDENTITY_ROUTE = "/rltune/identity"
MIDDLEWARE = "rltune.rollout.server_auth.RequireSecret"   # vLLM's --middleware value
MIN_SECRET_CHARS = 16
_CONTEXT = b"rltune rollout server identity\x00"


def new_secret() -> str:
    """A per-run secret: 256 random bits, hex."""
    return secrets.token_hex(32)


def identity_proof(secret: str, nonce: str) -> str:
    """What a server holding `secret` answers to GET /rltune/identity?nonce=`nonce`."""
    return hmac.new(secret.encode(), _CONTEXT + nonce.encode(), hashlib.sha256).hexdigest()


def secret_problem(secret: str | None) -> str | None:
    """Why `secret` cannot guard a server, or None."""
    if not secret:
        return f"no secret: the environment variable {SECRET_ENV} is not set"
    if len(secret) < MIN_SECRET_CHARS:
        return f"the secret in {SECRET_ENV} is shorter than {MIN_SECRET_CHARS} characters"
    return None


class RequireSecret:
    """ASGI middleware: a request without `Authorization: Bearer <secret>` gets 401 on every
    route; GET /rltune/identity answers the HMAC of its nonce (module docstring)."""

    def __init__(self, app, secret: str | None = None):
        secret = os.environ.get(SECRET_ENV) if secret is None else secret
        problem = secret_problem(secret)
        if problem:   # never serve the RL routes unguarded
            raise RuntimeError(f"rltune's server guard cannot start: {problem} (start the server with "
                               f"`{SECRET_ENV}=... python -m rltune.rollout.server_launch ...`, docs/rollout-server.md)")
        self.app = app
        self._secret = secret
        self._expected = ("Bearer " + secret).encode()

    async def __call__(self, scope, receive, send):
        kind = scope.get("type")
        if kind not in ("http", "websocket"):   # lifespan: vLLM's start-up and shutdown
            return await self.app(scope, receive, send)
        if kind == "http" and scope.get("path") == IDENTITY_ROUTE and scope.get("method") in ("GET", "HEAD"):
            return await self._identity(scope, send)
        given = b""
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                given = value
                break
        if hmac.compare_digest(given, self._expected):
            return await self.app(scope, receive, send)
        if kind == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await _answer(send, 401, {"error": "unauthorized: this rollout server takes requests from the rltune "
                                           "trainer that started it only (docs/rollout-server.md)"},
                      [(b"www-authenticate", b"Bearer")])

    async def _identity(self, scope, send) -> None:
        query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
        nonce = (query.get("nonce") or [""])[0]
        if not 16 <= len(nonce) <= 256:
            return await _answer(send, 400, {"error": "nonce: 16 to 256 characters"})
        await _answer(send, 200, {"server": "rltune", "proof": identity_proof(self._secret, nonce)})


async def _answer(send, status: int, body: dict, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": data})


__all__ = ["IDENTITY_ROUTE", "MIDDLEWARE", "RequireSecret", "SECRET_ENV", "identity_proof", "new_secret",
           "secret_problem"]
