"""`rltune plan` and `validate --gpus/--gpu-mem` (rule memory-budget) from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "recipes").glob("*.yaml"))

# Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json)
LLAMA3_8B = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "tie_word_embeddings": False}


@pytest.fixture
def llama8b(tmp_path):
    d = tmp_path / "llama-3-8b"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA3_8B))
    return d


@pytest.fixture
def full_8b(tmp_path, llama8b):
    p = tmp_path / "full-8b.yaml"
    p.write_text(f"model:\n  policy: {llama8b}\ndata:\n  train: builtin:arithmetic\n"
                 "reward:\n  functions: [builtin:exact_answer]\ntrainer:\n  precision: bf16\n")
    return str(p)


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
@pytest.mark.parametrize("hw", [["--device", "cpu"], ["--gpus", "8", "--gpu-mem", "80GB"], []])
def test_plan_runs_on_every_shipped_recipe(cli_streams, path, hw):
    code, out, err = cli_streams("plan", str(path), *hw)
    assert code in (0, 1), err
    assert "peak:" in out and "Traceback" not in out + err


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_plan_json_is_valid(cli_streams, path):
    code, out, err = cli_streams("plan", str(path), "--gpus", "1", "--gpu-mem", "24GB", "--format", "json")
    assert code in (0, 1), err
    d = json.loads(out)
    assert set(d["phases"]) == {"rollout", "experience", "update", "save"}
    assert d["peak"] == max(d["phases"].values())
    assert d["capacity"] == 24 * 2**30 and d["headroom"] == d["capacity"] - d["peak"]
    assert d["fits"] == (code == 0)
    for p in d["proposals"]:
        assert p["fits"] and p["peak"] < d["capacity"] and p["changes"]


def test_validate_8b_full_fine_tune_on_one_24gb_card(cli_streams, full_8b):
    code, out, err = cli_streams("validate", full_8b, "--gpus", "1", "--gpu-mem", "24GB", "--skip-files")
    assert code == 1
    line = next(ln for ln in out.splitlines() if "memory-budget" in ln)
    assert "error memory-budget" in line and "24.00 GiB" in line
    fix = out.splitlines()[out.splitlines().index(line) + 1]
    assert fix.strip().startswith("fix: set ") and "model.lora" in fix


def test_validate_json_reports_memory_budget(cli_streams, full_8b):
    code, out, _ = cli_streams("validate", full_8b, "--gpus", "1", "--gpu-mem", "24GB", "--skip-files", "--format", "json")
    assert code == 1
    found = [f for f in json.loads(out) if f["rule"] == "memory-budget"]
    assert found and found[0]["severity"] == "error" and found[0]["fix"]


def test_no_memory_finding_without_hardware(cli_streams, full_8b):
    code, out, _ = cli_streams("validate", full_8b, "--skip-files")
    assert code == 0, out
    assert "memory-budget" not in out


def test_a_hardware_preset_declares_the_hardware(cli_streams, tmp_path, llama8b):
    p = tmp_path / "r.yaml"
    p.write_text(f"preset: lora-1gpu\nmodel:\n  policy: {llama8b}\n  lora: null\ndata:\n  train: builtin:arithmetic\n"
                 "reward:\n  functions: [builtin:exact_answer]\n")
    code, out, _ = cli_streams("validate", str(p), "--skip-files")
    assert "error memory-budget" in out and code == 1
    # the same preset with its LoRA adapter: fits the 24 GB card
    p.write_text(p.read_text().replace("  lora: null\n", ""))
    code, out, _ = cli_streams("validate", str(p), "--skip-files")
    assert "memory-budget" not in out


def test_plan_over_capacity_proposes_changes(cli_streams, full_8b):
    code, out, _ = cli_streams("plan", full_8b, "--gpus", "1", "--gpu-mem", "24GB")
    assert code == 1
    assert "DOES NOT FIT" in out and "changes that fit, best first:" in out
    assert "1. set " in out


def test_plan_unknown_model_says_how_to_fix(cli_streams, tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("model:\n  policy: some-org/not-a-cached-model\ndata:\n  train: builtin:arithmetic\n"
                 "reward:\n  functions: [builtin:exact_answer]\n")
    code, _, err = cli_streams("plan", str(p), "--gpus", "1", "--gpu-mem", "24GB")
    assert code == 2
    assert "size is unknown" in err and "fix: set model.policy to a local directory" in err


def test_plan_bad_input_is_a_message(cli_streams, tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("model:\n  policy: [unclosed\n")
    code, _, err = cli_streams("plan", str(p))
    assert code == 2 and "r.yaml:" in err and "Traceback" not in err
    code, _, err = cli_streams("plan", str(ROOT / "recipes" / "minimal.yaml"), "--gpu-mem", "lots")
    assert code == 2 and "--gpu-mem" in err
    code, _, err = cli_streams("plan", str(ROOT / "recipes" / "minimal.yaml"), "train.micro_batch_size=0")
    assert code == 1 and "train.micro_batch_size" in err


def test_plan_imports_no_torch():
    code = ("import sys\nfrom rltune.cli import main\n"
            "try:\n    main(['plan', 'recipes/quickstart.yaml', '--gpus', '8', '--gpu-mem', '80GB'])\n"
            "except SystemExit:\n    pass\n"
            "heavy = [m for m in ('torch', 'transformers', 'deepspeed', 'vllm') if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr


def test_validate_with_hardware_imports_no_torch(full_8b):
    code = ("import sys\nfrom rltune.cli import main\n"
            f"try:\n    main(['validate', {full_8b!r}, '--gpus', '1', '--gpu-mem', '24GB', '--skip-files'])\n"
            "except SystemExit:\n    pass\n"
            "print('HEAVY', [m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
