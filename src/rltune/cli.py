"""The `rltune` command line: a thin Typer app.

Each command's body lives in `rltune.commands.<name>` and is imported inside the command
function, so `rltune validate` never pays for what `rltune train` needs (no torch here).
`main()` turns any exception into a one-paragraph message (exit 2 for input errors, 1
otherwise) unless RLTUNE_DEBUG=1.
"""

from __future__ import annotations

import os
import sys
from typing import List, Optional

import typer

from rltune.errors import UserError

app = typer.Typer(
    name="rltune",
    help="Declarative RL post-training (PPO, GRPO, RLOO, REINFORCE++) for language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)



def _version() -> str:
    """`rltune X.Y.Z` from the installed package's metadata (no torch)."""
    from importlib import metadata

    try:
        return f"rltune {metadata.version('rltune')}"
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        from rltune import __version__

        return f"rltune {__version__}"


def _print_version(value: bool) -> None:
    if value:
        print(_version())
        raise typer.Exit(0)


@app.callback()
def _main(version: bool = typer.Option(False, "--version", "-V", is_eager=True, callback=_print_version,
                                       help="Print the version and exit.")) -> None:
    """Declarative RL post-training (PPO, GRPO, RLOO, REINFORCE++) for language models."""


def _plain_help_types() -> None:
    """Typer (0.2x) prints a type tag beside every parameter in --help: `--quiet <bool>`,
    `RECIPE <str>`. Flags and arguments get none (their name says it); value options show their
    metavar (`--nproc N`). Older Typer versions have no such hook and print none anyway."""
    from typer import core

    option_type = getattr(core.TyperOption, "display_type_rich", None)
    if option_type is None or getattr(option_type, "_rltune", False):
        return

    def display_type_rich(self, ctx):
        return None if (self.is_flag or self.count) else option_type(self, ctx)

    display_type_rich._rltune = True
    core.TyperOption.display_type_rich = display_type_rich
    core.TyperArgument.display_type_rich = lambda self, ctx: None


_plain_help_types()

# ------------------------------------------------------------------ config half (no torch)


def _reject_bare_keys(args: List[str]) -> None:
    """A trailing argument without `=` is read as another recipe file: when it is no file and looks
    like a dotted recipe key (`actor.lr`), say it is an override that lost its value (exit 2)."""
    import re

    for a in args:
        if "=" in a or os.path.exists(a) or not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z0-9_-]+)+", a):
            continue
        from rltune.recipe.schema import Recipe

        if a.split(".", 1)[0] in Recipe.model_fields:
            from rltune.errors import RecipeInputError

            raise RecipeInputError(f"`{a}` looks like an override without a value: write {a}=VALUE",
                                   fix="overrides are KEY=VALUE after the recipe (or -o KEY=VALUE), e.g. actor.lr=2e-6")


@app.command(context_settings={"allow_extra_args": False})
def validate(
    recipes: List[str] = typer.Argument(..., metavar="RECIPE",
                                        help="Recipe files; trailing key=value args are overrides."),
    strict: bool = typer.Option(False, "--strict", help="Treat warnings as errors."),
    fmt: str = typer.Option("text", "--format", "-f", metavar="FORMAT", help="Output: text | json | github."),
    overrides: Optional[List[str]] = typer.Option(None, "--set", "-o", metavar="KEY=VALUE",
                                                  help="Override a key, e.g. -o actor.lr=2e-6 (repeatable)."),
    skip_files: bool = typer.Option(False, "--skip-files",
                                    help="Do not check the data, model and reward files the recipe names "
                                         "(lint a template on a machine without them)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", metavar="N",
                                       help="GPUs (ranks) the run will use: with --gpu-mem, checks the memory budget."),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", metavar="SIZE",
                                          help="Memory per GPU, e.g. 24GB (GB = GiB): rule memory-budget checks "
                                               "the plan (rltune plan) against it."),
) -> None:
    """Lint recipes against the schema and the tuning playbook, and check the files they name
    (exit 0 ok, 1 errors, 2 unreadable: a recipe, or a data/model/reward file it names)."""
    from rltune.commands.validate import run

    _reject_bare_keys(recipes[1:])
    raise typer.Exit(run(recipes, overrides or [], strict=strict, fmt=fmt, skip_files=skip_files,
                         gpus=gpus, gpu_mem=gpu_mem))


