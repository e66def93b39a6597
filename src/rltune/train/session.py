"""What one process of `rltune train` shares across its steps (run.py sets it up, steps.py
trains with it): the Run state, the signal flag, rank-0-first set-up, the checkpoint of the
current state and the message for a storage failure."""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..recipe.schema import Recipe
from .collective import broadcast_int
from .console import LOG
from .setup import TrainError

EXIT_INTERRUPTED = 130


class Stop:
    """SIGINT/SIGTERM set a flag; the loop saves a checkpoint after the current step and exits.
    A second one abandons at once (KeyboardInterrupt), a save in progress included: its
    partial files are removed and the last complete checkpoint stays what a resume uses."""

    def __init__(self):
        self.signal = None
        self.saving: int | None = None      # the step being saved right now
        self.abandoned: int | None = None   # the step whose save a second signal abandoned

    def again(self) -> str:
        return "press Ctrl-C again" if self.signal in (None, signal.SIGINT) else "send SIGTERM again"

    def __call__(self, signum, frame):
        if self.signal is not None:  # the second one: give up at once
            raise KeyboardInterrupt
        self.signal = signum
        name = signal.Signals(signum).name
        if self.saving is not None:
            LOG.warning("received %s while saving checkpoint step %d: the save finishes, then the run exits "
                        "(%s to abort the save)", name, self.saving, self.again())
        else:
            LOG.warning("received %s: finishing this step, saving a checkpoint, then exiting (%s to exit at once "
                        "without saving)", name, self.again())


def main_first(dist, fn):
    """Run `fn` on rank 0 only; a TrainError there stops every rank (the message on rank 0)."""
    err = result = None
    if dist.is_main:
        try:
            result = fn()
        except TrainError as e:
            err = e
    ok = broadcast_int(0 if err is not None else 1)
    if err is not None:
        raise err
    if not ok:
        raise TrainError("rank 0 could not set up the run directory (its message says why)")
    return result


@dataclass
class Run:
    """What the steps of `_train` share."""
    recipe: Recipe
    run_dir: Path
    dist: Any
    console: str
    stop: Stop = field(default_factory=Stop)
    hint: str = ""                   # the command line that resumes this run
    recipe_dict: dict = field(default_factory=dict)
    rhash: str = ""                  # the recipe's identity (bookkeeping keys left out)
    c: Any = None                    # setup.Components: engines, rollout, data, rewards
    knobs: Any = None                # the live knobs (autotune moves them)
    gen: Any = None                  # the shuffle RNG (torch.Generator)
    engines: dict = field(default_factory=dict)
    monitor: Any = None              # health monitor, or None
    tuner: Any = None                # autotune, or None
    sinks: list = field(default_factory=list)
    faults: Any = None               # test faults (RLTUNE_FAULTS), or None
    progress: Any = None
    start: int = 0                   # the step this process started at (a checkpoint's, or 0)
    step: int = 0                    # the step the state is at (a rollback sets it back)
    skipped_in_a_row: int = 0        # non-finite steps in a row
    eval_start: Any = None           # EvalScore before training
    last_eval: Any = None            # (step, score) of the newest periodic eval: the final eval when it is at the last step
    step_ok: bool = True             # no warning/error event and no skipped update at this step: a rollback target
    saved_step: int | None = None    # the step saved last (a step is not saved twice)
    phase: str = "starting"          # what the ranks are doing: named when a collective fails

    @property
    def rollback_on(self) -> bool:
        return self.tuner is not None and self.tuner.rollback_on


def save(run: Run, step: int) -> None:
    """Checkpoint `step` (every rank): the engines, RNG and state.json (docs/training.md)."""
    from . import checkpoint as ckpt
    from . import rundir as rd

    if run.saved_step == step:
        return
    c, monitor, tuner, eval_start = run.c, run.monitor, run.tuner, run.eval_start
    state = {"step": step, "seed": c.seed, "recipe_hash": run.rhash, "recipe": run.recipe_dict,
             "kl_ctl": c.kl_ctl.state_dict(), "sampler": c.sampler.state_dict(), "rewards": c.rewards.state_dict(),
             "knobs": vars(run.knobs).copy(), "skipped_in_a_row": run.skipped_in_a_row,
             "eval_start": eval_start.reward if eval_start is not None else None,
             "eval_start_parts": eval_start.parts if eval_start is not None else None,
             "eval_start_episode": eval_start.episode if eval_start is not None else None, "good": run.step_ok,
             "eval_start_env": eval_start.env if eval_start is not None else None,
             "monitor": monitor.state_dict() if monitor is not None else None,
             "autotune": tuner.state_dict() if tuner is not None else None}
    inflight = None
    if c.pipeline is not None:   # rollout.asynchronous: the batches generated ahead, and where they began
        c.pipeline.quiesce()
        state["sampler"], state["rewards"] = c.sampler.state_dict(), c.rewards.state_dict()
        state["async"], inflight = c.pipeline.state(step)
    stop = run.stop
    if stop.signal is not None:
        LOG.warning("saving checkpoint step %d (%s to abort the save)", step, stop.again())
    stop.saving = step
    try:
        path = ckpt.save(run.run_dir, step, run.engines, state, run.gen, run.dist.rank,
                         run.recipe.trainer.keep_checkpoints,
                         pause=run.faults.save_pause if run.faults is not None else None, inflight=inflight,
                         sampling=ckpt.sampling_rng(c.rollout))
    except KeyboardInterrupt:
        stop.abandoned = step
        raise
    except (OSError, RuntimeError) as err:
        needed = rd.checkpoint_estimate(run.engines, run.recipe.trainer.precision, last_good(run.run_dir))
        e = storage_error(err, f"checkpoint step {step}", run.run_dir / ckpt.CKPT_DIR, needed, run.run_dir,
                          run.hint, "the partial save was removed; ")
        if e is err:
            raise
        raise e from None
    finally:
        stop.saving = None
    run.saved_step = step
    LOG.info("checkpoint saved: %s", path)


def last_good(run_dir: Path) -> Path | None:
    from . import checkpoint as ckpt

    quiet = logging.getLogger("rltune.quiet")
    quiet.disabled = True
    return ckpt.find_resumable(run_dir, quiet)


def storage_error(err: BaseException, what: str, where: Path, needed, run_dir: Path, hint: str, prefix: str,
                  finished: bool = False) -> BaseException:
    """A TrainError naming the path, the space needed and the fix for a storage failure; the
    original exception for anything else (a real bug stays visible)."""
    from .rundir import storage_message, storage_problem

    problem = storage_problem(err, where, needed)
    if problem is None:
        return err
    last = last_good(run_dir)
    if finished:
        kept = f"{prefix}checkpoint {last} is complete: `--resume auto` exports final/ from it"
    elif last is not None:
        kept = f"{prefix}checkpoint {last} is intact and a resume continues from it"
    else:
        kept = f"{prefix}there is no complete checkpoint yet: a resume starts the run over"
    return TrainError(storage_message(what, where, problem, needed, kept, hint))
