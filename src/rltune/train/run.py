"""`rltune train`: set up, resume, loop, checkpoint, export. The loop itself is in loop.py; the
run directory's lifecycle (lock, moving an old run aside, storage errors, the resume command)
in rundir.py; what a resume continues from and what a changed recipe may change in resume.py."""

from __future__ import annotations

import errno
import json
import logging
import shlex
import signal
from pathlib import Path
from typing import Sequence

from ..recipe.knobs import KNOB_KEYS
from ..recipe.schema import Recipe
from .collective import barrier, broadcast_int
from .console import LOG, setup_logging
from .setup import TrainError

EXIT_INTERRUPTED = 130


class _Stop:
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


def _main_first(dist, fn):
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


def train(recipe: Recipe, recipe_path: Path, resume: str = "auto", allow_recipe_change: bool = False,
          quiet: bool = False, command: list[str] | None = None, overrides: Sequence[str] = ()) -> int:
    """`command`: the user's arguments after `rltune train` (for the resume hint); `overrides`: the
    key=value overrides applied to the recipe file (RUN_DIR/recipe.yaml records them for
    `diagnose --patch`)."""
    from ..engine.distributed import process_group
    from .rundir import RunLock, prepare

    run_dir = Path(recipe.trainer.output_dir)
    lock = RunLock(run_dir)
    with process_group(recipe.trainer.device) as dist:
        try:
            stale = _main_first(dist, lambda: (prepare(run_dir), lock.acquire())[1])
            return _train(recipe, recipe_path, resume, allow_recipe_change, quiet, command, overrides, dist,
                          run_dir, stale)
        finally:
            lock.release()