@app.command(context_settings={"allow_extra_args": False})
def plan(
    args: List[str] = typer.Argument(..., metavar="RECIPE",
                                     help="Recipe file; trailing key=value args are overrides."),
    overrides: Optional[List[str]] = typer.Option(None, "--set", "-o", metavar="KEY=VALUE",
                                                  help="Override a key, e.g. -o train.micro_batch_size=2 (repeatable)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", metavar="N", help="GPUs (ranks) in the run."),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", metavar="SIZE",
                                          help="Memory per GPU, e.g. 80GB (GB = GiB, as cards are named)."),
    device: Optional[str] = typer.Option(None, "--device", metavar="DEVICE", help="cpu | cuda (default: the recipe's)."),
    fmt: str = typer.Option("text", "--format", "-f", metavar="FORMAT", help="Output: text | json."),
    times: Optional[str] = typer.Option(None, "--times", metavar="RUN_DIR",
                                        help="A run's directory: its phase times give the step time of each "
                                             "placement of the rollout engine (synchronous, colocated, separate)."),
) -> None:
    """Per-device memory budget of a recipe (weights, gradients, optimizer, activations, logits, KV
    cache) by phase, the peak and the headroom, and changes that fit (exit 0 fits or capacity
    unknown, 1 over capacity, 2 unreadable). Loads nothing: sizes come from the model's config.json.
    With --times RUN_DIR, the expected step time of each placement of the rollout engine."""
    from rltune.commands.plan import run

    _reject_bare_keys(args[1:])
    raise typer.Exit(run(args, overrides or [], gpus=gpus, gpu_mem=gpu_mem, device=device, fmt=fmt, times=times))


presets_app = typer.Typer(help="Stage and hardware presets: list, show, apply.", no_args_is_help=False,
                          invoke_without_command=True)
app.add_typer(presets_app, name="presets")


@presets_app.callback()
def _presets(ctx: typer.Context) -> None:
    """Stage (cold-start, acceleration, anti-overfit) and hardware presets."""
    if ctx.invoked_subcommand is None:
        from rltune.commands.presets import run_list

        raise typer.Exit(run_list())


@presets_app.command("list")
def presets_list() -> None:
    """List presets with when to use each."""
    from rltune.commands.presets import run_list

    raise typer.Exit(run_list())


@presets_app.command("show")
def presets_show(name: str = typer.Argument(..., help="Preset name.")) -> None:
    """Print a preset's YAML."""
    from rltune.commands.presets import run_show

    raise typer.Exit(run_show(name))


@presets_app.command("apply")
def presets_apply(
    name: str = typer.Argument(..., help="Preset name."),
    recipe: str = typer.Argument(..., help="Recipe file to apply it to."),
    out: Optional[str] = typer.Option(None, "--output", "-O", metavar="PATH",
                                      help="Write the merged recipe here (default: stdout)."),
    force: bool = typer.Option(False, "--force", help="Replace the --output file if it exists."),
) -> None:
    """Write RECIPE with the preset's values applied (they win), keeping comments; show what changed."""
    from rltune.commands.presets import run_apply

    raise typer.Exit(run_apply(name, recipe, out, force=force))


recipes_app = typer.Typer(help="The shipped example recipes: list, show, copy.", no_args_is_help=False,
                          invoke_without_command=True)
app.add_typer(recipes_app, name="recipes")


@recipes_app.callback()
def _recipes(ctx: typer.Context) -> None:
    """The shipped example recipes (installed with rltune): list, show, copy one to edit."""
    if ctx.invoked_subcommand is None:
        from rltune.commands.recipes import run_list

        raise typer.Exit(run_list())


@recipes_app.command("list")
def recipes_list() -> None:
    """List the shipped recipes with what each is for."""
    from rltune.commands.recipes import run_list

    raise typer.Exit(run_list())


