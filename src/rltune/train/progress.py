"""What `rltune train` shows while it runs (docs/training.md, "What the console shows"):

- the start-up block: run directory, batch plan, sampling settings, rollout engine and why;
- a line when the first step starts (a step can take minutes: no silent gap);
- one line per step (every `logging.log_every`): the grep-able `[Rollout] step=N avg_reward=..
  kl=..`, then step/total, seconds per step and the ETA, then the reward's weighted parts and
  the environment's own reward parts (`reward/env/NAME`, an agent's or a verifiers rubric's);
- a Rich progress bar (step/total, s/step, ETA, reward, KL) where the console is a terminal;
- every eval result with the reward broken into its parts.

Formatting only: no torch import.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..monitor.advice import fmt


@dataclass
class EvalScore:
    """The mean eval reward and its parts (`spec` -> mean score before weighting); with
    rollout.env, `episode` holds the greedy episodes' `turns_mean` and `tool_calls_mean`, and
    `env` the environment's own reward parts (NAME -> mean per episode, `reward/env/NAME`)."""
    reward: float
    parts: dict = field(default_factory=dict)
    prompts: int = 0
    episode: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)

    def metrics(self, prefix: str = "eval/reward") -> dict:
        """`eval/reward` and one `eval/reward/<spec>` per part (as `reward/<spec>` in training);
        `eval/reward/env/NAME` per environment part; `eval/episode/<name>` for episodes."""
        return ({prefix: self.reward} | {f"{prefix}/{spec}": v for spec, v in self.parts.items()}
                | {f"{prefix}/env/{k}": v for k, v in self.env.items()}
                | {f"eval/episode/{k}": v for k, v in self.episode.items()})


# -- the reward's parts ------------------------------------------------------------------------

def part_name(spec: str) -> str:
    """`builtin:format` -> format, `pkg.mod:score` / `path/r.py:score` -> score, `model` -> model."""
    return spec.rsplit(":", 1)[-1] if ":" in spec else spec


def reward_weights(recipe) -> dict:
    """The weight of each reward source, in the order RewardComputer sums them."""
    rw = recipe.reward
    weights = list(rw.weights) if rw.weights is not None else [1.0] * len(rw.functions)
    out = dict(zip(rw.functions, weights))
    if rw.model:
        out["model"] = 1.0
    if recipe.rollout.env:   # an environment's own reward(), where it defines one (source `env`)
        out["env"] = 1.0
    return out


def parts_text(parts: dict, weights: dict) -> str:
    """`exact_answer 0.000 x1.0, format 1.000 x0.5` (each part's mean before weighting)."""
    return ", ".join(f"{part_name(spec)} {v:.3f} x{fmt(float(weights.get(spec, 1.0)))}" for spec, v in parts.items())


ENV_PARTS_SHOWN = 6   # on one line; the rest are counted (`+K more`), all are in metrics.jsonl


def env_parts_text(parts: dict) -> str:
    """`digits 0.410, short 0.770` (an environment's parts, by name; after 6, `+K more`)."""
    names = sorted(parts)
    text = ", ".join(f"{k} {parts[k]:.3f}" for k in names[:ENV_PARTS_SHOWN])
    return text + (f" +{len(names) - ENV_PARTS_SHOWN} more" if len(names) > ENV_PARTS_SHOWN else "")


def env_parts(m: dict) -> dict:
    """NAME -> value of the `reward/env/NAME` keys of a metrics dict."""
    return {k[len("reward/env/"):]: v for k, v in m.items() if k.startswith("reward/env/")}


def worth_splitting(weights: dict) -> bool:
    """A reward with one source of weight 1 is its own part: nothing to break down."""
    return len(weights) > 1 or any(w != 1.0 for w in weights.values())


def eval_line(label: str, score: EvalScore, weights: dict) -> str:
    """`eval at step 10: reward 1.000 (exact_answer 0.000 x1.0, format 1.000 x0.5) on 32 held-out prompts`;
    with episodes `; per episode 1.00 turns, 0.00 tool calls`, then `; env: digits 0.410, short 0.770`."""
    parts = f" ({parts_text(score.parts, weights)})" if score.parts and worth_splitting(weights) else ""
    ep = score.episode
    episodes = (f"; per episode {ep['turns_mean']:.2f} turns, {ep['tool_calls_mean']:.2f} tool calls"
                if {"turns_mean", "tool_calls_mean"} <= set(ep) else "")
    env = f"; env: {env_parts_text(score.env)}" if score.env else ""
    return f"eval {label}: reward {score.reward:.3f}{parts} on {score.prompts} held-out prompts{episodes}{env}"


