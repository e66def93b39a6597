"""`rltune train`: set up, resume, train, checkpoint, export, as numbered steps (`_train`). The
training steps are in steps.py (each in numbered parts), the RL step itself in loop.py, what the
steps share (state, checkpoint save, storage errors) in session.py, autotune's rollback in
rollback.py; the run directory's lifecycle (lock, moving an old run aside, storage errors, the
resume command) in rundir.py; what a resume continues from and what a changed recipe may change in
resume.py."""

from __future__ import annotations

import errno
import json
import os
import shlex
import signal
from pathlib import Path
from typing import Sequence

from ..recipe.schema import Recipe
from .collective import barrier, broadcast_int
from .console import LOG, setup_logging
from .rollback import restore
from .session import EXIT_INTERRUPTED, Run, Stop, last_good, main_first, save, storage_error
from .setup import TrainError
from .steps import run_steps


def train(recipe: Recipe, recipe_path: Path, resume: str = "auto", allow_recipe_change: bool = False,
          quiet: bool = False, command: list[str] | None = None, overrides: Sequence[str] = ()) -> int:
    """`command`: the user's arguments after `rltune train` (for the resume hint); `overrides`: the
    key=value overrides applied to the recipe file (RUN_DIR/recipe.yaml records them for
    `diagnose --patch`)."""
    from ..engine.distributed import process_group
    from ..errors import RecipeInputError
    from ..plan import ConfigError, check_model_configs
    from .rundir import RunLock, absolute_run_dir, prepare

    try:   # the models' config.json, checked where it is read (plan/arch.py) before anything heavy
        check_model_configs(recipe)
    except ConfigError as err:
        raise RecipeInputError(str(err)) from None
    recipe = absolute_run_dir(recipe)   # an os.chdir during the run (a reward, an environment) moves nothing
    run_dir = Path(recipe.trainer.output_dir)
    lock = RunLock(run_dir)
    # what was there before this run: a run that fails before its first step removes only what it made
    created, before = _made_by_us(run_dir)
    started: list = []   # _train appends when the steps begin (step 7)
    with process_group(recipe.trainer.device, recipe.trainer.collective_timeout_s) as dist:
        failed = True
        try:
            stale = main_first(dist, lambda: (prepare(run_dir), lock.acquire())[1])
            code = _train(recipe, recipe_path, resume, allow_recipe_change, quiet, command, overrides, dist,
                          run_dir, stale, started)
            failed = False
            return code
        finally:
            locked = lock.fd is not None
            lock.release()
            if failed and not started and dist.is_main and (locked or created is not None):
                _clean_failed_start(run_dir, created, before)


def _made_by_us(run_dir: Path) -> tuple[Path | None, set]:
    """(the topmost directory of run_dir's path that does not exist yet, or None when run_dir does;
    the names run_dir holds now)."""
    created = None
    p = run_dir.absolute()
    while not p.exists() and not p.is_symlink() and p != p.parent:
        created, p = p, p.parent
    try:
        before = set(os.listdir(run_dir)) if created is None and run_dir.is_dir() else set()
    except OSError:
        before = set()
    return created, before


# what a run writes before its first step (train.log, recipe.yaml, .lock; the metric sinks' files)
_START_FILES = ("train.log", "recipe.yaml", ".lock", "metrics.jsonl", "events.jsonl")


def _clean_failed_start(run_dir: Path, created: Path | None, before: set) -> None:
    """A run that failed before its first step leaves nothing behind: the run directory (and the
    parents) it created itself, else the files of _START_FILES it added to a directory that was
    there before (a resumed run's directory keeps everything it held)."""
    import logging
    import shutil

    for h in list(LOG.handlers):   # train.log is open: close it before it goes
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename).parent == run_dir.absolute():
            LOG.removeHandler(h)
            h.close()
    try:
        if created is not None:
            if run_dir.is_dir() and not run_dir.is_symlink():
                shutil.rmtree(run_dir)
            p = run_dir.absolute().parent
            while p != created.parent and p.is_dir() and not any(p.iterdir()):
                p.rmdir()
                p = p.parent
            return
        for name in _START_FILES:
            f = run_dir / name
            if name not in before and f.is_file() and not f.is_symlink():
                f.unlink()
    except OSError as err:  # best effort: the error that stopped the run is the one to report
        LOG.debug("could not clean up %s: %s", run_dir, err)


