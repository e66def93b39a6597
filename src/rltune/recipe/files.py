"""What `rltune validate` checks beyond the schema and the playbook: the files and builtins a
recipe names exist, and its data files can be read (the checks `train` makes when it loads them,
so that a missing or broken file shows up before a GPU is booked).

Looked up exactly as `train` does: data files as given (absolute, or relative to the current
directory), then relative to the recipe's directory; `path.py:function` reward files the same
way; model directories as given. Model hub ids and `module:function` rewards are not checked (no
download, no user code runs here). An `hf:` data source is loaded as train loads it (a hub
dataset is downloaded into the Hugging Face cache, which train then reuses; offline, a clear
error) and its first rows are checked. Each problem is a Finding with rule `input` (an error:
input that cannot be read, exit code 2) at the recipe key that names the file.
No torch, no pydantic beyond the loaded recipe; `datasets` is imported only for an hf: source.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Optional

from rltune.recipe.findings import Finding

RULE = "input"


def _did_you_mean(name: str, choices) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return (f"did you mean `builtin:{close[0]}`? " if close else "") + "available: " + ", ".join(
        f"builtin:{c}" for c in choices)


def _looked(spec: str, base_dir: Optional[Path]) -> str:
    """ (looked in CWD and RECIPE_DIR)" for a relative path; "" for an absolute one."""
    if Path(spec).expanduser().is_absolute():
        return ""
    dirs = [Path.cwd().resolve()]
    if base_dir is not None and Path(base_dir).resolve() not in dirs:
        dirs.append(Path(base_dir).resolve())
    return f" (looked in {' and '.join(map(str, dirs))})"


def model_problem(spec: str) -> Optional[tuple]:
    """(problem, fix) for a model spec train could not resolve; None when it can (or it is a hub id)."""
    from rltune.data.datasets import missing_file_reason
    from rltune.models.common import BUILTINS

    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTINS:
            return f"unknown builtin model `{spec}`", _did_you_mean(name, BUILTINS)
        return None
    p = Path(spec).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            kind = "directory" if p.is_dir() else "file"
            return (f"model {kind} `{spec}` has no config.json",
                    "point to a directory written by save_pretrained (config.json and the weights), "
                    "a hub id, or builtin:tiny-llama")
        return None
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1 or p.is_symlink():
        return (f"model path `{spec}` {missing_file_reason(p)} (read from the current directory {os.getcwd()})",
                "check the path: a local model is a directory written by save_pretrained; "
                "a hub id looks like `Qwen/Qwen2.5-0.5B-Instruct`")
    return None  # a hub id: train downloads it (or says clearly that it cannot)


def data_problem(spec: str, prompt_key: str, base_dir: Optional[Path], key: str,
                 options: Optional[dict] = None) -> Optional[tuple]:
    from rltune.data.datasets import (BUILTIN_TASKS, FORMATS, SCAN_BYTES, DataError, missing_file_reason,
                                      read_rows, resolve_data_path)
    from rltune.envs import DATA, adapter, prefix_of

    eco = prefix_of(spec, DATA)
    if eco:   # a library's tasks (rltune/envs): what its adapter checks
        problems = adapter(eco[0], DATA).data_problems(eco[1], dict(options or {}))
        return problems[0] if problems else None

    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_TASKS:
            return f"unknown builtin data `{spec}`", _did_you_mean(name, BUILTIN_TASKS)
        return None
    if spec.startswith("hf:"):
        from rltune.data.hub import CHECK_ROWS, load_hf_rows

        try:
            load_hf_rows(spec, prompt_key, key=key, base_dir=base_dir, max_rows=CHECK_ROWS)
        except DataError as e:
            return e.problem, e.fix or ""
        return None
    path = resolve_data_path(spec, base_dir)
    if path is None:
        return (f"data file `{spec}` not found{_looked(spec, base_dir)}",
                f"check {key}: a relative path is read from the current directory, then from the recipe's "
                f"directory; the formats are {', '.join(FORMATS)} (or hf:NAME for a Hugging Face dataset, "
                f"or builtin:arithmetic). "
                "`rltune validate --skip-files` lints a recipe whose files are elsewhere")
    if not path.exists():
        return f"data file `{spec}` {missing_file_reason(path)}", f"point {key} at the real file"
    if path.is_dir():
        return (f"`{spec}` is a directory, not a data file",
                "give a " + ", ".join(FORMATS) + f" file, or hf:{spec} for a dataset directory (save_to_disk or data files)")
    try:
        read_rows(path, spec, prompt_key, max_bytes=SCAN_BYTES)
    except DataError as e:
        return e.problem, e.fix or ""
    return None