def final_eval_lines(before: EvalScore, after: EvalScore, weights: dict) -> list[str]:
    """The before -> after summary, then each part's before -> after when there are several, the
    episodes' tool calls and turns, and each environment part's (`  env/digits: before ..`)."""
    lines = [f"eval reward on {after.prompts} held-out prompts: before {before.reward:.3f} -> after {after.reward:.3f}"]
    if worth_splitting(weights):
        for spec, v in after.parts.items():
            b = before.parts.get(spec, float("nan"))
            lines.append(f"  {part_name(spec)} (x{fmt(float(weights.get(spec, 1.0)))}): before {b:.3f} -> after {v:.3f}")
    for key, label in (("tool_calls_mean", "tool calls"), ("turns_mean", "turns")):
        if key in before.episode and key in after.episode:
            lines.append(f"  {label} per episode: before {before.episode[key]:.2f} -> after {after.episode[key]:.2f}")
    for name in sorted(after.env):   # a resumed run's eval before, from an older checkpoint, may lack them
        b = before.env.get(name, float("nan"))
        lines.append(f"  env/{name}: before {b:.3f} -> after {after.env[name]:.3f}")
    return lines


# -- time per step and ETA ---------------------------------------------------------------------

def fmt_duration(seconds: float) -> str:
    """42s, 3m38s, 1h02m."""
    if not math.isfinite(seconds):
        return "--"
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class StepClock:
    """Seconds per step (the mean over the steps this process ran, eval and checkpoint time
    included: what the remaining steps will cost) and the ETA of the last step."""

    def __init__(self, total: int, start: int, clock: Callable[[], float] = time.monotonic):
        self.total, self.start, self.clock = total, start, clock
        self.t0: float | None = None
        self.step = start
        self.elapsed = 0.0

    def begin(self) -> None:
        """The first step of this process starts now."""
        if self.t0 is None:
            self.t0 = self.clock()

    def tick(self, step: int) -> None:
        """Step `step` has finished."""
        self.begin()
        self.step = step
        self.elapsed = self.clock() - self.t0

    @property
    def s_per_step(self) -> float:
        done = self.step - self.start
        return self.elapsed / done if done > 0 else float("nan")

    @property
    def eta(self) -> float:
        return self.s_per_step * (self.total - self.step)

    def text(self) -> str:
        """`3/10 steps, 31.2 s/step, ETA 3m38s`."""
        return f"{self.step}/{self.total} steps, {self.s_per_step:.1f} s/step, ETA {fmt_duration(self.eta)}"


def fixed(x: float, digits: int = 4) -> str:
    """`x` with `digits` decimals; a value that rounds to zero prints as 0.0000, never -0.0000."""
    s = f"{x:.{digits}f}"
    return s[1:] if s.startswith("-") and float(s) == 0 else s


def step_line(step: int, m: dict, clock: StepClock, weights: dict) -> str:
    """`[Rollout] step=3 avg_reward=0.5200 kl=0.0040 | 3/10 steps, 31.2 s/step, ETA 3m38s | parts:
    exact_answer 0.125 x1.0, format 0.812 x1.0 | env: digits 0.410, short 0.770` (`[Rollout] step=..
    avg_reward=.. kl=..` is a documented grep target: keep its keys and their order)."""
    line = f"[Rollout] step={step} avg_reward={fixed(m['reward/mean'])} kl={fixed(m['kl'])} | {clock.text()}"
    parts = {spec: m[f"reward/{spec}"] for spec in weights if f"reward/{spec}" in m}
    if parts and worth_splitting(weights):
        line += f" | parts: {parts_text(parts, weights)}"
    env = env_parts(m)
    if env:   # the environment's own parts of reward/env (means per episode)
        line += f" | env: {env_parts_text(env)}"
    if "rollout/groups_generated" in m:   # dynamic sampling: what the batch cost
        line += (f" | groups kept {m['rollout/groups_kept']:.0f}/{m['rollout/groups_generated']:.0f} "
                 f"in {m['rollout/gen_calls']:.0f} calls")
    return line


def first_step_line(recipe, step: int) -> str:
    """Said before the first step of a process: generation alone can take minutes."""
    r = recipe
    calls = r.gen_calls_per_step
    return (f"step {step}/{r.trainer.max_steps}: generating {calls * r.rollout.batch_size} sequences "
            f"({calls} generation call(s) of {r.rollout.batch_size}), then scoring and updating ...")


# -- the start-up block ------------------------------------------------------------------------

def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}es" if word.endswith("ch") else f"{n} {word}s"


