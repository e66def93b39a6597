"""One rank of test_update.py's two-rank check: on a tied model (tiny-qwen2), one update with the
gradients added early (train/shared_prompt.py) and one without, from the same weights; each rank
its own experience. Writes {loss, grad_norm, max weight difference} per rank to OUT/rank{r}.json.

    python -m torch.distributed.run --nproc_per_node 2 tests/train/early_grads_case.py ZERO OUT"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from test_update import _experience, _params, _recipe  # noqa: E402


def main() -> int:
    from rltune.engine.distributed import init_distributed
    from rltune.engine.roles import build_actor
    from rltune.recipe.knobs import Knobs
    from rltune.train import shared_prompt, update

    init_distributed("cpu")
    rank, zero, out = torch.distributed.get_rank(), int(sys.argv[1]), Path(sys.argv[2])
    r = _recipe()
    r = r.model_copy(update={"model": r.model.model_copy(update={"policy": "builtin:tiny-qwen2"}),
                             "actor": r.actor.model_copy(update={"zero_stage": zero})})
    shared_prompt.MIN_SAVED_FLOP = 0.0                 # tiny prompts: share them all the same
    exp = _experience(3 + rank)
    exp.prompt_ids = exp.prompt_ids[:2].repeat_interleave(4, 0)      # two groups of 4 samples
    knobs, results, params, real = Knobs(1e-2, 3e-2, 0.0, 0.2, 0.0), [], [], shared_prompt.into_grad
    for early in (True, False):
        shared_prompt.into_grad = real if early else contextlib.nullcontext
        torch.manual_seed(0)
        engine = build_actor(r, "cpu", 10)
        results.append(update.run_update(engine, [exp.select(torch.arange(0, 4)), exp.select(torch.arange(4, 8))],
                                         update.make_actor_loss(engine, r, knobs), "token-mean"))
        params.append(_params(engine))
    diff = max(float((params[0][n] - params[1][n]).abs().max()) for n in params[0])
    (out / f"rank{rank}.json").write_text(json.dumps({
        "loss": [x.loss for x in results], "grad_norm": [x.grad_norm for x in results],
        "skipped": [x.skipped for x in results], "diff": diff}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
