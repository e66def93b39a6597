"""Loading the environment a recipe names (`rollout.env`) and driving one episode of it.

A user's class is a tools environment (`reset(row)` plus public methods, with type hints and a
docstring, that the model calls; optional `reward()`) or a turns environment (`reset(row)` and
`step(assistant_text) -> {"messages", "done", "info"}`; optional `reward(episode)`). The rollout
drives both through `Session`; `check_env_file` checks a file for `validate` with `ast` only.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import math
import numbers
import sys
import time
from pathlib import Path

from ..errors import UserError
from ..reward.functions import EXIT_FIX, reward_file_path
from .builtin import BUILTIN_ENVS
from .tools import NOT_TOOLS, call_tool, parse_tool_calls, run_with_timeout, tool_methods, tool_schemas

SPEC_FORMS = "builtin:NAME, module.path:ClassName or path/to/file.py:ClassName"
MAX_CHECK_BYTES = 2_000_000
SHAPES_FIX = ("give the class reset(self, row) and either step(self, assistant_text) (a turns environment) "
              "or public methods with type hints and a docstring (its tools)")
PARSE_HELP = 'Write <tool_call>{"name": ..., "arguments": {...}}</tool_call>'


class EnvError(UserError):
    """An environment that cannot be loaded or misbehaves: names the spec or class, then a fix line."""

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem + (f"\n  fix: {fix}" if fix else ""))


def _short(value: object, limit: int = 200) -> str:
    """repr(value) cut to `limit` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# ---------------------------------------------------------------- loading

def load_env_class(spec: str, base_dir: Path | None = None) -> type:
    """The class `spec` names (builtin:NAME, module.path:ClassName or file.py:ClassName),
    checked to be a usable environment; EnvError naming the spec otherwise. A file path is
    read as given, else relative to the recipe's directory `base_dir`."""
    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_ENVS:
            raise EnvError(f"unknown builtin environment {spec!r}",
                           "use one of: " + ", ".join("builtin:" + n for n in BUILTIN_ENVS))
        return BUILTIN_ENVS[name]
    target, _, class_name = spec.rpartition(":")
    if not target or not class_name:
        raise EnvError(f"environment {spec!r} is not {SPEC_FORMS}",
                       "name the class after a colon, e.g. `envs.py:MyEnv` or `my_pkg.envs:MyEnv`")
    module = _import(spec, target, base_dir)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise EnvError(f"{target} has no {class_name!r} (from rollout.env: {spec})",
                       f"define class {class_name} in {target}, or name the class it defines")
    if is_agent(cls):          # an agent: run(client, row) -> reward (agents/agent.py)
        check_agent(cls)
        return cls
    if not isinstance(cls, type):
        raise EnvError(f"{spec}: {class_name} is a {type(cls).__name__}, not a class or a function",
                       "name a class (one instance per episode) or an agent function run(client, row)")
    try:
        if kind_of(cls) == "tools":
            tool_schemas(cls)
    except EnvError as err:
        raise EnvError(f"{spec}: {err.problem}", err.fix) from None
    except ValueError as err:
        raise EnvError(f"{spec}: {err}", "fix the tool method named above") from None
    return cls


def _import(spec: str, target: str, base_dir: Path | None):
    """The module of a spec: a .py file imported under a private name, else `module.path`.
    Either runs the user's code; its failures become EnvErrors naming the spec."""
    is_file = target.endswith(".py")
    what = f"environment file {target}" if is_file else f"environment module {target!r}"
    try:
        return _exec_file(spec, target, base_dir) if is_file else importlib.import_module(target)
    except SystemExit as err:
        raise EnvError(f"importing {what} called sys.exit({err.code!r})", EXIT_FIX) from None
    except EnvError:
        raise
    except Exception as err:  # noqa: BLE001 - any failure of user code is reported, with its type
        fix = f"fix the error in {target}" if is_file else "install the package, or give a file: path/to/envs.py:Class"
        raise EnvError(f"importing {what} failed (from rollout.env: {spec}): {type(err).__name__}: {err}", fix) from err


