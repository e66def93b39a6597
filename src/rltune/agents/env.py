"""Loading the environment a recipe names (`rollout.env`) and driving one episode of it.

A user's class is a tools environment (`reset(row)` plus public methods, with type hints and a
docstring, that the model calls; optional `reward()`) or a turns environment (`reset(row)` and
`step(assistant_text) -> {"messages", "done", "info"}`; optional `reward(episode)`). The rollout
drives both through `Session` (session.py); `check_env_file` checks a file for `validate` with `ast`
only.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

from ..errors import UserError
from ..reward.functions import EXIT_FIX, reward_file_path
from .builtin import BUILTIN_ENVS
from .tools import NOT_TOOLS, tool_methods, tool_schemas

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

def load_env_class(spec: str, base_dir: Path | None = None, args: dict | None = None) -> type:
    """The class `spec` names (builtin:NAME, module.path:ClassName or file.py:ClassName, or a
    library's environment: verifiers:NAME, openenv:NAME with `args` = rollout.env_args, rltune/envs),
    checked to be a usable environment; EnvError naming the spec otherwise. A file path is
    read as given, else relative to the recipe's directory `base_dir`."""
    from ..envs import ENVS, adapter, prefix_of

    eco = prefix_of(spec, ENVS)
    if eco:
        return adapter(eco[0], ENVS).load_env(eco[1], dict(args or {}), base_dir)
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
        own = [(n, v) for n, v in vars(module).items() if not n.startswith("_")
               and getattr(v, "__module__", None) == module.__name__]
        problem, fix = no_such_name(target, class_name, [n for n, v in own if isinstance(v, type)],
                                    [n for n, v in own if is_agent(v)])
        raise EnvError(f"{target} has no {class_name!r} (from rollout.env: {spec}; {problem})", fix)
    if is_agent(cls):          # an agent: run(client, row) -> reward (agents/agent.py)
        check_agent(cls)
        return cls
    if not isinstance(cls, type):
        raise EnvError(f"{spec}: {class_name} is a {type(cls).__name__}, not a class or a function",
                       "name a class (one instance per episode) or an agent function run(client, row)")
    try:
        if kind_of(cls) == "tools":
            tool_schemas(cls)
        problems = class_signature_problems(cls)
    except EnvError as err:
        raise EnvError(f"{spec}: {err.problem}", err.fix) from None
    except ValueError as err:
        raise EnvError(f"{spec}: {err}", "fix the tool method named above") from None
    if problems:       # what a method takes or returns: found before any model loads, not at step 1
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise EnvError(f"{spec}: {problems[0][0]}{more}", problems[0][1])
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
    return exec_module_file(path, f"rltune_user_env_{abs(hash(str(path.resolve())))}")


def exec_module_file(path: Path, mod_name: str):
    """Import the file at `path` as the module `mod_name`, registered in sys.modules while and after
    it runs (dataclasses and get_type_hints look it up there); unregistered again when it fails."""
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


def no_such_name(target: str, name: str, classes: list[str], functions: list[str]) -> tuple[str, str]:
    """("it defines ...", fix) for a spec naming what its file or module does not define: what it defines
    (classes and functions: the name may be either), and the closest of those names."""
    import difflib

    def listed(kind: str, names: list[str]) -> str:
        return f"the {kind} " + ", ".join(f"`{n}`" for n in names[:12]) + (
            f" and {len(names) - 12} more" if len(names) > 12 else "")

    parts = [listed(k if len(ns) > 1 else k[:-2 if k == "classes" else -1], ns)
             for k, ns in (("classes", classes), ("functions", functions)) if ns]
    defines = " and ".join(parts) if parts else "no classes and no functions"
    close = difflib.get_close_matches(name, classes + functions, n=3, cutoff=0.6)
    fix = (f"did you mean {' or '.join(f'`{target}:{c}`' for c in close)}? " if close else "") + (
        f"name an environment class or an agent function run(client, row) that {target} defines (docs/agents.md)")
    return f"it defines {defines}", fix


# ---------------------------------------------------------------- agent functions (agents/agent.py runs them)

SIGNATURE_FIX = "define it as `def run(client, row):` returning the episode's reward (a float)"


def is_agent(obj) -> bool:
    """Whether a loaded `rollout.env` object is an agent function (a class is an environment)."""
    return (inspect.isfunction(obj) or inspect.ismethod(obj)) and not isinstance(obj, type)


def check_agent(fn) -> None:
    """EnvError unless `fn` can be called as fn(client, row), with its parameters in that order
    and no return annotation that is not a number."""
    try:
        inspect.signature(fn).bind(object(), object())
    except TypeError:
        raise EnvError(f"agent function {fn.__qualname__}{inspect.signature(fn)} cannot be called as "
                       "run(client, row)", SIGNATURE_FIX) from None
    sig = _runtime_sig(fn)
    problems = [] if sig is None else _agent_problems(sig, f"agent function {fn.__qualname__}", fn.__name__)
    if problems:
        raise EnvError(*problems[0])


def check_agent_def(node: ast.FunctionDef | ast.AsyncFunctionDef, target: str) -> str | None:
    """A problem with an agent function, judged from its text (validate), or None."""
    problems = agent_def_problems(node, target)
    return problems[0][0] if problems else None


def agent_def_problems(node: ast.FunctionDef | ast.AsyncFunctionDef, target: str) -> list[tuple[str, str]]:
    """Every (problem, fix) with an agent function, judged from its text (validate)."""
    a = node.args
    positional = a.posonlyargs + a.args
    required_kw = [k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is None]
    if (len(positional) < 2 and not a.vararg) or required_kw or (
            len(positional) - len(a.defaults) > 2):
        return [(f"agent function `{node.name}` in `{target}` cannot be called as run(client, row): "
                 + SIGNATURE_FIX, SIGNATURE_FIX)]
    return _agent_problems(_ast_sig(node), f"agent function `{node.name}` in `{target}`", node.name)


# ---------------------------------------------------------------- signatures: what rltune passes each method

# a method's return annotation that names only these kinds of value, none of them one rltune takes,
# is wrong (an annotation naming anything else, or nothing, cannot be judged)
KNOWN_TYPES = {"None": "None", "NoneType": "None", "str": "str", "int": "int", "float": "float", "bool": "bool",
               "bytes": "bytes", "dict": "dict", "Dict": "dict", "Mapping": "dict", "MutableMapping": "dict",
               "list": "list", "List": "list", "Sequence": "list", "tuple": "tuple", "Tuple": "tuple",
               "set": "set", "Set": "set", "frozenset": "set", "FrozenSet": "set"}
NUMBER = ({"int", "float", "bool"}, "the episode's reward, a finite number", "-> float")
RETURNS = {
    ("tools", "reset"): ({"None", "str", "list"}, "None (keep the prompt), a str (added to the prompt) or a list "
                         "of messages", "-> str | None"),
    ("turns", "reset"): ({"list"}, 'the first messages, a non-empty list of {"role", "content"} dicts',
                         "-> list[dict]"),
    ("turns", "step"): ({"dict"}, 'a dict {"messages", "done", "info"}', "-> dict"),
    ("tools", "reward"): NUMBER,
    ("turns", "reward"): NUMBER,
    ("agent", "run"): NUMBER,
}
ROW_NAMES = frozenset({"row", "rows", "example", "sample", "record", "item"})
TOOLS_REWARD_FIX = ("def reward(self) -> float: score from what reset() and the tools kept on self (a tools "
                    "environment's reward gets no arguments; reward.functions score the last answer)")


class _Sig:
    """A function's signature as rltune calls it, read from its text (ast) or from the function."""

    def __init__(self, params, required, vararg, kwonly, required_kw, returns, doc, decorated=False):
        self.params, self.required, self.vararg = list(params), required, vararg   # positional, self included
        self.kwonly, self.required_kw = list(kwonly), list(required_kw)
        self.returns, self.doc, self.decorated = returns, doc, decorated

    def takes(self, n: int) -> bool:
        """Whether it can be called with n positional arguments (self counted) and nothing else."""
        return (len(self.params) >= n or self.vararg) and self.required <= n and not self.required_kw

    def text(self, name: str) -> str:
        return f"{name}({', '.join(self.params + (['*args'] if self.vararg else []) + self.kwonly)})"


def _ast_names(node) -> set | None:
    """The kinds of value (KNOWN_TYPES' values) an annotation names, or None when it names others."""
    if isinstance(node, ast.Constant):
        if node.value is None:
            return {"None"}
        if isinstance(node.value, str):       # a string annotation: its text
            try:
                return _ast_names(ast.parse(node.value, mode="eval").body)
            except (SyntaxError, ValueError, RecursionError):
                return None
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, right = _ast_names(node.left), _ast_names(node.right)
        return None if left is None or right is None else left | right
    if isinstance(node, ast.Subscript):
        base = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", None)
        if base in ("Optional", "Union"):
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            names = [_ast_names(x) for x in parts]
            if any(n is None for n in names):
                return None
            return set().union(*names) | ({"None"} if base == "Optional" else set())
        node = node.value
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None) if isinstance(node, ast.Attribute) else None
    return {KNOWN_TYPES[name]} if name in KNOWN_TYPES else None


