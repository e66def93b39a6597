"""verifiers tool servers behind rltune's guard (docs/agents.md, "verifiers", tools).

verifiers starts a task's tool servers (`vf.Toolset`: MCP over HTTP) as `python -m MODULE`,
bound to 127.0.0.1 without authentication: any user of the machine could call an episode's
tools, which run the environment's code as the trainer's user, and change what the episode is
scored on. rltune starts them through this module instead:

- trainer side, `install()`: verifiers' `serve_in_runtime` is wrapped so that the start command
  of a subprocess runtime, `python -m MODULE`, becomes `python -m rltune.envs.verifiers_tools
  MODULE CLASS [FILE]`, with the run's secret in the child's environment (readable only by the
  same user). A tool server in another runtime (docker, a sandbox) is refused with the fix:
  rltune cannot put its guard there.
- child side, `main()`: the secret is taken out of the environment before the environment's
  code is imported; the ASGI app verifiers hands uvicorn is wrapped so that every HTTP request
  and WebSocket must carry `Authorization: Bearer SECRET` (compared in constant time; 401
  otherwise); then CLASS runs as verifiers runs it (`CLASS.run()`).
- rltune's chat harness sends the header (`headers()`); nothing else holds the secret.
"""

from __future__ import annotations

import hmac
import importlib
import importlib.util
import os
import secrets
import sys

SECRET_VAR = "RLTUNE_VF_TOOL_SECRET"
_SECRET = secrets.token_urlsafe(32)


def headers() -> dict[str, str]:
    """What rltune's harness sends to the run's tool servers."""
    return {"Authorization": f"Bearer {_SECRET}"}


# ---------------------------------------------------------------- trainer side

class _GuardedRuntime:
    """verifiers' runtime, but its background start of a tool server goes through main()."""

    def __init__(self, runtime, server):
        self._runtime, self._server = runtime, server

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    async def run_background(self, argv, env, log):
        cls = type(self._server)
        if list(argv[1:]) != ["-m", cls.__module__]:
            from verifiers.v1.errors import ToolsetError

            raise ToolsetError(f"tool server {self._server.server_name!r}: unexpected start command {argv!r} "
                               "(this verifiers version starts tool servers differently than rltune knows)")
        file = getattr(sys.modules.get(cls.__module__), "__file__", None) or ""
        argv = [argv[0], "-m", __name__, cls.__module__, cls.__qualname__, file]
        return await self._runtime.run_background(argv, {**env, SECRET_VAR: _SECRET}, log)


def install() -> None:
    """Route verifiers' tool-server starts through the guard (idempotent; the trainer's process)."""
    from verifiers.v1.mcp import launch

    if getattr(launch.serve_in_runtime, "_rltune_guard", False):
        return
    original = launch.serve_in_runtime

    async def serve_in_runtime(server, runtime, **kwargs):
        if runtime.type != "subprocess":
            from verifiers.v1.errors import ToolsetError

            raise ToolsetError(f"tool server {server.server_name!r} runs in a {runtime.type!r} runtime, where rltune "
                               "cannot guard it; fix: leave its runtime as a subprocess (no toolset runtime in "
                               "rollout.env_args), or give it a url of a server you secured")
        return await original(server, _GuardedRuntime(runtime, server), **kwargs)

    serve_in_runtime._rltune_guard = True
    launch.serve_in_runtime = serve_in_runtime


# ---------------------------------------------------------------- child side

def guard(app, secret: str):
    """`app` (ASGI), answering only requests that carry `Authorization: Bearer secret`."""
    want = f"Bearer {secret}".encode()

    async def guarded(scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(got, want):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                else:
                    await send({"type": "http.response.start", "status": 401,
                                "headers": [(b"content-type", b"text/plain")]})
                    await send({"type": "http.response.body", "body": b"unauthorized\n"})
                return
        await app(scope, receive, send)

    return guarded


def main(argv: list[str]) -> None:
    module, qualname, file = (argv + ["", "", ""])[:3]
    secret = os.environ.pop(SECRET_VAR, "")
    if not secret or not module or not qualname:
        sys.exit("rltune.envs.verifiers_tools: started without its secret or class; rltune starts this itself")
    import uvicorn

    class GuardedConfig(uvicorn.Config):
        def __init__(self, app, *args, **kwargs):
            super().__init__(guard(app, secret), *args, **kwargs)

    uvicorn.Config = GuardedConfig
    if file and module not in sys.modules and importlib.util.find_spec(module.split(".")[0]) is None:
        from ..agents.env import exec_module_file

        exec_module_file(file, module)
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    from verifiers.v1.mcp.server import ServerBase

    if not (isinstance(obj, type) and issubclass(obj, ServerBase)):
        sys.exit(f"rltune.envs.verifiers_tools: {module}.{qualname} is not a verifiers tool server")
    obj.run()


if __name__ == "__main__":
    main(sys.argv[1:])