def _exec_file(spec: str, target: str, base_dir: Path | None):
    """Run a user's .py file as a module registered in sys.modules (dataclasses and
    get_type_hints look it up there); unregistered again when it fails."""
    path = reward_file_path(target, base_dir)
    if not path.is_file():
        raise EnvError(f"environment file {target} does not exist (from rollout.env: {spec})",
                       "check the path: a relative path is read from the current directory, then the recipe's")
    mod_name = f"rltune_user_env_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module


def kind_of(cls: type) -> str:
    """The shape of an environment class: "turns" when it has step(), "tools" when it has tool
    methods, "agent" for a function run(client, row) (agents/agent.py); EnvError when it is
    none of these, has no reset(), or its step is not callable."""
    if is_agent(cls):
        return "agent"
    if not isinstance(cls, type):
        raise EnvError(f"environment {_short(cls)} is not a class", "name a class")
    name = cls.__qualname__
    if not callable(getattr(cls, "reset", None)):
        raise EnvError(f"environment class {name} has no reset(self, row) method", SHAPES_FIX)
    if hasattr(cls, "step"):
        if not callable(getattr(cls, "step")):
            raise EnvError(f"{name}.step is not a method", "define step(self, assistant_text) -> dict")
        return "turns"
    if not tool_methods(cls):
        raise EnvError(f"environment class {name} has neither step() nor any tool method", SHAPES_FIX)
    return "tools"


def gives_reward(cls: type) -> bool:
    """Whether the environment class defines its own reward() (an agent's run() returns one)."""
    return is_agent(cls) or callable(getattr(cls, "reward", None))


# ---------------------------------------------------------------- agent functions (agents/agent.py runs them)

SIGNATURE_FIX = "define it as `def run(client, row):` returning the episode's reward (a float)"


def is_agent(obj) -> bool:
    """Whether a loaded `rollout.env` object is an agent function (a class is an environment)."""
    return (inspect.isfunction(obj) or inspect.ismethod(obj)) and not isinstance(obj, type)


def check_agent(fn) -> None:
    """EnvError unless `fn` can be called as fn(client, row)."""
    try:
        inspect.signature(fn).bind(object(), object())
    except TypeError:
        raise EnvError(f"agent function {fn.__qualname__}{inspect.signature(fn)} cannot be called as "
                       "run(client, row)", SIGNATURE_FIX) from None


def check_agent_def(node: ast.FunctionDef | ast.AsyncFunctionDef, target: str) -> str | None:
    """A problem with an agent function, judged from its text (validate), or None."""
    a = node.args
    positional = a.posonlyargs + a.args
    required_kw = [k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    if (len(positional) < 2 and not a.vararg) or required_kw or (
            len(positional) - len(a.defaults) > 2):
        return (f"agent function `{node.name}` in `{target}` cannot be called as run(client, row): "
                + SIGNATURE_FIX)
    return None


# ---------------------------------------------------------------- validate: read, never run

def check_env_file(spec: str, base_dir: Path | None) -> str | None:
    """A problem with the environment `spec` names, found WITHOUT running user code, or None.

    builtin: the name exists. file.py:Class: the file (at most 2 MB) parses and defines the
    class with reset() and step() or documented, typed public methods. None for module:Class
    (only importing could tell), and when a reading cannot tell (a base class from elsewhere).
    """
    if spec.startswith("builtin:"):
        if spec.split(":", 1)[1] in BUILTIN_ENVS:
            return None
        return f"unknown builtin environment `{spec}`; available: " + ", ".join(f"builtin:{n}" for n in BUILTIN_ENVS)
    target, _, class_name = spec.rpartition(":")
    if not target or not class_name:
        return f"environment `{spec}` is not {SPEC_FORMS}"
    if not target.endswith(".py"):
        return None
    path = reward_file_path(target, base_dir)
    if not path.exists():
        return f"environment file `{target}` not found" + ("" if Path(target).is_absolute() else " (looked in the current directory, then the recipe's)")
    if not path.is_file():
        return f"environment file `{target}` is not a regular file"
    tree, problem = _parse_file(path, target)
    if tree is None:
        return problem
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if class_name in functions and class_name not in classes:   # an agent: run(client, row)
        return check_agent_def(functions[class_name], target)
    if class_name not in classes:
        if _may_bind(tree, class_name):
            return None  # bound by an import or an assignment: only importing could tell
        shown = ", ".join(f"`{c}`" for c in list(classes)[:12]) or "no classes"
        return f"environment file `{target}` does not define class `{class_name}` (it defines {shown})"
    return _class_problem(classes, class_name, target)


def env_defines_reward(spec: str, base_dir: Path | None) -> bool | None:
    """Whether the environment `spec` names defines reward(), read without running user code;
    None when only importing could tell (module:Class, a base class from elsewhere, a file
    that cannot be read)."""
    if spec.startswith("builtin:"):
        cls = BUILTIN_ENVS.get(spec.split(":", 1)[1])
        return None if cls is None else gives_reward(cls)
    target, _, class_name = spec.rpartition(":")
    path = reward_file_path(target, base_dir)
    if not target.endswith(".py") or not class_name or not path.is_file():
        return None
    tree, _ = _parse_file(path, target)
    if tree is not None and any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == class_name
                                for n in tree.body):
        return True            # an agent function: its return value is the reward
    members = None if tree is None else _class_members({n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}, class_name)
    return None if members is None else "reward" in members


