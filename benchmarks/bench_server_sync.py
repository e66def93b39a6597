"""Weight sync into `rollout.engine: vllm-server`: the `file` transfer vs the `gloo` one.

    python benchmarks/bench_server_sync.py [--syncs 6]

For each `rollout.server.weight_transfer`, in turn: the server the quickstart recipe starts on
this machine (SmolLM2-135M-Instruct, fp32), then `--syncs` syncs of the full weights, each after
the weights moved (as an update moves them) with one short generation between syncs. Reported:
the median sync time in ms (what `timing/sync_ms` logs: pause, the buckets through
/update_weights, finish, resume, prefix-cache reset) and the mean |rollout logp - actor logp|
after the last sync (the stale-weight probe: both transfers must be exact).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(transfer: str, syncs: int) -> dict:
    import torch

    from rltune.models import load_causal_lm, load_tokenizer
    from rltune.recipe import load_recipe
    from rltune.rollout import make_rollout
    from rltune.rollout.base import Sampling
    from rltune.train.update import forward_logp

    recipe = load_recipe(ROOT / "recipes" / "quickstart.yaml",
                         ["rollout.engine=vllm-server", f"rollout.server.weight_transfer={transfer}"]).recipe
    tok = load_tokenizer(recipe.model.policy)
    model = load_causal_lm(recipe.model.policy, "fp32", "sdpa", "cpu")
    engine = make_rollout(recipe, None, tok, "cpu", log_dir=Path(tempfile.mkdtemp()))
    prompts = [tok("What is 2+3? Answer with just the number.")["input_ids"]] * 4
    times = []
    try:
        for i in range(syncs):
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.0 + 1e-3 * (1 if i % 2 else -1))
            times.append(engine.sync_weights(model))
            exp = engine.generate(prompts, Sampling(n=2, max_new_tokens=16))
        diff = float(((exp.rollout_logp - forward_logp(model, exp, 1.0, 8)).abs() * exp.response_mask).sum()
                     / exp.response_mask.sum())
    finally:
        engine.close()
    return {"transfer": transfer, "sync_ms": [round(t) for t in times], "median_ms": round(statistics.median(times)),
            "logprob_diff": diff}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--syncs", type=int, default=6)
    args = ap.parse_args()
    rows = [one(t, args.syncs) for t in ("file", "gloo")]
    print(json.dumps(rows, indent=1))
    print("| transfer | sync ms (each) | median | mean \\|rollout - actor\\| log-prob |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| `{r['transfer']}` | {', '.join(map(str, r['sync_ms']))} | {r['median_ms']} | {r['logprob_diff']:.1e} |")


if __name__ == "__main__":
    main()
