"""Plan vs reality on CPU (issue 17, item 4): the plan's predicted peak RSS of a training process
against the measured one (`ru_maxrss` of a real run in a subprocess), within the error docs/plan.md
states (15%). Prompts are truncated to data.max_prompt_length so that every sequence has the
length the plan assumes (it counts sequences at their longest).

The plan's CPU runtime constant (the resident memory of the imports alone) is the reference
machine's fresh-install figure, and the same files give up to ~125 MiB less once the kernel has
evicted and re-read them (docs/plan.md). So each check first measures that baseline in this
environment, now, and puts it in place of the constant: the check is on what the plan models
beyond the imports, not on this machine's page cache."""

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

# runs the training as a child of a fresh interpreter and prints the child's peak RSS (KiB on
# Linux): RUSAGE_CHILDREN of pytest itself would also count every other subprocess of the session
MEASURE = """
import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:]).returncode
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "RC", rc)
"""


# the imports of a train process, as docs/plan.md measures the runtime constant
BASELINE = """
import importlib, resource, sys
for m in ("torch deepspeed transformers accelerate mlflow pandas sklearn scipy pyarrow fastapi sympy PIL "
          "numpy tokenizers safetensors rich typer pydantic yaml psutil").split() + sys.argv[1:]:
    importlib.import_module(m)
import transformers.models.llama.modeling_llama, transformers.models.qwen2.modeling_qwen2
import deepspeed.runtime.engine
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def child_env() -> dict:
    # the run's own distributed world: not the one in-process tests of this session left in the
    # environment (its MASTER_PORT is taken while pytest lives)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def maxrss(p: subprocess.CompletedProcess) -> int:
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("MAXRSS_KB")), None)
    assert line is not None and p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return int(line.split()[1]) * 1024


def measured_runtime(extra_modules: list) -> int:
    p = subprocess.run([sys.executable, "-c", BASELINE, *extra_modules], cwd=ROOT, env=child_env(),
                       capture_output=True, text=True, timeout=300)
    return maxrss(p)


def measured_peak(recipe: str, overrides: list, out_dir: Path) -> int:
    cmd = [sys.executable, "-c", MEASURE, sys.executable, "-m", "rltune", "train", recipe, *overrides,
           f"trainer.output_dir={out_dir}", "--resume", "never", "--quiet"]
    p = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=900)
    assert p.stdout.rstrip().endswith("RC 0"), p.stdout[-2000:] + p.stderr[-3000:]
    return maxrss(p)


def check(recipe: str, overrides: list, tmp_path: Path):
    r = load_recipe(ROOT / recipe, overrides).recipe
    plan = estimate(r, Hardware("cpu"))
    constant = next(it.bytes for it in plan.items if it.name.startswith("runtime"))
    runtime = measured_runtime(["peft"] if r.model.lora is not None else [])
    predicted = plan.peak - constant + runtime
    measured = measured_peak(recipe, overrides, tmp_path / "run")
    error = (predicted - measured) / measured
    print(f"{recipe}: runtime constant {constant / 2**20:.0f} MiB, here {runtime / 2**20:.0f} MiB; "
          f"predicted {predicted / 2**20:.0f} MiB, measured {measured / 2**20:.0f} MiB, error {error:+.1%}")
    assert abs(error) <= TOLERANCE, (predicted, measured, error)


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
