"""Attaching to a server started by hand (issue 46 item 4), on the installed vLLM: the command
docs/rollout-server.md gives for a CPU (--dtype float32 beside an fp32 trainer, a KV-cache size
in VLLM_CPU_KVCACHE_SPACE, --max-model-len within the tiny model's 512) starts, and the trainer
attaches to it; a trainer in another precision, or needing a longer context, is refused with the
flag that fixes it (what vLLM's GET /v1/models and GET /server_info really answer). One server,
~60 s on the 2-core CPU."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_test_helpers import vllm_available  # noqa: E402

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm-cpu on CPU) is not installed")


def _recipe(url: str):
    from rltune.recipe.schema import Recipe

    return Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                                  "reward": {"functions": ["builtin:exact_answer"]},
                                  "rollout": {"engine": "vllm-server", "max_new_tokens": 6, "server": {
                                      "url": url, "secret_env": "RLTUNE_SERVER_SECRET", "request_timeout_s": 60.0}}})


def test_attach_to_the_documented_cpu_command_and_refuse_another_dtype(tmp_path, monkeypatch):
    from rltune.models import resolve_model_dir
    from rltune.models.loading import load_tokenizer
    from rltune.rollout.server import ServerError, call, free_port
    from rltune.rollout.server_auth import new_secret
    from rltune.rollout.vllm_server import VLLMServerRollout

    d = resolve_model_dir("builtin:tiny-llama")
    secret, port = new_secret(), free_port()
    monkeypatch.setenv("RLTUNE_SERVER_SECRET", secret)
    # docs/rollout-server.md, "Attaching to a running server", on a CPU
    cmd = [sys.executable, "-m", "rltune.rollout.server_launch", "--host", "127.0.0.1", "--port", str(port),
           "--model", d, "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
           "--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048",
           "--enable-scale-out", "--logprobs-mode", "processed_logprobs",
           "--weight-transfer-config", '{"backend": "rltune_file"}']
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(cmd, env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1"), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 400
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                call(url, "GET", "/health", timeout_s=5.0, secret=secret)
                break
            except ServerError:
                assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
                time.sleep(2)
        tok = load_tokenizer(d)
        engine = VLLMServerRollout(d, tok, _recipe(url).rollout, precision="fp32", max_len=128)
        engine.close()
        with pytest.raises(ServerError) as e:
            VLLMServerRollout(d, tok, _recipe(url).rollout, precision="bf16", max_len=1024)
        head, fix = str(e.value).split("\n")
        assert head.startswith(f"rollout.server.url {url} serves {d} in float32 with max_model_len 512; the trainer "
                               f"trains {d} in bfloat16 (trainer.precision: bf16)"), head
        assert fix.startswith("  fix: restart the server with --dtype bfloat16 --max-model-len 1024"), fix
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
