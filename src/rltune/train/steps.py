"""Step 7 of `rltune train` (run.py): the training steps, each in numbered parts (`one_step`).
The RL step itself is loop.train_step; a rollback's restore is rollback.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .console import LOG
from .rollback import good_checkpoint, rollback as _rollback, sync_knobs_from_tuner
from .session import EXIT_INTERRUPTED, Run, main_first, save


# what a step is doing after each phase `loop.train_step` marks as done (named when a collective fails)
PHASES = {"": "generation and scoring (loop steps 1-2)", "rollout": "the experience passes (loop steps 3-7)",
          "experience": "the update (loop step 8)", "update": "the weight sync and the step's metrics (loop steps 9-10)"}


def run_steps(run: Run) -> int:
    """7. The eval before training, then the steps until trainer.max_steps steps of progress. A
    rollback sets the step back to its checkpoint's: the steps after it are taken again (on new
    batches), so step N always means N steps of progress (rollback.py). Returns the exit code:
    0, 1 (too many non-finite steps in a row), 130 (a signal)."""
    from . import progress as pg
    from .loop import evaluate

    r, c = run.recipe, run.c
    if run.eval_start is None and c.eval_set is not None:
        run.eval_start = evaluate(c)
        LOG.info("%s", pg.eval_line("before training", run.eval_start, pg.reward_weights(r)))
    taken = run.start  # the steps taken: the step number, until a rollback sets that back
    while run.step < r.trainer.max_steps:
        run.step += 1
        taken += 1
        if taken == run.start + 1:
            LOG.info("%s", pg.first_step_line(r, run.step))
        exit_code = one_step(run, run.step, taken)
        if exit_code is not None:
            return exit_code
    return 0


def one_step(run: Run, step: int, taken: int) -> int | None:
    """One training step:
      a. train     the RL step (loop.train_step); the non-finite streak; the periodic eval
      b. watch     the health monitor's events; whether this step can be a rollback target
      c. tune      autotune's knob changes, or a rollback (the step goes back to its checkpoint's)
      d. log       metric sinks, the progress bar, the console
      e. stop      too many non-finite steps in a row (exit 1) or a signal (exit 130), with a checkpoint
      f. save      the periodic checkpoint, and the good ones a rollback restores
    Returns the exit code to stop with, or None to go on (with the step after `run.step`)."""
    m, score = _train_and_eval(run, step, taken)                                        # a
    events = run.monitor.observe(m) if run.monitor is not None else []                 # b
    run.step_ok = not _skipped(m) and not any(e.severity in ("warning", "error") for e in events)
    back_to = _tune(run, step, m, events)                                               # c
    _log(run, step, m, score)                                                           # d
    if back_to is not None:
        run.step = back_to  # the next step is back_to + 1; back_to's checkpoint is on disk
        run.progress.clock.start -= step - back_to  # s/step and the ETA count every step taken
    return _stop_or_save(run, saving=back_to is None)                                  # e, f


def _skipped(m: dict) -> int:
    return m.get("actor/skipped_updates", 0) + m.get("critic/skipped_updates", 0)


def _train_and_eval(run: Run, step: int, taken: int) -> tuple[dict, Any]:
    """a. The RL step's metrics, with the non-finite streak and, when due, the eval (and its score)."""
    from .loop import evaluate, train_step

    r, c = run.recipe, run.c
    run.progress.begin(step)
    if run.faults is not None:
        # a fault fires at the n-th step taken (the step number until a rollback sets that back; a
        # resume counts from its checkpoint's step): a step taken again after a rollback is clean
        run.faults.step = taken
        run.faults.signal_self(run.dist.rank)
    run.phase = f"step {step}: {PHASES['']}"
    m = train_step(c, step, run.knobs, run.gen, mark=lambda done: setattr(run, "phase", f"step {step}: {PHASES[done]}"))
    skipped = _skipped(m)
    run.skipped_in_a_row = run.skipped_in_a_row + 1 if skipped else 0
    m["health/skipped_steps"] = run.skipped_in_a_row
    if skipped:
        _warn_skipped(m, step)
    _warn_overflow(m, step)
    score = None
    if r.trainer.eval_every and (step % r.trainer.eval_every == 0 or step == r.trainer.max_steps) \
            and c.eval_set is not None:
        run.phase = f"step {step}: the eval"
        score = evaluate(c)
        m.update(score.metrics())
        run.last_eval = (step, score)
    return m, score


def _tune(run: Run, step: int, m: dict, events: list) -> int | None:
    """c. A hard spike with a good checkpoint from before the trouble began (a sustained
    condition or a streak started some steps before it fired) rolls back: returns the
    checkpoint's step. Otherwise autotune's changes for this step's metrics and events."""
    from .loop import apply_knobs

    tuner, knobs = run.tuner, run.knobs
    rb = tuner.hard_spike(m, events) if run.rollback_on else None
    target = good_checkpoint(run.run_dir, rb["before"]) if rb is not None else None
    if rb is not None and target is None:
        LOG.warning("[AutoTune] step %d: %s; no rollback: no good checkpoint before this step "
                    "(the ordinary spike fix applies)", step, rb["why"])
    if target is not None:
        return _roll_back(run, step, target, rb, m)
    if tuner is not None:
        tuner.knobs.kl_coef = knobs.kl_coef  # the adaptive KL controller may have moved it
        tuner.step(m, events)                # logs each change with its reason
        sync_knobs_from_tuner(tuner, knobs)
        apply_knobs(run.c, knobs)
        m.update(tuner.metrics())
    return None


