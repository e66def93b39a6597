"""benchmarks/bench_grpo_gpu.py (`make bench-gpu`) on this CPU: the tiny shape end to end, so that the
script a GPU call runs without a network is known to work before it gets there. Slow: each run builds
a model and starts `rltune train` in fresh processes (hf ~40 s, vLLM ~60 s on 2 cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_grpo_gpu.py"


def run_bench(tmp_path: Path, *extra: str, response_len: int = 16) -> tuple[list[dict], str]:
    out = tmp_path / "out.json"
    cmd = [sys.executable, str(SCRIPT), "--shape", "tiny", "--device", "cpu", "--steps", "2", "--prompts", "2",
           "--group-size", "4", "--prompt-len", "32", "--response-len", str(response_len), "--threads", "2",
           "--timeout", "300", "--json", str(out), "--keep", str(tmp_path / "work"), *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return json.loads(out.read_text()), res.stdout


def check(r: dict, response_len: int) -> None:
    assert r["ok"], r.get("error")
    assert r["steps"] == 2
    assert r["tokens_per_s_per_gpu"] > 0 and r["rltune_tokens_per_s"] > 0 and r["sequences_per_s"] > 0
    # EOS held back: every response is exactly --response-len tokens
    assert r["response_len_mean"] == response_len and r["response_len_min"] == response_len
    # the script's figure and rltune's count the same tokens (prompt + response of every sequence)
    assert r["tokens_per_s_per_gpu"] == pytest.approx(r["rltune_tokens_per_s"], rel=0.05)
    assert r["sequences_per_step"] == 8 and r["prompt_len"] == 32
    for k in ("step_s", "generation_s", "update_s", "sync_ms"):
        assert r[k] is not None and r[k] >= 0, k
    assert r["torch"] and r["transformers"]


@pytest.mark.slow
def test_tiny_hf_synchronous_and_one_step_ahead(tmp_path):
    results, stdout = run_bench(tmp_path, "--engine", "hf", "--staleness", "0", "1")
    assert [r["max_staleness"] for r in results] == [0, 1]
    assert [r["engine"] for r in results] == ["hf", "hf"]
    for r in results:
        check(r, 16)
    assert "| tiny-K0-hf | True | 2 |" in stdout and "| tiny-K1-hf | True | 2 |" in stdout


@pytest.mark.slow
def test_tiny_vllm_synchronous(tmp_path):
    pytest.importorskip("vllm")
    results, stdout = run_bench(tmp_path, "--engine", "vllm", "--staleness", "0")
    (r,) = results
    check(r, 16)
    assert r["engine"] == "vllm" and r["params"] > 0


def test_staleness_one_with_vllm_runs_the_server_engine(tmp_path):
    """The in-process vllm engine refuses generation ahead: K >= 1 settings name vllm-server, and
    the recipes the script writes pass `rltune validate` (no download, no training: fast)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_grpo_gpu as b

    args = b.parse_args(["--shape", "qwen2.5-0.5b", "--lora", "8", "--prompts", "4", "--group-size", "4"])
    assert args.micro_batch_size == 8 and args.device == "cuda" and args.staleness == [0, 1]
    model = b.write_config_only("qwen2.5-0.5b", tmp_path / "model")
    cfg = json.loads((model / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"], cfg["tie_word_embeddings"]) == \
        (896, 24, 151936, True)
    data = tmp_path / "p.jsonl"
    b.write_data(data, 4, 64)
    for K, engine in ((0, "vllm"), (1, "vllm-server")):
        rec = b.make_recipe(args, model, data, tmp_path / "run", K, engine)
        assert rec["rollout"]["asynchronous"]["max_staleness"] == K
        assert rec["trainer"]["precision"] == "bf16" and rec["algorithm"]["kl"]["coef"] == 0.0
        assert rec["model"]["lora"]["r"] == 8
        path = tmp_path / f"r{K}.yaml"
        b.dump_yaml(rec, path)
        ok, text = b.validate(path)
        assert ok, text
        assert "0 error(s), 0 warning(s)" in text, text
