"""Training-health detectors: read the metrics of each step the way an experienced RLHF engineer
reads a run, and say what is wrong and what to change (docs/health.md lists every detector).

`HealthMonitor(recipe, run_dir).observe(metrics)` is called by the trainer after each step and by
`rltune diagnose` offline. Thresholds come from `recipe.health` (defaults from the playbook); the
advice is computed from the current recipe (monitor/advice.py). A detector fires once per episode
of a condition and re-arms after the condition clears. No torch import.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from pathlib import Path
from typing import Optional

from . import advice as A
from .events import Event, append_events, truncate_events_after  # noqa: F401 - re-exported

SEVERITIES = ("info", "warning", "error")
# verdict ranking (most likely root cause first); kinds not listed rank last
KIND_RANK = [
    "critic_nan", "actor_nan", "reward_nan", "skipped_step",
    "kl_spike", "grad_spike",
    "reward_collapse", "reward_hacking",
    "kl_high",
    "reward_swing",
    "grad_clip",
    "entropy_collapse", "length_collapse", "length_runaway",
    "stale_weights", "sync_slow",
]
log = logging.getLogger("rltune")
HISTORY = 64         # values kept per metric (enough for every running statistic here)
SWING_FLOOR = 0.05   # smallest reward scale for relative swings (rewards near 0)


def default_recipe():
    """The schema defaults, for runs without a recipe.yaml."""
    from rltune.recipe.schema import Recipe
    return Recipe.model_validate({"model": {"policy": "unknown"}, "data": {"train": "unknown"}})


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _num(x) -> Optional[float]:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    try:  # numpy / torch scalars
        return float(x)
    except (TypeError, ValueError):
        return None


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _rd(x: float, n: int = 4) -> float:
    return float(f"{x:.{n}g}") if _finite(x) else x


# ------------------------------------------------------------------------------------------
# detectors
# ------------------------------------------------------------------------------------------

class Detector:
    """One symptom. `state` is a JSON-able dict (checkpointed); `check` sees the values of this
    step before they enter the monitor's history, so running statistics exclude the current step."""

    name = ""

    def __init__(self):
        self.state: dict = self.initial()

    def initial(self) -> dict:
        return {"armed": True}

    def check(self, mon: "HealthMonitor", step: int, v: dict, fired: list) -> list[Event]:
        raise NotImplementedError

    # helpers
    def sustained(self, key: str, cond: bool) -> int:
        """Consecutive steps `cond` has held (0 when it does not hold now)."""
        runs = self.state.setdefault("runs", {})
        runs[key] = runs.get(key, 0) + 1 if cond else 0
        return runs[key]


class NonFinite(Detector):
    name = "nonfinite"
    GROUPS = [
        ("critic_nan", [("critic/loss", "Critic loss"), ("critic/grad_norm", "Critic grad norm")], A.for_critic_nan),
        ("actor_nan", [("actor/loss", "Actor loss"), ("actor/grad_norm", "Actor grad norm"),
                       ("kl", "KL")], A.for_actor_nan),
        ("reward_nan", [("reward/mean", "Reward")], A.for_reward_nan),
    ]

    def initial(self):
        return {"armed": {g[0]: True for g in self.GROUPS}}

    def check(self, mon, step, v, fired):
        out = []
        for kind, keys, adv in self.GROUPS:
            bad = [(k, lab, v[k]) for k, lab in keys if k in v and not math.isfinite(v[k])]
            seen = any(k in v for k, _ in keys)
            if not bad:
                if seen:
                    self.state["armed"][kind] = True
                continue
            if not self.state["armed"][kind]:
                continue
            self.state["armed"][kind] = False
            k, lab, val = bad[0]
            word = "NaN" if math.isnan(val) else ("Inf" if val > 0 else "-Inf")
            msg = f"{lab} {word} at step {step}"
            others = [f"{l2} {A.fmt(x)}" for _, l2, x in bad[1:]]
            if others:
                msg += " (also " + ", ".join(others) + ")"
            skipped = v.get("health/skipped_steps")
            if skipped is not None and math.isfinite(skipped) and skipped > mon.last("health/skipped_steps", -1):
                msg += f"; step skipped ({int(skipped)} skipped so far)"
            ch, lines = adv(mon.recipe)
            nums = {kk: str(x) for kk, _, x in bad}
            out.append(Event(step, kind, "error", msg, nums, lines, ch))
        return out


