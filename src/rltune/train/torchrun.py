"""torchrun as `rltune train --nproc N` starts it, with rltune's own word when a rank fails.

`python -m rltune.train.torchrun ARGS` is `python -m torch.distributed.run ARGS`: the same
parser, rendezvous and elastic agent (which stops the other ranks when one dies). What differs is
the end of a failed job: instead of torch's ChildFailedError traceback, one line per failed rank
(how it failed: its exit code, or the signal that killed it), and exit code 1. When every rank
that stopped was interrupted (exit 130: each saved its checkpoint and said so) the exit code is
130 and nothing more is said. launch.py adds the resume command. A rendezvous that fails (a node
that never joins within trainer.rendezvous_timeout_s, a closed rendezvous, a node rank 0 that cannot
be reached) is one line with the fix, and exit code 3 (RENDEZVOUS_FAILED), under the c10d
rendezvous and under the static one that `--node-rank` takes.
"""

from __future__ import annotations

import signal
import sys

RENDEZVOUS_FAILED = 3


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import DistNetworkError, DistStoreError
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (RendezvousConnectionError, RendezvousError,
                                                          RendezvousTimeoutError)
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    # --node-rank: torchrun's static rendezvous (launch.py), whose TCP store raises its own errors:
    # node rank 0 waits for the others (DistStoreError), the others for it (DistNetworkError)
    ranks = " and its own --node-rank (0 on the endpoint's host)" if args.rdzv_backend == "static" else ""
    try:
        run(args)
    except ChildFailedError as err:
        return report(err.failures)
    except (RendezvousTimeoutError, DistStoreError) as err:
        if isinstance(err, DistStoreError) and "waiting for clients" not in str(err):
            return _failed(args, err)
        print(f"rltune: not every node joined the rendezvous at {args.rdzv_endpoint} in time ({args.nnodes} nodes "
              "expected; trainer.rendezvous_timeout_s)\n  fix: start `rltune train` on every node with the same "
              f"--nnodes and --rdzv-endpoint{ranks}, within that time; check that the endpoint's host and port are "
              "reachable from every node", file=sys.stderr)
        return RENDEZVOUS_FAILED
    except (RendezvousConnectionError, DistNetworkError) as err:
        first = "the first node (the endpoint's host" + (", --node-rank 0)" if ranks else ")")
        print(f"rltune: could not reach the rendezvous at {args.rdzv_endpoint} ({str(err)[:200]})\n  fix: start "
              f"{first} too, with the same --rdzv-endpoint; check that its host and port are reachable from every "
              "node (firewall, the address of the right network interface)", file=sys.stderr)
        return RENDEZVOUS_FAILED
    except RendezvousError as err:
        return _failed(args, err)
    return 0


def _failed(args, err: BaseException) -> int:
    print(f"rltune: the rendezvous at {args.rdzv_endpoint} failed: {type(err).__name__}: {str(err)[:300]}\n  fix: "
          "check --rdzv-endpoint (a host:port every node reaches, its port free on that host) and --nnodes",
          file=sys.stderr)
    return RENDEZVOUS_FAILED


def report(failures: dict) -> int:
    """Print how each rank failed (global rank -> ProcessFailure); the job's exit code."""
    codes = [f.exitcode for f in failures.values()]
    # a stop request: every rank saves and exits 130; torchrun, seeing the first one go, sends the
    # others SIGTERM, and a rank still on its way out counts as killed by it (the race is harmless:
    # the save of the step was complete on every rank before any exited, checkpoint.save's barrier)
    if codes and 130 in codes and all(c in (130, -signal.SIGTERM) for c in codes):
        return 130
    if codes and all(c == 2 for c in codes):
        return 2        # bad input, said by the ranks themselves: not a crash to restart
    for rank, f in sorted(failures.items()):
        how = f"was killed by {f.signal_name()}" if f.exitcode < 0 else f"exited with code {f.exitcode}"
        print(f"rltune: rank {rank} (pid {f.pid}) {how}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
