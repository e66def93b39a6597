"""One rank of test_update.py's two-rank check (`tied_updates` on this rank's own experience):
writes {loss, grad_norm, skipped, max weight difference} of the updates with and without the
gradients added early to OUT/rank{r}.json.

    python -m torch.distributed.run --nproc_per_node 2 tests/train/early_grads_case.py ZERO OUT"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from test_update import tied_updates  # noqa: E402


def main() -> int:
    from rltune.engine.distributed import init_distributed

    init_distributed("cpu")
    rank, zero, out = torch.distributed.get_rank(), int(sys.argv[1]), Path(sys.argv[2])
    results, params, _ = tied_updates(zero, True, 3 + rank)
    diff = max(float((params[0][n] - params[1][n]).abs().max()) for n in params[0])
    (out / f"rank{rank}.json").write_text(json.dumps({
        "loss": [x.loss for x in results], "grad_norm": [x.grad_norm for x in results],
        "skipped": [x.skipped for x in results], "diff": diff}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