def _train(recipe, recipe_path, resume, allow_recipe_change, quiet, command, overrides, dist, run_dir, stale,
           started: list | None = None) -> int:
    """One process of the run (every rank runs it):
      1. logging     train.log and the console; the command line that resumes this run
      2. resume      the checkpoint to continue from, and the recipe changes it allows (before
                     anything heavy is built)
      3. directory   one run per directory (an old run, or the checkpoints a resume abandons, moved
                     aside); RUN_DIR/recipe.yaml
      4. build       engines, rollout, data, rewards; the checkpoint's weights, optimizer, LR
                     scheduler and RNG
      5. monitoring  health monitor, autotune, metric sinks; the rest of the checkpoint's state
      6. ready       Ctrl-C / SIGTERM handlers, test faults, the startup lines, the progress bar
      7. train       the steps, until trainer.max_steps steps of progress (steps.py: `run_steps`,
                     `one_step`)
      8. finish      the last checkpoint, final/ and the final eval (`_end`)
    """
    from . import rundir as rd
    from .faults import Faults

    run = Run(recipe, run_dir, dist, console="quiet" if quiet else recipe.logging.console)
    # 1. logging
    setup_logging(run_dir, run.console, dist.is_main)
    if stale:
        LOG.warning("%s", stale)
    run.hint = rd.resume_hint(command, recipe_path)
    # 2. resume (every rank runs the same recipe and rltune first)
    resume_path, saved, changes = _resume_point(run, resume, allow_recipe_change)
    _same_on_every_rank(run)
    if resume_path is not None and _nothing_left(run, saved):
        return 0
    # 3. directory
    _take_directory(run, resume_path, recipe_path, overrides)
    # 4. build
    state = _build(run, recipe_path, resume_path, saved)
    # 5. monitoring
    _start_monitoring(run, state, changes, resume_path)
    # 6. ready
    old_handlers = {s: signal.signal(s, run.stop) for s in (signal.SIGINT, signal.SIGTERM)}
    run.faults = Faults.from_env()
    if run.faults is not None:
        run.faults.install(run.c)
    _ready(run, state)
    if started is not None:
        started.append(True)
    from ..rollout.server import ServerError
    try:
        _start_pipeline(run, state, resume_path)
        # 7. train
        try:
            exit_code = run_steps(run)
        except RuntimeError as err:   # a collective that failed because another rank died or stalls
            raise _peer_lost(err, run) from None
        except ServerError as err:    # the rollout server died or closed its connection mid-run
            raise ServerError(str(err).replace("the same `rltune train` command with --resume auto", run.hint)) from None
        # 8. finish
        if exit_code == 0:
            exit_code = _end(run)
    except KeyboardInterrupt:
        run.progress.close()
        _abandoned(run.stop, run_dir, run.step, run.hint)
        return EXIT_INTERRUPTED
    except OSError as err:  # writing a metrics line or eval.json: a full disk is not a bug
        where = Path(err.filename) if isinstance(err.filename, str) else run_dir
        e = err
        if err.errno not in (errno.EACCES, errno.EPERM) or _inside(where, run_dir):
            e = storage_error(err, "the run's files", where, None, run_dir, run.hint,
                              f"the run stopped at step {run.step}; ")
        if e is err:
            raise
        raise e from None
    finally:
        run.progress.close()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        for sink in run.sinks:
            sink.close()
        if run.c.pipeline is not None:
            run.c.pipeline.close()
        run.c.rollout.close()   # a rollout server ends with the run, not with the process
        from .episodes import close_environment

        close_environment(run.c.env)   # a library environment's child server ends with the run too
    if exit_code == EXIT_INTERRUPTED:
        LOG.warning("interrupted at step %d; resume with: %s", run.step, run.hint)
    return exit_code


def _peer_lost(err: RuntimeError, run: Run) -> BaseException:
    """A TrainError naming this rank, the phase and the bound for a collective that failed because
    of another rank; `err` itself for any other error."""
    from ..engine.distributed import peer_failure

    why = peer_failure(err)
    if why is None:
        return err
    timeout = run.recipe.trainer.collective_timeout_s
    return TrainError(f"rank {run.dist.rank} {why} during {run.phase} (trainer.collective_timeout_s: {timeout:g} s): "
                      "another rank died or stalls; its own log, or the launcher's line, says which\n  fix: see "
                      f"why that rank stopped, then resume from the last checkpoint with: {run.hint}")


# ---------------------------------------------------------------- steps 2-6: set up