def reward_problem(spec: str, base_dir: Optional[Path]) -> Optional[tuple]:
    from rltune.data.datasets import missing_file_reason
    from rltune.reward.functions import reward_file_path
    from rltune.reward.builtins import BUILTIN_REWARDS

    if spec.startswith("builtin:"):
        name = spec.split(":", 1)[1]
        if name not in BUILTIN_REWARDS:
            return f"unknown builtin reward `{spec}`", _did_you_mean(name, BUILTIN_REWARDS)
        return None
    target, _, func = spec.rpartition(":")
    if not target or not func:
        return (f"reward function `{spec}` is not builtin:NAME, module:function or path/to/file.py:function",
                "name the function after a colon, e.g. `rewards.py:score` or `my_pkg.rewards:score`")
    if not target.endswith(".py"):
        return None  # module:function: importing it would run user code; train imports it
    p = reward_file_path(target, base_dir)
    if not p.exists():
        return (f"reward file `{target}` " + (missing_file_reason(p) if p.is_symlink() else "not found"
                                              + _looked(target, base_dir)),
                "check the path: a relative path is read from the current directory, then from the recipe's directory")
    if p.is_dir():
        return f"reward file `{target}` is a directory", "name a .py file and a function in it: `path/to/rewards.py:score`"
    return reward_name_problem(p, target, func)


def _module_names(tree) -> Optional[set]:
    """The names a module's top level binds (def, async def, class, assignments, imports, for/with
    targets, ... also under top-level if/try/with), or None when it may bind names a reading cannot
    see: a module-level `__getattr__`, `from x import *`, or a `globals()` / `exec` / `setattr` call."""
    import ast

    names: set = set()
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda,
              ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

    def visit(node) -> bool:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(child.name)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for a in child.names:
                    if a.name == "*":
                        return False
                    names.add(a.asname or a.name.split(".")[0])
                continue
            if isinstance(child, scopes):
                continue
            ok = visit_expr(child) if isinstance(child, ast.expr) else visit(child)
            if not ok:
                return False
            if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names.add(child.id)
            elif isinstance(child, ast.ExceptHandler) and child.name:
                names.add(child.name)
            elif isinstance(child, (ast.MatchAs, ast.MatchStar)) and child.name:
                names.add(child.name)
            elif isinstance(child, ast.MatchMapping) and child.rest:
                names.add(child.rest)
        return True

    def visit_expr(e) -> bool:
        for n in ast.walk(e):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("globals", "exec", "setattr", "vars"):
                return False
            if isinstance(n, ast.NamedExpr) and isinstance(n.target, ast.Name):
                names.add(n.target.id)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
        return True

    for n in ast.walk(tree):  # `global NAME` in a function binds NAME at the top level when it runs
        if isinstance(n, ast.Global):
            names.update(n.names)
    if not visit(tree) or "__getattr__" in names:
        return None
    return names