@recipes_app.command("show")
def recipes_show(name: str = typer.Argument(..., metavar="NAME", help="Recipe name (see `rltune recipes list`).")) -> None:
    """Print a shipped recipe's YAML."""
    from rltune.commands.recipes import run_show

    raise typer.Exit(run_show(name))


@recipes_app.command("copy")
def recipes_copy(
    name: str = typer.Argument(..., metavar="NAME", help="Recipe name (see `rltune recipes list`)."),
    dest: Optional[str] = typer.Argument(None, metavar="DEST", help="File or directory (default: ./NAME.yaml)."),
    force: bool = typer.Option(False, "--force", help="Overwrite DEST if it exists."),
) -> None:
    """Copy a shipped recipe to DEST to edit it (its `$schema` comment still works from there)."""
    from rltune.commands.recipes import run_copy

    raise typer.Exit(run_copy(name, dest, force=force))


@app.command()
def schema(
    output: Optional[str] = typer.Option(None, "--output", "-O", metavar="PATH",
                                         help="Write to this file instead of stdout."),
    force: bool = typer.Option(False, "--force", help="Replace the --output file if it exists."),
) -> None:
    """Print the recipe's JSON Schema (for yaml-language-server and editors)."""
    from rltune.commands.schema import run

    raise typer.Exit(run(output, force=force))


# ------------------------------------------------------------------ training half


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def train(
    recipe: str = typer.Argument(..., metavar="RECIPE", help="Recipe file."),
    overrides: Optional[List[str]] = typer.Argument(None, metavar="KEY=VALUE",
                                                    help="Overrides, e.g. actor.lr=2e-6 trainer.max_steps=50."),
    sets: Optional[List[str]] = typer.Option(None, "--set", "-o", metavar="KEY=VALUE",
                                             help="Override a key, e.g. -o actor.lr=2e-6 (repeatable)."),
    resume: str = typer.Option("auto", "--resume", metavar="auto|never|PATH", help="auto (newest valid checkpoint in the run dir) | never | PATH."),
    allow_recipe_change: bool = typer.Option(False, "--allow-recipe-change",
                                             help="Resume although the recipe changed (the changed keys are listed)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Only warnings and errors on the console."),
    strict: bool = typer.Option(False, "--strict", help="Lint warnings stop the run too."),
    nproc: Optional[int] = typer.Option(None, "--nproc", metavar="N", help="Ranks on this node (trainer.nproc)."),
    nnodes: Optional[int] = typer.Option(None, "--nnodes", metavar="N", help="Nodes (trainer.nnodes)."),
    launcher: Optional[str] = typer.Option(None, "--launcher", metavar="NAME", help="torchrun | deepspeed (trainer.launcher)."),
    hostfile: Optional[str] = typer.Option(None, "--hostfile", metavar="PATH", help="DeepSpeed launcher hostfile (multi-node)."),
    rdzv_endpoint: Optional[str] = typer.Option(None, "--rdzv-endpoint", metavar="HOST:PORT", help="torchrun rendezvous HOST:PORT."),
    node_rank: Optional[int] = typer.Option(None, "--node-rank", metavar="N", help="This node's rank (multi-node)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Build every engine, run two small steps at the longest prompts and "
                                 "responses, print peak memory per phase beside `rltune plan`'s estimate; "
                                 "writes nothing."),
    fmt: str = typer.Option("text", "--format", "-f", metavar="FORMAT", help="With --dry-run: text | json (on stdout)."),
) -> None:
    """Validate RECIPE (lint errors stop it, warnings are shown), then train (or, with --dry-run,
    measure the peak memory of two small steps and exit)."""
    from rltune.commands.train import run
    from rltune.quiet import quiet_dependencies

    quiet_dependencies()
    _reject_bare_keys(overrides or [])

    # `-o/--set` and trailing key=value are the same overrides (as in `validate`), applied in that order
    overrides = [*(overrides or []), *(sets or [])]
    extra: List[str] = []
    if hostfile:
        extra += ["--hostfile", hostfile]
    if rdzv_endpoint:
        extra += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint]
    if node_rank is not None:
        extra += ["--node-rank" if (launcher or "torchrun") == "torchrun" else "--node_rank", str(node_rank)]
    # the command as the user typed it, for the hint that continues an interrupted run
    command = [recipe, *(overrides or [])]
    for flag, value in (("--nproc", nproc), ("--nnodes", nnodes), ("--launcher", launcher), ("--hostfile", hostfile),
                        ("--rdzv-endpoint", rdzv_endpoint), ("--node-rank", node_rank)):
        if value is not None:
            command += [flag, str(value)]
    command += ["--quiet"] * quiet + ["--strict"] * strict
    raise typer.Exit(run(recipe, overrides or [], resume=resume, allow_recipe_change=allow_recipe_change,
                         quiet=quiet, strict=strict, nproc=nproc, nnodes=nnodes, launcher=launcher,
                         launcher_args=extra, command=command, dry_run=dry_run, fmt=fmt))


