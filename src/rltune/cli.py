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

# ------------------------------------------------------------------ config half (no torch)


@app.command(context_settings={"allow_extra_args": False})
def validate(
    recipes: List[str] = typer.Argument(..., metavar="RECIPE... [KEY=VALUE...]",
                                        help="Recipe files; trailing key=value args are overrides."),
    strict: bool = typer.Option(False, "--strict", help="Treat warnings as errors."),
    fmt: str = typer.Option("text", "--format", "-f", help="Output: text | json | github."),
    overrides: Optional[List[str]] = typer.Option(None, "--set", "-o", metavar="KEY=VALUE",
                                                  help="Override a key, e.g. -o actor.lr=2e-6 (repeatable)."),
) -> None:
    """Lint recipes against the schema and the tuning playbook (exit 0 ok, 1 errors, 2 unreadable)."""
    from rltune.commands.validate import run

    raise typer.Exit(run(recipes, overrides or [], strict=strict, fmt=fmt))


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
    out: Optional[str] = typer.Option(None, "--output", "-o", help="Write the merged recipe here (default: stdout)."),
) -> None:
    """Write RECIPE with the preset's values applied (they win), keeping comments; show what changed."""
    from rltune.commands.presets import run_apply

    raise typer.Exit(run_apply(name, recipe, out))


@app.command()
def schema(
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Print the recipe's JSON Schema (for yaml-language-server and editors)."""
    from rltune.commands.schema import run

    raise typer.Exit(run(output))


# ------------------------------------------------------------------ training half
# `train`, `diagnose`, `plot`, `doctor` are added here the same way: a thin function that
# imports `rltune.commands.<name>` inside its body and raises typer.Exit(code).


# ------------------------------------------------------------------ entry point


def main(argv: Optional[List[str]] = None) -> None:
    """Console script `rltune`."""
    debug = os.environ.get("RLTUNE_DEBUG", "") not in ("", "0")
    try:
        app(args=argv, prog_name="rltune")
    except SystemExit:
        raise
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


if __name__ == "__main__":
    main()
