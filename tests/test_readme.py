"""README's own command lines run as written on a fresh clone (issue 26).

Every `rltune ...` line in README's code blocks (fenced bash/sh/console/shell blocks, and the
4-space indented blocks the reference sections use) is run in-process, in a temporary directory
that holds a copy of `recipes/` (so `recipes/*.yaml` globs as a shell would glob it), and must exit
0 (README: "0 ok (warnings allowed)"). Lines that are not run are listed with the reason; any other
line fails the test, so nothing is skipped silently.

Names README uses as the reader's own files are made first, as a reader would make them:
`recipe.yaml` and `my.yaml` with `rltune recipes copy minimal ...` (README: "`rltune recipes copy
NAME [DEST]` copies it to edit"); the run directories `runs/tiny-grpo` and `runs/x` and the
`trl_log.jsonl` that `diagnose` / `plot` read are written as a healthy run would write them
(tests/monitor/synth.py).
"""

from __future__ import annotations

import glob
import json
import random
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
sys.path.insert(0, str(ROOT / "tests" / "monitor"))

# (what the line starts with, why it is not run here)
SKIP = [
    (("make",), "installs into ./.venv and trains or runs the whole suite (minutes); CI runs `make test` itself"),
    (("pip",), "installs packages"),
    (("rltune", "train"), "trains a model (seconds to minutes); tests/train covers train, --resume, --nproc and --dry-run"),
    (("rltune", "eval"), "builds the recipe's engines and plays its eval set; tests/train/test_eval_command.py runs it on a trained run"),
    (("rltune", "launch", "slurm"), "submits a job with sbatch; tests/train/test_launch_slurm.py runs it under a Slurm shim"),
]
# exit codes README states for a line, where not 0
EXPECTED: dict = {}


def code_blocks(text: str) -> list:
    """The shell code blocks of a markdown text: fenced bash/sh/console/shell/no-language blocks and
    4-space indented blocks (after a blank line, outside fences). Each a list of lines."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```\s*(\w*)", lines[i])
        if m:
            lang, body, i = m.group(1).lower(), [], i + 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if lang in ("", "bash", "sh", "console", "shell"):
                blocks.append([re.sub(r"^\$ ", "", ln) for ln in body])
            i += 1
            continue
        if lines[i].startswith("    ") and lines[i].strip() and (i == 0 or not lines[i - 1].strip()):
            body = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            blocks.append(body)
            continue
        i += 1
    return blocks


def commands(text: str) -> list:
    """Each command line of the shell blocks, split like a shell (comments dropped); a line that is
    only a comment (a continuation of the comment above) gives nothing."""
    out = []
    for block in code_blocks(text):
        for ln in block:
            if not ln.strip():
                continue
            argv = shlex.split(ln, comments=True)
            if argv:
                out.append((ln.split("#")[0].strip() if "#" in ln else ln.strip(), argv))
    return out


def expand(argv: list) -> list:
    """Globs expanded as bash does (sorted; a pattern with no match stays as written)."""
    out = []
    for a in argv:
        hits = sorted(glob.glob(a)) if any(c in a for c in "*?[") else []
        out.extend(hits or [a])
    return out


def _healthy_run(run_dir: Path) -> None:
    import synth

    synth.write_run(run_dir, synth.healthy(40, seed=0), recipe=synth.RECIPE)


def _trl_log(path: Path) -> None:
    """TRL's logged dicts, one JSON object per line, of a run that learns."""
    rng = random.Random(0)
    rows = []
    for t in range(1, 21):
        f = t / 20
        rows.append({"step": t, "loss": rng.gauss(0, 0.02), "grad_norm": 0.3 * (1 + rng.gauss(0, 0.05)),
                     "learning_rate": 1e-6, "reward": 0.2 + 0.4 * f + rng.gauss(0, 0.01), "reward_std": 0.3,
                     "kl": 0.01 + 0.02 * f, "entropy": 1.2 - 0.2 * f, "completions/mean_length": 120.0,
                     "clip_ratio/region_mean": 0.02, "epoch": t / 40})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def clone(tmp_path, monkeypatch, cli):
    """A working directory like a fresh clone's top level: recipes/ copied, the reader's own files made."""
    shutil.copytree(ROOT / "recipes", tmp_path / "recipes", symlinks=False)
    monkeypatch.chdir(tmp_path)
    for name in ("recipe.yaml", "my.yaml"):
        code, out = cli("recipes", "copy", "minimal", name)
        assert code == 0, out
    _healthy_run(tmp_path / "runs" / "tiny-grpo")
    _healthy_run(tmp_path / "runs" / "x")
    _trl_log(tmp_path / "trl_log.jsonl")
    return tmp_path


def test_readme_blocks_are_found():
    cmds = commands(README.read_text())
    lines = [ln for ln, _ in cmds]
    # the CI example and the quick start are among them (a change to README's layout that hides
    # its commands from this test fails here rather than skipping them)
    assert any(ln.startswith("rltune validate recipes/*.yaml") for ln in lines), lines
    assert any(ln.startswith("make quickstart") for ln in lines), lines


def test_readme_commands_run_as_written(clone, cli):
    ran, skipped, failed = [], [], []
    for line, argv in commands(README.read_text()):
        why = next((w for pre, w in SKIP if tuple(argv[:len(pre)]) == pre), None)
        if why is not None:
            skipped.append((line, why))
            continue
        assert argv[0] == "rltune", f"README line `{line}`: neither run nor skipped with a reason (add it to SKIP)"
        code, out = cli(*expand(argv[1:]))
        ran.append(line)
        if code != EXPECTED.get(line, 0):
            failed.append(f"$ {line}\nexit {code} (README: {EXPECTED.get(line, 0)})\n{out[-2500:]}")
    print("ran:\n  " + "\n  ".join(ran))
    print("skipped:\n  " + "\n  ".join(f"{ln}  -- {why}" for ln, why in skipped))
    assert ran, "no README command ran"
    assert any("validate" in ln for ln in ran) and any("diagnose" in ln for ln in ran), ran
    assert not failed, "\n\n".join(failed)
    assert (clone / "my-stage2.yaml").exists() and (clone / "run.png").exists()


def test_readme_ci_example_needs_skip_files_for_the_templates(clone, cli):
    """Why README's CI line has --skip-files: without it the two templates' unshipped data exits 2,
    and the message for the missing file names the way to check the recipe without it."""
    code, out = cli("validate", *sorted(glob.glob("recipes/*.yaml")), "--strict", "--format", "github")
    assert code == 2
    for name in ("gsm8k-grpo-qwen", "ppo-rm-8gpu"):
        head = (clone / "recipes" / f"{name}.yaml").read_text().splitlines()[:3]
        assert any(ln.startswith("# TEMPLATE:") for ln in head), head
    code, out = cli("validate", "recipes/gsm8k-grpo-qwen.yaml")
    assert code == 2
    line = next(ln for ln in out.splitlines() if "data file `data/gsm8k.jsonl` not found" in ln)
    assert "is a template" in line and "rltune validate --skip-files recipes/gsm8k-grpo-qwen.yaml" in line, out


def test_a_missing_file_in_a_recipe_that_is_no_template_gets_no_template_note(clone, cli):
    code, out = cli("validate", "recipes/tiny-grpo.yaml", "data.train=data/nope.jsonl")
    assert code == 2 and "not found" in out and "is a template" not in out, out