class SkippedStep(Detector):
    name = "skipped_step"

    def check(self, mon, step, v, fired):
        s = v.get("health/skipped_steps")
        if s is None or not math.isfinite(s):
            return []
        prev = mon.last("health/skipped_steps", 0.0)
        if s <= prev or any(e.kind.endswith("_nan") for e in fired):
            return []
        ch, lines = A.for_skipped_step(mon.recipe)
        limit = mon.h.max_skipped_steps
        return [Event(step, "skipped_step", "warning",
                      f"Step {step} skipped: non-finite loss or gradient ({int(s)} skipped so far;"
                      f" the run stops after {limit} in a row)",
                      {"skipped_steps": int(s)}, lines, ch)]


class RewardSwing(Detector):
    """Early reward swings > ±15% around its running mean (lr too high)."""
    name = "reward_swing"

    def initial(self):
        return {"armed": True, "devs": []}  # [step, relative deviation] of the recent window

    def check(self, mon, step, v, fired):
        r = v.get("reward/mean")
        h = mon.h
        if r is None or not math.isfinite(r):
            return []
        hist = mon.recent("reward/mean", h.window)
        if len(hist) < max(2, h.warmup_steps) or mon.n > h.swing_steps:
            return []
        mean = statistics.fmean(hist)
        stds = mon.recent("reward/std", h.window) + ([v["reward/std"]] if _finite(v.get("reward/std")) else [])
        std = statistics.fmean(stds) if stds else 0.0
        scale = max(abs(mean), std, SWING_FLOOR)
        dev = (r - mean) / scale
        # a deviation sampling noise explains is not a swing: need > 3 standard errors of the batch mean
        cur_std = v["reward/std"] if _finite(v.get("reward/std")) else std
        se = cur_std / math.sqrt(max(1, mon.sequences_per_step))
        big = abs(dev) > h.reward_swing and abs(r - mean) > 3 * se
        devs = [d for d in self.state["devs"] if d[0] > step - h.window]
        if big:
            devs.append([step, _rd(dev)])
        self.state["devs"] = devs
        if not devs:
            self.state["armed"] = True
            return []
        up = [d[1] for d in devs if d[1] > 0]
        down = [d[1] for d in devs if d[1] < 0]
        if not (big and up and down and self.state["armed"]):
            return []
        self.state["armed"] = False
        ch, lines = A.for_reward_swing(mon.recipe)
        msg = (f"Reward swings {_pct(max(up))}/{_pct(min(down))} around its running mean "
               f"{A.fmt(_rd(mean))} at step {step} (early threshold ±{h.reward_swing * 100:.0f}%): actor lr too high")
        return [Event(step, "reward_swing", "warning", msg,
                      {"reward": _rd(r), "running_mean": _rd(mean), "swing_up": max(up), "swing_down": min(down),
                       "scale": _rd(scale), "threshold": h.reward_swing}, lines, ch)]


class KLHigh(Detector):
    name = "kl_high"

    def check(self, mon, step, v, fired):
        kl = v.get("kl")
        if kl is None or not math.isfinite(kl):
            return []
        h = mon.h
        n = self.sustained("kl", kl > h.kl_high)
        if n == 0:
            self.state["armed"] = True
            return []
        if n < h.window or not self.state["armed"]:
            return []
        self.state["armed"] = False
        window = mon.recent("kl", h.window - 1) + [kl]
        r_hist = mon.recent("reward/mean", 3 * h.window)
        creeping = len(r_hist) >= 2 * h.window and 0 < (
            statistics.fmean(r_hist[-h.window:]) - statistics.fmean(r_hist[:h.window]))
        ch, lines = A.for_kl_high(mon.recipe, statistics.fmean(window), creeping)
        msg = (f"KL {A.fmt(_rd(kl, 3))} > {A.fmt(h.kl_high)} sustained for {n} steps (since step {step - n + 1})"
               f": policy drifting from the reference; raise the KL coefficient")
        return [Event(step, "kl_high", "warning", msg,
                      {"kl": _rd(kl), "kl_mean": _rd(statistics.fmean(window)), "threshold": h.kl_high,
                       "steps": n, "kl_coef": v.get("kl_coef", mon.recipe.algorithm.kl.coef)}, lines, ch)]


