"""Autotune: a stage controller that applies the playbook's stage transitions and spike fixes
during training, with the reason and the numbers, never outside the lint bounds.

Stages: 0 cold-start -> 1 acceleration -> 2 anti-overfit (terminal).
- cold-start -> acceleration: reward up > 5% over each of 2 consecutive windows of
  `autotune.window` steps, KL < 0.4, and no spike / NaN in the last 3 windows:
  kl coef -> min(current, 0.02), clip -> max(current, 0.2) (the acceleration preset).
- any -> anti-overfit: a reward_collapse / reward_hacking event:
  kl coef -> max(0.08, current), entropy -> max(0.01, current), clip -> min(0.12, current).
- spike fix (kl_spike, grad_spike, reward_swing, kl_high; at most once per `autotune.cooldown`
  steps): actor lr x0.5 (x0.1 while it is more than 10x above the playbook range), kl coef x1.5
  (cap 0.1), clip -0.05 (floor 0.1); critic_nan halves the critic lr.
- rollback (`autotune.rollback`, act mode, at most `autotune.max_rollbacks` per run): a hard spike
  (a kl_spike / grad_spike event whose value is more than `autotune.rollback_factor` x the max of
  its last ROLLBACK_HIST finite values before this step, an `entropy_collapse` event (a
  deterministic policy: in GRPO every advantage is 0, no later fix can move it), or
  `health.max_skipped_steps - 1` non-finite steps in a row) makes `hard_spike` return the reason;
  the trainer restores the last good checkpoint from before it began and calls `rollback`, which
  applies the spike fix (no cooldown) and logs a `rollback` event. The count is in `state_dict`.

The trainer reads `.knobs` each step. In `advise` mode nothing changes: the tuner only logs what
it would do. No torch import.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterable, Optional

from ..recipe.knobs import KNOB_KEYS, Knobs
from . import advice as A
from .detectors import SWING_FLOOR, Event, append_events

log = logging.getLogger("rltune")

STAGES = ("cold-start", "acceleration", "anti-overfit")
# kl_high (KL above health.kl_high for `window` steps) is a spike fix too: a KL that runs away
# under a too-high lr never forms a 10x spike once it is already high (docs/autotune-experiment.md)
SPIKE_KINDS = ("kl_spike", "grad_spike", "reward_swing", "kl_high")
COLLAPSE_KINDS = ("reward_collapse", "reward_hacking")
PROBLEM_KINDS = SPIKE_KINDS + ("critic_nan", "actor_nan", "skipped_step")
ACCEL_RISE = 0.05      # reward up > 5% per window
ACCEL_KL = 0.4         # and KL below this
ACCELERATION = {"kl_coef": 0.02, "clip_range": 0.2}
SPIKE_LR_FACTOR, SPIKE_KL_FACTOR, SPIKE_CLIP_STEP = 0.5, 1.5, 0.05
# an actor lr more than an order of magnitude above the playbook range comes down by an order of
# magnitude per fix (the playbook's field case: 1e-5 -> 5e-7); halving would take ~3 cooldowns each
FAR_ABOVE, FAR_LR_FACTOR = 10.0, 0.1
ENTROPY_MAX = 0.05
ROLLBACK_HIST = 10     # a hard spike is measured against the max of this many earlier values
HARD_KEYS = {"kl_spike": ("kl", "KL"), "grad_spike": ("actor/grad_norm", "actor grad norm")}


@dataclass
class Change:
    step: int
    knob: str            # Knobs field name; `.key` is the recipe key
    old: float
    new: float
    reason: str          # "reward +6.1%, +5.4% over 2 windows and KL 0.21 < 0.4"
    numbers: dict = field(default_factory=dict)
    action: str = ""     # "stage acceleration" | "spike fix (kl_spike)" | ...
    applied: bool = True

    @property
    def key(self) -> str:
        return KNOB_KEYS[self.knob]

    @property
    def line(self) -> str:
        head = f"[AutoTune] step {self.step}" + ("" if self.applied else " (advise, not applied)")
        return (f"{head}: {self.action}: {self.key} {A.fmt(self.old)} -> {A.fmt(self.new)}"
                f" because {self.reason}")

    def to_event(self) -> Event:
        return Event(self.step, "autotune", "info", self.line,
                     {**self.numbers, "knob": self.key, "old": self.old, "new": self.new,
                      "applied": self.applied, "action": self.action},
                     [], {self.key: self.new})

    def to_dict(self) -> dict:
        return asdict(self)


def _mean(xs):
    return sum(xs) / len(xs)


class AutoTuner:
    def __init__(self, recipe, run_dir=None, write: bool = True):
        self.recipe = recipe
        self.cfg = recipe.autotune
        self.enabled = self.cfg.enabled
        self.mode = self.cfg.mode
        self.has_critic = recipe.has_critic
        self.kl_adaptive = recipe.algorithm.kl.target is not None
        # the playbook's clip range [0.1, 0.3] is for token ratios in the PPO surrogate: GSPO's
        # sequence ratios use ~1e-4 clips and CISPO clips importance weights, so there the
        # clip range is left as the recipe set it
        algo = recipe.algorithm
        self.tunes_clip = algo.ratio_level == "token" and algo.policy_loss == "ppo"
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.write = write
        self.start = Knobs.from_recipe(recipe)
        self.knobs = Knobs.from_recipe(recipe)
        self.stage = 0
        self.last_fix: Optional[int] = None
        self.last_problem: Optional[int] = None
        self.rewards: list[float] = []
        self.kls: list[float] = []
        self.changes: list[Change] = []
        self.rollbacks = 0
        self.rollback_log: list[dict] = []
        self.hist: dict[str, list[float]] = {"kl": [], "actor/grad_norm": [], "critic/grad_norm": []}
        self._limit_logged = False

    # ---- bounds -----------------------------------------------------------------------------
    def bounds(self, knob: str) -> tuple[float, float]:
        """Lint bounds, widened to include the recipe's start value (moving toward a bound from
        outside is allowed, moving further out is not)."""
        s = getattr(self.start, knob)
        lo, hi = {
            "actor_lr": (A.ACTOR_LR_MIN, A.ACTOR_LR_MAX),
            "critic_lr": (A.ACTOR_LR_MIN, A.ACTOR_LR_MAX * A.CRITIC_RATIO_MAX),
            "kl_coef": (A.KL_MIN, A.KL_MAX),
            "clip_range": (A.CLIP_MIN, A.CLIP_MAX),
            "entropy_coef": (0.0, ENTROPY_MAX),
        }[knob]
        return min(s, lo), max(s, hi)

    def _clamp(self, knob: str, x: float) -> float:
        lo, hi = self.bounds(knob)
        return min(max(x, lo), hi)

    # ---- changes ----------------------------------------------------------------------------
    def _set(self, step, knob, new, action, reason, numbers, out: list) -> None:
        if knob == "clip_range" and not self.tunes_clip:
            return
        old = getattr(self.knobs, knob)
        new = A.r3(self._clamp(knob, new))
        new = self._clamp(knob, new)  # rounding must not step outside
        if abs(new - old) <= 1e-12 * max(abs(old), 1e-30):
            return
        ch = Change(step, knob, old, new, reason, dict(numbers), action, applied=(self.mode == "act"))
        if ch.applied:
            setattr(self.knobs, knob, new)
        out.append(ch)
        if knob == "actor_lr" and self.has_critic:
            self._fix_critic(step, action, out)

    def _fix_critic(self, step, action, out) -> None:
        """critic lr stays within [actor lr, 5 x actor lr] (playbook lr order / ratio)."""
        a = self.knobs.actor_lr if self.mode == "act" else (out[-1].new if out else self.knobs.actor_lr)
        c = self.knobs.critic_lr
        target = min(max(c, a), A.CRITIC_RATIO_MAX * a)
        if abs(target - c) > 1e-12 * c:
            why = (f"critic.lr must stay <= {A.CRITIC_RATIO_MAX:g} x actor.lr ({A.fmt(A.r3(a))})" if target < c
                   else f"critic.lr must stay >= actor.lr ({A.fmt(A.r3(a))})")
            old = c
            new = A.r3(target)
            while new > A.CRITIC_RATIO_MAX * a:   # float: 5 * 5e-07 < 2.5e-06; stay lint-clean
                new = float(f"{new * (1 - 1e-3):.4g}")
            if new < a:
                new = target
            ch = Change(step, "critic_lr", old, new, why, {"actor_lr": a}, action, applied=(self.mode == "act"))
            if ch.applied:
                self.knobs.critic_lr = new
            out.append(ch)

    # ---- the per-step entry point ------------------------------------------------------------
    def step(self, metrics: dict, events: Iterable[Event] = ()) -> list[Change]:
        if not self.enabled:
            return []
        step = int(metrics.get("step", (self.rewards and len(self.rewards)) or 0))
        events = list(events)
        r = metrics.get("reward/mean")
        kl = metrics.get("kl")
        if isinstance(r, (int, float)) and r == r and abs(r) != float("inf"):
            self.rewards.append(float(r))
            self.rewards = self.rewards[-3 * self.cfg.window:]
        if isinstance(kl, (int, float)) and kl == kl and abs(kl) != float("inf"):
            self.kls.append(float(kl))
            self.kls = self.kls[-self.cfg.window:]
        out: list[Change] = []
        kinds = {e.kind: e for e in events}
        if any(k in kinds for k in PROBLEM_KINDS):
            self.last_problem = step

        # anti-overfit: reward spiked, then collapsed
        collapse = next((kinds[k] for k in COLLAPSE_KINDS if k in kinds), None)
        if collapse is not None and self.stage < 2:
            self.stage = 2
            why = collapse.message.split(": reward")[0]
            act = "stage anti-overfit"
            nums = dict(collapse.numbers)
            n0 = len(out)
            if not self.kl_adaptive:
                self._set(step, "kl_coef", max(0.08, self.knobs.kl_coef), act, why, nums, out)
            self._set(step, "entropy_coef", max(0.01, self.knobs.entropy_coef), act, why, nums, out)
            self._set(step, "clip_range", min(0.12, self.knobs.clip_range), act, why, nums, out)
            self._note_stage(step, out, n0)

        # spike fixes, with a cooldown
        spike = next((kinds[k] for k in SPIKE_KINDS if k in kinds), None)
        if spike is not None or "critic_nan" in kinds:
            ev = spike or kinds["critic_nan"]
            if self.last_fix is not None and step - self.last_fix < self.cfg.cooldown:
                log.info("[AutoTune] step %d: %s ignored: cooldown (last fix at step %d, cooldown %d)",
                         step, ev.kind, self.last_fix, self.cfg.cooldown)
            else:
                self.last_fix = step
                act = f"spike fix ({ev.kind})"
                why = ev.message
                nums = dict(ev.numbers)
                if spike is not None:
                    self._spike_fix(step, act, why, nums, out)
                if "critic_nan" in kinds and self.has_critic:
                    c = self.knobs.critic_lr
                    new = max(c * 0.5, self.knobs.actor_lr)
                    self._set(step, "critic_lr", new, "fix (critic_nan)", kinds["critic_nan"].message,
                              dict(kinds["critic_nan"].numbers), out)

        # cold-start -> acceleration
        w = self.cfg.window
        if self.stage == 0 and len(self.rewards) >= 3 * w and self.kls:
            quiet = self.last_problem is None or step - self.last_problem >= 3 * w
            w0, w1, w2 = (_mean(self.rewards[i * w:(i + 1) * w]) for i in range(3))
            g1 = (w1 - w0) / max(abs(w0), SWING_FLOOR)
            g2 = (w2 - w1) / max(abs(w1), SWING_FLOOR)
            klm = _mean(self.kls)
            if quiet and g1 > ACCEL_RISE and g2 > ACCEL_RISE and klm < ACCEL_KL:
                self.stage = 1
                why = (f"reward {g1 * 100:+.1f}%, {g2 * 100:+.1f}% over 2 windows and KL {klm:.2f}"
                       f" < {ACCEL_KL}")
                nums = {"reward_rise": [round(g1, 4), round(g2, 4)], "kl": round(klm, 4), "window": w}
                act = "stage acceleration"
                n0 = len(out)
                if not self.kl_adaptive:
                    self._set(step, "kl_coef", min(self.knobs.kl_coef, ACCELERATION["kl_coef"]), act, why, nums, out)
                self._set(step, "clip_range", max(self.knobs.clip_range, ACCELERATION["clip_range"]), act, why, nums, out)
                self._note_stage(step, out, n0)

        self._remember(metrics)
        for ch in out:
            log.warning(ch.line)
        self.changes.extend(out)
        if self.write:
            append_events(self.run_dir, [c.to_event() for c in out])
        return out

    def _spike_fix(self, step, act, why, nums, out) -> None:
        k = self.knobs
        far = k.actor_lr > FAR_ABOVE * A.ACTOR_LR_MAX
        self._set(step, "actor_lr", k.actor_lr * (FAR_LR_FACTOR if far else SPIKE_LR_FACTOR), act, why, nums, out)
        if not self.kl_adaptive:
            self._set(step, "kl_coef", min(A.KL_MAX, k.kl_coef * SPIKE_KL_FACTOR), act, why, nums, out)
        self._set(step, "clip_range", max(A.CLIP_MIN, k.clip_range - SPIKE_CLIP_STEP), act, why, nums, out)

    def _remember(self, metrics: dict) -> None:
        """The running values a hard spike is measured against (finite values only)."""
        for key, h in self.hist.items():
            v = metrics.get(key)
            if isinstance(v, (int, float)) and v == v and abs(v) != float("inf"):
                h.append(float(v))
                del h[:-ROLLBACK_HIST]

    # ---- rollback -----------------------------------------------------------------------------
    @property
    def rollback_on(self) -> bool:
        return bool(self.enabled and self.mode == "act" and getattr(self.cfg, "rollback", False))

    def hard_spike(self, metrics: dict, events: Iterable[Event] = ()) -> Optional[dict]:
        """Call before `step`: the reason for a rollback at this step, or None. A hard spike is a
        kl_spike / grad_spike event whose value is more than `rollback_factor` x the max of its
        last ROLLBACK_HIST finite values, an `entropy_collapse` event, or
        `health.max_skipped_steps - 1` (at least 1) non-finite steps in a row
        (`health/skipped_steps`). reason["before"]: the step the trouble began."""
        if not self.rollback_on:
            return None
        step = int(metrics.get("step", 0))
        reason = None
        kinds = {e.kind: e for e in events}
        factor = float(self.cfg.rollback_factor)
        for kind, (key, label) in HARD_KEYS.items():
            if kind not in kinds or reason is not None:
                continue
            ev = kinds[kind]
            if kind == "grad_spike" and ev.numbers.get("role") == "critic":
                key, label = "critic/grad_norm", "critic grad norm"
            v, hist = metrics.get(key), self.hist[key]
            if not isinstance(v, (int, float)) or v != v or not hist:
                continue
            # |value|: a k1 KL estimate can be negative, and a max reached through negative values
            # (or ~0) would make any later KL look like a hard spike (issue 46.5)
            ref = max(max(abs(h) for h in hist), 1e-8)
            if v > factor * ref:
                reason = {"trigger": kind, "value": round(float(v), 6), "recent_max": round(ref, 6),
                          "ratio": round(float(v) / ref, 2), "rollback_factor": factor,
                          "why": f"{label} {A.fmt(A.r3(v))} is {v / ref:.0f}x its recent max {A.fmt(A.r3(ref))}"
                                 f" (> {factor:g}x)"}
        if reason is None and "entropy_collapse" in kinds:
            ev = kinds["entropy_collapse"]
            v = metrics.get("actor/entropy")
            shown = A.fmt(A.r3(v)) if isinstance(v, (int, float)) and v == v else "n/a"
            n = ev.numbers.get("steps")
            n = int(n) if isinstance(n, (int, float)) and n >= 1 else int(self.recipe.health.window)
            reason = {"trigger": "entropy_collapse", "value": v, "before": step - n + 1,
                      "why": f"entropy collapse: actor entropy {shown} nats/token (the {ev.kind} event of step {ev.step})"}
        streak = int(metrics.get("health/skipped_steps", 0) or 0)
        need = max(1, int(self.recipe.health.max_skipped_steps) - 1)
        if reason is None and streak >= need:
            reason = {"trigger": "nonfinite", "skipped_in_a_row": streak, "limit": need, "before": step - streak + 1,
                      "why": f"{streak} non-finite step(s) in a row (rollback at {need}, the run stops at "
                             f"{self.recipe.health.max_skipped_steps})"}
        if reason is None:
            return None
        if self.rollbacks >= self.cfg.max_rollbacks:
            if not self._limit_logged:
                log.warning("[AutoTune] step %d: %s; no rollback: autotune.max_rollbacks (%d) reached",
                            step, reason["why"], self.cfg.max_rollbacks)
                self._limit_logged = True
            return None
        reason["step"] = step
        reason.setdefault("before", step)  # the rollback target is a good checkpoint before this step
        return reason

    def rollback(self, step: int, reason: dict, numbers: dict) -> list[Change]:
        """The trainer has restored checkpoint `numbers["from_step"]`: count it, apply the spike fix
        (no cooldown) and log a `rollback` event with the numbers."""
        self.rollbacks += 1
        self.last_fix = self.last_problem = step
        act = f"rollback ({reason['trigger']})"
        nums = {k: v for k, v in reason.items() if k not in ("why", "step", "before")}
        out: list[Change] = []
        self._spike_fix(step, act, reason["why"], nums, out)
        fix = {c.key: [c.old, c.new] for c in out}
        rec = {"step": step, **nums, **numbers, "rollback": self.rollbacks, "max_rollbacks": self.cfg.max_rollbacks,
               "fix": fix}
        self.rollback_log.append(rec)
        fix_txt = ", ".join(f"{k} {A.fmt(o)} -> {A.fmt(n)}" for k, (o, n) in fix.items()) or "no knob to move"
        msg = (f"[AutoTune] step {step}: rollback {self.rollbacks}/{self.cfg.max_rollbacks}: {reason['why']}; "
               f"restored checkpoint step {numbers.get('from_step')}, skipped the batch of step {step}; {fix_txt}")
        log.warning(msg)
        for ch in out:
            log.warning(ch.line)
        self.changes.extend(out)
        if self.write:
            ev = Event(step, "rollback", "warning", msg, rec, [], {c.key: c.new for c in out})
            append_events(self.run_dir, [ev] + [c.to_event() for c in out])
        return out

    def _note_stage(self, step, out, n0) -> None:
        if len(out) == n0:
            log.warning("[AutoTune] step %d: stage %s (no knob to move)", step, STAGES[self.stage])

    # ---- metrics / checkpoints ----------------------------------------------------------------
    def metrics(self) -> dict:
        k = self.knobs
        m = {"autotune/stage": self.stage, "autotune/stage_name": STAGES[self.stage],
             "autotune/actor_lr": k.actor_lr, "autotune/kl_coef": k.kl_coef,
             "autotune/clip_range": k.clip_range, "autotune/entropy_coef": k.entropy_coef}
        if self.has_critic:
            m["autotune/critic_lr"] = k.critic_lr
        if self.rollback_on:
            m["autotune/rollbacks"] = self.rollbacks
        return m

    @property
    def stage_name(self) -> str:
        return STAGES[self.stage]

    def state_dict(self) -> dict:
        return {"version": 1, "knobs": asdict(self.knobs), "start": asdict(self.start), "stage": self.stage,
                "last_fix": self.last_fix, "last_problem": self.last_problem,
                "rewards": list(self.rewards), "kls": list(self.kls),
                "changes": [c.to_dict() for c in self.changes[-200:]],
                "rollbacks": self.rollbacks, "rollback_log": list(self.rollback_log[-50:]),
                "hist": {k: list(v) for k, v in self.hist.items()}}

    def load_state_dict(self, state: dict) -> None:
        names = [f.name for f in fields(Knobs)]
        self.knobs = Knobs(**{n: float(state["knobs"][n]) for n in names})
        self.start = Knobs(**{n: float(state["start"][n]) for n in names})
        self.stage = int(state.get("stage", 0))
        self.last_fix = state.get("last_fix")
        self.last_problem = state.get("last_problem")
        self.rewards = [float(x) for x in state.get("rewards", [])]
        self.kls = [float(x) for x in state.get("kls", [])]
        self.changes = [Change(**c) for c in state.get("changes", [])]
        self.rollbacks = int(state.get("rollbacks", 0))
        self.rollback_log = list(state.get("rollback_log", []))
        for k, v in (state.get("hist") or {}).items():
            if k in self.hist:
                self.hist[k] = [float(x) for x in v]
