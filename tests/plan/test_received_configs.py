"""What rltune receives is untrusted (issue 25, items 7 and 8): a model's config.json from a
directory someone sent or a hub snapshot. Crafted configs through `rltune plan`, `rltune validate
--gpus 1 --gpu-mem 80GB` and the dry run's config read (train/dryrun.py check_configs): each ends in
a message naming the file and the field (or what is wrong with the file) and a fix, never a
traceback, the traceback handler's "probably a bug", or a silent plan of nonsense. Mixture-of-experts
configs are sized (Mixtral, Qwen2-MoE, Qwen3-MoE: every expert for memory, the active ones for
activations) or refused by name (DeepSeek's layout), never planned as a dense model."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from rltune.recipe.loader import load_recipe

# Llama-2-7B (meta-llama/Llama-2-7b-hf config.json)
BASE = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000, "tie_word_embeddings": False}

# config.json values of released mixtures of experts (their repositories on the Hugging Face hub)
MIXTRAL_8X7B = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": False}
QWEN15_MOE_A27B = {"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
                   "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
                   "vocab_size": 151936, "num_experts": 60, "num_experts_per_tok": 4,
                   "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                   "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False}
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                 "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                 "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
               "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
               "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
               "n_shared_experts": 1, "first_k_dense_replace": 3}

# name -> (config.json text, the field the message must name, or None where the message names the
# file's problem instead)
BAD = {
    "heads-zero": (json.dumps(dict(BASE, num_attention_heads=0)), "num_attention_heads"),
    "hidden-infinity": (json.dumps(BASE)[:-1] + ', "hidden_size": Infinity}', "hidden_size"),
    "hidden-nan": (json.dumps(BASE)[:-1] + ', "hidden_size": NaN}', "hidden_size"),
    "layers-negative": (json.dumps(dict(BASE, num_hidden_layers=-3)), "num_hidden_layers"),
    "layers-zero": (json.dumps(dict(BASE, num_hidden_layers=0)), "num_hidden_layers"),
    "vocab-zero": (json.dumps(dict(BASE, vocab_size=0)), "vocab_size"),
    "mlp-1e30-float": (json.dumps(dict(BASE, intermediate_size=1e30)), "intermediate_size"),
    "vocab-1e30-int": (json.dumps(dict(BASE, vocab_size=10 ** 30)), "vocab_size"),
    "hidden-string": (json.dumps(dict(BASE, hidden_size="4096")), "hidden_size"),
    "hidden-fraction": (json.dumps(dict(BASE, hidden_size=4096.5)), "hidden_size"),
    "layers-true": (json.dumps(dict(BASE, num_hidden_layers=True)), "num_hidden_layers"),
    "kv-heads-not-dividing": (json.dumps(dict(BASE, num_key_value_heads=5)), "num_key_value_heads"),
    "head-dim-zero": (json.dumps(dict(BASE, head_dim=0)), "head_dim"),
    "hidden-not-multiple-of-heads": (json.dumps(dict(BASE, hidden_size=4000, num_attention_heads=3)),
                                     "num_attention_heads"),
    "tied-string": (json.dumps(dict(BASE, tie_word_embeddings="false")), "tie_word_embeddings"),
    "text-config-heads-zero": (json.dumps({"model_type": "llava", "text_config": dict(BASE, num_attention_heads=0)}),
                               "text_config.num_attention_heads"),
    "mixtral-more-active-than-experts": (json.dumps(dict(MIXTRAL_8X7B, num_experts_per_tok=9)), "num_experts_per_tok"),
    "deep-nesting": ('{"hidden_size": 4096, "x": ' + "[" * 200_000 + "]" * 200_000 + "}", None),
    "not-json": ('{"hidden_size": 4096,', None),
    "not-an-object": ("[1, 2, 3]", None),
    "huge-file": (json.dumps(dict(BASE, pad="x" * (5 << 20))), None),     # a valid config, padded
}
# what the message says about a file that is not a usable config.json at all
FILE_PROBLEM = {"deep-nesting": "nested too deeply", "not-json": "not valid JSON", "not-an-object": "not an object",
                "huge-file": "MiB", "fifo": "FIFO", "dev-zero": "device"}


def recipe_for(tmp_path: Path, name: str, model_dir: Path, key: str = "policy") -> Path:
    p = tmp_path / f"{name}.yaml"
    model = f"  policy: {model_dir}\n" if key == "policy" else f"  policy: builtin:tiny-llama\n  {key}: {model_dir}\n"
    p.write_text(f"model:\n{model}data:\n  train: builtin:arithmetic\nreward:\n  functions: [builtin:exact_answer]\n"
                 "trainer:\n  precision: bf16\n")
    return p


def model_dir(tmp_path: Path, name: str, text: str | None = None) -> Path:
    d = tmp_path / name
    d.mkdir()
    if name == "fifo":
        os.mkfifo(d / "config.json")
    elif name == "dev-zero":
        (d / "config.json").symlink_to("/dev/zero")
    else:
        (d / "config.json").write_text(text)
    return d


@contextlib.contextmanager
def no_hang(seconds: int = 60):
    """Fail instead of hanging forever if something opens a FIFO for reading and blocks."""
    def _raise(*_):
        raise TimeoutError(f"hung for {seconds} s (a FIFO opened for reading?)")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def clean(text: str) -> None:
    assert "Traceback" not in text and "probably a bug" not in text, text


CASES = sorted(BAD) + ["fifo", "dev-zero"]


@pytest.fixture(params=CASES)
def bad(request, tmp_path):
    """(recipe path, config.json path, the field the message names or the file problem it states)."""
    name = request.param
    text, field = BAD.get(name, (None, None))
    d = model_dir(tmp_path, name, text)
    return recipe_for(tmp_path, name, d), d / "config.json", field or FILE_PROBLEM[name]


def test_plan_names_the_file_and_the_field(cli_streams, bad):
    recipe, cfg, what = bad
    with no_hang():
        code, out, err = cli_streams("plan", str(recipe), "--gpus", "1", "--gpu-mem", "80GB")
    clean(out + err)
    assert code == 2, out + err
    assert str(cfg) in err and what in err and "fix:" in err, err
    assert "peak:" not in out


def test_validate_names_the_file_and_the_field(cli_streams, bad):
    recipe, cfg, what = bad
    with no_hang():
        code, out, err = cli_streams("validate", str(recipe), "--gpus", "1", "--gpu-mem", "80GB")
    clean(out + err)
    assert code == 1, out + err
    line = next((ln for ln in out.splitlines() if "memory-budget" in ln), "")
    assert "error memory-budget" in line and str(cfg) in line and what in line, out
    fix = out.splitlines()[out.splitlines().index(line) + 1]
    assert fix.strip().startswith("fix:"), out


def test_the_dry_runs_config_read_names_the_file_and_the_field(tmp_path, bad):
    from rltune.train.dryrun import check_configs

    recipe, cfg, what = bad
    res = load_recipe(str(recipe), [])
    assert res.recipe is not None, res.findings
    with no_hang():
        problem = check_configs(res.recipe)
    assert problem is not None and str(cfg) in problem and what in problem and "fix:" in problem, problem


@pytest.mark.parametrize("key", ["critic", "reference"])
def test_a_critic_or_reference_config_is_checked_too(cli_streams, tmp_path, key):
    d = model_dir(tmp_path, "heads-zero", BAD["heads-zero"][0])
    recipe = recipe_for(tmp_path, "r", d, key=key)
    code, out, err = cli_streams("plan", str(recipe), "--gpus", "1", "--gpu-mem", "80GB", "algorithm.name=ppo")
    clean(out + err)
    assert code == 2 and f"model.{key}: {d / 'config.json'}" in err and "num_attention_heads" in err, out + err


def test_train_dry_run_stops_before_building(cli_streams, tmp_path):
    d = model_dir(tmp_path, "layers-negative", BAD["layers-negative"][0])
    recipe = recipe_for(tmp_path, "r", d)
    code, out, err = cli_streams("train", str(recipe), "--dry-run", "trainer.precision=fp32")
    clean(out + err)
    assert code == 2, out + err
    assert str(d / "config.json") in err and "num_hidden_layers" in err and "fix:" in err, err


def test_train_stops_before_building(cli_streams, tmp_path):
    # plain `train` too: the config is checked where it is read, before any model or engine is built
    d = model_dir(tmp_path, "heads-zero", BAD["heads-zero"][0])
    recipe = recipe_for(tmp_path, "r", d)
    code, out, err = cli_streams("train", str(recipe), "trainer.precision=fp32", f"trainer.output_dir={tmp_path / 'run'}")
    clean(out + err)
    assert code == 2, out + err
    assert str(d / "config.json") in err and "num_attention_heads" in err and "fix:" in err, err
    assert not (tmp_path / "run").exists()


def test_missing_sizes_are_named(cli_streams, tmp_path):
    cfg = {k: v for k, v in BASE.items() if k != "num_hidden_layers"}
    d = model_dir(tmp_path, "missing", json.dumps(cfg))
    recipe = recipe_for(tmp_path, "r", d)
    code, out, err = cli_streams("plan", str(recipe), "--gpus", "1", "--gpu-mem", "80GB")
    clean(out + err)
    assert code == 2 and str(d / "config.json") in err and "num_hidden_layers" in err and "fix:" in err, err
    # validate: the budget is not checked (an info naming the field); transformers may still load it
    code, out, err = cli_streams("validate", str(recipe), "--gpus", "1", "--gpu-mem", "80GB")
    clean(out + err)
    assert code == 0 and "memory budget not checked" in out and "num_hidden_layers" in out, out
    from rltune.train.dryrun import check_configs

    assert check_configs(load_recipe(str(recipe), []).recipe) is None


@pytest.mark.parametrize("cmd", ["plan", "validate"])
@pytest.mark.parametrize("size", ["1e999GB", "1e400", "99999999999999TB"])
def test_gpu_mem_out_of_range(cli_streams, tmp_path, cmd, size):
    d = model_dir(tmp_path, "llama", json.dumps(BASE))
    recipe = recipe_for(tmp_path, "r", d)
    code, out, err = cli_streams(cmd, str(recipe), "--gpus", "1", "--gpu-mem", size)
    clean(out + err)
    assert code == 2 and "--gpu-mem" in err and "too large" in err, out + err


# ---------------------------------------------------------------- mixtures of experts


@pytest.mark.parametrize("cfg, total, active", [
    (MIXTRAL_8X7B, 46.7e9, 12.9e9),          # Mixtral-8x7B: "46.7B total, 12.9B active"
    (QWEN15_MOE_A27B, 14.3e9, 2.7e9),        # Qwen1.5-MoE-A2.7B: "14.3B total, 2.7B activated"
    (QWEN3_30B_A3B, 30.5e9, 3.3e9),          # Qwen3-30B-A3B: "30.5B total, 3.3B activated"
], ids=["mixtral-8x7b", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b"])
def test_moe_sizes_match_the_published_counts(cfg, total, active):
    from rltune.plan.arch import arch_from_config

    a = arch_from_config(cfg, "config.json")
    assert abs(a.params() - total) / total < 0.01, a.params()
    assert abs(a.params(active=True) - active) / active < 0.03, a.params(active=True)


def test_mixtral_plan_counts_every_expert(cli_streams, tmp_path):
    """The dense reading (7.24B) proposed LoRA that "fits" on one 80 GB card: 8 experts of 46.7B
    parameters do not fit there even frozen (87 GiB of bf16 weights)."""
    d = model_dir(tmp_path, "mixtral", json.dumps(MIXTRAL_8X7B))
    recipe = recipe_for(tmp_path, "r", d)
    code, out, err = cli_streams("plan", str(recipe), "--gpus", "1", "--gpu-mem", "80GB", "--format", "json")
    clean(out + err)
    assert code == 1, err
    plan = json.loads(out)
    m = plan["model"]
    assert m["experts"] == 8 and m["experts_per_token"] == 2 and m["moe_layers"] == 32
    assert m["params"] == 46_702_792_704
    weights = next(i for i in plan["items"] if i["name"] == "actor weights")["bytes"]
    assert weights == m["params"] * 2
    assert not [p for p in plan["proposals"] if "model.lora" in p["changes"]]
    code, out, _ = cli_streams("plan", str(recipe), "--gpus", "1", "--gpu-mem", "80GB")
    assert "mixture of experts: 8 experts of MLP 14336, 2 per token" in out and "12.9B active" in out


def test_moe_activations_count_the_active_experts():
    """Per token per layer, a sparse block keeps k x (4i' + 2h) values for its experts plus the
    router's ~3 x experts: for Mixtral 2 x (4 x 14336 + 2 x 4096) + 24 = 131,096, against the dense
    reading's 4 x 14336 = 57,344."""
    from rltune.plan import budget as B
    from rltune.plan.arch import arch_from_config

    a = arch_from_config(MIXTRAL_8X7B, "config.json")
    h = 4096
    per_layer = 7 * h + 2 * h + 2 * (4 * 14336 + 2 * h) + 3 * 8     # sdpa: k, v repeated to all heads
    assert B.activations(a, 1, 100, 2, False) == (32 * 100 * per_layer + 100 * 100) * 2


def test_deepseek_layout_is_refused_by_name(cli_streams, tmp_path):
    d = model_dir(tmp_path, "deepseek", json.dumps(DEEPSEEK_V3))
    recipe = recipe_for(tmp_path, "r", d)
    code, out, err = cli_streams("plan", str(recipe), "--gpus", "8", "--gpu-mem", "80GB")
    clean(out + err)
    assert code == 2 and "peak:" not in out
    assert "mixture-of-experts" in err and "256 experts, 8 active" in err and "deepseek_v3" in err, err
    # the dry run does not stop on it: loading it is transformers' business
    from rltune.train.dryrun import check_configs

    assert check_configs(load_recipe(str(recipe), []).recipe) is None


@pytest.mark.filterwarnings("ignore:The following .*_pattern keys did not match")
def test_moe_params_and_lora_match_transformers_and_peft():
    """The plan's parameter and LoRA (all-linear) counts against the models transformers builds (on
    the meta device: no memory) and the adapters PEFT adds to them."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from rltune.plan import budget as B
    from rltune.plan.arch import arch_from_config

    small = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    cfgs = [
        dict(small, model_type="mixtral", intermediate_size=96, num_hidden_layers=2, num_local_experts=4,
             num_experts_per_tok=2),
        dict(small, model_type="qwen2_moe", intermediate_size=80, num_hidden_layers=4, num_experts=6,
             num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
             decoder_sparse_step=2, mlp_only_layers=[3]),
        dict(small, model_type="qwen3_moe", intermediate_size=80, num_hidden_layers=2, head_dim=32, num_experts=6,
             num_experts_per_tok=2, moe_intermediate_size=32, tie_word_embeddings=True),
    ]
    for c in cfgs:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**c))
        a = arch_from_config(c, "config.json")
        assert a.params() == sum(p.numel() for p in model.parameters()), c["model_type"]
        peft_model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear"))
        adapter = sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n)
        assert B.lora_params(a, 4, "all-linear") == adapter, c["model_type"]