class KLSpike(Detector):
    name = "kl_spike"

    def check(self, mon, step, v, fired):
        kl = v.get("kl")
        h = mon.h
        if kl is None or not math.isfinite(kl):
            return []
        hist = mon.recent("kl", 4 * h.window)
        if len(hist) < max(2, h.warmup_steps):
            return []
        ref = max(max(hist), 1e-4)
        spike = kl >= h.kl_spike_min and kl > h.kl_spike_factor * ref
        if not spike:
            if kl < h.kl_spike_min or kl <= h.kl_spike_factor * ref:
                self.state["armed"] = True
            return []
        if not self.state["armed"]:
            return []
        self.state["armed"] = False
        ch, lines = A.for_spike(mon.recipe)
        msg = (f"KL spike at step {step}: {A.fmt(_rd(max(hist[-1], 0.0), 3))} -> {A.fmt(_rd(kl, 3))} "
               f"({kl / ref:.0f}x its recent max {A.fmt(_rd(ref, 3))}); reward can still look fine: the spike is the warning")
        return [Event(step, "kl_spike", "error", msg,
                      {"kl": _rd(kl), "recent_max": _rd(ref), "factor": _rd(kl / ref, 3)}, lines, ch)]


class GradSpike(Detector):
    """Grad-norm spikes far above the running median, or norms pinned at the clip threshold."""
    name = "grad_spike"
    ROLES = (("actor", "actor/grad_norm", "Actor"), ("critic", "critic/grad_norm", "Critic"))

    def initial(self):
        return {"armed": {"actor": True, "critic": True}, "clip_armed": {"actor": True, "critic": True},
                "at_clip": {"actor": [], "critic": []}}

    def check(self, mon, step, v, fired):
        out = []
        h = mon.h
        for role, key, lab in self.ROLES:
            g = v.get(key)
            if g is None or not math.isfinite(g):
                continue
            hist = mon.recent(key, 4 * h.window)
            if len(hist) >= max(2, h.warmup_steps):
                med = max(statistics.median(hist), 1e-8)
                if g > h.grad_spike_factor * med:
                    if self.state["armed"][role]:
                        self.state["armed"][role] = False
                        ch, lines = A.for_spike(mon.recipe, role)
                        out.append(Event(step, "grad_spike", "error",
                                         f"{lab} grad-norm spike at step {step}: {A.fmt(_rd(g, 3))} is "
                                         f"{g / med:.0f}x its running median {A.fmt(_rd(med, 3))}",
                                         {"grad_norm": _rd(g), "running_median": _rd(med),
                                          "factor": _rd(g / med, 3), "role": role}, lines, ch))
                else:
                    self.state["armed"][role] = True
            # repeatedly at the clip threshold
            clip = getattr(mon.recipe, role).grad_clip
            if clip is None:
                continue
            at = [s for s in self.state["at_clip"][role] if s > step - 2 * h.window]
            if g >= 0.98 * clip:
                at.append(step)
            self.state["at_clip"][role] = at
            if not at:
                self.state["clip_armed"][role] = True
            elif len(at) >= h.window and self.state["clip_armed"][role] and at[-1] == step:
                self.state["clip_armed"][role] = False
                ch, lines = A.for_grad_clip_saturated(mon.recipe) if role == "actor" else A.for_spike(mon.recipe, role)
                out.append(Event(step, "grad_clip", "warning",
                                 f"{lab} grad norm at the clip threshold {A.fmt(clip)} on {len(at)} of the last "
                                 f"{2 * h.window} steps (step {step})",
                                 {"grad_norm": _rd(g), "grad_clip": clip, "steps_at_clip": len(at), "role": role},
                                 lines, ch))
        return out