def _same_on_every_rank(run: Run) -> None:
    """Refuse, on every rank, a run whose ranks do not all have the same recipe (overrides
    included) and rltune version: nodes started with different files or installs would train
    different things, or desynchronise in their collectives. One all-gather of a 48-bit hash."""
    from .checkpoint import recipe_hash
    from .collective import gather_rows, world_size

    if world_size() == 1:
        return
    import torch

    from .. import __version__

    mine = int(recipe_hash({"recipe": run.recipe_dict, "rltune": __version__})[:12], 16)
    every = gather_rows(torch.tensor([mine], dtype=torch.int64)).tolist()
    odd = [r for r, h in enumerate(every) if h != every[0]]
    if odd:
        raise TrainError(f"rank(s) {', '.join(map(str, odd))} run a different recipe (file or overrides) or rltune "
                         f"version than rank 0 (this is rank {run.dist.rank}, rltune {__version__})\n  fix: start "
                         "every node with the same recipe file, the same key=value overrides and the same rltune")


def _resume_point(run: Run, resume: str, allow_recipe_change: bool) -> tuple[Path | None, dict, list]:
    """2. (checkpoint or None, its state.json, the recipe changes): the recipe is checked against
    the checkpoint's before anything heavy is built."""
    from . import checkpoint as ckpt
    from . import resume as rs

    from ..redact import redact

    # what the run directory keeps (recipe.yaml, state.json) carries no credentials: rltune/redact.py
    d = run.recipe_dict = redact(run.recipe.model_dump(mode="json"))
    run.rhash = ckpt.recipe_hash({k: v for k, v in d.items() if k != "trainer"} |
                                 {"trainer": {k: v for k, v in d["trainer"].items()
                                              if k not in ("max_steps", "save_every", "keep_checkpoints")}})
    resume_path = rs.choose_checkpoint(run.run_dir, resume, LOG)
    saved: dict = {}
    changes: list = []
    if resume_path is not None:
        saved = json.loads((resume_path / "state.json").read_text())
        if saved.get("recipe_hash") != run.rhash:
            changes = rs.recipe_changes(saved.get("recipe", {}), d)
            rs.check_changes(changes, allow_recipe_change, resume_path, run.run_dir)
    return resume_path, saved, changes


def _nothing_left(run: Run, saved: dict) -> bool:
    """A resume of a run that had finished, with its final/ export complete and its final eval
    written (or none wanted): say so before any engine is built (they cost the quickstart 18 s and
    2.7 GB only to find nothing to do). Whatever is missing is redone by `_finish` as before."""
    from . import checkpoint as ckpt

    step, run_dir = int(saved.get("step", 0)), run.run_dir
    if step < run.recipe.trainer.max_steps:
        return False
    done = main_first(run.dist, lambda: ckpt.final_problem(run_dir / "final", step) is None and (
        saved.get("eval_start") is None or (run_dir / "eval.json").is_file()))
    if not broadcast_int(1 if done else 0):
        return False
    LOG.info("the run in %s already finished at step %d (trainer.max_steps %d): nothing to do; "
             "raise trainer.max_steps to continue, or use --resume never to start over",
             run_dir, step, run.recipe.trainer.max_steps)
    return True


def _take_directory(run: Run, resume_path: Path | None, recipe_path: Path, overrides: Sequence[str]) -> None:
    """3. One run per directory: a new run moves an old one aside, a resume from an earlier
    checkpoint moves the later ones (an abandoned continuation) aside; RUN_DIR/recipe.yaml."""
    import yaml

    from ..redact import redact_text
    from .rundir import OVERRIDES_TAG

    barrier()  # every rank has chosen its checkpoint before rank 0 moves anything
    moved = main_first(run.dist, lambda: _own_directory(run.run_dir, resume_path))
    if moved is not None:
        setup_logging(run.run_dir, run.console, run.dist.is_main)  # train.log went with the old run
        LOG.warning("%s", moved)
    if run.dist.is_main:
        _write(run.run_dir / "recipe.yaml", f"# source: {Path(recipe_path).resolve()}\n"
               + (OVERRIDES_TAG + redact_text(shlex.join(overrides)) + "\n" if overrides else "")
               + yaml.safe_dump(run.recipe_dict, sort_keys=False), run.hint)


def _build(run: Run, recipe_path: Path, resume_path: Path | None, saved: dict) -> dict | None:
    """4. Engines, rollout, data, rewards (setup.build), knobs and the shuffle RNG; on a resume the
    checkpoint's weights, optimizer, LR scheduler and RNG. Returns its state.json (None: a new run)."""
    import torch

    from . import checkpoint as ckpt
    from .loop import initial_knobs
    from .setup import build

    c = run.c = build(run.recipe, run.dist, recipe_path.parent, seed=saved.get("seed"))
    run.knobs = initial_knobs(c)
    run.gen = torch.Generator().manual_seed((run.recipe.trainer.seed or 0) + 17)
    run.engines = {"actor": c.actor, "critic": c.critic}
    if resume_path is None:
        return None
    state = ckpt.load(resume_path, run.engines, run.gen, run.dist.rank, ckpt.sampling_rng(c.rollout))
    run.start = run.step = int(state["step"])
    return state