def _parse_file(path: Path, target: str):
    """(ast tree, None) for a readable, parseable file of at most 2 MB, else (None, problem)."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CHECK_BYTES + 1)
    except OSError as err:
        return None, f"environment file `{target}` cannot be read: {err.strerror or err}"
    if len(data) > MAX_CHECK_BYTES:
        return None, f"environment file `{target}` is over 2 MB: too large to be checked (or to be an environment)"
    try:
        return ast.parse(data.decode("utf-8"), filename=str(path)), None
    except UnicodeDecodeError:
        return None, f"environment file `{target}` is not UTF-8 text"
    except SyntaxError as err:
        return None, f"environment file `{target}` does not parse: {err.msg} (line {err.lineno})"
    except (ValueError, RecursionError, MemoryError) as err:
        return None, f"environment file `{target}` cannot be parsed: {type(err).__name__}"


def _may_bind(tree: ast.Module, name: str) -> bool:
    """Whether something other than a top-level `class` statement may bind `name` (an import,
    a star import, an assignment, a class under `if`/`try`): only importing could tell then."""
    return any((isinstance(n, ast.alias) and (n.name == "*" or (n.asname or n.name.split(".")[0]) == name))
               or (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id == name)
               or (isinstance(n, ast.ClassDef) and n.name == name) for n in ast.walk(tree))


def _class_members(classes: dict, name: str, depth: int = 0) -> dict | None:
    """{member name: FunctionDef or None} a class defines or inherits within the file, or None
    when a base class, metaclass or class decorator makes that unknowable from the text."""
    node = classes.get(name)
    if node is None or depth > 20 or node.keywords or node.decorator_list:
        return None
    members: dict = {}
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id == "object":
            continue
        inherited = _class_members(classes, base.id, depth + 1) if isinstance(base, ast.Name) else None
        if inherited is None:
            return None
        members.update(inherited)
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            members[item.name] = item
        elif isinstance(item, (ast.Assign, ast.AnnAssign)):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            members.update((t.id, None) for t in targets if isinstance(t, ast.Name))
    return members


def _class_problem(classes: dict, class_name: str, target: str) -> str | None:
    """What keeps the class from being an environment, judged from its text (None: fine or unknowable)."""
    members = _class_members(classes, class_name)
    if members is None:
        return None
    where = f"class `{class_name}` in `{target}`"
    if "reset" not in members:
        return f"{where} has no reset(self, row) method: an environment needs one"
    if "step" in members:
        return None
    plain = {"staticmethod", "classmethod", "property", "cached_property"}
    tools = {n: f for n, f in members.items() if f is not None and not n.startswith("_") and n not in NOT_TOOLS
             and not any(isinstance(d, (ast.Name, ast.Attribute)) and getattr(d, "id", getattr(d, "attr", "")) in plain
                         for d in f.decorator_list)}
    if not tools:
        return f"{where} has neither step() nor any public method (a tool): " + SHAPES_FIX
    for n, f in tools.items():
        if ast.get_docstring(f) is None:
            return f"tool `{n}` of {where} has no docstring: the model reads it to learn what the tool does"
        if f.args.vararg or f.args.kwarg:
            return f"tool `{n}` of {where} takes *args or **kwargs: a tool's parameters must be named"
        params = (f.args.posonlyargs + f.args.args)[1:] + f.args.kwonlyargs  # without self
        unhinted = [a.arg for a in params if a.annotation is None]
        if unhinted:
            return f"parameter `{unhinted[0]}` of tool `{n}` of {where} has no type hint: the tool's schema needs one"
    return None


# ---------------------------------------------------------------- one episode

class Session:
    """One episode of an environment: a fresh instance (`cls()`), the conversation it starts,
    its answer to each assistant turn, and its reward. Counters say how the episode went.

    A tool call or a step() that runs past `tool_timeout_s` is abandoned in its worker thread
    (see tools.run_with_timeout): the episode goes on (tools) or ends (turns). Creating the
    instance, reset() and reward() are bounded the same way; one that runs past the bound is an
    EnvError naming the class and the method (the run stops: no episode can go on without them).
    The caller waits in Thread.join, so a Ctrl-C still reaches it.
    """

    def __init__(self, cls: type, tool_timeout_s: float = 10.0):
        self.cls = cls
        self.kind = kind_of(cls)
        self.tool_timeout_s = tool_timeout_s
        self.tool_calls = self.tool_errors = self.parse_errors = self.timeouts = self.turns = 0
        self.env_time_s = 0.0
        self.info: dict = {}
        self.tools: list[dict] | None = None
        if self.kind == "tools":
            try:
                self.tools = tool_schemas(cls)
            except ValueError as err:
                raise EnvError(f"environment class {cls.__qualname__}: {err}", "fix the tool method named above") from None
        try:
            self.env = self._bounded(f"creating {cls.__qualname__}()", "__init__", cls)
        except EnvError:
            raise
        except Exception as err:  # noqa: BLE001
            raise EnvError(f"creating {cls.__qualname__}() failed: {type(err).__name__}: {err}",
                           "an environment class is created with no arguments, once per episode") from err

    def _timed(self, fn, *args):
        """fn(*args), its time added to env_time_s."""
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.env_time_s += time.perf_counter() - t0

    def _bounded(self, what: str, method: str, fn, *args, where: str = ""):
        """fn(*args) in a worker thread bounded by tool_timeout_s (tools.run_with_timeout): its
        value, or its exception raised here. Past the bound, an EnvError naming `what` (the call
        is abandoned and may go on in its thread)."""
        finished, value, err = self._timed(run_with_timeout, fn, self.tool_timeout_s, *args)
        if not finished:
            self.timeouts += 1
            raise EnvError(f"{what} did not return within rollout.tool_timeout_s ({self.tool_timeout_s:g} s)"
                           f"{where}: abandoned",
                           f"fix {method}() so that it returns; if it needs longer, raise rollout.tool_timeout_s")
        if err is not None and not isinstance(err, Exception):   # SystemExit in user code: named, not obeyed
            raise EnvError(f"{what} raised {type(err).__name__}: {err}", f"fix {method}()")
        if err is not None:
            raise err
        return value

    def start(self, row: dict, prompt_messages: list[dict]) -> list[dict]:
        """Reset the environment for `row`; return the episode's first conversation.

        tools: reset() returning None keeps `prompt_messages`, a str is added (after a blank
        line) to the last user message, a list of messages replaces them. turns: reset()
        returns the conversation, a non-empty list of {"role", "content"} messages.
        """
        try:
            out = self._bounded(f"{self.cls.__qualname__}.reset", "reset", self.env.reset, row,
                                where=f" for the row {_short(row)}")
        except EnvError:
            raise
        except Exception as err:  # noqa: BLE001
            raise EnvError(f"{self.cls.__qualname__}.reset failed for the row {_short(row)}: "
                           f"{type(err).__name__}: {err}", "fix reset(), or the row it cannot handle") from err
        if self.kind == "turns" or isinstance(out, list):
            if not isinstance(out, list) or not out:
                raise EnvError(f"{self.cls.__qualname__}.reset returned {_short(out)}: it must return the first "
                               "messages, a non-empty list", 'return [{"role": "user", "content": "..."}]')
            return self._messages(out, "reset")
        conversation = [dict(m) for m in prompt_messages]
        if out is None:
            return conversation
        if not isinstance(out, str):
            raise EnvError(f"{self.cls.__qualname__}.reset returned {_short(out)}",
                           "return None (keep the prompt), a str (added to the prompt) or a list of messages")
        return _add_to_prompt(conversation, out)

    def respond(self, assistant_text: str) -> tuple[list[dict], bool]:
        """The environment's answer to one assistant turn: (new messages, done)."""
        self.turns += 1
        return (self._respond_tools if self.kind == "tools" else self._respond_turns)(assistant_text)

    def _respond_tools(self, assistant_text: str) -> tuple[list[dict], bool]:
        calls, why = parse_tool_calls(assistant_text)
        if why is not None:
            self.parse_errors += 1
            return [{"role": "tool", "content": f"error: could not parse the tool call: {why}. {PARSE_HELP}"}], False
        if not calls:
            return [], True
        out = []
        for call in calls:
            self.tool_calls += 1
            text, error = self._timed(call_tool, self.env, call, self.tool_timeout_s)
            self.tool_errors += error is not None
            self.timeouts += error == "timeout"
            out.append({"role": "tool", "name": call.name, "content": text})
        return out, False

    def _respond_turns(self, assistant_text: str) -> tuple[list[dict], bool]:
        finished, result, err = self._timed(run_with_timeout, self.env.step, self.tool_timeout_s, assistant_text)
        if not finished:
            self.timeouts += 1
            return [], True
        name = self.cls.__qualname__
        if err is not None:
            raise EnvError(f"{name}.step raised {type(err).__name__}: {err}", "fix step()") from err
        if not isinstance(result, dict) or "done" not in result:
            raise EnvError(f"{name}.step returned {_short(result)}: it must return a dict with \"done\"",
                           'return {"messages": [...], "done": False, "info": {}}')
        done, info = result["done"], result.get("info") or {}
        if done is None or isinstance(done, str) or not isinstance(info, dict):
            raise EnvError(f"{name}.step returned done={done!r}, info={_short(info)}",
                           "set \"done\" to True or False, and \"info\" (if any) to a dict")
        self.info = info
        return self._messages(result.get("messages") or [], "step"), bool(done)

    def _messages(self, messages, method: str) -> list[dict]:
        """Copies of the messages reset/step returned, checked: a list of dicts with a str
        role and a content (made a str when it is not)."""
        where = f"{self.cls.__qualname__}.{method}"
        if not isinstance(messages, list):
            raise EnvError(f"{where} returned messages {_short(messages)}: not a list",
                           'return a list of {"role": ..., "content": ...} dicts')
        out = []
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
                raise EnvError(f"{where} returned the message {_short(m)}: a message is a dict with a str "
                               "\"role\" and a \"content\"", 'e.g. {"role": "user", "content": "Higher."}')
            m = dict(m)
            if not isinstance(m["content"], str):
                m["content"] = str(m["content"])
            out.append(m)
        return out

    def reward(self, messages: list[dict], info: dict | None = None) -> float | None:
        """The environment's own reward for the finished episode, or None when it has none.

        tools: reward(); turns: reward(episode) with episode = {"messages", "info" (the last
        step's, unless given), "turns"}. A non-number or non-finite value is an EnvError.
        """
        if not gives_reward(self.cls):
            return None
        name = f"{self.cls.__qualname__}.reward"
        args = () if self.kind == "tools" else (
            {"messages": messages, "info": self.info if info is None else info, "turns": self.turns},)
        try:
            value = self._bounded(name, "reward", self.env.reward, *args)
        except EnvError:
            raise
        except Exception as err:  # noqa: BLE001
            raise EnvError(f"{name} raised {type(err).__name__}: {err}", "fix reward()") from err
        if isinstance(value, str) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise EnvError(f"{name} returned {_short(value)}: a reward is a finite number", "return a float")
        return float(value)


def _add_to_prompt(conversation: list[dict], text: str) -> list[dict]:
    """The conversation with `text` added, after a blank line, to its last user message (a new
    user message when there is none, or when that message's content is not text)."""
    users = [m for m in conversation if m.get("role") == "user"]
    if users and isinstance(users[-1].get("content"), str):
        users[-1]["content"] = f"{users[-1]['content']}\n\n{text}" if users[-1]["content"] else text
    else:
        conversation.append({"role": "user", "content": text})
    return conversation