class RewardCollapse(Detector):
    """Reward rises (well above noise) then gives back a large part of the rise: reward hacking /
    reward-model overfitting. Also: eval reward falling while the train reward holds."""
    name = "reward_collapse"

    def initial(self):
        return {"armed": True, "start": None, "peak": None, "peak_step": None,
                "eval": [], "hack_armed": True}

    def check(self, mon, step, v, fired):
        out = []
        h = mon.h
        r = v.get("reward/mean")
        st = self.state
        if r is not None and math.isfinite(r):
            w = 2 * h.window   # smoothing window: a collapse is a trend, not a noisy dip
            hist = mon.recent("reward/mean", HISTORY) + [r]
            if len(hist) >= w:
                sm = statistics.fmean(hist[-w:])
                if st["start"] is None:
                    st["start"] = sm
                if st["peak"] is None or sm > st["peak"]:
                    st["peak"], st["peak_step"] = sm, step
                diffs = [abs(b - a) for a, b in zip(hist, hist[1:])]
                sigma = statistics.median(diffs) / (0.6745 * math.sqrt(2)) if len(diffs) >= 3 else 0.0
                sigma_sm = sigma / math.sqrt(w)
                rise = st["peak"] - st["start"]
                drop = st["peak"] - sm
                significant_rise = rise > max(6 * sigma, 0.05 * max(abs(st["start"]), SWING_FLOOR))
                collapsed = significant_rise and step > st["peak_step"] and \
                    drop >= max(h.collapse_drop * rise, 4 * sigma_sm)
                n = self.sustained("collapse", collapsed)   # 2 steps in a row: not one noisy dip
                if n >= 2 and st["armed"]:
                    st["armed"] = False
                    ch, lines = A.for_reward_collapse(mon.recipe)
                    msg = (f"Reward rose {A.fmt(_rd(st['start'], 3))} -> {A.fmt(_rd(st['peak'], 3))} "
                           f"(peak at step {st['peak_step']}) then collapsed to {A.fmt(_rd(sm, 3))} at step {step}"
                           f" (-{drop / rise * 100:.0f}% of the rise): reward hacking / reward-model overfitting")
                    out.append(Event(step, "reward_collapse", "error", msg,
                                     {"start": _rd(st["start"]), "peak": _rd(st["peak"]),
                                      "peak_step": st["peak_step"], "now": _rd(sm),
                                      "drop_of_rise": _rd(drop / rise, 3)}, lines, ch))
                elif rise > 0 and drop < 0.5 * h.collapse_drop * rise:
                    st["armed"] = True  # recovered toward the peak: a later collapse is a new episode
        # eval reward falling while the train reward holds or rises
        ev = v.get("eval/reward")
        if ev is not None and math.isfinite(ev) and r is not None and math.isfinite(r):
            evs = st["eval"] + [[step, ev, r]]
            st["eval"] = evs[-HISTORY:]
            if len(evs) >= 5:
                best = max(evs[:-3], key=lambda e: e[1])
                first = evs[0]
                rise = best[1] - first[1]
                need = max(h.collapse_drop * rise, 0.2 * max(abs(best[1]), SWING_FLOOR))
                last2 = evs[-3:]   # three evals in a row below the best: not eval noise
                train_now = statistics.fmean(mon.recent("reward/mean", h.window - 1) + [r])
                falling = (best[0] < last2[0][0] and rise > 0.1 * max(abs(best[1]), SWING_FLOOR)
                           and all(best[1] - e[1] >= need for e in last2) and train_now >= best[2])
                if falling and st["hack_armed"]:
                    st["hack_armed"] = False
                    ch, lines = A.for_reward_collapse(mon.recipe)
                    out.append(Event(step, "reward_hacking", "error",
                                     f"Eval reward fell {A.fmt(_rd(best[1], 3))} -> {A.fmt(_rd(ev, 3))} "
                                     f"(best at step {best[0]}) while the train reward kept rising"
                                     f" ({A.fmt(_rd(best[2], 3))} -> {A.fmt(_rd(train_now, 3))}): reward hacking",
                                     {"eval_best": _rd(best[1]), "eval_now": _rd(ev), "best_step": best[0],
                                      "train_reward": _rd(train_now)}, lines, ch))
                elif ev >= best[1]:
                    st["hack_armed"] = True
        return out


class Sustained(Detector):
    """A condition on one metric held for `n` consecutive steps."""
    name = ""
    key = ""
    severity = "warning"

    def steps_needed(self, mon) -> int:
        return mon.h.window

    def condition(self, mon, x: float) -> bool:
        raise NotImplementedError

    def event(self, mon, step, x, n) -> Event:
        raise NotImplementedError

    def ready(self, mon) -> bool:
        return True

    def check(self, mon, step, v, fired):
        x = v.get(self.key)
        if x is None or not math.isfinite(x) or not self.ready(mon):
            return []
        n = self.sustained(self.key, self.condition(mon, x))
        if n == 0:
            self.state["armed"] = True
            return []
        if n >= self.steps_needed(mon) and self.state["armed"]:
            self.state["armed"] = False
            return [self.event(mon, step, x, n)]
        return []


