"""Shared by tests/train/test_final_export.py and tests/vllm/test_final_serves.py (issue 46,
item 1): train a tiny run through the CLI and read back its final/ (no vLLM import here)."""

from __future__ import annotations

from pathlib import Path

from trainlib import read_metrics, tiny_recipe

PROMPTS = ["12+34=", "7*8=?", "what is 3+5? ", "99-9="]
NEW_TOKENS = 8

# name: (recipe, overrides, the directory under final/ that holds the HF model)
CASES = {
    "tiny-llama": ("tiny-grpo.yaml", {"model__policy": "builtin:tiny-llama"}, ""),
    "tiny-qwen2": ("tiny-grpo.yaml", {"model__policy": "builtin:tiny-qwen2"}, ""),
    "lora-merged": ("tiny-grpo-lora.yaml", {"trainer__save_merged": True}, "merged"),
    # tied embeddings (the LM head is not adapted: a tied adapted module cannot be merged)
    "lora-merged-qwen2": ("tiny-grpo-lora.yaml", {"trainer__save_merged": True, "model__policy": "builtin:tiny-qwen2",
                                                  "model__lora__target_modules": ["q_proj", "v_proj"]}, "merged"),
    # ZeRO-3: the parameters are gathered for the export (a tied one included)
    "tiny-qwen2-zero3": ("tiny-grpo.yaml", {"model__policy": "builtin:tiny-qwen2", "actor__zero_stage": 3}, ""),
}


def overrides(case: str, tmp_path: Path) -> Path:
    name, extra, _ = CASES[case]
    return tiny_recipe(tmp_path, name, trainer__max_steps=2, trainer__eval_every=0, **extra)


def model_dir(case: str, run: Path) -> Path:
    return run / "final" / CASES[case][2] if CASES[case][2] else run / "final"


def greedy_hf(model, tokenizer, prompts=PROMPTS, new_tokens: int = NEW_TOKENS) -> list[list[int]]:
    """Greedy continuations (token ids, prompt excluded) of `prompts`, one prompt at a time (no padding)."""
    import torch

    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([tokenizer(p, add_special_tokens=False)["input_ids"]])
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                 pad_token_id=tokenizer.pad_token_id)
            out.append(gen[0, ids.shape[1]:].tolist())
    return out


def load_final_hf(path: Path):
    """(model, tokenizer, loading info) of a final/ directory, strictly as transformers loads it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, dtype="float32")
    return model.eval(), AutoTokenizer.from_pretrained(path), info


def safetensors_keys(path: Path) -> set[str]:
    from safetensors import safe_open

    keys: set[str] = set()
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            keys |= set(st.keys())
    return keys


def save_pretrained_keys(path: Path, tmp: Path) -> set[str]:
    """The tensor names save_pretrained writes for a fresh model of `path`'s config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    model.save_pretrained(tmp, safe_serialization=True)
    return safetensors_keys(tmp)


def record_policy_greedy(monkeypatch) -> dict:
    """Patch the final/ writers so that, just before writing, the trainer's own policy (the actor
    engine's module: the HF model, or the PEFT model with its adapter) records its greedy tokens
    for PROMPTS. Returns the dict they land in (key "tokens")."""
    from rltune.models.adaptation import FullWeights, LoraAdapter

    seen: dict = {}
    for cls in (FullWeights, LoraAdapter):
        original = cls.__dict__["write_final"]

        def write_final(self, engine, tokenizer, out, rank, save_merged, _original=original):
            module = getattr(engine, "module", engine)
            was_training = module.training
            module.eval()
            seen["tokens"] = greedy_hf(module, tokenizer)
            module.train(was_training)
            return _original(self, engine, tokenizer, out, rank, save_merged)

        monkeypatch.setattr(cls, "write_final", write_final)
    return seen


def trained(case: str, tmp_path: Path, run_cli_or_inproc) -> Path:
    """Train `case` for 2 steps; the run directory."""
    path = overrides(case, tmp_path)
    res = run_cli_or_inproc("train", str(path), "--resume", "never")
    assert res.returncode == 0, res.stderr[-3000:]
    run = tmp_path / "run"
    assert len(read_metrics(run)) == 2
    return run