def _start_monitoring(run: Run, state: dict | None, changes: list, resume_path: Path | None) -> None:
    """5. Health monitor, autotune and metric sinks (a resume truncates what a killed run wrote
    after its checkpoint); on a resume the rest of the checkpoint's state, then the recipe changes
    allowed with --allow-recipe-change."""
    from . import resume as rs
    from .loop import apply_knobs

    run.monitor, run.tuner, run.sinks = _monitoring(run.recipe, run.run_dir, run.dist,
                                                    run.start if state is not None else None)
    if state is None:
        return
    c, knobs, tuner = run.c, run.knobs, run.tuner
    restore(c, knobs, run.monitor, tuner, state)
    if tuner is not None and state.get("autotune") is None:  # autotune newly on: it starts from the run's knobs
        for k, v in vars(knobs).items():
            setattr(tuner.knobs, k, v)
    notes = rs.apply_changes(changes, c, knobs, tuner)  # the new values win over the checkpoint's
    apply_knobs(c, knobs)
    c.rollout.sync_weights(c.actor)
    LOG.info("resumed from %s at step %d", resume_path, run.start)
    if notes:
        LOG.warning("resuming with a changed recipe (--allow-recipe-change); taking effect now: %s",
                    "; ".join(notes))


def _start_pipeline(run: Run, state: dict | None, resume_path: Path | None) -> None:
    """6b. rollout.asynchronous: the producer that generates ahead (pipeline.py). A resume restores
    the batches the checkpoint holds (generated, not trained) or, where it cannot (another
    max_staleness or world size, a missing or unreadable file), generates them again from where
    they began: no prompt is lost either way."""
    from .checkpoint import load_tensors_only
    from .collective import world_size
    from .pipeline import Pipeline, check_batch, unpack

    c, K = run.c, run.recipe.rollout.asynchronous.max_staleness
    entry = (state or {}).get("async")
    inflight, why, before = None, None, {}
    if entry is not None:
        path = resume_path / f"inflight-rank{run.dist.rank}.pt"
        if int(entry.get("max_staleness", -1)) != K:
            why = f"rollout.asynchronous.max_staleness is now {K}"
        elif int(state.get("world_size", 1)) != world_size():
            why = "the world size changed"
        elif entry.get("inflight_steps") and path.is_file():
            try:
                loaded = load_tensors_only(path)
                inflight = {int(j): unpack(d) for j, d in loaded.items()}
                for batch in inflight.values():   # data, checked before it is trained on
                    check_batch(batch, vocab_size(c))
            except Exception as err:  # noqa: BLE001 - any unreadable file: regenerate instead
                inflight = None
                detail = f": {str(err)[:160]}" if isinstance(err, ValueError) else ""
                why = f"{path.name} is not readable ({type(err).__name__}{detail})"
            if inflight is not None and sorted(inflight) != [int(j) for j in entry["inflight_steps"]]:
                inflight, why = None, f"{path.name} does not hold the steps state.json names"
            before = _inflight_before(entry, inflight)
            if inflight is not None and before is None:
                inflight, why = None, "state.json does not say where each of them began"
        elif entry.get("inflight_steps"):
            why = f"{path.name} is missing"
        if inflight is None:
            c.sampler.load_state_dict(entry["sampler_before"])
            c.rewards.load_state_dict(entry["rewards_before"])
            if why and K > 0:
                LOG.warning("[Async] the batches generated ahead of step %d are generated again (%s)",
                            entry["next_step"], why)
    if K == 0:
        return
    a = run.recipe.rollout.asynchronous
    if a.partial and c.rollout.name != "vllm-server":
        raise TrainError(f"rollout.asynchronous.max_staleness {K} with partial rollouts needs the vllm-server "
                         f"engine (this run uses {c.rollout.name})\n  fix: set rollout.engine: vllm-server, or "
                         "rollout.asynchronous.partial: false")
    if a.on_stale == "drop" and world_size() > 1:
        raise TrainError(f"rollout.asynchronous.on_stale: drop with {world_size()} processes: a rank that drops "
                         "groups would train fewer rows than the others\n  fix: set rollout.asynchronous.on_stale: "
                         "regenerate")
    c.pipeline = Pipeline(c, run.start + 1, run.recipe.trainer.max_steps, inflight, before if inflight else None)


