"""verifiers environments (`rollout.env: verifiers:NAME`, `data.train: verifiers:NAME`; docs/agents.md,
"verifiers").

NAME is what verifiers' own loader takes as a taskset id: an importable module (an installed
environment package, `owner/name[@version]` for a Hub id installed as `name`, or a dotted module
such as rltune's examples `rltune.envs.verifiers_examples.digits`), or a file `path/to/env.py`
(read from the current directory, then from the recipe's). The module exports (`__all__`) one
`vf.Taskset` subclass, and optionally a `vf.Env` (multi-turn control flow) and a `vf.Harness`.

- data: the taskset's tasks are the rows: `prompt` (the task's prompt text), `answer` when the
  task has one, and `vf_task` (the task's data, JSON) from which the episode rebuilds the task. A
  row of other data (a jsonl file) becomes a task through the task's data model.
- rollout: `load_env` returns an agent function `run(client, row)` (agents/agent.py): each call
  runs one verifiers episode (`Env.run_episode`: its Env's control flow, its harness) with the
  model client pointed at rltune's recording endpoint (the client's base URL), so each model turn
  is sampled by rltune, token-in token-out, and recorded. The harness is the taskset's own when it
  exports one, else rltune's in-process chat harness (verifiers_examples/chat.py: verifiers' own
  harnesses are `uv` programs, which cannot be prepared offline).
- reward: the trace's rewards (the Task's `@vf.reward` methods and judges), weighted as verifiers
  weighs them; each criterion's score is returned as a reward part (`reward/env/NAME`), each
  `@vf.metric` value as a metric (`env/metric/NAME`).

`rollout.env_args` is merged onto the verifiers env config (its `[env]` block: `taskset`, `agent`,
`timeout`, ...): rltune sets `taskset.id` = NAME, the agent's runtime `subprocess` and the
interception `server` (local, no tunnel); anything given there wins.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import math
import sys
import threading
from pathlib import Path

LIB = "verifiers"
INSTALL_FIX = "pip install 'rltune[envs]' (or: pip install verifiers)"
DEFAULT_HARNESS = "rltune.envs.verifiers_examples.chat"
ENDED = ("episode_ended", "this episode has ended")   # rltune's endpoint ended the episode (a bound)


class VerifiersError(Exception):
    """One line: verifiers, the environment, what happened and the fix."""


# ---------------------------------------------------------------- names, without importing verifiers

def _file(name: str, base_dir: Path | None = None) -> Path | None:
    if not name.endswith(".py"):
        return None
    p = Path(name).expanduser()
    if p.is_file() or p.is_absolute() or base_dir is None:
        return p
    return Path(base_dir) / p


def _module_name(name: str) -> str:
    """The module verifiers imports for a taskset id (its loader: `owner/name@v` -> name)."""
    return name.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def _problem(name: str) -> tuple[str, str] | None:
    if importlib.util.find_spec("verifiers") is None:
        return (f"verifiers:{name} needs the `verifiers` package, which is not installed", INSTALL_FIX)
    path = _file(name)
    if path is not None:
        if not path.is_file():
            return (f"verifiers environment file {name} does not exist",
                    "check the path (read from the current directory, then the recipe's)")
        return None
    module = _module_name(name)
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return (f"verifiers environment {name!r} is not installed (no module {module!r})",
                f"install it (prime env install {name}, or pip install it), or name a local one: "
                "verifiers:path/to/env.py or verifiers:rltune.envs.verifiers_examples.digits")
    return None


def env_problems(name: str, args: dict) -> list[tuple[str, str]]:
    problem = _problem(name)
    if problem is None and not isinstance(args, dict):
        problem = ("rollout.env_args must be a mapping (the verifiers env config)", "e.g. env_args: {taskset: {...}}")
    return [problem] if problem else []


def data_problems(name: str, options: dict) -> list[tuple[str, str]]:
    problem = _problem(name)
    return [problem] if problem else []


# ---------------------------------------------------------------- loading

def _import_vf():
    try:
        import verifiers.v1 as vf
    except ImportError as err:
        raise VerifiersError(f"verifiers: the package cannot be imported ({err}); fix: {INSTALL_FIX}") from None
    return vf


def _taskset_id(name: str, base_dir: Path | None) -> str:
    """The id verifiers' loader imports: NAME, or for a file a module registered under its own name."""
    path = _file(name, base_dir)
    if path is None:
        if "." not in _module_name(name):
            return name
        # a dotted module: verifiers' loader looks it up under verifiers.v1.tasksets first, which
        # fails for a dotted name; it is imported here and registered under a flat alias
        alias = "rltune_vf_" + _module_name(name).replace(".", "_")
        sys.modules.setdefault(alias, importlib.import_module(_module_name(name)))
        return alias
    if not path.is_file():
        raise VerifiersError(f"verifiers environment file {name} does not exist; fix: check the path "
                             "(read from the current directory, then the recipe's)")
    mod_name = f"rltune_vf_{abs(hash(str(path.resolve())))}"
    if mod_name not in sys.modules:
        from ..agents.env import exec_module_file

        exec_module_file(path, mod_name)
    return mod_name


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _load(name: str, args: dict, base_dir: Path | None):
    """(vf, the verifiers Env) for NAME with `args` merged onto rltune's defaults."""
    vf = _import_vf()
    from .verifiers_tools import install

    install()                       # tool servers start behind rltune's guard
    try:
        tid = _taskset_id(name, base_dir)
        from verifiers.v1.utils.loaders import default_harness_id, environment_class, taskset_class

        taskset_class(tid)          # the taskset first: its error names what is missing
        harness = {} if default_harness_id(tid) == tid else {"id": DEFAULT_HARNESS}
        config = _merge({"taskset": {"id": tid}, "interception": {"type": "server"},
                         "agent": {"runtime": {"type": "subprocess"}, **({"harness": harness} if harness else {})}},
                        dict(args or {}))
        cls = environment_class(tid, config.get("id", ""))
        from verifiers.v1.utils.generic import concrete_type

        config_cls = concrete_type(cls, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig
        return vf, cls(config_cls.model_validate(config))
    except VerifiersError:
        raise
    except Exception as err:  # noqa: BLE001 - the library's failure, as one line with the fix
        raise VerifiersError(_line(name, f"loading it failed: {type(err).__name__}: {_first(err)}",
                                   "check the environment module and rollout.env_args (verifiers' env config)")) from err


def _ended(errors) -> bool:
    """An error of an episode rltune's recording endpoint ended (max_turns, max_episode_tokens, a
    turn cut at max_new_tokens): the episode is over, not broken."""
    return any(any(k in (e.message or "") for k in ENDED) for e in errors)


def _first(err) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else "")[:300]


