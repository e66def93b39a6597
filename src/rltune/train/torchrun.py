"""torchrun as `rltune train --nproc N` starts it, with rltune's own word when a rank fails.

`python -m rltune.train.torchrun ARGS` is `python -m torch.distributed.run ARGS`: the same
parser, rendezvous and elastic agent (which stops the other ranks when one dies). What differs is
the end of a failed job: instead of torch's ChildFailedError traceback, one line per failed rank
(how it failed: its exit code, or the signal that killed it), and exit code 1. When every rank
that stopped was interrupted (exit 130: each saved its checkpoint and said so) the exit code is
130 and nothing more is said. launch.py adds the resume command.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(argv))
    except ChildFailedError as err:
        return report(err.failures)
    return 0


def report(failures: dict) -> int:
    """Print how each rank failed (global rank -> ProcessFailure); the job's exit code."""
    if failures and all(f.exitcode == 130 for f in failures.values()):
        return 130
    for rank, f in sorted(failures.items()):
        how = f"was killed by {f.signal_name()}" if f.exitcode < 0 else f"exited with code {f.exitcode}"
        print(f"rltune: rank {rank} (pid {f.pid}) {how}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