class EntropyCollapse(Sustained):
    name = "entropy_collapse"
    key = "actor/entropy"

    def condition(self, mon, x):
        return x < mon.h.entropy_floor

    def event(self, mon, step, x, n):
        ch, lines = A.for_entropy_collapse(mon.recipe)
        start = mon.first("actor/entropy")
        return Event(step, "entropy_collapse", "warning",
                     f"Entropy collapsed to {A.fmt(_rd(x, 3))} < {A.fmt(mon.h.entropy_floor)} nats/token for {n} steps"
                     f" (since step {step - n + 1}; started at {A.fmt(_rd(start, 3)) if start is not None else '?'})",
                     {"entropy": _rd(x), "floor": mon.h.entropy_floor, "start": start, "steps": n}, lines, ch)


class LengthCollapse(Sustained):
    name = "length_collapse"
    key = "response/length_mean"

    def ready(self, mon):
        return len(mon.hist.get(self.key, [])) >= mon.h.window and mon.first_mean(self.key) is not None

    def condition(self, mon, x):
        return x < mon.h.length_collapse * mon.first_mean(self.key)

    def event(self, mon, step, x, n):
        start = mon.first_mean(self.key)
        ch, lines = A.for_length_collapse(mon.recipe)
        return Event(step, "length_collapse", "warning",
                     f"Response length collapsed to {A.fmt(_rd(x, 3))} tokens, {x / start * 100:.0f}% of its start "
                     f"{A.fmt(_rd(start, 3))} (< {mon.h.length_collapse * 100:.0f}%) for {n} steps",
                     {"length": _rd(x), "start": _rd(start), "ratio": _rd(x / start, 3), "steps": n}, lines, ch)


class LengthRunaway(Sustained):
    name = "length_runaway"
    key = "response/length_mean"

    def condition(self, mon, x):
        return x > mon.h.length_runaway * mon.recipe.rollout.max_new_tokens

    def event(self, mon, step, x, n):
        mnt = mon.recipe.rollout.max_new_tokens
        ch, lines = A.for_length_runaway(mon.recipe)
        return Event(step, "length_runaway", "warning",
                     f"Response length runaway: mean {A.fmt(_rd(x, 3))} tokens is {x / mnt * 100:.0f}% of "
                     f"rollout.max_new_tokens {mnt} for {n} steps (responses are being truncated)",
                     {"length": _rd(x), "max_new_tokens": mnt, "steps": n}, lines, ch)


class SyncSlow(Sustained):
    name = "sync_slow"
    key = "timing/sync_ms"

    def steps_needed(self, mon):
        return 2

    def ready(self, mon):
        # the first sync includes warm-up (allocations, compilation): ignore it
        return mon.n >= 1

    def condition(self, mon, x):
        return x > mon.h.sync_ms

    def event(self, mon, step, x, n):
        ch, lines = A.for_sync_slow(mon.recipe)
        return Event(step, "sync_slow", "warning",
                     f"Actor resharding time: {x:.0f} ms (> {mon.h.sync_ms:.0f} ms) for {n} steps at step {step}",
                     {"sync_ms": _rd(x), "threshold_ms": mon.h.sync_ms, "steps": n}, lines, ch)


class StaleWeights(Sustained):
    name = "stale_weights"
    key = "rollout/logprob_diff_mean"

    def steps_needed(self, mon):
        return 1  # the first step after a (missed) sync is the test

    def condition(self, mon, x):
        return x > mon.recipe.rollout.logprob_tolerance

    def event(self, mon, step, x, n):
        tol = mon.recipe.rollout.logprob_tolerance
        ch, lines = A.for_stale_weights(mon.recipe)
        return Event(step, "stale_weights", "warning",
                     f"Stale rollout weights: mean |rollout logp - actor logp| {A.fmt(_rd(x, 3))} > "
                     f"rollout.logprob_tolerance {A.fmt(tol)} for {n} steps (step {step})",
                     {"logprob_diff_mean": _rd(x), "tolerance": tol, "steps": n}, lines, ch)


DETECTORS = [NonFinite, SkippedStep, KLSpike, GradSpike, RewardCollapse, KLHigh, RewardSwing,
             EntropyCollapse, LengthCollapse, LengthRunaway, StaleWeights, SyncSlow]