def _line(name: str, what: str, fix: str) -> str:
    return f"verifiers environment {name!r}: {what}; fix: {fix}"


def _task_row(task) -> dict:
    data = task.data.model_dump(mode="json", exclude_none=True)
    row = {"prompt": task.data.prompt_text, "vf_task": data}
    if "answer" in data:
        row["answer"] = str(data["answer"])
    return row


def rows(name: str, options: dict, size: int, seed: int, split: str) -> list[dict]:
    """The taskset's tasks as rows; the eval split is the same tasks (a taskset has no split:
    `data.eval` may name another file or taskset). `options` are merged onto the env config."""
    try:
        _, env = _load(name, options, None)
        tasks = list(env.taskset.take(max(int(size), 1)) if not env.taskset.bounded else env.taskset)
    except VerifiersError as err:
        from ..data.datasets import DataError

        problem, _, fix = str(err).partition("; fix: ")
        raise DataError(f"data.{split}: {problem}", fix) from None
    if not tasks:
        from ..data.datasets import DataError

        raise DataError(f"data.{split}: verifiers environment {name!r} has no tasks", "check its taskset's load()")
    return [_task_row(t) for t in tasks]


def load_env(name: str, args: dict, base_dir: Path | None):
    """The agent function rltune's episodes drive (see the module docstring)."""
    from ..agents.env import EnvError

    try:
        vf, env = _load(name, args, base_dir)
    except VerifiersError as err:
        problem, _, fix = str(err).partition("; fix: ")
        raise EnvError(problem, fix) from None
    task_cls = env._task_cls
    data_cls = task_cls.data_type()
    task_config = env.taskset.config.task
    lock = threading.Lock()

    def task_of(row: dict):
        data = row.get("vf_task")
        if not isinstance(data, dict):       # a row of other data: the task's data model from its columns
            data = {k: v for k, v in row.items() if k in data_cls.model_fields}
        return task_cls(data_cls.model_validate(data), task_config)

    async def episode(client, row):
        with lock:
            mine = copy.copy(env)            # serving() keeps its resources on the instance
        ctx = vf.ModelContext(model="policy", client=vf.EvalClientConfig(
            base_url=str(client.base_url).rstrip("/"), api_key_var="RLTUNE_VF_UNUSED"))
        task = task_of(row)
        async with mine.serving():
            result = await mine.run_episode(task, ctx)
        if _ended(result.errors) or any(_ended(t.errors) for t in result.traces):
            # rltune ended the episode (a bound): verifiers skips its scoring after the failed
            # turn; the turns played are scored here (signals that need the runtime are skipped)
            for trace in result.traces:
                if not trace.rewards:
                    await task.score(trace)
        return result

    def run(client, row):
        result = asyncio.run(episode(client, row))
        traces = [t for t in result.traces if t.rewards]
        errors = list(result.errors) + [e for t in result.traces for e in t.errors]
        if errors and not _ended(errors):
            e = errors[0]
            raise VerifiersError(_line(name, f"{e.type}: {(e.message or '').strip().splitlines()[0][:300] if e.message else ''}",
                                       "fix the environment's code named in the message (or its rollout.env_args)"))
        parts: dict[str, float] = {}
        metrics: dict[str, float] = {}
        for t in result.traces:
            for key, r in t.rewards.items():
                if r is not None and math.isfinite(r.score):
                    parts[key] = parts.get(key, 0.0) + float(r.score)
            for key, v in t.metrics.items():          # @vf.metric: measured, not rewarded
                if v is not None and math.isfinite(v):
                    metrics[key] = metrics.get(key, 0.0) + float(v)
        reward = sum(t.reward for t in traces)
        return {"reward": float(reward), "parts": parts, "metrics": metrics}

    run.__qualname__ = f"verifiers:{name}"
    run.vf_env = env
    return run


__all__ = ["data_problems", "env_problems", "load_env", "rows"]