def reward_name_problem(p: Path, target: str, func: str) -> Optional[tuple]:
    """(problem, fix) when the reward file at `p` does not define `func` at its top level, read with
    `ast` (the file is not imported: no user code runs in validate); None when it does, or when a
    reading cannot tell (a module `__getattr__`, a star import, an unreadable file)."""
    import ast

    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None  # train reports what it cannot read when it imports the file
    try:
        tree = ast.parse(text, filename=str(p))
    except SyntaxError as e:
        return (f"reward file `{target}` does not parse: {e.msg} (line {e.lineno})",
                f"fix the syntax error in {target}")
    except (ValueError, RecursionError):
        return None
    names = _module_names(tree)
    if names is None or func in names:
        return None
    funcs = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
             and not n.name.startswith("_")]
    public = sorted(n for n in names if not n.startswith("_"))
    close = difflib.get_close_matches(func, funcs or public, n=1, cutoff=0.5)
    shown = funcs or public
    defines = ("it defines the functions " if funcs else "it defines ") + (
        ", ".join(f"`{n}`" for n in shown[:12]) + (f" and {len(shown) - 12} more" if len(shown) > 12 else "")
        if shown else "nothing public at its top level")
    fix = (f"did you mean `{target}:{close[0]}`? " if close else "") + (
        f"name a function {target} defines (`{target}:NAME`), or define `{func}` at its top level")
    return f"reward file `{target}` does not define `{func}` ({defines}): train would fail loading it", fix


def check_files(res) -> list[Finding]:
    """Findings (rule `input`, errors) for the files and builtins a loaded, valid recipe names."""
    r = res.recipe
    if r is None:
        return []
    base = res.base_dir
    out: list[Finding] = []

    def add(path: str, problem: tuple) -> None:
        message, fix = problem
        file, line, col = res.where(path)
        ov = res.override_for(path)
        if ov:
            message += f" (from the override `{ov}`)"
        out.append(Finding(file=file, line=line, column=col, rule=RULE, severity="error", path=path,
                           message=f"{path}: {message}", fix=fix))

    needs_reference = r.algorithm.kl.coef > 0 or r.algorithm.kl.target is not None or r.autotune.enabled
    models = [("model.policy", r.model.policy), ("model.tokenizer", r.model.tokenizer),
              ("model.critic", r.model.critic if r.has_critic else None),
              ("model.reference", r.model.reference if needs_reference else None),
              ("reward.model", r.reward.model)]
    for key, spec in models:
        if spec:
            p = model_problem(spec)
            if p:
                add(key, p)
    for key, spec in (("data.train", r.data.train), ("data.eval", r.data.eval)):
        if spec:
            p = data_problem(spec, r.data.prompt_key, base, key, r.data.options)
            if p:
                add(key, p)
    for i, spec in enumerate(r.reward.functions):
        p = reward_problem(spec, base)
        if p:
            add(f"reward.functions.{i}", p)
    if r.rollout.env:
        for p in env_problems(r, base):
            add("rollout.env", p)
    return out


def env_problems(r, base_dir: Optional[Path]) -> list[tuple]:
    """Every (problem, fix) for `rollout.env`, read and never run (agents/env.py): the class loads and
    has what it needs, its methods take and return what rltune passes and reads (docs/agents.md),
    and the run has a reward (the environment's reward() or reward.functions)."""
    from rltune.agents.env import env_defines_reward, env_file_problems

    spec = r.rollout.env
    shape = ("write the class as docs/agents.md shows: reset(row) and tools (documented, typed public "
             "methods) or step(text)")
    problems = [(problem, fix or shape) for problem, fix in env_file_problems(spec, base_dir, r.rollout.env_args)]
    if problems:
        return problems
    if not r.reward.functions and r.reward.model is None and env_defines_reward(spec, base_dir) is False:
        return [(f"no reward: `{spec}` defines no reward() and reward.functions is empty; every advantage "
                 "would be zero", "define reward(self) (tools) or reward(self, episode) (turns) on the class, or set "
                 "reward.functions (e.g. [builtin:exact_answer] for an `answer` column)")]
    return []


def env_problem(r, base_dir: Optional[Path]) -> Optional[tuple]:
    """The first of env_problems, or None."""
    problems = env_problems(r, base_dir)
    return problems[0] if problems else None
