"""`rltune eval RECIPE [--model DIR]`: the recipe's held-out evaluation outside training.

The eval a run does before its first step and after its last (train/loop.py `evaluate`: greedy
single-turn answers, or greedy episodes for `rollout.env`, environment classes and OpenAI-client
agents through the recording endpoint, scored by the recipe's rewards) on the recipe's own
components (train/setup.py `build`: tokenizer, eval rows, rewards, environment, rollout engine),
first with model.policy ("before"), then with the weights in DIR loaded into the actor and synced
into the rollout engine exactly as a training step syncs them ("after"). It prints the lines a run
prints at its end (train/progress.py).

Which rows: the run's eval set (data.eval, or a builtin task's held-out split, drawn from
trainer.seed). A recipe on file data without data.eval has none: refused with the key to set.

DIR is input rltune did not write (or did, on another machine): read as data (docs/reliability.md,
"What rltune trusts"). No link is followed; config.json is read with plan's bounded reader and must
describe the policy's architecture; weights are read from safetensors only (never a pickle); a
final/ with a manifest.json is checked against it first. Bad input: one message, exit 1.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from rltune.errors import UserError

WEIGHT_DTYPES = ("F32", "F16", "BF16", "F64")


class EvalInputError(UserError):
    """DIR cannot be evaluated (the message names the file and the fix): exit 1."""


@dataclass
class Weights:
    """What `--model` names, checked: the directory, its safetensors files, and whether they hold a
    LoRA adapter (PEFT's adapter_model.safetensors) rather than a whole model."""
    dir: Path
    files: list
    adapter: bool = False


def run(recipe_path: str, overrides: list[str], model: str | None = None, as_json: bool = False,
        limit: int | None = None) -> int:
    from rltune.commands.validate import check_all
    from rltune.recipe import format_findings, has_errors

    if limit is not None and limit < 1:
        print(f"rltune: --limit {limit}: give a number of eval rows, 1 or more", file=sys.stderr)
        return 2
    recipe, findings = check_all(recipe_path, overrides)
    if recipe is None or has_errors(findings):
        errors = [f for f in findings if f.severity == "error"]
        if errors:
            print(format_findings(errors, "text"), file=sys.stderr)
        print(f"rltune: {recipe_path}: the recipe has errors; not evaluating", file=sys.stderr)
        return 1
    d = recipe.data
    from ..envs import generated

    if not d.eval and not generated(d.train):
        print(f"rltune: {recipe_path}: the recipe has no eval set: data.eval is not set, and data.train "
              f"({d.train}) is not a builtin task with a held-out split (training evaluates nothing either)\n"
              f"  fix: set data.eval to the held-out rows, e.g. `rltune eval {recipe_path} data.eval=heldout.jsonl`",
              file=sys.stderr)
        return 2
    weights = find_weights(model, recipe) if model is not None else None
    with tempfile.TemporaryDirectory(prefix="rltune-eval-") as tmp:
        # one process; a builtin task's held-out split even where the recipe's trainer.eval_every is 0;
        # nothing written into the recipe's run directory (a vllm-server log goes to `tmp`)
        trainer = recipe.trainer.model_copy(update={"nproc": 1, "nnodes": 1, "output_dir": tmp,
                                                    "eval_every": recipe.trainer.eval_every or 1})
        recipe = recipe.model_copy(update={"trainer": trainer})
        result = _evaluate(recipe, Path(recipe_path), weights, limit)
    _report(result, recipe_path, model, recipe, as_json)
    return 0


def _evaluate(recipe, recipe_path: Path, weights: Weights | None, limit: int | None) -> dict:
    """Build the run's components, evaluate the policy, then (with `weights`) the weights."""
    from rltune.data import PromptSet
    from rltune.lean_imports import import_stack

    import_stack()
    from rltune.engine.distributed import process_group
    from rltune.train.loop import evaluate
    from rltune.train.setup import build

    with process_group(recipe.trainer.device, recipe.trainer.collective_timeout_s) as dist:
        c = build(recipe, dist, recipe_path.parent)
        try:
            if limit is not None:
                c.eval_set = PromptSet(c.eval_set.rows[:limit], c.eval_set.prompt_key, c.eval_set.source)
            out = {"engine": c.rollout.name, "before": evaluate(c), "after": None}
            if weights is not None:
                load_weights(c.actor, weights)
                c.rollout.sync_weights(c.actor)
                out["after"] = evaluate(c)
        finally:
            c.rollout.close()
            from ..train.episodes import close_environment

            close_environment(c.env)   # a library environment's child server (rltune/envs)
    return out


def _report(result: dict, recipe_path: str, model: str | None, recipe, as_json: bool) -> None:
    from rltune.train.progress import eval_line, final_eval_lines, reward_weights

    before, after = result["before"], result["after"]
    if as_json:   # the keys of RUN/eval.json, and what was evaluated
        out = {"recipe": str(recipe_path), "policy": recipe.model.policy, "model": model, "engine": result["engine"],
               "prompts": before.prompts, "before": before.reward, "after": after.reward if after else None,
               "before_parts": before.parts, "after_parts": after.parts if after else None,
               "before_episode": before.episode, "after_episode": after.episode if after else None,
               "before_env": before.env, "after_env": after.env if after else None}
        print(json.dumps(out))
        return
    weights = reward_weights(recipe)
    print(f"rollout engine {result['engine']}")
    print(eval_line(f"of model.policy ({recipe.model.policy})", before, weights))
    if after is None:
        return
    print(eval_line(f"of {model}", after, weights))
    for line in final_eval_lines(before, after, weights):
        print(line)


# ------------------------------------------------------------------ DIR: what it holds, checked


def _refuse(where, problem: str, fix: str) -> EvalInputError:
    return EvalInputError(f"--model {where}: {problem}\n  fix: {fix}")


def _plain_file(path: Path, what: str) -> None:
    """`path` must be a regular file that is not a link (rltune never follows one it did not make)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise _refuse(path, f"{what} is missing", "pass a directory written by save_pretrained (a run's final/)") from None
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, f"{what} is a link: rltune does not follow links in a model directory it did not write",
                      f"copy the file itself into the directory (cp --dereference), after checking where it points: "
                      f"{os.readlink(path)}")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, f"{what} is not a regular file", "pass a directory written by save_pretrained")


FIX_DIR = "pass a run's final/ (RUN_DIR/final), or a directory with config.json and model.safetensors"


def find_weights(arg: str, recipe) -> Weights:
    """The weights `--model ARG` names, checked before anything heavy is built: a model directory
    (config.json + safetensors), a LoRA run's final/ (the adapter), or a run directory (its final/)."""
    path = Path(arg).expanduser()
    if path.is_symlink():
        raise _refuse(arg, "is a link: rltune does not follow links to a model directory",
                      f"pass the directory it points to ({os.readlink(path)}) after checking it")
    if not path.exists():
        raise _refuse(arg, "does not exist", FIX_DIR)
    if not path.is_dir():
        raise _refuse(arg, "is a file, not a directory", FIX_DIR)
    if not _holds_model(path):
        final = path / "final"
        if final.exists() or final.is_symlink():
            return find_weights(str(final), recipe)
        if any((path / n).exists() for n in ("metrics.jsonl", "checkpoints", "recipe.yaml", "train.log")):
            raise _refuse(arg, "is a run directory without final/ (the run has not finished, or stopped before its "
                               "final export)",
                          f"finish it with `rltune train RECIPE trainer.output_dir={arg} --resume auto` (it exports "
                          "final/ at the end), then pass it again")
        raise _refuse(arg, "holds no model (no config.json, no adapter_config.json, no final/)", FIX_DIR)
    if (path / "manifest.json").exists() or (path / "manifest.json").is_symlink():
        from rltune.train.manifest import verify

        problem = verify(path)
        if problem:
            raise _refuse(arg, f"does not match its manifest.json: {problem}",
                          "export it again (`rltune train RECIPE --resume auto` redoes an incomplete final/), "
                          "or copy it again from where it was written")
    lora = recipe.model.lora
    if not (path / "config.json").exists() and not (path / "config.json").is_symlink():   # a LoRA adapter
        if lora is None:
            raise _refuse(arg, "holds a LoRA adapter (adapter_config.json) and the recipe trains full weights "
                               "(model.lora is not set)",
                          "evaluate it with the LoRA recipe it was trained with, or pass its merged model "
                          "(final/merged/, written with trainer.save_merged: true)")
        _plain_file(path / "adapter_config.json", "adapter_config.json")
        _check_adapter_config(path, lora)
        _plain_file(path / "adapter_model.safetensors", "adapter_model.safetensors")
        return Weights(path, [path / "adapter_model.safetensors"], adapter=True)
    _plain_file(path / "config.json", "config.json")
    _check_arch(path, recipe)
    return Weights(path, _safetensors_files(path))


def _holds_model(path: Path) -> bool:
    return any((path / n).exists() or (path / n).is_symlink() for n in ("config.json", "adapter_config.json"))


def _check_arch(path: Path, recipe) -> None:
    """config.json, read as plan reads one (bounded, every size checked), must describe the
    policy's architecture and vocabulary: the recipe's tokenizer renders every prompt."""
    from rltune.plan import ConfigError
    from rltune.plan.arch import ArchUnknown, resolve_arch

    try:
        mine = resolve_arch(str(path), "--model")
    except ConfigError as err:
        raise EvalInputError(str(err)) from None
    except ArchUnknown as err:
        raise _refuse(path, str(err).split("\n")[0].split(": ", 1)[-1], FIX_DIR) from None
    try:
        policy = resolve_arch(recipe.model.policy, "model.policy")
    except ArchUnknown:   # a hub id not cached: the weights' names and shapes are checked when they load
        return
    skip = ("source",)
    a = {k: v for k, v in asdict(mine).items() if k not in skip}
    b = {k: v for k, v in asdict(policy).items() if k not in skip}
    if a != b:
        diff = ", ".join(f"{k} {a[k]} (the policy: {b[k]})" for k in a if a[k] != b[k])
        raise _refuse(path, f"its config.json is not the architecture of model.policy {recipe.model.policy}: {diff}",
                      "pass weights trained from model.policy (a run of this recipe), or set model.policy "
                      "(and model.tokenizer) to the model they were trained from")


def _check_adapter_config(path: Path, lora) -> None:
    from rltune.plan import ConfigError
    from rltune.plan.arch import read_config_file

    try:
        cfg = read_config_file(path / "adapter_config.json", "--model")
    except ConfigError as err:
        raise EvalInputError(str(err)) from None
    r, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if r != lora.r or not isinstance(alpha, (int, float)) or float(alpha) != float(lora.alpha):
        raise _refuse(path / "adapter_config.json", f"the adapter has r {r!r}, lora_alpha {alpha!r}; the recipe's "
                                                    f"model.lora has r {lora.r}, alpha {lora.alpha:g}",
                      "evaluate it with the model.lora settings it was trained with")


def _safetensors_files(path: Path) -> list:
    """model.safetensors, or the shards model.safetensors.index.json lists (plain names in `path`)."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if single.exists() or single.is_symlink():
        _plain_file(single, "model.safetensors")
        return [single]
    if not (index.exists() or index.is_symlink()):
        other = [n for n in ("pytorch_model.bin", "model.bin", "pytorch_model.bin.index.json") if (path / n).exists()]
        why = (f" ({other[0]} is a pickle: rltune reads weights it did not write from safetensors only)"
               if other else "")
        raise _refuse(path, f"has no model.safetensors{why}",
                      "save the model with save_pretrained(..., safe_serialization=True), or pass a run's final/")
    _plain_file(index, "model.safetensors.index.json")
    from rltune.plan import ConfigError
    from rltune.plan.arch import read_config_file

    try:
        weight_map = read_config_file(index, "--model").get("weight_map")
    except ConfigError as err:
        raise EvalInputError(str(err)) from None
    names = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else None
    if not names or not all(isinstance(n, str) and n == Path(n).name and n not in (".", "..") for n in names):
        raise _refuse(index, "has no `weight_map` of plain file names in its directory",
                      "save the model again with save_pretrained")
    for n in names:
        _plain_file(path / n, n)
    return [path / n for n in names]


# ------------------------------------------------------------------ loading them into the actor


def load_weights(actor, weights: Weights) -> None:
    """Copy the weights into the actor's parameters (gathered under ZeRO-3): every parameter they
    must give, with its shape, or nothing is copied. A whole model into a LoRA actor sets the base
    weights and zeroes the adapter's B (the adapter then adds nothing); an adapter sets the adapter."""
    from contextlib import ExitStack

    from safetensors import safe_open

    from rltune.engine.weights import is_zero3
    from rltune.models.adaptation import adaptation_of
    from rltune.models.lora import base_name

    module = actor.module
    lora = adaptation_of(actor).adapted
    adapter_name = getattr(module, "active_adapter", "default") if lora else None
    targets, zeroed = {}, []
    for name, p in module.named_parameters():
        is_adapter = lora and ".lora_" in name
        if not lora:
            targets[name] = p
        elif weights.adapter and is_adapter:
            targets[name.replace(f".{adapter_name}.", ".")] = p      # PEFT saves without the adapter's name
        elif not weights.adapter and is_adapter:
            if ".lora_B." in name or ".lora_embedding_B." in name:
                zeroed.append(p)
        elif not weights.adapter:
            targets[base_name(name)] = p
    known = set(targets)
    if not weights.adapter:   # tied aliases and persistent buffers may be saved too
        known |= {base_name(n) if lora else n for n in module.state_dict()}
    with ExitStack() as stack:
        where = {}
        for f in weights.files:
            try:
                h = stack.enter_context(safe_open(str(f), framework="pt"))
            except Exception as err:  # noqa: BLE001 - any unreadable file is bad input
                raise _refuse(f, f"is not a readable safetensors file ({type(err).__name__}: {str(err)[:200]})",
                              "save the model again with save_pretrained") from None
            for k in h.keys():
                where[k] = h
        missing = sorted(set(targets) - set(where))
        extra = sorted(set(where) - known)
        if missing or extra:
            what = (f"has no weight for {missing[0]} ({len(missing)} missing)" if missing
                    else f"holds {extra[0]} ({len(extra)} weight(s) the policy does not have)")
            raise _refuse(weights.dir, f"{what}: not weights of model.policy's architecture"
                          + (" and model.lora" if lora else ""), FIX_DIR)
        for key, p in targets.items():
            sl = where[key].get_slice(key)
            shape = tuple(getattr(p, "ds_shape", p.shape))
            if tuple(sl.get_shape()) != shape or sl.get_dtype() not in WEIGHT_DTYPES:
                raise _refuse(weights.dir, f"{key} is {sl.get_dtype()} {tuple(sl.get_shape())}; the policy's is a "
                                           f"float {shape}", FIX_DIR)
        zero3 = is_zero3(actor)
        for key, p in targets.items():
            with _modifying(p, zero3):
                p.data.copy_(where[key].get_tensor(key).to(p.device, p.dtype))
        for p in zeroed:
            with _modifying(p, zero3):
                p.data.zero_()


def _modifying(p, zero3: bool):
    from contextlib import nullcontext

    if not zero3:
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([p], modifier_rank=0)