def _roll_back(run: Run, step: int, target: Path, reason: dict, m: dict) -> int:
    """Restore `target` and apply the spike fix (rollback.py); the checkpoints of the discarded
    steps go aside (their step numbers come again: a resume or a later rollback must not pick
    them). Returns the checkpoint's step."""
    run.last_eval = None  # the weights it scored are gone
    run.step_ok = True    # the state is now the good checkpoint's (a save of it stays a rollback target)
    if run.c.pipeline is not None:   # batches generated ahead with the discarded weights: gone
        run.c.pipeline.flush()
    back_to, run.skipped_in_a_row = _rollback(run.c, run.engines, run.gen, run.knobs, run.monitor, run.tuner,
                                              target, step, reason)
    m["health/skipped_steps"] = run.skipped_in_a_row
    m.update(run.tuner.metrics())
    if run.c.pipeline is not None:
        run.c.pipeline.restart(back_to)
    moved = main_first(run.dist, lambda: _discard_after(run.run_dir, back_to))
    run.saved_step = None
    LOG.warning("[AutoTune] step %d: the run goes back to step %d and takes steps %d-%d again, on new batches "
                "(trainer.max_steps counts steps of progress: the LR schedule ends where it was planned)",
                step, back_to, back_to + 1, step)
    if moved is not None:
        LOG.warning("%s", moved)
    return back_to


def _discard_after(run_dir: Path, step: int) -> str | None:
    """Rank 0: move the checkpoints after `step` (and a final/ exported after it) aside."""
    from . import checkpoint as ckpt
    from .rundir import fmt_bytes, move_checkpoints_after, tree_size

    dest = move_checkpoints_after(run_dir, step, ckpt.CKPT_DIR, ckpt.PREFIX)
    if dest is None:
        return None
    return (f"the checkpoints after step {step} (of the discarded steps) were moved to {dest} "
            f"({fmt_bytes(tree_size(dest))}); delete it when you no longer need it")


def _log(run: Run, step: int, m: dict, score) -> None:
    """d. Metric sinks, the progress bar and the console lines."""
    from ..monitor.trackers import log_all
    from . import progress as pg

    log_all(run.sinks, m, step)
    run.progress.update(step, m["reward/mean"], m["kl"])
    if step % run.recipe.logging.log_every == 0:
        LOG.info("%s", pg.step_line(step, m, run.progress.clock, pg.reward_weights(run.recipe)))
        LOG.info("Actor resharding time: %d ms", round(m["timing/sync_ms"]))
    if "eval/reward" in m:
        LOG.info("%s", pg.eval_line(f"at step {step}", score, pg.reward_weights(run.recipe)))


def _stop_or_save(run: Run, saving: bool) -> int | None:
    """e-f. At `run.step`: stop with a checkpoint (exit 1 or 130), or save one when due
    (`saving` False: a rollback just restored this step's checkpoint)."""
    r, step = run.recipe, run.step
    if run.skipped_in_a_row >= r.health.max_skipped_steps:
        LOG.error("stopping: %d steps in a row had a non-finite loss or gradient and were skipped; "
                  "the weights are those of step %d. Likely causes: learning rate too high "
                  "(actor.lr / critic.lr), broken reward normalisation, fp16 overflow.",
                  run.skipped_in_a_row, step - run.skipped_in_a_row)
        save(run, step)  # the weights are good: the skipped updates never touched them
        return 1
    if saving and r.trainer.save_every and step % r.trainer.save_every == 0 and step < r.trainer.max_steps:
        save(run, step)
    elif saving and run.rollback_on and run.step_ok and step % r.autotune.rollback_every == 0 \
            and step < r.trainer.max_steps:
        save(run, step)  # the "last good" checkpoint a rollback restores
    run.phase = f"step {step}: the stop check"
    if _stop_requested(run):
        save(run, step)
        return EXIT_INTERRUPTED
    return None


def _stop_requested(run: Run) -> bool:
    """A signal on any rank stops every rank after the same step, each saving its part of that
    step's checkpoint (one all-reduce a step; alone, a rank signalled on its own would start a save
    while the others went on into the next step's collectives, and all would hang)."""
    from .collective import global_max

    return global_max([0.0 if run.stop.signal is None else 1.0])[0] > 0


def _warn_overflow(m: dict, step: int) -> None:
    for role in ("actor", "critic"):
        if m.get(f"{role}/overflow_skips"):
            LOG.warning("fp16 overflow at step %d: the %s update was skipped and the loss scale lowered to %g "
                        "(normal while the scale settles; weights untouched)", step, role,
                        m.get(f"{role}/loss_scale", float("nan")))


def _warn_skipped(m: dict, step: int) -> None:
    if m.get("critic/skipped_updates"):
        LOG.warning("Critic loss NaN at step %d: the critic update was skipped, weights untouched. "
                    "Likely causes: critic.lr too high, reward normalisation broken.", step)
    if m.get("actor/skipped_updates"):
        LOG.warning("Actor loss or gradient non-finite at step %d: the actor update was skipped, weights "
                    "untouched. Likely causes: actor.lr too high, fp16 overflow, extreme log-ratios.", step)