@app.command("eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def evaluate(
    recipe: str = typer.Argument(..., metavar="RECIPE", help="Recipe file."),
    overrides: Optional[List[str]] = typer.Argument(None, metavar="KEY=VALUE",
                                                    help="Overrides, as for train (e.g. data.eval=heldout.jsonl)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", metavar="DIR",
                                        help="Weights to compare with model.policy: a run's final/, a run directory "
                                             "(its final/), or a save_pretrained directory of the policy's architecture."),
    sets: Optional[List[str]] = typer.Option(None, "--set", "-o", metavar="KEY=VALUE",
                                             help="Override a key (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (the keys of RUN/eval.json)."),
    limit: Optional[int] = typer.Option(None, "--limit", metavar="N", help="Evaluate the first N eval rows only."),
) -> None:
    """Run the recipe's held-out eval outside training (the same greedy answers or episodes, rollout
    engine and rewards as a run's eval), with model.policy and, with --model DIR, with DIR's
    weights: prints before -> after as a run does at its end (exit 0; 1 bad recipe or DIR; 2 usage)."""
    from rltune.commands.evaluate import run
    from rltune.quiet import quiet_dependencies

    quiet_dependencies()
    _reject_bare_keys(overrides or [])
    raise typer.Exit(run(recipe, [*(overrides or []), *(sets or [])], model=model, as_json=as_json, limit=limit))


launch_app = typer.Typer(help="A job for an existing scheduler that runs `rltune train` on several nodes: slurm, k8s.",
                         no_args_is_help=True, rich_markup_mode=None)
app.add_typer(launch_app, name="launch")

_NODES = typer.Option(..., "--nodes", metavar="N", min=1, help="Nodes.")
_GPUS = typer.Option(0, "--gpus-per-node", metavar="G", min=0, help="GPUs per node (0: CPU nodes).")
_PROCS = typer.Option(None, "--procs-per-node", metavar="P", min=1, help="Ranks per node (default: the GPUs, or 1).")


