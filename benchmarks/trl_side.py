"""The TRL side of benchmarks/bench_vs_trl.py: the same GRPO workload through TRL's GRPOTrainer.

Run by the python of benchmarks/.venv-trl (TRL + the same CPU torch + rltune itself), never by
rltune's own venv: TRL is no dependency of rltune.

    benchmarks/.venv-trl/bin/python benchmarks/trl_side.py --out DIR --steps N [--gc default|off] \
        [--override key=value ...] [--check-tokens]

Every shared setting comes from rltune's recipe (recipes/quickstart.yaml plus the overrides
bench_vs_trl.py passes), loaded with rltune's own loader, so the two sides cannot drift:
prompts are rltune's builtin arithmetic rows in the order rltune's sampler draws them (TRL's
shuffling off, so step k of both sides sees the same 16 prompts), encoded by the same chat
template; rewards are rltune's builtin functions with the recipe's weights; the LR schedule is
rltune's own `lr_factor` (HF's constant_with_warmup starts at lr 0 on the first update, rltune
at lr/warmup). Everything else is TRL's default (gradient checkpointing on unless --gc off).

Writes DIR/steps.jsonl (one line per step: wall time, reward mean, zero-advantage group share,
completion tokens, TRL's own logs) and DIR/info.json (versions, the config, the first prompt's
token ids as TRL encoded them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "quickstart.yaml"


def load_recipe(overrides: list[str]):
    from rltune.recipe.loader import load_recipe as _load

    res = _load(RECIPE, overrides)
    if res.recipe is None:
        raise SystemExit(f"recipe does not validate with {overrides}: {res.findings}")
    return res.recipe


def step_rows(recipe, steps: int) -> tuple[list[dict], list[list[int]]]:
    """The rows rltune trains on, in the order its sampler draws them (rltune: setup.build)."""
    from rltune.data import PromptSampler, load_prompts

    d = recipe.data
    train_set = load_prompts(d.train, d.prompt_key, size=d.builtin_size, digits=d.builtin_digits,
                             seed=recipe.trainer.seed, split="train", chat=True)
    sampler = PromptSampler(len(train_set), recipe.prompts_per_call, recipe.trainer.seed, d.shuffle, d.drop_last)
    batches = [sampler.next_batch() for _ in range(steps * recipe.gen_calls_per_step)]
    return [train_set.rows[i] for b in batches for i in b], batches


def trl_reward(fn, name: str):
    """rltune's reward signature (prompts, completions: list[str], **columns) as TRL's: TRL hands
    conversational completions as [{"role": "assistant", "content": text}]."""
    def wrapped(prompts, completions, **columns):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        ptexts = [p[-1]["content"] if isinstance(p, list) else p for p in prompts]
        cols = {k: v for k, v in columns.items() if k in ("answer",)}
        return [float(x) for x in fn(ptexts, texts, **cols)]
    wrapped.__name__ = name
    return wrapped


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--gc", choices=["default", "off"], default="default",
                   help="gradient checkpointing: TRL's default (GRPOConfig) or off")
    p.add_argument("--override", action="append", default=[], help="rltune recipe override key=value")
    p.add_argument("--check-tokens", action="store_true", help="print the first prompt's token ids and exit")
    a = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    recipe = load_recipe(a.override)
    torch.set_num_threads(recipe.trainer.threads or 2)

    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rltune.engine.roles import lr_factor
    from rltune.models.loading import load_tokenizer, resolve_model_dir
    from rltune.reward import load_reward_function
    from rltune.train.prompts import encode_prompt, prompt_messages

    rows, _ = step_rows(recipe, a.steps)
    d = recipe.data
    tok = load_tokenizer(recipe.model.policy)
    rltune_ids = encode_prompt(rows[0], tok, d, d.prompt_key)
    dataset = Dataset.from_list([{"prompt": prompt_messages(r, d.prompt_key, d), "answer": r["answer"]} for r in rows])

    r, ro, ac, tr = recipe, recipe.rollout, recipe.actor, recipe.train
    n_gen = r.algorithm.group_size
    micro = tr.micro_batch_size
    grad_acc = tr.batch_size // micro
    kw = dict(
        output_dir=str(out / "trainer"), max_steps=a.steps, logging_steps=1, report_to="none",
        save_strategy="no", eval_strategy="no", use_cpu=True, bf16=False, fp16=False,
        seed=r.trainer.seed, data_seed=r.trainer.seed, shuffle_dataset=False, dataloader_num_workers=0,
        per_device_train_batch_size=micro, gradient_accumulation_steps=grad_acc,
        generation_batch_size=tr.batch_size, num_generations=n_gen, num_iterations=tr.ppo_epochs,
        max_completion_length=ro.max_new_tokens, temperature=ro.temperature, top_p=ro.top_p,
        top_k=ro.top_k, use_vllm=False, beta=r.algorithm.kl.coef,
        epsilon=r.algorithm.clip_range, epsilon_high=r.algorithm.clip_range_high or r.algorithm.clip_range,
        scale_rewards="group" if r.algorithm.scale_by_std else "none",
        reward_weights=list(r.reward.weights or [1.0] * len(r.reward.functions)),
        learning_rate=ac.lr, warmup_steps=ac.warmup_steps, lr_scheduler_type="constant_with_warmup",
        weight_decay=ac.weight_decay, adam_beta1=ac.betas[0], adam_beta2=ac.betas[1], adam_epsilon=ac.eps,
        max_grad_norm=ac.grad_clip or 0.0,
        optim="adamw_torch_fused",   # TRL's default with torch >= 2.8, and what rltune runs on CPU
    )
    if a.gc == "off":
        kw["gradient_checkpointing"] = False
    cfg = GRPOConfig(**kw)

    model = AutoModelForCausalLM.from_pretrained(resolve_model_dir(r.model.policy), dtype=torch.float32)
    funcs = [trl_reward(load_reward_function(s), s.split(":")[-1]) for s in r.reward.functions]

    total = a.steps * r.optimizer_updates_per_step  # rltune: the LR schedule counts updates

    class Trainer(GRPOTrainer):
        def create_scheduler(self, num_training_steps, optimizer=None):  # rltune's lr_factor, exactly
            if self.lr_scheduler is None:
                opt = optimizer or self.optimizer
                self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: lr_factor(
                    u, ac.warmup_steps, total, ac.lr_schedule, ac.min_lr_ratio))
                self._created_lr_scheduler = True
            return self.lr_scheduler

    seen: dict = {}

    class Recorder(TrainerCallback):
        def __init__(self):
            self.t = None
            self.last_step_s = None
            self.f = open(out / "steps.jsonl", "w")

        def on_train_begin(self, args, state, control, **k):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **k):
            now = time.perf_counter()
            self.last_step_s, self.t = now - self.t, now

        def on_log(self, args, state, control, logs=None, **k):
            logs = dict(logs or {})
            if "reward" not in logs:
                return
            rec = {"step": state.global_step, "step_s": self.last_step_s, "reward_mean": logs.get("reward"),
                   "zero_adv_frac": logs.get("frac_reward_zero_std"),
                   "completion_tokens": (logs.get("completions/mean_length") or 0.0) * tr.batch_size,
                   "lr": logs.get("learning_rate"), "trl": logs}
            self.f.write(json.dumps(rec) + "\n")
            self.f.flush()
            print(f"[trl] step {rec['step']}: {rec['step_s']:.1f} s, reward {rec['reward_mean']:.3f}, "
                  f"zero-adv {rec['zero_adv_frac']}", flush=True)

    trainer = Trainer(model=model, reward_funcs=funcs, args=cfg, train_dataset=dataset, processing_class=tok,
                      callbacks=[Recorder()])
    orig = trainer._tokenize_prompts

    def spy(prompts):
        res = orig(prompts)
        seen.setdefault("first_prompt_ids", list(res[0][0]))
        seen.setdefault("first_call_size", len(prompts))
        return res
    trainer._tokenize_prompts = spy

    info = {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "gc": bool(cfg.gradient_checkpointing),
            "loss_type": cfg.loss_type, "gradient_checkpointing_default": GRPOConfig.__dataclass_fields__[
                "gradient_checkpointing"].default,
            "loss_type_default": GRPOConfig.__dataclass_fields__["loss_type"].default,
            "steps_per_generation": cfg.steps_per_generation, "generation_batch_size": cfg.generation_batch_size,
            "rltune_first_prompt_ids": rltune_ids}
    if a.check_tokens:
        ids = spy([dataset[0]["prompt"]])[0][0]
        info["first_prompt_ids"] = list(ids)
        same = list(ids) == rltune_ids
        print(f"[trl] first prompt {rows[0][d.prompt_key]!r}\n  rltune ids {rltune_ids}\n  TRL ids    {list(ids)}\n"
              f"  identical: {same}")
        (out / "info.json").write_text(json.dumps(info, indent=1))
        sys.exit(0 if same else 1)
    trainer.train()
    info.update(seen)
    info["prompt_ids_identical"] = seen.get("first_prompt_ids") == rltune_ids
    (out / "info.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
