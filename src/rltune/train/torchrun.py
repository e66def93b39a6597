"""torchrun as `rltune train --nproc N` starts it, with rltune's own word when a rank fails.

`python -m rltune.train.torchrun ARGS` is `python -m torch.distributed.run ARGS`: the same
parser, rendezvous and elastic agent (which stops the other ranks when one dies). What differs is
the end of a failed job: instead of torch's ChildFailedError traceback, one line per failed rank
(how it failed: its exit code, or the signal that killed it), and exit code 1. When every rank
that stopped was interrupted (exit 130: each saved its checkpoint and said so) the exit code is
130 and nothing more is said. launch.py adds the resume command. A rendezvous that fails (a node
that never joins within trainer.rendezvous_timeout_s, a closed rendezvous) is one line with the
fix, and exit code 3 (RENDEZVOUS_FAILED).
"""

from __future__ import annotations

import signal
import sys

RENDEZVOUS_FAILED = 3


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (RendezvousConnectionError, RendezvousError,
                                                          RendezvousTimeoutError)
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    try:
        run(args)
    except ChildFailedError as err:
        return report(err.failures)
    except RendezvousTimeoutError:
        print(f"rltune: not every node joined the rendezvous at {args.rdzv_endpoint} in time ({args.nnodes} nodes "
              "expected; trainer.rendezvous_timeout_s)\n  fix: start `rltune train` on every node with the same "
              "--nnodes and --rdzv-endpoint, within that time; check that the endpoint's host and port are reachable "
              "from every node", file=sys.stderr)
        return RENDEZVOUS_FAILED
    except RendezvousConnectionError as err:
        print(f"rltune: could not reach the rendezvous at {args.rdzv_endpoint} ({str(err)[:200]})\n  fix: start the "
              "first node (the endpoint's host) too, with the same --rdzv-endpoint; check that its host and port are "
              "reachable from every node (firewall, the address of the right network interface)", file=sys.stderr)
        return RENDEZVOUS_FAILED
    except RendezvousError as err:
        print(f"rltune: the rendezvous at {args.rdzv_endpoint} failed: {type(err).__name__}: {str(err)[:300]}\n  fix: "
              "check --rdzv-endpoint (a host:port every node reaches, its port free on that host) and --nnodes",
              file=sys.stderr)
        return RENDEZVOUS_FAILED
    return 0


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
