"""final/ is what save_pretrained writes (issue 46, item 1): the trained model loads in
transformers with no missing or unexpected keys, its safetensors hold exactly save_pretrained's
tensor names (no non-persistent buffers such as the rotary embedding's inv_freq, which vLLM
refuses), and it gives the greedy tokens the trainer's policy gave, for full weights of every
builtin architecture and for a merged LoRA (trainer.save_merged). The vLLM side:
tests/vllm/test_final_serves.py."""

from __future__ import annotations

import pytest

from final_export_helpers import (CASES, greedy_hf, load_final_hf, model_dir, record_policy_greedy,
                                  safetensors_keys, save_pretrained_keys, trained)
from trainlib import run_inproc


@pytest.mark.parametrize("case", list(CASES))
def test_final_is_what_save_pretrained_writes_and_greedy_matches_the_policy(case, capfd, monkeypatch, tmp_path):
    seen = record_policy_greedy(monkeypatch)
    run = trained(case, tmp_path, lambda *a: run_inproc(capfd, *a))
    final = model_dir(case, run)
    keys = safetensors_keys(final)
    assert not any("inv_freq" in k for k in keys), sorted(k for k in keys if "inv_freq" in k)
    assert keys == save_pretrained_keys(final, tmp_path / "reference")
    model, tok, info = load_final_hf(final)
    assert all(not info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    assert seen["tokens"] and greedy_hf(model, tok) == seen["tokens"]