def _hint_names(hint) -> set | None:
    """_ast_names for a resolved type hint."""
    import collections.abc
    import types
    import typing

    if hint is None or hint is type(None):
        return {"None"}
    origin = typing.get_origin(hint)
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        names = [_hint_names(a) for a in typing.get_args(hint)]
        return None if any(n is None for n in names) else set().union(*names)
    base = origin or hint
    known = {str: "str", int: "int", float: "float", bool: "bool", bytes: "bytes", dict: "dict",
             collections.abc.Mapping: "dict", collections.abc.MutableMapping: "dict", list: "list",
             collections.abc.Sequence: "list", tuple: "tuple", set: "set", frozenset: "set"}
    try:
        return {known[base]} if base in known else None
    except TypeError:       # an unhashable annotation
        return None


def _ast_sig(f) -> _Sig:
    a = f.args
    params = [x.arg for x in a.posonlyargs + a.args]
    return _Sig(params, len(params) - len(a.defaults), a.vararg is not None, [k.arg for k in a.kwonlyargs],
                [k.arg for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is None],
                None if f.returns is None else _ast_names(f.returns), ast.get_docstring(f), bool(f.decorator_list))


def _runtime_sig(fn) -> _Sig | None:
    """The _Sig of a function (None when inspect cannot read it). Its return hint is resolved as
    the tools' schemas resolve theirs (typing.get_type_hints); one that does not resolve is not judged."""
    import typing

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    P = inspect.Parameter
    pos = [p for p in sig.parameters.values() if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    kw = [p for p in sig.parameters.values() if p.kind == P.KEYWORD_ONLY]
    returns = None
    if sig.return_annotation is not inspect.Signature.empty:
        try:
            returns = _hint_names(typing.get_type_hints(fn).get("return", object))
        except Exception:  # noqa: BLE001 - a forward reference that does not resolve: not judged
            returns = None
    return _Sig([p.name for p in pos], sum(p.default is P.empty for p in pos),
                any(p.kind == P.VAR_POSITIONAL for p in sig.parameters.values()), [p.name for p in kw],
                [p.name for p in kw if p.default is P.empty], returns, inspect.getdoc(fn))


def _return_problem(kind: str, method: str, sig: _Sig, label: str) -> tuple[str, str] | None:
    takes, what, fix = RETURNS[(kind, method)]
    if sig.returns is None or sig.returns & takes:
        return None
    shown = " | ".join(sorted(sig.returns))
    return (f"{label}: {method}() is annotated `-> {shown}`, but rltune reads what it returns as {what}",
            f"annotate it `{fix}` (or drop the annotation), and return {what}")


def _agent_problems(sig: _Sig, label: str, name: str) -> list[tuple[str, str]]:
    out = []
    first, second = (sig.params + ["", ""])[:2]
    if first.lower() in ROW_NAMES or "client" in second.lower():
        out.append((f"{label}: {sig.text(name)} has its parameters swapped: rltune calls it as run(client, row), "
                    f"so `{first}` would get the OpenAI client and `{second}` the data row",
                    f"def {name}(client, row): the client first, then the row (a dict of its columns)"))
    p = _return_problem("agent", "run", sig, label)
    if p:
        out.append(p)
    return out


def _method_problems(kind: str, label: str, methods: dict, tools: dict) -> list[tuple[str, str]]:
    """Every (problem, fix) with what an environment class's methods take and return.

    `methods`: {"reset" / "step" / "reward": _Sig or None}; `tools`: {name: _Sig}. Decorated
    methods are not judged (a decorator may change the signature)."""
    out: list[tuple[str, str]] = []
    reset, step, reward = (methods.get(n) for n in ("reset", "step", "reward"))
    if reset is not None and not reset.decorated:
        if not reset.takes(2):
            out.append((f"{label}: {reset.text('reset')} cannot be called as reset(row): rltune calls reset with "
                        "the episode's data row (a dict of its columns) before the first turn",
                        "def reset(self, row): (ignore `row` if the episode does not need it)"))
        out.append(_return_problem(kind, "reset", reset, label))
    if kind == "turns" and step is not None and not step.decorated:
        if not step.takes(2):
            out.append((f"{label}: {step.text('step')} cannot be called as step(assistant_text): rltune passes "
                        "each assistant turn's text, a str", "def step(self, assistant_text) -> dict:"))
        out.append(_return_problem(kind, "step", step, label))
    if reward is not None and not reward.decorated:
        if kind == "tools" and not reward.takes(1):
            out.append((f"{label}: {reward.text('reward')} cannot be called as reward(): a tools environment's "
                        "reward gets no arguments (only a turns environment's gets the episode); the first "
                        "episode's end would fail", TOOLS_REWARD_FIX))
        if kind == "turns" and not reward.takes(2):
            out.append((f"{label}: {reward.text('reward')} cannot be called as reward(episode): a turns "
                        'environment\'s reward gets episode = {"messages", "info", "turns"}',
                        "def reward(self, episode) -> float:"))
        out.append(_return_problem(kind, "reward", reward, label))
    for name, sig in tools.items():
        if sig.decorated:
            continue
        if not sig.params or sig.params[0] != "self":
            got = f"its first parameter `{sig.params[0]}` would get" if sig.params else "it takes"
            out.append((f"tool `{name}` of {label} has no `self`: a tool is called on the instance "
                        f"(env.{name}(...)), so {got} the instance, not the model's argument",
                        f"def {name}(self, {', '.join(sig.params + sig.kwonly)}):".replace(", )", ")")))
            continue
        if sig.doc:
            from .tools import _split_docstring

            _, described = _split_docstring(sig.doc)
            names = sig.params[1:] + sig.kwonly
            for extra in (a for a in described if a not in names):
                import difflib

                bare = [n for n in names if n not in described]     # parameters no entry describes
                close = difflib.get_close_matches(extra, bare or names, n=1, cutoff=0.5) or bare[:1]
                out.append((f"the Args: section of tool `{name}` of {label} describes `{extra}`, which is not one "
                            f"of its parameters ({', '.join(f'`{n}`' for n in names) or 'none'}): the model "
                            "would be told of an argument the tool does not take",
                            (f"rename the entry `{close[0]}:`" if close else "remove the entry")
                            + f" in {name}'s docstring, or rename the parameter"))
    return [p for p in out if p is not None]


def class_signature_problems(cls: type) -> list[tuple[str, str]]:
    """_method_problems of a loaded environment class (train, before any model loads)."""
    kind = kind_of(cls)
    methods = {}
    for name in ("reset", "step", "reward"):
        raw = inspect.getattr_static(cls, name, None)
        if inspect.isfunction(raw):
            sig = _runtime_sig(raw)
            if sig is not None:
                methods[name] = sig
    tools = {}
    for name, fn in (tool_methods(cls) if kind == "tools" else {}).items():    # a turns class's methods are no tools
        sig = _runtime_sig(fn)
        if sig is not None:
            tools[name] = sig
    return _method_problems(kind, f"environment class {cls.__qualname__}", methods, tools)


# ---------------------------------------------------------------- validate: read, never run

def check_env_file(spec: str, base_dir: Path | None) -> str | None:
    """A problem with the environment `spec` names, found WITHOUT running user code, or None
    (the first of env_file_problems)."""
    problems = env_file_problems(spec, base_dir)
    return problems[0][0] if problems else None


def env_file_problems(spec: str, base_dir: Path | None, args: dict | None = None) -> list[tuple[str, str | None]]:
    """Every (problem, fix or None) with the environment `spec` names, found WITHOUT running user code.

    builtin: the name exists. file.py:Class: the file (at most 2 MB) parses and defines the
    class with reset() and step() or documented, typed public methods; then what each method
    takes and returns as rltune calls it (reset(row), step(text), reward() for tools and
    reward(episode) for turns, tools with self and Args: entries naming parameters, return
    annotations). file.py:function: an agent, run(client, row). Nothing for module:Class (only
    importing could tell: `train` checks the same on the loaded class before any model loads),
    nor what a reading cannot tell (a base class from elsewhere). A library's environment
    (verifiers:NAME, openenv:NAME): what its adapter checks (rltune/envs).
    """
    from ..envs import ENVS, adapter, prefix_of

    eco = prefix_of(spec, ENVS)
    if eco:
        return adapter(eco[0], ENVS).env_problems(eco[1], dict(args or {}))
    if spec.startswith("builtin:"):
        if spec.split(":", 1)[1] in BUILTIN_ENVS:
            return []
        return [("unknown builtin environment `" + spec + "`; available: "
                 + ", ".join(f"builtin:{n}" for n in BUILTIN_ENVS),
                 "name one of those, or a class or agent function of your own (docs/agents.md)")]
    target, _, class_name = spec.rpartition(":")
    if not target or not class_name:
        return [(f"environment `{spec}` is not {SPEC_FORMS}",
                 "name the class or agent function after a colon, e.g. `envs.py:MyEnv` or `agent.py:run`")]
    if not target.endswith(".py"):
        return []
    path = reward_file_path(target, base_dir)
    where = "check the path: a relative path is read from the current directory, then the recipe's"
    if not path.exists():
        return [(f"environment file `{target}` not found"
                 + ("" if Path(target).is_absolute() else " (looked in the current directory, then the recipe's)"), where)]
    if not path.is_file():
        return [(f"environment file `{target}` is not a regular file", where)]
    tree, problem = _parse_file(path, target)
    if tree is None:     # the file, not what it defines: no class or agent template fits
        return [(problem, f"fix {target} so that Python can read it (a UTF-8 .py file, at most 2 MB)")]
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if class_name in functions and class_name not in classes:   # an agent: run(client, row)
        return agent_def_problems(functions[class_name], target)
    if class_name not in classes:
        if _may_bind(tree, class_name):
            return []  # bound by an import or an assignment: only importing could tell
        problem, fix = no_such_name(target, class_name, list(classes), list(functions))
        return [(f"environment file `{target}` defines no `{class_name}` ({problem})", fix)]
    return _class_problems(classes, class_name, target)


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


def _class_problems(classes: dict, class_name: str, target: str) -> list[tuple[str, str | None]]:
    """What keeps the class from being an environment, judged from its text ([]: fine or unknowable)."""
    members = _class_members(classes, class_name)
    if members is None:
        return []
    where = f"class `{class_name}` in `{target}`"
    if "reset" not in members:
        return [(f"{where} has no reset(self, row) method: an environment needs one", None)]
    methods = {n: _ast_sig(members[n]) for n in ("reset", "step", "reward") if members.get(n) is not None}
    if "step" in members:
        return _method_problems("turns", where, methods, {})
    plain = {"staticmethod", "classmethod", "property", "cached_property"}
    tools = {n: f for n, f in members.items() if f is not None and not n.startswith("_") and n not in NOT_TOOLS
             and not any(isinstance(d, (ast.Name, ast.Attribute)) and getattr(d, "id", getattr(d, "attr", "")) in plain
                         for d in f.decorator_list)}
    if not tools:
        return [(f"{where} has neither step() nor any public method (a tool): " + SHAPES_FIX, None)]
    out: list[tuple[str, str | None]] = []
    for n, f in tools.items():
        if ast.get_docstring(f) is None:
            out.append((f"tool `{n}` of {where} has no docstring: the model reads it to learn what the tool does", None))
        elif f.args.vararg or f.args.kwarg:
            out.append((f"tool `{n}` of {where} takes *args or **kwargs: a tool's parameters must be named", None))
        else:
            params = (f.args.posonlyargs + f.args.args)[1:] + f.args.kwonlyargs  # without self
            unhinted = [a.arg for a in params if a.annotation is None]
            if unhinted:
                out.append((f"parameter `{unhinted[0]}` of tool `{n}` of {where} has no type hint: the tool's "
                            "schema needs one", None))
    return out + _method_problems("tools", where, methods, {n: _ast_sig(f) for n, f in tools.items()})