def _train(recipe, recipe_path, resume, allow_recipe_change, quiet, command, overrides, dist, run_dir, stale) -> int:
    import torch
    import yaml

    from . import checkpoint as ckpt
    from . import resume as rs
    from . import rundir as rd
    from .faults import Faults
    from .loop import apply_knobs, evaluate, initial_knobs, train_step
    from ..monitor.trackers import log_all
    from .setup import build
    from . import progress as pg

    console = "quiet" if quiet else recipe.logging.console
    setup_logging(run_dir, console, dist.is_main)
    if stale:
        LOG.warning("%s", stale)
    hint = rd.resume_hint(command, recipe_path)
    recipe_dict = recipe.model_dump(mode="json")
    rhash = ckpt.recipe_hash({k: v for k, v in recipe_dict.items() if k != "trainer"} |
                             {"trainer": {k: v for k, v in recipe_dict["trainer"].items()
                                          if k not in ("max_steps", "save_every", "keep_checkpoints")}})

    # resume: find the checkpoint and check the recipe before building anything heavy
    resume_path = rs.choose_checkpoint(run_dir, resume, LOG)
    changes: list = []
    if resume_path is not None:
        saved = json.loads((resume_path / "state.json").read_text())
        if saved.get("recipe_hash") != rhash:
            changes = rs.recipe_changes(saved.get("recipe", {}), recipe_dict)
            rs.check_changes(changes, allow_recipe_change, resume_path, run_dir)

    # one run per directory: a new run moves an old one aside, a resume from an earlier
    # checkpoint moves the later ones (an abandoned continuation) aside
    barrier()  # every rank has chosen its checkpoint before rank 0 moves anything
    moved = _main_first(dist, lambda: _own_directory(run_dir, resume_path))
    if moved is not None:
        setup_logging(run_dir, console, dist.is_main)  # train.log went with the old run
        LOG.warning("%s", moved)
    if dist.is_main:
        _write(run_dir / "recipe.yaml", f"# source: {Path(recipe_path).resolve()}\n"
               + (rd.OVERRIDES_TAG + shlex.join(overrides) + "\n" if overrides else "")
               + yaml.safe_dump(recipe_dict, sort_keys=False), hint)
    drawn_seed = saved.get("seed") if resume_path is not None else None
    c = build(recipe, dist, recipe_path.parent, seed=drawn_seed)
    knobs = initial_knobs(c)
    gen = torch.Generator().manual_seed((recipe.trainer.seed or 0) + 17)
    engines = {"actor": c.actor, "critic": c.critic}
    start = 0
    if resume_path is not None:
        state = ckpt.load(resume_path, engines, gen, dist.rank)
        start = int(state["step"])
    monitor, tuner, sinks = _monitoring(recipe, run_dir, dist, start if resume_path is not None else None)
    if resume_path is not None:
        _restore(c, knobs, monitor, tuner, state)
        if tuner is not None and state.get("autotune") is None:  # autotune newly on: it starts from the run's knobs
            for k, v in vars(knobs).items():
                setattr(tuner.knobs, k, v)
        notes = rs.apply_changes(changes, c, knobs, tuner)  # the new values win over the checkpoint's
        apply_knobs(c, knobs)
        c.rollout.sync_weights(c.actor)
        LOG.info("resumed from %s at step %d", resume_path, start)
        if notes:
            LOG.warning("resuming with a changed recipe (--allow-recipe-change); taking effect now: %s",
                        "; ".join(notes))

    stop = _Stop()
    saved_step: list[int | None] = [None]

    def save(step: int) -> None:
        if saved_step[0] == step:
            return
        state = {"step": step, "seed": c.seed, "recipe_hash": rhash, "recipe": recipe_dict, "kl_ctl": c.kl_ctl.state_dict(),
                 "sampler": c.sampler.state_dict(), "rewards": c.rewards.state_dict(),
                 "knobs": vars(knobs).copy(), "skipped_in_a_row": skipped_in_a_row,
                 "eval_start": eval_start.reward if eval_start is not None else None,
                 "eval_start_parts": eval_start.parts if eval_start is not None else None, "good": step_ok,
                 "monitor": monitor.state_dict() if monitor is not None else None,
                 "autotune": tuner.state_dict() if tuner is not None else None}
        if stop.signal is not None:
            LOG.warning("saving checkpoint step %d (%s to abort the save)", step, stop.again())
        stop.saving = step
        try:
            path = ckpt.save(run_dir, step, engines, state, gen, dist.rank, recipe.trainer.keep_checkpoints,
                             pause=faults.save_pause if faults is not None else None)
        except KeyboardInterrupt:
            stop.abandoned = step
            raise
        except (OSError, RuntimeError) as err:
            needed = rd.checkpoint_estimate(engines, recipe.trainer.precision, _last_good(run_dir))
            e = _storage_error(err, f"checkpoint step {step}", run_dir / ckpt.CKPT_DIR, needed, run_dir,
                               hint, "the partial save was removed; ")
            if e is err:
                raise
            raise e from None
        finally:
            stop.saving = None
        saved_step[0] = step
        LOG.info("checkpoint saved: %s", path)

    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    faults = Faults.from_env()
    if faults is not None:
        faults.install(c)
    skipped_in_a_row = int(state.get("skipped_in_a_row", 0)) if resume_path is not None else 0
    eval_start = None
    if resume_path is not None and state.get("eval_start") is not None:
        eval_start = pg.EvalScore(state["eval_start"], state.get("eval_start_parts") or {},
                                  len(c.eval_set) if c.eval_set is not None else 0)
    r = recipe
    weights = pg.reward_weights(r)
    if dist.is_main:
        for line in pg.startup_lines(c, run_dir, start if resume_path is not None else None):
            LOG.info("%s", line)
    progress = pg.Progress(r.trainer.max_steps, start, enabled=dist.is_main and console != "quiet")
    step, exit_code = start, 0
    last_eval = None  # (step, score) of the newest periodic eval: the final eval when it is at the last step
    step_ok = True  # no warning/error event and no skipped update at this step: a rollback target
    rollback_on = tuner is not None and tuner.rollback_on
    try:
        if eval_start is None and c.eval_set is not None:
            eval_start = evaluate(c)
            LOG.info("%s", pg.eval_line("before training", eval_start, weights))
        for step in range(start + 1, r.trainer.max_steps + 1):
            if step == start + 1:
                LOG.info("%s", pg.first_step_line(r, step))
            progress.begin(step)
            if faults is not None:
                faults.step = step
            m = train_step(c, step, knobs, gen)
            skipped = m.get("actor/skipped_updates", 0) + m.get("critic/skipped_updates", 0)
            skipped_in_a_row = skipped_in_a_row + 1 if skipped else 0
            m["health/skipped_steps"] = skipped_in_a_row
            if skipped:
                _warn_skipped(m, step)
            _warn_overflow(m, step)
            if r.trainer.eval_every and (step % r.trainer.eval_every == 0 or step == r.trainer.max_steps) \
                    and c.eval_set is not None:
                score = evaluate(c)
                m.update(score.metrics())
                last_eval = (step, score)
            events = monitor.observe(m) if monitor is not None else []
            step_ok = not skipped and not any(e.severity in ("warning", "error") for e in events)
            rb = tuner.hard_spike(m, events) if rollback_on else None
            # a good checkpoint from before the trouble began (a sustained condition or a streak
            # started some steps before it fired)
            target = _good_checkpoint(run_dir, rb["before"]) if rb is not None else None
            if rb is not None and target is None:
                LOG.warning("[AutoTune] step %d: %s; no rollback: no good checkpoint before this step "
                            "(the ordinary spike fix applies)", step, rb["why"])
            if target is not None:
                last_eval = None  # the weights it scored are gone
                skipped_in_a_row = _rollback(c, engines, gen, knobs, monitor, tuner, target, step, rb)
                m["health/skipped_steps"] = skipped_in_a_row
                m.update(tuner.metrics())
            elif tuner is not None:
                tuner.knobs.kl_coef = knobs.kl_coef  # the adaptive KL controller may have moved it
                tuner.step(m, events)                # logs each change with its reason
                _sync_knobs_from_tuner(tuner, knobs)
                apply_knobs(c, knobs)
                m.update(tuner.metrics())
            log_all(sinks, m, step)
            progress.update(step, m["reward/mean"], m["kl"])
            if step % r.logging.log_every == 0:
                LOG.info("%s", pg.step_line(step, m, progress.clock, weights))
                LOG.info("Actor resharding time: %d ms", round(m["timing/sync_ms"]))
            if "eval/reward" in m:
                LOG.info("%s", pg.eval_line(f"at step {step}", score, weights))
            if skipped_in_a_row >= r.health.max_skipped_steps:
                LOG.error("stopping: %d steps in a row had a non-finite loss or gradient and were skipped; "
                          "the weights are those of step %d. Likely causes: learning rate too high "
                          "(actor.lr / critic.lr), broken reward normalisation, fp16 overflow.",
                          skipped_in_a_row, step - skipped_in_a_row)
                save(step)  # the weights are good: the skipped updates never touched them
                exit_code = 1
                break
            if r.trainer.save_every and step % r.trainer.save_every == 0 and step < r.trainer.max_steps:
                save(step)
            elif rollback_on and step_ok and step % r.autotune.rollback_every == 0 and step < r.trainer.max_steps:
                save(step)  # the "last good" checkpoint a rollback restores
            if stop.signal is not None:
                save(step)
                exit_code = EXIT_INTERRUPTED
                break
        if exit_code == 0:
            if step > start:
                save(step)
            if stop.signal is not None:
                LOG.warning("interrupted before the final export: `--resume auto` exports it")
                exit_code = EXIT_INTERRUPTED
            else:
                _finish(c, run_dir, step, fresh=step > start, eval_start=eval_start, hint=hint,
                        final=last_eval[1] if last_eval is not None and last_eval[0] == step else None)
    except KeyboardInterrupt:
        progress.close()
        _abandoned(stop, run_dir, step, hint)
        return EXIT_INTERRUPTED
    except OSError as err:  # writing a metrics line or eval.json: a full disk is not a bug
        where = Path(err.filename) if isinstance(err.filename, str) else run_dir
        e = err
        if err.errno not in (errno.EACCES, errno.EPERM) or _inside(where, run_dir):
            e = _storage_error(err, "the run's files", where, None, run_dir, hint, f"the run stopped at step {step}; ")
        if e is err:
            raise
        raise e from None
    finally:
        progress.close()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        for sink in sinks:
            sink.close()
    if exit_code == EXIT_INTERRUPTED:
        LOG.warning("interrupted at step %d; resume with: %s", step, hint)
    return exit_code