@launch_app.command("slurm", context_settings={"allow_extra_args": False})
def launch_slurm(
    recipe: str = typer.Argument(..., metavar="RECIPE", help="Recipe file."),
    overrides: Optional[List[str]] = typer.Argument(None, metavar="KEY=VALUE", help="Overrides, as for train."),
    nodes: int = _NODES, gpus: int = _GPUS, procs: Optional[int] = _PROCS,
    partition: Optional[str] = typer.Option(None, "--partition", metavar="NAME", help="#SBATCH --partition."),
    time_limit: Optional[str] = typer.Option(None, "--time", metavar="LIMIT", help="#SBATCH --time, e.g. 24:00:00."),
    account: Optional[str] = typer.Option(None, "--account", metavar="NAME", help="#SBATCH --account."),
    env: Optional[List[str]] = typer.Option(None, "--env", metavar="NAME=VALUE", help="Exported in the job (repeatable), e.g. NCCL_SOCKET_IFNAME=ib0."),
    script: Optional[str] = typer.Option(None, "--script", metavar="PATH", help="Where to write the script (default RUN_DIR/slurm/)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --script file."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the sbatch script; submit nothing."),
) -> None:
    """Write an sbatch script that trains RECIPE on N nodes (torchrun's rendezvous on the first,
    --resume auto, requeued when preempted) and submit it with sbatch (docs/scale.md)."""
    from rltune.commands.launch import run

    _reject_bare_keys(overrides or [])
    raise typer.Exit(run("slurm", recipe, overrides or [], nodes, procs, gpus, dry_run, partition=partition,
                         time_limit=time_limit, account=account, env=env or [], script=script, force=force))


@launch_app.command("k8s", context_settings={"allow_extra_args": False})
def launch_k8s(
    recipe: str = typer.Argument(..., metavar="RECIPE", help="Recipe file (its path inside the pods)."),
    overrides: Optional[List[str]] = typer.Argument(None, metavar="KEY=VALUE", help="Overrides, as for train."),
    nodes: int = _NODES, gpus: int = _GPUS, procs: Optional[int] = _PROCS,
    image: Optional[str] = typer.Option(None, "--image", metavar="IMAGE", help="Container image with rltune installed."),
) -> None:
    """Print a Kubeflow PyTorchJob manifest that trains RECIPE on N pods (docs/scale.md)."""
    from rltune.commands.launch import run

    _reject_bare_keys(overrides or [])
    raise typer.Exit(run("k8s", recipe, overrides or [], nodes, procs, gpus, True, image=image))


@app.command()
def diagnose(
    run_dir: str = typer.Argument(..., metavar="RUN_DIR",
                                  help="A run directory (holds metrics.jsonl), or a log file (with --from)."),
    fmt: str = typer.Option("text", "--format", "-f", metavar="FORMAT", help="text | json."),
    patch: Optional[str] = typer.Option(None, "--patch", metavar="PATH", help="Write the recipe with the fixes applied here."),
    maps: Optional[List[str]] = typer.Option(None, "--map", metavar="OURS=THEIRS", help="OUR_KEY=THEIR_KEY for metrics logged by other tools."),
    source: Optional[str] = typer.Option(
        None, "--from", metavar="TOOL", help="trl | verl | openrlhf: read that tool's log (JSON lines, trainer_state.json or console)."),
    apply_overrides: bool = typer.Option(
        False, "--apply-overrides", help="With --patch: also write in the run's command-line overrides of learning knobs "
        "(never keys that load code, models or data: a run directory may be someone else's)."),
    force: bool = typer.Option(False, "--force", help="With --patch: replace the file if it exists."),
) -> None:
    """Read a run's metrics, name what went wrong and what to change (exit 0 healthy, 1 problems)."""
    from rltune.commands.diagnose import run

    kw = {"source": source} if source else {}
    raise typer.Exit(run(run_dir, fmt=fmt, patch=patch, maps=tuple(maps or ()), apply_overrides=apply_overrides,
                         force=force, **kw))


@app.command()
def plot(
    run_dir: str = typer.Argument(..., metavar="RUN_DIR", help="A run directory (holds metrics.jsonl)."),
    out: Optional[str] = typer.Option(None, "--output", "-O", metavar="PATH",
                                      help="PNG path, or a directory for DIR/plot.png (default RUN_DIR/run.png)."),
    force: bool = typer.Option(False, "--force", help="Replace the --output file if it exists."),
) -> None:
    """PNG of reward, KL, grad norms, critic loss, entropy, length and timings, with health events."""
    from rltune.commands.plot import run

    raise typer.Exit(run(run_dir, out, force=force))


@app.command()
def doctor(
    fmt: str = typer.Option("text", "--format", "-f", metavar="FORMAT", help="text | json."),
    deep: bool = typer.Option(False, "--deep", help="Also import vLLM to check that it is usable."),
) -> None:
    """Environment check: torch, CUDA, NCCL, DeepSpeed, vLLM, flash-attn, transformers; known-bad combinations."""
    from rltune.commands.doctor import run
    from rltune.quiet import quiet_dependencies

    quiet_dependencies()
    raise typer.Exit(run(fmt, deep=deep))


# ------------------------------------------------------------------ fast path
# Building the Typer app and its pydantic-based parameter adapters costs ~0.1 s, a third of
# `rltune validate`'s budget. For the config commands, a plain argparse mirror of the options
# above runs the same command bodies; anything it does not recognise (help, a usage error,
# another command) falls through to Typer, which stays the one place that documents the CLI.


class _FallBack(Exception):
    pass


def _fast(argv: List[str]) -> Optional[int]:
    if not argv or argv[0] not in ("validate", "presets", "schema"):
        return None
    if any(a in ("-h", "--help") or a.startswith("--help") for a in argv):
        return None
    import argparse

    class P(argparse.ArgumentParser):
        def error(self, message):  # let Typer produce the usage error
            raise _FallBack(message)

        def exit(self, status=0, message=None):
            raise _FallBack(message)

    cmd, rest = argv[0], argv[1:]
    # pydantic scans every installed distribution for plugins on first use (~25 ms here);
    # no plugin has anything to do while linting a recipe
    saved = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
    try:
        if cmd == "validate":
            p = P(add_help=False)
            p.add_argument("recipes", nargs="+")
            p.add_argument("--strict", action="store_true")
            p.add_argument("--format", "-f", dest="fmt", default="text")
            p.add_argument("--set", "-o", dest="overrides", action="append", default=[])
            p.add_argument("--skip-files", dest="skip_files", action="store_true")
            p.add_argument("--gpus", type=int, default=None)
            p.add_argument("--gpu-mem", dest="gpu_mem", default=None)
            a = p.parse_intermixed_args(rest)
            from rltune.commands.validate import run

            _reject_bare_keys(a.recipes[1:])
            return run(a.recipes, a.overrides, strict=a.strict, fmt=a.fmt, skip_files=a.skip_files,
                       gpus=a.gpus, gpu_mem=a.gpu_mem)
        if cmd == "schema":
            p = P(add_help=False)
            p.add_argument("--output", "-O", default=None)
            p.add_argument("--force", action="store_true")
            a = p.parse_args(rest)
            from rltune.commands.schema import run

            return run(a.output, force=a.force)
        # presets
        from rltune.commands import presets as pc

        if not rest or rest == ["list"]:
            return pc.run_list()
        if rest[0] == "show" and len(rest) == 2:
            return pc.run_show(rest[1])
        if rest[0] == "apply":
            p = P(add_help=False)
            p.add_argument("name")
            p.add_argument("recipe")
            p.add_argument("--output", "-O", default=None)
            p.add_argument("--force", action="store_true")
            a = p.parse_intermixed_args(rest[1:])
            return pc.run_apply(a.name, a.recipe, a.output, force=a.force)
    except _FallBack:
        return None
    finally:
        if saved is None:
            os.environ.pop("PYDANTIC_DISABLE_PLUGINS", None)
        else:
            os.environ["PYDANTIC_DISABLE_PLUGINS"] = saved
    return None


# ------------------------------------------------------------------ entry point


def main(argv: Optional[List[str]] = None) -> None:
    """Console script `rltune`."""
    debug = os.environ.get("RLTUNE_DEBUG", "") not in ("", "0")
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["--version"], ["-V"]):  # without building the Typer app
        print(_version())
        sys.exit(0)
    try:
        code = _fast(args)
        if code is not None:
            sys.exit(code)
        _reflow_help()
        app(args=args, prog_name="rltune")
    except SystemExit:
        raise
    except BrokenPipeError:  # `rltune validate ... | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except UserError as e:
        if debug:
            raise
        print(f"rltune: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        print("rltune: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - the one place that turns bugs into a message
        if debug:
            raise
        msg = str(e) or type(e).__name__
        print(f"rltune: error: {type(e).__name__}: {msg}\n"
              "  this is probably a bug in rltune; rerun with RLTUNE_DEBUG=1 for a traceback and report it",
              file=sys.stderr)
        sys.exit(1)


def reflow(text: str | None) -> str | None:
    """A docstring as --help shows it: the source's line breaks inside a paragraph joined (the
    terminal wraps), blank lines between paragraphs kept."""
    if not text:
        return text
    import inspect

    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in par.splitlines() if line.strip()) for par in paragraphs)


def _reflow_help() -> None:
    for typer_app in (app, presets_app, recipes_app):
        for cmd in typer_app.registered_commands:
            if cmd.help is None and cmd.callback is not None:
                cmd.help = reflow(cmd.callback.__doc__)


if __name__ == "__main__":
    main()