def startup_lines(c, run_dir: Path, resumed_step: int | None) -> list[str]:
    """Run directory, batch plan, effective sampling settings, rollout engine and why."""
    r, w = c.recipe, c.dist.world_size
    calls, rb, tb, mb = r.gen_calls_per_step, r.rollout.batch_size, r.train.batch_size, r.train.micro_batch_size
    accum = max(1, tb // w // mb)
    what = f"resuming at step {resumed_step}" if resumed_step is not None else "new run"
    evals = (f", eval every {r.trainer.eval_every} step(s) on {len(c.eval_set)} held-out prompts"
             if c.eval_set is not None and r.trainer.eval_every else "")
    ro = r.rollout
    sampling = (f"temperature {ro.temperature:g}, top_p {ro.top_p:g}, top_k {ro.top_k or 'off'}" if ro.do_sample
                else "greedy")
    corr = c.correction + (f" (cap {r.algorithm.rollout_correction.cap:g})" if c.correction != "none" else "")
    lines = [
        f"run directory: {run_dir} ({what}; metrics.jsonl, events.jsonl, train.log)",
        f"batch plan: {r.algorithm.name}, {_plural(w, 'rank')}, {r.trainer.max_steps} steps{evals}",
        f"  one step    {_plural(calls, 'generation call')} x {rb} sequences (rollout.batch_size: "
        f"{r.prompts_per_call} prompts x {r.algorithm.group_size} samples) = {calls * rb} sequences",
        f"  one update  {tb} sequences (train.batch_size) = {_plural(w, 'rank')} x {_plural(accum, 'micro-batch')} "
        f"of {mb} ({_plural(accum, 'accumulation step')})",
        f"  per step    {_plural(r.optimizer_updates_per_step, 'optimizer update')} = {r.train.ppo_epochs} ppo "
        f"epoch(s) x {r.train.updates_per_step} (train.updates_per_step)",
        f"sampling: {sampling}, max_new_tokens {ro.max_new_tokens}, {r.algorithm.group_size} per prompt; "
        f"log-probs at temperature {r.logprob_temperature:g}; rollout correction {corr}",
        getattr(c.rollout, "reason", "") or f"rollout engine {c.rollout.name}",
    ]
    if getattr(c.rollout, "kv_cache_line", ""):
        lines.append(c.rollout.kv_cache_line)
    from ..models.adaptation import adaptation_of

    adapted = adaptation_of(c.actor).summary(c)   # LoRA: r, alpha, what trains, reference, sync
    if adapted:
        lines.append(adapted)
    from .packed import packed_reason

    packed = packed_reason(c.actor) if r.train.padding_free else "train.padding_free is false"
    if r.algorithm.group_size > 1:
        from .shared_prompt import shared_prompt_reason

        reason = shared_prompt_reason(c.actor) if r.train.share_prompts else "train.share_prompts is false"
        lines.append("shared-prompt passes: " + (f"off ({reason})" if not r.train.share_prompts or (reason and packed)
                                                  else "on (each prompt computed once per group"
                                                  + (" in the padding-free sequence)" if packed is None else ")")))
    if r.train.padding_free:
        lines.append("padding-free passes: " + ("on (each micro-batch's rows end to end; "
                                                "train.max_tokens_per_micro_batch counts real tokens)"
                                                if packed is None else f"off ({packed})"))
    if r.actor.gradient_checkpointing:
        from ..models.checkpointing import checkpointing_mode

        mode = checkpointing_mode(c.actor)
        lines.append(f"actor gradient checkpointing: {mode or 'off'}"
                     + (f" (asked: {r.actor.gradient_checkpointing}; the model's layers do not support it)"
                        if mode != r.actor.gradient_checkpointing else ""))
    return lines


# -- the progress bar --------------------------------------------------------------------------

class Progress:
    """Step/total, s/step, ETA, reward and KL: a Rich bar where the console is a terminal (every
    console mode but quiet), nothing otherwise (the step lines carry the same figures)."""

    def __init__(self, total: int, start: int, enabled: bool, console=None,
                 clock: Callable[[], float] = time.monotonic):
        self.clock = StepClock(total, start, clock)
        self.bar = None
        if not enabled:
            return
        if console is None:
            from .console import rich_console

            console = rich_console()
        if not console.is_terminal:
            return
        from rich.progress import BarColumn, Progress as RichProgress, TextColumn

        self.bar = RichProgress(TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TextColumn("{task.fields[info]}"), console=console, transient=False)
        self.task = self.bar.add_task("train", total=total, completed=start, info="starting")
        self.bar.start()

    def begin(self, step: int) -> None:
        self.clock.begin()
        self._show(f"step {step}: generating ...")

    def update(self, step: int, reward: float, kl: float) -> None:
        self.clock.tick(step)
        if self.bar is not None:
            c = self.clock
            self.bar.update(self.task, completed=step,
                            info=f"{c.s_per_step:.1f} s/step  ETA {fmt_duration(c.eta)}  reward {fixed(reward, 3)}  kl {fixed(kl)}")

    def _show(self, info: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, info=info)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