def _own_directory(run_dir: Path, resume_path: Path | None) -> str | None:
    """Rank 0: make the directory hold one run only; returns what was moved, for the log."""
    from . import checkpoint as ckpt
    from .rundir import fmt_bytes, holds_run, move_aside, move_checkpoints_after, tree_size

    ours = resume_path is not None and resume_path.resolve().parent == (run_dir / ckpt.CKPT_DIR).resolve()
    if ours:
        dest = move_checkpoints_after(run_dir, int(resume_path.name[len(ckpt.PREFIX):]), ckpt.CKPT_DIR, ckpt.PREFIX)
        what = f"checkpoints after {resume_path.name} (broken, or of a continuation that this resume replaces)"
    elif holds_run(run_dir):
        dest = move_aside(run_dir)
        what = "the previous run's files"
    else:
        return None
    if dest is None:
        return None
    return (f"{run_dir} held {what}: moved them to {dest} ({fmt_bytes(tree_size(dest))}) so that the runs never "
            f"mix; delete it when you no longer need it")


def _finish(c, run_dir: Path, step: int, fresh: bool, eval_start, hint: str, final=None) -> None:
    """Export final/ and evaluate; on a run that had finished before, do whatever of this a
    kill left undone (final/ missing or incomplete, eval.json missing)."""
    from . import checkpoint as ckpt
    from .loop import evaluate
    from .progress import final_eval_lines, reward_weights

    final_dir = run_dir / "final"
    problem = None if fresh else _main_first(c.dist, lambda: ckpt.final_problem(final_dir, step))
    redo = fresh or bool(broadcast_int(1 if problem else 0))  # every rank takes part in the export
    if redo:
        if problem:
            LOG.warning("the run finished at step %d but its final export %s is not complete (%s): exporting it "
                        "again from checkpoint step %d", step, final_dir, problem, step)
        try:
            ckpt.export_hf(c.actor, c.tokenizer, final_dir, c.dist.rank, step=step,
                           save_merged=c.recipe.trainer.save_merged)
        except (OSError, RuntimeError) as err:
            needed = sum(getattr(p, "ds_numel", p.numel()) * 4 for p in c.actor.module.parameters()) + (1 << 20)
            e = _storage_error(err, "the final policy", run_dir, needed, run_dir, hint,
                               "the partial export was removed; ", finished=True)
            if e is err:
                raise
            raise e from None
    need_eval = c.eval_set is not None and eval_start is not None and (fresh or not (run_dir / "eval.json").exists())
    if need_eval:
        final = final if final is not None else evaluate(c)   # the last step's periodic eval, when it ran
        for line in final_eval_lines(eval_start, final, reward_weights(c.recipe)):
            LOG.info("%s", line)
        if c.dist.is_main:
            (run_dir / "eval.json").write_text(json.dumps({"before": eval_start.reward, "after": final.reward,
                                                           "before_parts": eval_start.parts,
                                                           "after_parts": final.parts}))
    if not redo and not need_eval:
        LOG.info("the run in %s already finished at step %d (trainer.max_steps %d): nothing to do; "
                 "raise trainer.max_steps to continue, or use --resume never to start over",
                 run_dir, step, c.recipe.trainer.max_steps)
    else:
        LOG.info("done: %s (final policy in %s)", run_dir, final_dir)