def vocab_size(c) -> int:
    """Rows of the policy's input embedding: the token ids it can take."""
    module = getattr(c.actor, "module", c.actor)
    return int(module.get_input_embeddings().num_embeddings)


def _inflight_before(entry: dict, inflight: dict | None) -> dict | None:
    """Step -> (sampler, rewards) state before each restored batch was drawn (state.json's "async"
    "before"); the first one is "sampler_before" / "rewards_before". None where a restored batch
    has no record (a checkpoint of an rltune that did not save them, with more than one batch)."""
    if not inflight:
        return {}
    saved = entry.get("before") if isinstance(entry.get("before"), dict) else {}
    out = {int(j): (d["sampler"], d["rewards"]) for j, d in saved.items()
           if str(j).isdigit() and isinstance(d, dict) and "sampler" in d and "rewards" in d}
    first = min(inflight)
    out.setdefault(first, (entry["sampler_before"], entry["rewards_before"]))
    return out if all(j in out for j in inflight) else None


def _ready(run: Run, state: dict | None) -> None:
    """6. (after the signal handlers and faults) The checkpoint's non-finite streak and eval
    before training; the startup lines and the progress bar."""
    from . import progress as pg

    c = run.c
    if state is not None:
        run.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))
        if state.get("eval_start") is not None:
            run.eval_start = pg.EvalScore(state["eval_start"], state.get("eval_start_parts") or {},
                                          len(c.eval_set) if c.eval_set is not None else 0,
                                          _floats(state.get("eval_start_episode")),
                                          _floats(state.get("eval_start_env")))   # absent in older checkpoints
    if run.dist.is_main:
        for line in pg.startup_lines(c, run.run_dir, run.start if state is not None else None):
            LOG.info("%s", line)
    run.progress = pg.Progress(run.recipe.trainer.max_steps, run.start,
                               enabled=run.dist.is_main and run.console != "quiet")


# ---------------------------------------------------------------- step 8: finish

def _end(run: Run) -> int:
    """8. The last checkpoint; then final/ and the final eval, unless a signal came (a resume
    exports them). Returns the exit code."""
    step = run.step
    if step > run.start:
        save(run, step)
    if run.stop.signal is not None:
        LOG.warning("interrupted before the final export: `--resume auto` exports it")
        return EXIT_INTERRUPTED
    last = run.last_eval
    _finish(run.c, run.run_dir, step, fresh=step > run.start, eval_start=run.eval_start, hint=run.hint,
            final=last[1] if last is not None and last[0] == step else None)
    return 0


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


def _floats(value) -> dict:
    """A {name: number} dict read back from a checkpoint's state; anything else is dropped."""
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _finish(c, run_dir: Path, step: int, fresh: bool, eval_start, hint: str, final=None) -> None:
    """Export final/ and evaluate; on a run that had finished before, do whatever of this a
    kill left undone (final/ missing or incomplete, eval.json missing)."""
    from . import checkpoint as ckpt
    from .loop import evaluate
    from .progress import final_eval_lines, reward_weights

    final_dir = run_dir / "final"
    problem = None if fresh else main_first(c.dist, lambda: ckpt.final_problem(final_dir, step))
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
            e = storage_error(err, "the final policy", run_dir, needed, run_dir, hint,
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
                                                           "after_parts": final.parts,
                                                           "before_episode": eval_start.episode,
                                                           "after_episode": final.episode,
                                                           "before_env": eval_start.env, "after_env": final.env}))
    if not redo and not need_eval:
        LOG.info("the run in %s already finished at step %d (trainer.max_steps %d): nothing to do; "
                 "raise trainer.max_steps to continue, or use --resume never to start over",
                 run_dir, step, c.recipe.trainer.max_steps)
    else:
        LOG.info("done: %s (final policy in %s)", run_dir, final_dir)


def _abandoned(stop: Stop, run_dir: Path, step: int, hint: str) -> None:
    """A second Ctrl-C: say what was abandoned and what a resume will continue from."""
    name = signal.Signals(stop.signal).name if stop.signal is not None else "SIGINT"
    last = last_good(run_dir)
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
    if dist.is_main:   # the start-up lines name RUN_DIR/events.jsonl: it exists (empty) until an event fires
        try:
            open(Path(run_dir) / "events.jsonl", "a", encoding="utf-8").close()
        except BaseException:
            for s in sinks:
                s.close()
            raise
    return monitor, tuner, sinks


__all__ = ["train", "EXIT_INTERRUPTED"]
