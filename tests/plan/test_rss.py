"""Plan vs reality on CPU (issue 17, item 4): the plan's predicted peak RSS of a training process
against the measured one (`ru_maxrss` of a real run in a subprocess), within the error docs/plan.md
states (15%). Prompts are truncated to data.max_prompt_length so that every sequence has the
length the plan assumes (it counts sequences at their longest).

The plan's CPU runtime constant (the resident memory of the imports alone) is the reference
machine's fresh-install figure, and the same files give up to ~125 MiB less once the kernel has
evicted and re-read them (docs/plan.md). So each check measures that baseline in this
environment, now, in the training process itself before the run starts, and puts it in place of
the constant: the check is on what the plan models beyond the imports, not on the page cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rltune.plan import Hardware, estimate
from rltune.recipe.loader import load_recipe

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 0.15

# One fresh interpreter per check: it imports what a train process imports (the runtime the plan's
# constant stands for) and reads its peak RSS, then runs `rltune train` in the same process and reads
# the peak again. Both figures come from one process, so the page cache's state (which decides how
# much of the shared libraries a process maps) is the same for both: measured in two processes, the
# baseline came out 910 MiB against a 794 MiB training run in one CI run, 603 against 646 here.
MEASURE = """
import atexit, importlib, resource, runpy, sys
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
from rltune.lean_imports import import_stack
from rltune.plan.estimate import CPU_RUNTIME_MODULES
import_stack()
for m in list(CPU_RUNTIME_MODULES) + sys.argv[1].split():
    importlib.import_module(m)
print("BASELINE_KB", peak(), flush=True)
atexit.register(lambda: print("MAXRSS_KB", peak(), flush=True))
sys.argv = ["rltune", *sys.argv[2:]]
runpy.run_module("rltune", run_name="__main__", alter_sys=True)
"""


def child_env() -> dict:
    # the run's own distributed world: not the one in-process tests of this session left in the
    # environment (its MASTER_PORT is taken while pytest lives)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def read_kb(out: str, key: str) -> int:
    line = next((ln for ln in out.splitlines() if ln.startswith(key)), None)
    assert line is not None, out[-2000:]
    return int(line.split()[1]) * 1024


def measured(recipe: str, overrides: list, out_dir: Path, extra_modules: list) -> tuple:
    """(baseline, peak) in bytes: the peak RSS after the imports alone, and of the whole run."""
    cmd = [sys.executable, "-c", MEASURE, " ".join(extra_modules), "train", recipe, *overrides,
           f"trainer.output_dir={out_dir}", "--resume", "never", "--quiet"]
    p = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return read_kb(p.stdout, "BASELINE_KB"), read_kb(p.stdout, "MAXRSS_KB")


def check(recipe: str, overrides: list, tmp_path: Path):
    r = load_recipe(ROOT / recipe, overrides).recipe
    plan = estimate(r, Hardware("cpu"))
    constant = next(it.bytes for it in plan.items if it.name.startswith("runtime"))
    runtime, peak = measured(recipe, overrides, tmp_path / "run", ["peft"] if r.model.lora is not None else [])
    predicted = plan.peak - constant + runtime
    error = (predicted - peak) / peak
    print(f"{recipe}: runtime constant {constant / 2**20:.0f} MiB, here {runtime / 2**20:.0f} MiB; "
          f"predicted {predicted / 2**20:.0f} MiB, measured {peak / 2**20:.0f} MiB, error {error:+.1%}")
    assert abs(error) <= TOLERANCE, (predicted, peak, error)


COMMON = ["trainer.max_steps=1", "trainer.eval_every=0", "trainer.save_every=0", "rollout.engine=hf"]


@pytest.mark.parametrize("recipe", ["recipes/tiny-grpo.yaml",
                                    pytest.param("recipes/tiny-ppo.yaml", marks=pytest.mark.slow)])
def test_tiny_recipe_peak_rss_within_tolerance(tmp_path, recipe):
    # ~25 s each on an idle 2-core machine: the runtime dominates a tiny model's budget
    check(recipe, COMMON + ["data.max_prompt_length=16"], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["recipes/quickstart.yaml", "recipes/quickstart-lora.yaml"])
def test_smollm2_quickstart_peak_rss_within_tolerance(tmp_path, recipe):
    # the quickstart's chat-templated prompts are 43 tokens: truncated to 40, all are 40 long. Two
    # steps: the first update creates the optimizer state, and what the allocator keeps resident
    # settles from the second on (a full fine-tune's first step peaks ~0.9 GiB lower than its second)
    check(recipe, ["trainer.max_steps=2", "trainer.eval_every=0", "trainer.save_every=0", "rollout.engine=hf",
                   "data.max_prompt_length=40"], tmp_path)


def test_dry_run_agrees_with_the_plan_and_the_real_run(tmp_path):
    """README: the dry run tells before a launch whether the recipe fits. Its peak (two steps at the
    longest prompts and responses) is within the plan's stated error of the plan at those lengths and
    of a real run's peak at the same settings."""
    import json

    overrides = ["trainer.max_steps=2", "trainer.eval_every=0", "trainer.save_every=0", "rollout.engine=hf"]
    p = subprocess.run([sys.executable, "-m", "rltune", "train", "recipes/tiny-grpo.yaml", *overrides,
                        f"trainer.output_dir={tmp_path / 'dry'}", "--dry-run", "--format", "json"],
                       cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout)
    update = report["phases"]["update"]
    assert abs(update["plan"] - update["measured"]) / update["measured"] <= TOLERANCE, update
    dry_peak = max(ph["measured"] for ph in report["phases"].values())
    prompt_tokens = report["lengths"]["prompt_tokens"]
    real_base, real_peak = measured("recipes/tiny-grpo.yaml",
                                    overrides + [f"data.max_prompt_length={max(8, prompt_tokens)}"], tmp_path / "run", [])
    # two processes map different shares of the shared libraries (the page cache decides): the dry
    # run's figure is moved onto the real run's import baseline, both measured after the same imports
    dry_peak += real_base - report["plan_runtime"]["here"]
    print(f"dry run {dry_peak / 2**20:.0f} MiB (plan {update['plan'] / 2**20:.0f}), real run {real_peak / 2**20:.0f} MiB")
    assert abs(dry_peak - real_peak) / real_peak <= TOLERANCE, (dry_peak, real_peak)
    assert not (tmp_path / "dry").exists()