def _last_good(run_dir: Path) -> Path | None:
    from . import checkpoint as ckpt

    quiet = logging.getLogger("rltune.quiet")
    quiet.disabled = True
    return ckpt.find_resumable(run_dir, quiet)


def _abandoned(stop: _Stop, run_dir: Path, step: int, hint: str) -> None:
    """A second Ctrl-C: say what was abandoned and what a resume will continue from."""
    name = signal.Signals(stop.signal).name if stop.signal is not None else "SIGINT"
    last = _last_good(run_dir)
    if stop.abandoned is not None and last is not None and last.name.endswith(f"{stop.abandoned:08d}"):
        what = f"second {name}: the save of checkpoint step {stop.abandoned} had already completed"
    elif stop.abandoned is not None:
        what = f"second {name}: the save of checkpoint step {stop.abandoned} was abandoned (its partial files removed)"
    else:
        what = f"second {name}: stopped at once, without saving"
    then = (f"a resume continues from the last complete checkpoint, {last} (step {int(last.name.split('-')[-1])})"
            if last is not None else "there is no complete checkpoint: a resume starts a new run")
    LOG.warning("%s; %s", what, then)
    LOG.warning("resume with: %s", hint)


def _storage_error(err: BaseException, what: str, where: Path, needed, run_dir: Path, hint: str, prefix: str,
                   finished: bool = False) -> BaseException:
    """A TrainError naming the path, the space needed and the fix for a storage failure; the
    original exception for anything else (a real bug stays visible)."""
    from .rundir import storage_message, storage_problem

    problem = storage_problem(err, where, needed)
    if problem is None:
        return err
    last = _last_good(run_dir)
    if finished:
        kept = f"{prefix}checkpoint {last} is complete: `--resume auto` exports final/ from it"
    elif last is not None:
        kept = f"{prefix}checkpoint {last} is intact and a resume continues from it"
    else:
        kept = f"{prefix}there is no complete checkpoint yet: a resume starts the run over"
    return TrainError(storage_message(what, where, problem, needed, kept, hint))


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def _write(path: Path, text: str, hint: str) -> None:
    from .rundir import storage_message, storage_problem

    try:
        path.write_text(text)
    except OSError as err:
        problem = storage_problem(err, path)
        if problem is None:
            raise
        raise TrainError(storage_message(str(path.name), path.parent, problem, None, "nothing was trained yet",
                                         hint)) from None


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


