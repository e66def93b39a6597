"""`rltune train`: set up, resume, loop, checkpoint, export. The loop itself is in loop.py."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from ..recipe.schema import Recipe
from .collective import barrier
from .console import LOG, Progress, setup_logging
from .setup import TrainError

EXIT_INTERRUPTED = 130


class _Stop:
    """SIGINT/SIGTERM set a flag; the loop saves a checkpoint after the current step."""

    def __init__(self):
        self.signal = None

    def __call__(self, signum, frame):
        if self.signal is not None:  # second Ctrl-C: give up at once
            raise KeyboardInterrupt
        self.signal = signum
        LOG.warning("received %s: finishing this step, saving a checkpoint, then exiting",
                    signal.Signals(signum).name)


def train(recipe: Recipe, recipe_path: Path, resume: str = "auto", allow_recipe_change: bool = False,
          quiet: bool = False) -> int:
    import torch
    import yaml

    from ..engine.distributed import init_distributed
    from . import checkpoint as ckpt
    from .faults import Faults
    from .loop import apply_knobs, evaluate, initial_knobs, train_step
    from ..monitor.trackers import log_all
    from .setup import build

    dist = init_distributed(recipe.trainer.device)
    run_dir = Path(recipe.trainer.output_dir)
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    barrier()
    setup_logging(run_dir, "quiet" if quiet else recipe.logging.console, dist.is_main)
    recipe_dict = recipe.model_dump(mode="json")
    rhash = ckpt.recipe_hash({k: v for k, v in recipe_dict.items() if k != "trainer"} |
                             {"trainer": {k: v for k, v in recipe_dict["trainer"].items()
                                          if k not in ("max_steps", "save_every", "keep_checkpoints")}})

    # resume: find the checkpoint and check the recipe before building anything heavy
    resume_path = None
    if resume != "never":
        resume_path = Path(resume) if resume != "auto" else ckpt.find_resumable(run_dir, LOG)
        if resume_path is not None and resume != "auto":
            problem = ckpt.verify(resume_path)
            if problem:
                raise TrainError(f"checkpoint {resume_path} is not usable: {problem}")
    if resume_path is not None:
        saved = json.loads((resume_path / "state.json").read_text())
        if saved.get("recipe_hash") != rhash:
            changed = _changed_keys(saved.get("recipe", {}), recipe_dict)
            if not allow_recipe_change:
                raise TrainError(
                    f"the recipe changed since checkpoint {resume_path.name}: {', '.join(changed) or 'unknown keys'}\n"
                    "  fix: resume with the same recipe, pass --allow-recipe-change, or --resume never to start over")
            LOG.warning("resuming with a changed recipe (--allow-recipe-change): %s", ", ".join(changed))

    if dist.is_main:
        (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe_dict, sort_keys=False))
    drawn_seed = saved.get("seed") if resume_path is not None else None
    c = build(recipe, dist, recipe_path.parent, seed=drawn_seed)
    knobs = initial_knobs(c)
    gen = torch.Generator().manual_seed((recipe.trainer.seed or 0) + 17)
    engines = {"actor": c.actor, "critic": c.critic}
    start = 0
    if resume_path is None and dist.is_main:
        for name in ("metrics.jsonl", "events.jsonl", "eval.json"):  # a fresh run starts fresh logs
            if (run_dir / name).exists():
                (run_dir / name).unlink()
    if resume_path is not None:
        state = ckpt.load(resume_path, engines, gen, dist.rank)
        start = int(state["step"])
    monitor, tuner, sinks = _monitoring(recipe, run_dir, dist, start if resume_path is not None else None)
    if resume_path is not None:
        _restore(c, knobs, monitor, tuner, state)
        apply_knobs(c, knobs)
        c.rollout.sync_weights(c.actor)
        LOG.info("resumed from %s at step %d", resume_path, start)

    def save(step: int) -> None:
        state = {"step": step, "seed": c.seed, "recipe_hash": rhash, "recipe": recipe_dict, "kl_ctl": c.kl_ctl.state_dict(),
                 "sampler": c.sampler.state_dict(), "rewards": c.rewards.state_dict(),
                 "knobs": vars(knobs).copy(), "skipped_in_a_row": skipped_in_a_row,
                 "eval_start": eval_start,
                 "monitor": monitor.state_dict() if monitor is not None else None,
                 "autotune": tuner.state_dict() if tuner is not None else None}
        path = ckpt.save(run_dir, step, engines, state, gen, dist.rank, recipe.trainer.keep_checkpoints)
        LOG.info("checkpoint saved: %s", path)

    stop = _Stop()
    old_handlers = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    faults = Faults.from_env()
    if faults is not None:
        faults.install(c)
    skipped_in_a_row = int(state.get("skipped_in_a_row", 0)) if resume_path is not None else 0
    eval_start = state.get("eval_start") if resume_path is not None else None
    r = recipe
    if eval_start is None and c.eval_set is not None:
        eval_start = evaluate(c)
        LOG.info("eval before training: reward %.3f on %d held-out prompts", eval_start, len(c.eval_set))
    progress = Progress(r.trainer.max_steps, start, enabled=dist.is_main and not quiet and r.logging.console == "rich")
    step, exit_code = start, 0
    try:
        for step in range(start + 1, r.trainer.max_steps + 1):
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
                m["eval/reward"] = evaluate(c)
            events = monitor.observe(m) if monitor is not None else []
            if tuner is not None:
                tuner.knobs.kl_coef = knobs.kl_coef  # the adaptive KL controller may have moved it
                tuner.step(m, events)                # logs each change with its reason
                _sync_knobs_from_tuner(tuner, knobs)
                apply_knobs(c, knobs)
                m.update(tuner.metrics())
            log_all(sinks, m, step)
            if step % r.logging.log_every == 0:
                LOG.info("[Rollout] step=%d avg_reward=%.4f kl=%.4f", step, m["reward/mean"], m["kl"])
                LOG.info("Actor resharding time: %d ms", round(m["timing/sync_ms"]))
            progress.update(step, m["reward/mean"], m["kl"])
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
            if stop.signal is not None:
                save(step)
                exit_code = EXIT_INTERRUPTED
                break
    finally:
        progress.close()
        for s, h in old_handlers.items():
            signal.signal(s, h)
        for sink in sinks:
            sink.close()
    if exit_code == EXIT_INTERRUPTED:
        LOG.warning("interrupted at step %d; resume with: rltune train %s --resume auto", step, recipe_path)
        return exit_code
    if exit_code == 0 and start >= r.trainer.max_steps:
        LOG.info("the run in %s already finished at step %d (trainer.max_steps %d): nothing to do; "
                 "raise trainer.max_steps to continue, or use --resume never to start over",
                 run_dir, start, r.trainer.max_steps)
    elif exit_code == 0:
        save(step)
        ckpt.export_hf(c.actor, c.tokenizer, run_dir / "final", dist.rank)
        if c.eval_set is not None and eval_start is not None:
            final = evaluate(c)
            LOG.info("eval reward on %d held-out prompts: before %.3f -> after %.3f", len(c.eval_set),
                     eval_start, final)
            if dist.is_main:
                (run_dir / "eval.json").write_text(json.dumps({"before": eval_start, "after": final}))
        LOG.info("done: %s (final policy in %s)", run_dir, run_dir / "final")
    return exit_code


def _changed_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changed_keys(a, b, prefix + k + ".")
        elif a != b:
            out.append(f"{prefix}{k}: {a!r} -> {b!r}")
    return out


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


def _sync_knobs_from_tuner(tuner, knobs) -> None:
    tk = tuner.knobs
    for name in ("actor_lr", "critic_lr", "kl_coef", "clip_range", "entropy_coef"):
        if hasattr(tk, name):
            setattr(knobs, name, getattr(tk, name))


__all__ = ["train", "EXIT_INTERRUPTED"]
