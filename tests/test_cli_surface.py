"""The CLI surface (issue 14): `--version`, one meaning for `-o` (`--set`) and `-O` (`--output`)
on every command, help without type tags."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MINIMAL = "model:\n  policy: builtin:tiny-llama\ndata:\n  train: builtin:arithmetic\nreward:\n  functions: [builtin:exact_answer]\n"


@pytest.fixture
def recipe(tmp_path):
    p = tmp_path / "recipe.yaml"
    p.write_text(MINIMAL, encoding="utf-8")
    return str(p)


def test_version_from_metadata_without_torch():
    code = ("import sys\nfrom rltune.cli import main\n"
            "try:\n    main(['--version'])\nexcept SystemExit as e:\n"
            "    print('exit', e.code, 'torch' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.stdout == f"rltune {metadata.version('rltune')}\nexit 0 False\n"


def test_version_through_typer_short_flag(cli):
    code, out = cli("-V", "presets")       # eager: printed before any command runs
    assert (code, out) == (0, f"rltune {metadata.version('rltune')}\n")


def test_train_takes_set_like_validate(cli, recipe):
    code, out = cli("train", recipe, "trainer.max_steps=1", "-o", "actor.lrr=1e-6")
    assert code == 1
    assert "did you mean `actor.lr`" in out
    assert f"rltune: {recipe}: the recipe has errors; not training" in out
    code, out = cli("train", recipe, "--set", "algorithm.name=ppx")
    assert code == 1 and "algorithm.name" in out and "not training" in out


def test_validate_set_still_short_o(cli, recipe):
    code, out = cli("validate", recipe, "-o", "actor.lrr=1e-6")
    assert code == 1 and "did you mean `actor.lr`" in out


def test_schema_and_presets_apply_write_with_capital_o(cli, recipe, tmp_path):
    out_file = tmp_path / "s.json"
    code, out = cli("schema", "-O", str(out_file))
    assert (code, out) == (0, f"wrote {out_file}\n")
    assert json.loads(out_file.read_text())["title"] == "rltune recipe"
    merged = tmp_path / "m.yaml"
    code, out = cli("presets", "apply", "cold-start", recipe, "-O", str(merged))
    assert code == 0 and "clip_range: 0.15" in merged.read_text()   # actor.lr 1e-6 is the default: not written


@pytest.mark.parametrize("args", [
    ("schema", "-o", "x.json"),
    ("plot", "run", "-o", "x.png"),
    ("presets", "apply", "cold-start", "r.yaml", "-o", "x.yaml"),
    ("train", "r.yaml", "--output", "x"),
])
def test_o_is_never_an_output_path(cli, args):
    code, out = cli(*args)
    flag = args[-2]
    assert code == 2
    assert f"No such option: {flag}" in out


@pytest.mark.parametrize("command", ["train", "validate", "plan", "diagnose", "plot", "doctor", "schema"])
def test_help_has_no_type_tags(cli, command):
    code, out = cli(command, "--help")
    assert code == 0
    for tag in ("<bool>", "<str>", "<int>", "<list[str]>"):
        assert tag not in out, f"{command} --help shows {tag}"


def test_train_help_names_values(cli):
    code, out = cli("train", "--help")
    assert code == 0
    assert "rltune train [OPTIONS] {RECIPE} [KEY=VALUE]..." in out
    assert "--set" in out and "-o" in out and "--nproc" in out and " N " in out
    assert "--dry-run" in out and "--format" in out


# ---------------------------------------------------------------- rltune recipes

SHIPPED = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))


def test_recipes_list_names_every_shipped_recipe(cli):
    code, out = cli("recipes", "list")
    assert code == 0
    for name in SHIPPED + ["experiments/lr-too-high"]:
        assert f"\n{name} " in "\n" + out
    assert "minimal                  The smallest recipe: everything else has a default.\n" in out
    assert cli("recipes") == (code, out)


def test_recipes_show_prints_the_file(cli):
    code, out = cli("recipes", "show", "minimal")
    assert (code, out) == (0, (ROOT / "recipes" / "minimal.yaml").read_text())


def test_recipes_unknown_name_lists_them(cli):
    code, out = cli("recipes", "show", "tiny-grp")
    assert code == 2
    assert out == ("rltune: error: unknown recipe `tiny-grp`\n  fix: did you mean `tiny-grpo`? shipped recipes: "
                   + ", ".join(SHIPPED)
                   + ", experiments/lr-too-high (`rltune recipes list` describes them)\n")


def test_recipes_copy_retargets_schema_and_refuses_overwrite(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = cli("recipes", "copy", "tiny-grpo")
    assert (code, out) == (0, "wrote tiny-grpo.yaml (from the shipped recipe `tiny-grpo`); run it: rltune train tiny-grpo.yaml\n")
    text = (tmp_path / "tiny-grpo.yaml").read_text()
    schema = (ROOT / "schema" / "recipe.schema.json").resolve()
    assert text.startswith(f"# yaml-language-server: $schema={schema.as_posix()}\n")
    assert "#   rltune train tiny-grpo.yaml\n" in text
    code, out = cli("recipes", "copy", "tiny-grpo")
    assert code == 2
    assert out == ("rltune: error: `tiny-grpo.yaml` exists; not overwriting it\n"
                   "  fix: give another path, or add --force: rltune recipes copy tiny-grpo tiny-grpo.yaml --force\n")
    assert cli("recipes", "copy", "tiny-grpo", "--force")[0] == 0
    code, _ = cli("validate", "--skip-files", "tiny-grpo.yaml")
    assert code == 0


def test_recipes_copy_inside_the_checkout_keeps_a_relative_schema(cli, tmp_path):
    dest = ROOT / "runs" / f"copy-test-{os.getpid()}" / "x.yaml"
    try:
        assert cli("recipes", "copy", "experiments/lr-too-high", str(dest))[0] == 0
        assert dest.read_text().startswith("# yaml-language-server: $schema=../../schema/recipe.schema.json\n")
    finally:
        dest.unlink(missing_ok=True)
        dest.parent.rmdir()


def test_recipes_copy_drops_schema_line_without_a_schema_file(cli, tmp_path, monkeypatch):
    from rltune.commands import recipes

    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "minimal.yaml").write_text((ROOT / "recipes" / "minimal.yaml").read_text())
    monkeypatch.setattr(recipes, "RECIPE_DIR", shipped)   # like a wheel: no schema/ beside it
    code, out = cli("recipes", "copy", "minimal", str(tmp_path / "dir" / "m.yaml"))
    assert code == 0 and "note: dropped the `$schema` comment" in out
    assert (tmp_path / "dir" / "m.yaml").read_text().startswith("# The smallest recipe")


# ---------------------------------------------------------------- noise and progress

def test_quiet_filters_named_dependency_warnings_only():
    import warnings

    from rltune.quiet import quiet_dependencies

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_dependencies()
        msg = "`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead"
        warnings.warn_explicit(msg, FutureWarning, "dispatcher.py", 138, module="vllm.triton_utils.dispatcher")
        warnings.warn_explicit(msg, FutureWarning, "mine.py", 1, module="rltune.mine")
        warnings.warn_explicit("something new", FutureWarning, "dispatcher.py", 1, module="vllm.other")
    assert [(str(w.message), w.filename) for w in seen] == [(msg, "mine.py"), ("something new", "dispatcher.py")]


def test_doctor_prints_progress_to_stderr_and_json_to_stdout():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-m", "rltune", "doctor", "--format", "json"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["blocking"] is False
    progress = [ln for ln in p.stderr.splitlines() if ln.startswith("rltune doctor: checking")]
    assert progress[:4] == ["rltune doctor: checking Python and installed packages ...",
                            "rltune doctor: checking torch, CUDA and NCCL ...",
                            "rltune doctor: checking transformers ...",
                            "rltune doctor: checking DeepSpeed and its ops ..."]


def _help(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "100", "TERM": "dumb"}
    p = subprocess.run([sys.executable, "-m", "rltune", *args, "--help"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.parametrize("args", [(), ("presets",), ("recipes",)])
def test_help_lines_are_wrapped_by_the_terminal_not_the_source(args):
    """A command's docstring wraps in the source; --help used to keep those breaks, so a line of the
    command list stopped mid-sentence ("... logits, KV" / "cache) by phase"). Every line of an
    entry but its last now runs to the panel's width."""
    out = _help(*args)
    panel = out[out.index("Commands"):].splitlines()[1:]
    entries: list[list[str]] = []
    for line in panel:
        text = line.strip("│╰─╯ ")
        if not text:
            continue
        if not line.startswith("│           "):      # a command name starts an entry
            entries.append([])
        entries[-1].append(text)
    assert entries, out
    for entry in entries:
        for line in entry[:-1]:
            assert len(line) > 70, f"broken mid-sentence: {line!r} in\n{out}"


def test_output_cut_short_by_the_reader_is_no_bug():
    """`rltune validate ... | head -1`: the reader leaves early; no 'probably a bug' message. The
    read end is closed before the child writes a byte, so every write meets a closed pipe."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.Popen([sys.executable, "-m", "rltune", "validate", "recipes/tiny-grpo.yaml", "--skip-files"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert err == "", err
