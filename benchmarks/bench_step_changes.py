"""Before/after of each step-time change on one fixed step of a real workload.

    python benchmarks/bench_step_changes.py [--recipe recipes/quickstart.yaml] [--reps 2] [key=value ...]

Builds the recipe's engines once, generates and scores one step's experience, then times the
reference pass (no grad) and one actor update (forward + backward + optimizer step) on that
same experience with the changes switched on one after another:

  before   every micro-batch padded to the step's widest prompt + response, rows shuffled one
           by one, log-probs and entropy through the unfused chunked functions, every
           sequence computed whole
  +trim    micro-batches of whole groups sorted by length, all-padding columns dropped
  +fused   one fused log-prob + entropy pass at the log-prob temperature (no float32 copy)
  +shared  each prompt computed once per group (its keys/values shared by the group's responses)

The "before" variants are the previous code paths, restored here by swapping functions in;
rltune itself has no switch for them except `train.share_prompts`. Prints one markdown row per
variant: median seconds of the reference pass and of the update, and the peak RSS growth.
Each update starts from the same weights (they are restored after every timed update).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def _maxrss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--recipe", default="recipes/quickstart.yaml")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import torch

    from rltune.algo import entropy_from_logits, logprobs_from_logits
    from rltune.engine.distributed import init_distributed
    from rltune.recipe.knobs import Knobs
    from rltune.recipe.loader import load_recipe
    from rltune.rollout.experience import Experience
    from rltune.train import batching, loop, sampling, update
    from rltune.train.setup import build, seed_everything

    torch.set_num_threads(int(os.environ.get("RLTUNE_BENCH_THREADS", os.cpu_count() or 1)))
    overrides = ["rollout.engine=hf", "trainer.eval_every=0", "algorithm.kl.mode=loss", *a.overrides]
    recipe = load_recipe(ROOT / a.recipe, overrides).recipe
    dist = init_distributed("cpu")
    seed_everything(0, 0)
    c = build(recipe, dist, (ROOT / a.recipe).parent, seed=0)
    exp = sampling.sample_step(c).batch.exp                 # generated and scored
    exp.index = torch.arange(exp.size)
    micro, temp, n = recipe.train.micro_batch_size, recipe.logprob_temperature, recipe.algorithm.group_size
    exp.ref_logp = update.forward_logp(c.reference.module, exp, temp, micro, n, False)
    loop.compute_advantages(c, exp, recipe.algorithm.kl.coef)
    real = int(exp.prompt_mask.sum() + exp.response_mask.sum())
    padded = exp.size * (exp.prompt_width + exp.response_width)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {a.recipe} {' '.join(a.overrides)}")
    print(f"step: {exp.size} sequences, prompt width {exp.prompt_width}, response width {exp.response_width}, "
          f"{real} real tokens of {padded} padded ({real / padded:.0%})")

    fused, trimmed, order = update.token_logprobs_entropy, Experience.trimmed, batching._length_order

    def unfused(logits, labels, temperature=1.0):
        z = logits.float() / temperature
        return logprobs_from_logits(z, labels), entropy_from_logits(z)

    def variant(trim: bool, fuse: bool, share: bool):
        Experience.trimmed = trimmed if trim else (lambda self: self)
        batching._length_order = order if trim else (lambda e, rows, unit: rows)
        update.token_logprobs_entropy = fused if fuse else unfused
        object.__setattr__(recipe.train, "share_prompts", share)   # the recipe is frozen
    knobs = Knobs.from_recipe(recipe)
    saved = {k: v.detach().clone() for k, v in c.actor.module.state_dict().items()}
    variants = [("before", False, False, False), ("+trim", True, False, False),
                ("+fused", True, True, False), ("+shared", True, True, True)]
    print("| variant | reference pass (s) | actor update (s) | sum (s) | peak RSS so far (GB) |")
    print("| --- | --- | --- | --- | --- |")
    for name, trim, fuse, share in variants:
        variant(trim, fuse, share)
        ref_t, upd_t = [], []
        for rep in range(a.reps):
            t0 = time.perf_counter()
            update.forward_logp(c.reference.module, exp, temp, micro, n, update.use_shared_prompts(recipe, c.reference))
            ref_t.append(time.perf_counter() - t0)
            gen = torch.Generator().manual_seed(rep)
            mbs = batching.micro_batches(exp, micro, recipe.train.batch_size, gen, n if trim else 1)[0]
            t0 = time.perf_counter()
            update.run_update(c.actor, mbs, update.make_actor_loss(c.actor, recipe, knobs), recipe.algorithm.loss_agg)
            upd_t.append(time.perf_counter() - t0)
            c.actor.module.load_state_dict(saved)
        r, u = statistics.median(ref_t), statistics.median(upd_t)
        print(f"| {name} | {r:.2f} | {u:.2f} | {r + u:.2f} | {_maxrss_gb():.2f} |", flush=True)
    variant(True, True, True)


if __name__ == "__main__":
    main()