# ------------------------------------------------------------------------------------------

class HealthMonitor:
    """Runs every detector on each step's metrics; appends events to RUN_DIR/events.jsonl."""

    def __init__(self, recipe=None, run_dir=None, enabled: Optional[bool] = None, write: bool = True,
                 log_events: Optional[bool] = None):
        self.recipe = recipe if recipe is not None else default_recipe()
        self.h = self.recipe.health
        self.enabled = self.h.enabled if enabled is None else enabled
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.write = write
        # live runs log each event on the "rltune" logger (users grep `Critic loss NaN at step N`)
        self.log_events = write if log_events is None else log_events
        self.detectors = [cls() for cls in DETECTORS]
        self.hist: dict[str, list[float]] = {}
        self.firsts: dict[str, list[float]] = {}   # first `window` values per metric
        self.n = 0                                   # steps observed
        self.step = 0                                # last step observed
        self.events: list[Event] = []
        r = self.recipe
        self.sequences_per_step = r.gen_calls_per_step * r.rollout.batch_size

    # -- history helpers used by detectors
    def recent(self, key: str, n: int) -> list[float]:
        return list(self.hist.get(key, [])[-n:]) if n > 0 else []

    def last(self, key: str, default: float) -> float:
        h = self.hist.get(key)
        return h[-1] if h else default

    def first(self, key: str) -> Optional[float]:
        f = self.firsts.get(key)
        return f[0] if f else None

    def first_mean(self, key: str) -> Optional[float]:
        f = self.firsts.get(key)
        return statistics.fmean(f) if f and len(f) >= min(self.h.window, 1) else None

    # -- the per-step entry point
    def observe(self, metrics: dict) -> list[Event]:
        step = metrics.get("step")
        step = int(step) if _finite(_num(step)) else self.step + 1
        v: dict[str, float] = {}
        for k, x in metrics.items():
            if k == "step":
                continue
            f = _num(x)
            if f is not None:
                v[k] = f
        fired: list[Event] = []
        if self.enabled:
            for det in self.detectors:
                fired.extend(det.check(self, step, v, fired))
        for k, x in v.items():
            if math.isfinite(x):
                h = self.hist.setdefault(k, [])
                h.append(x)
                if len(h) > HISTORY:
                    del h[: len(h) - HISTORY]
                f = self.firsts.setdefault(k, [])
                if len(f) < self.h.window:
                    f.append(x)
        self.n += 1
        self.step = step
        self.events.extend(fired)
        if self.log_events:
            for e in fired:
                log.log(logging.ERROR if e.severity == "error" else logging.WARNING
                        if e.severity == "warning" else logging.INFO, "%s", e)
        if self.write:
            append_events(self.run_dir, fired)
        return fired

    # -- checkpoints
    def state_dict(self) -> dict:
        return {"version": 1, "n": self.n, "step": self.step,
                "hist": {k: list(v) for k, v in self.hist.items()},
                "firsts": {k: list(v) for k, v in self.firsts.items()},
                "detectors": {d.__class__.__name__: json.loads(json.dumps(d.state)) for d in self.detectors},
                "events": [e.to_dict() for e in self.events[-200:]]}

    def load_state_dict(self, state: dict) -> None:
        self.n = int(state.get("n", 0))
        self.step = int(state.get("step", 0))
        self.hist = {k: [float(x) for x in v] for k, v in state.get("hist", {}).items()}
        self.firsts = {k: [float(x) for x in v] for k, v in state.get("firsts", {}).items()}
        dets = state.get("detectors", {})
        for d in self.detectors:
            if d.__class__.__name__ in dets:
                d.state = json.loads(json.dumps(dets[d.__class__.__name__]))
        self.events = [Event.from_dict(e) for e in state.get("events", [])]
        if self.write:
            truncate_events_after(self.run_dir, self.step)


def rank_key(e: Event) -> tuple:
    sev = {"error": 0, "warning": 1, "info": 2}.get(e.severity, 3)
    kind = KIND_RANK.index(e.kind) if e.kind in KIND_RANK else len(KIND_RANK)
    return (kind, sev, e.step)


def verdict_event(events: list[Event]) -> Optional[Event]:
    """The most likely root cause among problem events (warning/error)."""
    probs = [e for e in events if e.severity in ("warning", "error")]
    return min(probs, key=rank_key) if probs else None
