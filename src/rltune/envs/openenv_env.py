"""`rollout.env: openenv:NAME`: an OpenEnv environment (openenv-core) as an rltune turns environment
(docs/agents.md, "OpenEnv").

Where the environment runs:
- `rollout.env_args.url` set: a server the user started (http(s):// or ws(s)://); NAME is a label;
- no `url`: NAME is `module.path[:attr]`, the FastAPI app (`attr` default `app`) of an importable
  local package, built with openenv-core's `create_app`. rltune starts it as a child server
  (`python -m rltune.envs.openenv_env serve NAME --port P`) bound to 127.0.0.1 on a free port,
  behind rltune's guard (rollout/server.py's ServerProcess: it never outlives the run) and behind
  rltune's per-run secret (rollout/server_auth.py's RequireSecret: other local users' requests are
  refused); it stops at the end of the run (`rltune_stop`), at exit, or when the trainer dies.

An episode is one OpenEnv session: a WebSocket to the server's `/ws` (the protocol of openenv's
own EnvClient: {"type": "reset" | "step" | "close", "data": ...}; its HTTP /reset and /step
routes make a fresh environment per request, so a multi-turn episode cannot use them). rltune
speaks that protocol itself (websockets' sync client) instead of importing openenv's EnvClient:
the trainer imports no openenv code, every answer is bounded in bytes
(`max_message_bytes`, checked before it is buffered) and in time (`timeout_s` per call), and the
child's secret goes in a header the EnvClient cannot send. Nothing an answer holds is executed,
unpickled or evaluated: it is JSON, parsed and checked.

The mapping (a turns environment, agents/env.py): reset(row) sends the row's `reset_fields` as
reset's keyword arguments and returns the observation as the first message; step(text) sends
{action_field: text, **action_defaults} and returns the observation as the next message, with the
server's `done`; reward(episode) is the sum (or the last) of the steps' rewards.

`env_problems` (validate) imports neither openenv nor the environment's package.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
from pathlib import Path

ARGS = {
    "url": "a server you started: http://HOST:PORT (or ws://); without it, rltune starts NAME (module.path[:app]) itself",
    "action_field": "the field of the environment's Action that receives the model's text (default: message)",
    "action_defaults": "the Action's other fields, fixed (a mapping; default: none)",
    "observation_field": "the Observation field shown to the model (default: its only text field, else the observation as JSON)",
    "reset_fields": "the row's columns passed to reset() as keyword arguments (default: none)",
    "role": "the role of the environment's messages (default: user)",
    "reward": "sum (default) or last: how the steps' rewards make the episode's",
    "timeout_s": "seconds one reset or step may take, its whole answer included (default: 10)",
    "max_message_bytes": "bytes one answer may hold; a longer one is refused before it is buffered (default: 1000000)",
    "startup_timeout_s": "seconds the child server has to answer (default: 120)",
}
DEFAULTS = {"url": None, "action_field": "message", "action_defaults": {}, "observation_field": None,
            "reset_fields": [], "role": "user", "reward": "sum", "timeout_s": 10.0,
            "max_message_bytes": 1_000_000, "startup_timeout_s": 120.0}
INSTALL = "pip install 'rltune[envs]' (openenv-core)"
DOCS = "docs/agents.md, \"OpenEnv\""
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---------------------------------------------------------------- validate (no openenv import)

def env_problems(name: str, args: dict) -> list[tuple[str, str]]:
    """Every (problem, fix) with `openenv:NAME` and its env_args, found without importing openenv
    or the environment's package."""
    import difflib

    where = f"openenv:{name}"
    out: list[tuple[str, str]] = []
    for key in args:
        if key not in ARGS:
            close = difflib.get_close_matches(str(key), list(ARGS), n=1)
            out.append((f"{where}: rollout.env_args has an unknown key {key!r}",
                        (f"did you mean `{close[0]}`? " if close else "") + "its keys: " + ", ".join(ARGS)))
    cfg = {**DEFAULTS, **{k: v for k, v in args.items() if k in ARGS}}
    url = cfg["url"]
    if url is not None:
        problem = url_problem(url)
        if problem:
            out.append((f"{where}: rollout.env_args.url {problem}",
                        "give the server's address, e.g. http://127.0.0.1:8000 (" + DOCS + ")"))
        if not str(name).strip():
            out.append(("openenv: the environment has no name", "write rollout.env: openenv:NAME (a label with url)"))
    else:
        out.extend(_module_problems(name))
    fld = cfg["action_field"]
    if not isinstance(fld, str) or not _IDENT.match(fld):
        out.append((f"{where}: rollout.env_args.action_field {fld!r} is not a field name",
                    "name the Action's text field, e.g. action_field: message"))
    if not isinstance(cfg["action_defaults"], dict) or not all(isinstance(k, str) for k in cfg["action_defaults"]):
        out.append((f"{where}: rollout.env_args.action_defaults is not a mapping of field names",
                    "e.g. action_defaults: {language: python}"))
    elif isinstance(fld, str) and fld in cfg["action_defaults"]:
        out.append((f"{where}: rollout.env_args.action_defaults sets {fld!r}, the field the model's text goes in",
                    f"remove {fld} from action_defaults"))
    of = cfg["observation_field"]
    if of is not None and (not isinstance(of, str) or not _IDENT.match(of)):
        out.append((f"{where}: rollout.env_args.observation_field {of!r} is not a field name",
                    "name the Observation's text field, or leave it out"))
    rf = cfg["reset_fields"]
    if not isinstance(rf, list) or not all(isinstance(x, str) and _IDENT.match(x) for x in rf):
        out.append((f"{where}: rollout.env_args.reset_fields {rf!r} is not a list of column names",
                    "e.g. reset_fields: [target]"))
    if cfg["role"] not in ("user", "system", "tool"):
        out.append((f"{where}: rollout.env_args.role {cfg['role']!r}", "use user (default), system or tool"))
    if cfg["reward"] not in ("sum", "last"):
        out.append((f"{where}: rollout.env_args.reward {cfg['reward']!r}", "use sum (default) or last"))
    for key, lo, hi in (("timeout_s", 0.0, 3600.0), ("startup_timeout_s", 0.0, 3600.0),
                        ("max_message_bytes", 1024, 1 << 30)):
        v = cfg[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (lo < v <= hi) or (
                key == "max_message_bytes" and not isinstance(v, int)):
            out.append((f"{where}: rollout.env_args.{key} {v!r} is not a number in ({lo:g}, {hi:g}]",
                        f"{key}: {DEFAULTS[key]}"))
    return out


def url_problem(url) -> str | None:
    """Why `url` is no server address, or None."""
    from urllib.parse import urlsplit

    if not isinstance(url, str) or not url:
        return f"{url!r} is not a URL"
    try:
        p = urlsplit(url)
        port = p.port
    except ValueError as err:
        return f"{url!r} is malformed ({err})"
    if p.scheme not in ("http", "https", "ws", "wss"):
        return f"{url!r} is not an http://, https://, ws:// or wss:// address"
    if not p.hostname:
        return f"{url!r} names no host"
    if p.username or p.password:
        return f"{url!r} holds credentials (user:password@), which rltune does not send"
    if p.query or p.fragment:
        return f"{url!r} has a query or fragment"
    del port
    return None


def _module_problems(name: str) -> list[tuple[str, str]]:
    """Whether `module.path[:attr]` names a module that exists, found without importing it: the
    top package's spec, then the submodules' files under its directories."""
    import importlib.util

    where = f"openenv:{name}"
    module, _, attr = str(name).partition(":")
    if not _DOTTED.match(module) or (attr and not _IDENT.match(attr)):
        return [(f"{where}: {name!r} is not module.path[:app] (without rollout.env_args.url, NAME is the "
                 "module of the environment's server app)",
                 "name the module that defines the app, e.g. openenv:my_env.server.app, or set "
                 "rollout.env_args.url to a server you started")]
    parts = module.split(".")
    missing = (f"{where}: the module {module} is not installed (without rollout.env_args.url, rltune starts "
               "the server app NAME names)",
               f"install the environment's package (pip install -e path/to/env), put it on PYTHONPATH, or set "
               f"rollout.env_args.url to a server you started ({DOCS})")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return [missing]
    dirs = list(spec.submodule_search_locations or [])
    for i, part in enumerate(parts[1:], 1):
        found = None
        for d in dirs:
            pkg, mod = Path(d) / part, Path(d) / f"{part}.py"
            if (pkg / "__init__.py").is_file() or (pkg.is_dir() and i < len(parts) - 1):
                found = [str(pkg)]
                break
            if mod.is_file() and i == len(parts) - 1:
                found = []
                break
        if found is None:
            return [missing]
        dirs = found
    return []


# ---------------------------------------------------------------- loading (train)

def load_env(name: str, args: dict, base_dir: Path | None = None) -> type:
    """The turns-environment class rltune's episodes drive (agents/session.py: Session), bound to a
    server: the one at env_args.url, or a child started now. EnvError (one line: openenv, the
    environment, the fix) when the arguments, the library or the server are not usable."""
    from ..agents.env import EnvError

    problems = env_problems(name, args)
    if problems:
        raise EnvError(*problems[0])
    try:
        import websockets.sync.client  # noqa: F401 - openenv-core's dependency
    except ImportError:
        raise EnvError(f"openenv:{name}: the websockets package (openenv-core's) is not installed", INSTALL) from None
    cfg = {**DEFAULTS, **args}
    server = None
    if cfg["url"] is None:
        server = _start_child(name, cfg)
        base = server.base_url
    else:
        base = cfg["url"].rstrip("/")
    secret = getattr(server, "secret", None)
    try:
        _check_action(name, cfg, base, secret)
    except BaseException:
        if server is not None:
            server.stop()
        raise
    cls = type("OpenEnvEpisode", (OpenEnvEpisode,), {
        "name": name, "cfg": cfg, "base_url": base, "ws_url": _ws_url(base), "secret": secret, "server": server})
    cls.__qualname__ = f"openenv:{name}"
    return cls


def _ws_url(base: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    p = urlsplit(base)
    scheme = {"http": "ws", "https": "wss"}.get(p.scheme, p.scheme)
    return urlunsplit((scheme, p.netloc, p.path.rstrip("/") + "/ws", "", ""))


def _http_url(base: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    p = urlsplit(base)
    return urlunsplit(({"ws": "http", "wss": "https"}.get(p.scheme, p.scheme), p.netloc, p.path.rstrip("/"), "", ""))


def _start_child(name: str, cfg: dict):
    """The environment's server app as a child on 127.0.0.1, behind the guard and the secret."""
    import importlib.util
    import tempfile

    from ..agents.env import EnvError
    from ..rollout.server import ServerError, ServerProcess, free_port
    from ..rollout.server_auth import SECRET_ENV, new_secret

    if importlib.util.find_spec("openenv") is None:
        raise EnvError(f"openenv:{name}: openenv-core is not installed (the server needs it)", INSTALL)
    port = free_port("127.0.0.1")
    secret = new_secret()
    path = os.pathsep.join(p for p in sys.path if p)
    env = dict(os.environ, **{SECRET_ENV: secret, "PYTHONPATH": path, "ENABLE_WEB_INTERFACE": "false"})
    log = Path(tempfile.mkdtemp(prefix="rltune-openenv-")) / "server.log"
    cmd = [sys.executable, "-m", "rltune.envs.openenv_env", "serve", name, "--port", str(port),
           "--max-bytes", str(int(cfg["max_message_bytes"]))]
    proc = ServerProcess(cmd, f"http://127.0.0.1:{port}", log, env=env,
                         startup_timeout_s=float(cfg["startup_timeout_s"]), secret=secret)
    try:
        proc.start()
    except ServerError as err:
        text = str(err).replace("rollout.server.startup_timeout_s", "rollout.env_args.startup_timeout_s").replace(
            "the rollout server", "the environment's server").splitlines()
        raise EnvError(f"openenv:{name}: its server did not start: {text[0]}" + (
            "\n" + "\n".join(text[1:]) if len(text) > 1 else ""),
            f"the server's log lines above say why; {name} must define an app made with openenv's create_app "
            f"(try it alone: `uvicorn {name if ':' in name else name + ':app'} --host 127.0.0.1`; {DOCS})") from None
    return proc


def _check_action(name: str, cfg: dict, base: str, secret: str | None) -> None:
    """The server's /schema: the Action has `action_field`, a text field, and every other required
    field is in action_defaults. EnvError naming the fields otherwise."""
    from ..agents.env import EnvError
    from ..rollout.server import ServerError, call

    where = f"openenv:{name}"
    try:
        schema = call(_http_url(base), "GET", "/schema", timeout_s=float(cfg["timeout_s"]), secret=secret)
    except ServerError as err:
        raise EnvError(f"{where}: its server at {base} did not answer GET /schema: {str(err).splitlines()[0]}",
                       "start the server (python -m YOUR_ENV.server.app, bound to 127.0.0.1) and check "
                       f"rollout.env_args.url ({DOCS})") from None
    action = schema.get("action") if isinstance(schema, dict) else None
    props = action.get("properties") if isinstance(action, dict) else None
    if not isinstance(props, dict):
        raise EnvError(f"{where}: the server at {base} answered GET /schema without an Action schema",
                       "point rollout.env_args.url at an OpenEnv server (openenv-core's create_app)")
    fields = ", ".join(f"{k} ({_kind(v)})" for k, v in props.items() if k != "metadata")
    field = cfg["action_field"]
    if field not in props:
        raise EnvError(f"{where}: the environment's Action has no field {field!r} for the model's text (its fields: "
                       f"{fields or 'none'})", "set rollout.env_args.action_field to its text field")
    if "string" not in _kinds(props[field]):
        raise EnvError(f"{where}: the environment's Action cannot be built from text: its field {field!r} is "
                       f"{_kind(props[field])}, not a string (its fields: {fields})",
                       "set rollout.env_args.action_field to a string field; an Action without one is not "
                       "supported yet (" + DOCS + ")")
    required = [k for k in (action.get("required") or []) if k != field and k not in cfg["action_defaults"]]
    if required:
        raise EnvError(f"{where}: the environment's Action also requires {', '.join(required)} (its fields: {fields})",
                       "give them in rollout.env_args.action_defaults")
    unknown = [k for k in cfg["action_defaults"] if k not in props]
    if unknown:
        raise EnvError(f"{where}: rollout.env_args.action_defaults names {', '.join(unknown)}, which the "
                       f"environment's Action does not have (its fields: {fields})", "remove them")


def _kinds(prop) -> set:
    if not isinstance(prop, dict):
        return set()
    kinds = {prop["type"]} if isinstance(prop.get("type"), str) else set(prop.get("type") or [])
    for alt in (prop.get("anyOf") or []) + (prop.get("oneOf") or []):
        kinds |= _kinds(alt)
    return {k for k in kinds if isinstance(k, str)}


def _kind(prop) -> str:
    return "/".join(sorted(_kinds(prop))) or "any"


# ---------------------------------------------------------------- one episode = one session

_WARNED: set = set()
_WARN_LOCK = threading.Lock()


class OpenEnvError(Exception):
    """An answer rltune refuses (too big, late, malformed, an error): ends the episode."""


class OpenEnvEpisode:
    """A turns environment (agents/env.py) for one OpenEnv session; load_env makes a subclass
    bound to a server (class attributes below)."""

    name: str = ""
    cfg: dict = DEFAULTS
    base_url: str = ""
    ws_url: str = ""
    secret: str | None = None
    server = None

    def __init__(self) -> None:
        self.ws = None
        self.rewards: list[float] = []
        self.last_info: dict = {}

    # ---- rltune's turns interface
    def reset(self, row: dict) -> list[dict]:
        """Open a session, reset it with the row's reset_fields; the first observation as a message."""
        from ..agents.env import EnvError

        where = f"openenv:{self.name}"
        data = {}
        for col in self.cfg["reset_fields"]:
            if col not in row:
                raise EnvError(f"{where}: the row has no column {col!r} (rollout.env_args.reset_fields)",
                               "list only the data's columns in reset_fields")
            data[col] = row[col]
        self.close()
        try:
            self._connect()
            ans = self._ask({"type": "reset", "data": data}, "reset")
        except OpenEnvError as err:
            self.close()
            raise EnvError(f"{where}: reset failed: {err}", self._fix(err)) from None
        return [{"role": self.cfg["role"], "content": self._text(ans["observation"])}]

    def step(self, assistant_text: str) -> dict:
        """Send the text as the Action; the observation as the next message, the server's done."""
        from ..agents.env import EnvError

        if self.ws is None:
            return {"messages": [], "done": True, "info": {"openenv_error": "no session"}}
        action = {**self.cfg["action_defaults"], self.cfg["action_field"]: assistant_text}
        try:
            ans = self._ask({"type": "step", "data": action}, "step")
        except OpenEnvError as err:
            self.close()
            if getattr(err, "config", False):   # the Action or the capacity: every episode would fail
                raise EnvError(f"openenv:{self.name}: step failed: {err}", self._fix(err)) from None
            _warn_once(f"{self.name}:{str(err)[:30]}",
                       f"openenv:{self.name}: step failed, the episode ends: {err}\n  fix: {self._fix(err)}")
            return {"messages": [], "done": True, "info": {"openenv_error": str(err)[:500]}}
        if ans["reward"] is not None:
            self.rewards.append(ans["reward"])
        self.last_info = {"observation": ans["observation"], "reward": ans["reward"]}
        if ans["done"]:
            self.close()
        return {"messages": [{"role": self.cfg["role"], "content": self._text(ans["observation"])}],
                "done": ans["done"], "info": self.last_info}

    def reward(self, episode: dict) -> float:
        """The steps' rewards summed (env_args.reward: sum) or the last one; the session closes."""
        self.close()
        if not self.rewards:
            return 0.0
        return float(self.rewards[-1] if self.cfg["reward"] == "last" else sum(self.rewards))

    @classmethod
    def rltune_stop(cls) -> None:
        """End the child server (called at the end of the run; idempotent)."""
        if cls.server is not None:
            cls.server.stop()

    # ---- the session
    def _connect(self) -> None:
        from websockets.sync.client import connect

        headers = {"Authorization": f"Bearer {self.secret}"} if self.secret else None
        try:
            self.ws = connect(self.ws_url, open_timeout=float(self.cfg["timeout_s"]), close_timeout=1.0,
                              max_size=int(self.cfg["max_message_bytes"]), compression=None, proxy=None,
                              additional_headers=headers, ping_interval=None, max_queue=4,
                              legacy=True)   # a connection held across calls, closed in close()
        except Exception as err:  # noqa: BLE001 - refused, timed out, HTTP error: one line
            raise OpenEnvError(f"cannot open a session at {self.ws_url}: {type(err).__name__}: {str(err)[:200]}") from None

    def _ask(self, message: dict, what: str) -> dict:
        """One request, one answer: {"observation": dict, "reward": float | None, "done": bool}."""
        from websockets.exceptions import ConnectionClosed, PayloadTooBig

        limit, timeout = int(self.cfg["max_message_bytes"]), float(self.cfg["timeout_s"])
        try:
            self.ws.send(json.dumps(message))
            raw = self.ws.recv(timeout=timeout)
        except TimeoutError:
            raise OpenEnvError(f"the server did not answer {what} within {timeout:g} s "
                               "(rollout.env_args.timeout_s)") from None
        except PayloadTooBig:
            raise OpenEnvError(f"the server's answer to {what} is larger than {limit} bytes "
                               "(rollout.env_args.max_message_bytes): refused") from None
        except ConnectionClosed as err:
            sent = getattr(err, "sent", None)
            if sent is not None and getattr(sent, "code", None) == 1009:
                raise OpenEnvError(f"the server's answer to {what} is larger than {limit} bytes "
                                   "(rollout.env_args.max_message_bytes): refused") from None
            rcvd = getattr(err, "rcvd", None)
            why = f" (code {rcvd.code}: {rcvd.reason[:200]})" if rcvd is not None else ""
            raise OpenEnvError(f"the server closed the session during {what}{why}") from None
        except Exception as err:  # noqa: BLE001
            raise OpenEnvError(f"{what}: {type(err).__name__}: {str(err)[:200]}") from None
        if len(raw) > limit:
            raise OpenEnvError(f"the server's answer to {what} is larger than {limit} bytes: refused")
        try:
            ans = json.loads(raw)
        except (ValueError, RecursionError):
            raise OpenEnvError(f"the server's answer to {what} is not JSON: {_clip(raw)}") from None
        if not isinstance(ans, dict):
            raise OpenEnvError(f"the server's answer to {what} is not an object: {_clip(raw)}")
        data = ans.get("data")
        if ans.get("type") == "error":
            data = data if isinstance(data, dict) else {}
            err = OpenEnvError(f"the environment answered an error ({_clip(str(data.get('code')), 40)}): "
                               f"{_clip(str(data.get('message')))}" + (
                                   f" {_clip(json.dumps(data.get('errors')))}" if data.get("errors") else ""))
            err.config = str(data.get("code")) in ("VALIDATION_ERROR", "CAPACITY_REACHED", "FACTORY_ERROR")
            err.code = str(data.get("code"))
            raise err
        if ans.get("type") != "observation" or not isinstance(data, dict):
            raise OpenEnvError(f"the server's answer to {what} is not an observation: {_clip(raw)}")
        obs, reward, done = data.get("observation"), data.get("reward"), data.get("done", False)
        if not isinstance(obs, dict):
            raise OpenEnvError(f"the server's answer to {what} has no observation object: {_clip(raw)}")
        if not isinstance(done, bool):
            raise OpenEnvError(f"the server's answer to {what} has done={repr(done)[:40]}, not true or false")
        if reward is not None:
            if isinstance(reward, bool):
                reward = float(reward)
            if not isinstance(reward, (int, float)) or not math.isfinite(float(reward)):
                raise OpenEnvError(f"the server's answer to {what} has reward={repr(reward)[:40]}, "
                                   "not a finite number")
            reward = float(reward)
        return {"observation": obs, "reward": reward, "done": done}

    def _text(self, obs: dict) -> str:
        field = self.cfg["observation_field"]
        if field is not None:
            if field not in obs:
                from ..agents.env import EnvError

                raise EnvError(f"openenv:{self.name}: the observation has no field {field!r} (its fields: "
                               f"{', '.join(list(obs)[:20])})", "set rollout.env_args.observation_field to one of them")
            value = obs[field]
            return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        texts = [v for v in obs.values() if isinstance(v, str)]
        if len(texts) == 1:
            return texts[0]
        return json.dumps(obs, ensure_ascii=False, sort_keys=True)

    def _fix(self, err: OpenEnvError) -> str:
        code = getattr(err, "code", "")
        if code == "VALIDATION_ERROR":
            return ("the environment's Action cannot be built from the model's text as "
                    f"{{{self.cfg['action_field']}: text}}: set rollout.env_args.action_field / action_defaults")
        if code == "CAPACITY_REACHED":
            return ("rltune holds one session per episode in flight (rollout.batch_size, or the eval size): raise "
                    "max_concurrent_envs in the server's create_app (and SUPPORTS_CONCURRENT_SESSIONS)")
        if "timeout" in str(err) or "within" in str(err):
            return "make the environment answer sooner, or raise rollout.env_args.timeout_s"
        if "larger than" in str(err):
            return "raise rollout.env_args.max_message_bytes if the environment's answers really are this large"
        return f"check the environment's server at {self.base_url} (its log; {DOCS})"

    def close(self) -> None:
        ws, self.ws = self.ws, None
        if ws is not None:
            try:
                ws.close()
            except Exception:  # noqa: BLE001 - best effort
                pass

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def _clip(text, limit: int = 200) -> str:
    text = text if isinstance(text, str) else bytes(text[:limit * 4]).decode("utf-8", "replace")
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _warn_once(key: str, message: str) -> None:
    """Log `message` once per `key` (an environment and a kind of failure) in this process."""
    import logging

    with _WARN_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    logging.getLogger("rltune").warning("%s", message)


# ---------------------------------------------------------------- the child server's process

def serve(target: str, port: int, max_bytes: int) -> None:
    """Run the app `target` (module.path[:attr]) on 127.0.0.1:`port`, every route behind rltune's
    secret (RLTUNE_SERVER_SECRET; rollout/server_auth.py)."""
    import importlib

    import uvicorn

    from ..rollout.server_auth import RequireSecret

    module, _, attr = target.partition(":")
    app = getattr(importlib.import_module(module), attr or "app")
    uvicorn.run(RequireSecret(app), host="127.0.0.1", port=port, log_level="warning",
                ws_max_size=max(int(max_bytes), 1 << 20), access_log=False)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m rltune.envs.openenv_env")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run an OpenEnv server app on 127.0.0.1 behind rltune's secret")
    s.add_argument("target", help="module.path[:app]")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--max-bytes", type=int, default=DEFAULTS["max_message_bytes"])
    a = parser.parse_args(argv)
    serve(a.target, a.port, a.max_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