def _monitoring(recipe, run_dir, dist, resume_step):
    """Health monitor, autotuner and metric sinks (rank 0 writes; every rank decides the same)."""
    from ..monitor.autotune import AutoTuner
    from ..monitor.detectors import HealthMonitor
    from ..monitor.trackers import TrackerUnavailable, make_sinks

    monitor = HealthMonitor(recipe, run_dir, write=dist.is_main) if recipe.health.enabled else None
    tuner = AutoTuner(recipe, run_dir, write=dist.is_main) if recipe.autotune.enabled else None
    try:
        sinks = make_sinks(recipe, run_dir, dist.rank, resume_step=resume_step)
    except TrackerUnavailable as err:
        raise TrainError(f"{err}\n  fix: pip install 'rltune[tracking]', or turn the tracker off in logging:") from err
    return monitor, tuner, sinks


def _restore(c, knobs, monitor, tuner, state) -> None:
    c.kl_ctl.load_state_dict(state["kl_ctl"])
    c.sampler.load_state_dict(state["sampler"])
    c.rewards.load_state_dict(state["rewards"])
    for k, v in state["knobs"].items():
        setattr(knobs, k, v)
    if monitor is not None and state.get("monitor") is not None:
        monitor.load_state_dict(state["monitor"])
    if tuner is not None and state.get("autotune") is not None:
        tuner.load_state_dict(state["autotune"])


def _good_checkpoint(run_dir: Path, step: int) -> Path | None:
    """The newest intact checkpoint before `step` saved at a step without a warning or skipped
    update (state.json "good")."""
    from . import checkpoint as ckpt

    for path in reversed(ckpt.checkpoints(run_dir)):
        try:
            n = int(path.name[len(ckpt.PREFIX):])
        except ValueError:
            continue
        if n >= step or ckpt.verify(path) is not None:
            continue
        try:
            if json.loads((path / "state.json").read_text()).get("good"):
                return path
        except (OSError, ValueError):
            continue
    return None


def _rollback(c, engines, gen, knobs, monitor, tuner, path: Path, step: int, reason: dict) -> int:
    """Restore checkpoint `path` (weights, optimizer, scheduler, RNG, KL controller, reward
    moments, monitor state) through the resume path, keep the sampler where it is (past the batch
    that blew up: it is not replayed), apply the spike fix and log it. Returns the restored
    non-finite streak."""
    from . import checkpoint as ckpt
    from .loop import apply_knobs

    sampler_now = c.sampler.state_dict()
    state = ckpt.load(path, engines, gen, c.dist.rank)
    c.kl_ctl.load_state_dict(state["kl_ctl"])
    c.rewards.load_state_dict(state["rewards"])
    if monitor is not None and state.get("monitor") is not None:
        # the spike does not widen the detectors' running ranges; events.jsonl and the event list
        # keep what the discarded steps reported (a resume would truncate them: write off)
        events, write = list(monitor.events), monitor.write
        monitor.write = False
        try:
            monitor.load_state_dict(state["monitor"])
        finally:
            monitor.write, monitor.events = write, events
    c.sampler.load_state_dict(sampler_now)
    knobs.kl_coef = c.kl_ctl.coef
    tuner.knobs.kl_coef = knobs.kl_coef
    numbers = {"from_step": int(state["step"]), "from": str(path),
               "sampler_from": [state["sampler"].get("epoch"), state["sampler"].get("cursor")],
               "sampler_now": [sampler_now.get("epoch"), sampler_now.get("cursor")]}
    tuner.rollback(step, reason, numbers)
    _sync_knobs_from_tuner(tuner, knobs)
    apply_knobs(c, knobs)
    c.rollout.sync_weights(c.actor)
    return int(state.get("skipped_in_a_row", 0))


def _sync_knobs_from_tuner(tuner, knobs) -> None:
    for name in KNOB_KEYS:
        setattr(knobs, name, getattr(tuner.knobs, name))


__all__ = ["train", "EXIT_INTERRUPTED"]
