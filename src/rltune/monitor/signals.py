"""The detectors: one class per symptom (docs/health.md lists every kind, its severity and when it
fires). Each warning is a departure from the run's own recent behaviour or a hard fault (non-finite
values, stale weights); a fixed playbook figure that healthy runs cross gives at most an `info`.
Every event names its role in `numbers["role"]` (actor, critic, rollout, reward, data), and its
message and first recipe change speak of that same role. No torch import.
"""

from __future__ import annotations

import math
import statistics

from . import advice as A
from .base import (HISTORY, SWING_FLOOR, TOKEN_KL, Detector, Event, Sustained, _finite, _pct, _rd, kl_key, mean,
                   rising)


class NonFinite(Detector):
    name = "nonfinite"
    GROUPS = [
        ("critic_nan", "critic", [("critic/loss", "Critic loss"), ("critic/grad_norm", "Critic grad norm")],
         A.for_critic_nan),
        ("actor_nan", "actor", [("actor/loss", "Actor loss"), ("actor/grad_norm", "Actor grad norm"),
                                ("kl", "KL")], A.for_actor_nan),
        ("reward_nan", "reward", [("reward/mean", "Reward")], A.for_reward_nan),
    ]

    def initial(self):
        return {"armed": {g[0]: True for g in self.GROUPS}}

    def check(self, mon, step, v, fired):
        out = []
        for kind, role, keys, adv in self.GROUPS:
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
            nums["role"] = role
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
                      f"Step {step} skipped: non-finite actor loss or gradient ({int(s)} skipped so far;"
                      f" the run stops after {limit} in a row)",
                      {"skipped_steps": int(s), "role": "actor"}, lines, ch)]


class RewardSwing(Detector):
    """Early reward swings, up and down, beyond the batch's own sampling noise around the recent
    trend (actor lr too high). Noise: reward/std / sqrt(sequences per step)."""
    name = "reward_swing"

    def initial(self):
        return {"armed": True, "devs": []}  # [step, deviation in standard errors] of the recent window

    def check(self, mon, step, v, fired):
        r = v.get("reward/mean")
        h = mon.h
        if r is None or not math.isfinite(r):
            return []
        hist = mon.recent("reward/mean", h.window)
        if len(hist) < max(3, h.warmup_steps) or mon.n > h.swing_steps:
            return []
        # the recent trend, extrapolated one step (a rising reward is not a swing)
        n = len(hist)
        xs = range(n)
        xm, ym = (n - 1) / 2, statistics.fmean(hist)
        sxx = sum((x - xm) ** 2 for x in xs)
        slope = sum((x - xm) * (y - ym) for x, y in zip(xs, hist)) / sxx
        pred = ym + slope * (n - xm)
        extrap = math.sqrt(1 + 1 / n + (n - xm) ** 2 / sxx)   # error of a one-step extrapolation
        std = v.get("reward/std")
        if not _finite(std):
            stds = mon.recent("reward/std", h.window)
            std = statistics.fmean(stds) if stds else None
        if std is None:   # no std logged: the run's own step-to-step noise
            diffs = [abs(b - a) for a, b in zip(hist, hist[1:])]
            se = statistics.median(diffs) / (0.6745 * math.sqrt(2)) if diffs else 0.0
        else:
            se = std / math.sqrt(max(1, mon.sequences_per_step))
        se = max(se, 1e-3 * max(abs(ym), SWING_FLOOR))
        z = (r - pred) / (se * extrap)
        big = abs(z) > h.swing_sigmas
        devs = [d for d in self.state["devs"] if d[0] > step - h.window]
        if big:
            devs.append([step, _rd(z, 3)])
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
        rel = (r - pred) / max(abs(pred), SWING_FLOOR)
        msg = (f"Reward swings {max(up):+.1f}/{min(down):+.1f} standard errors around its recent trend at step {step}"
               f" (now {A.fmt(_rd(r, 3))} vs {A.fmt(_rd(pred, 3))} expected, {_pct(rel)}; batch noise ±{A.fmt(_rd(se, 2))},"
               f" threshold {A.fmt(h.swing_sigmas)} standard errors): actor lr too high")
        return [Event(step, "reward_swing", "warning", msg,
                      {"reward": _rd(r), "expected": _rd(pred), "swing_up": max(up), "swing_down": min(down),
                       "std_error": _rd(se), "sigmas": h.swing_sigmas, "role": "actor"}, lines, ch)]


RUNAWAY, RUNAWAY_GROWTH = 2.0, 1.5  # x the level, x per step: a KL this high growing this fast is a fault


class KLHigh(Detector):
    """KL above the playbook level for `window` steps. A warning (kl_high) when the reward has stopped
    improving meanwhile and the KL is still climbing (window mean >= 1.2x the window before, or too
    few steps to tell): drift that buys nothing; or when it runs away (window mean above 2x the
    level, still growing >= 1.5x per step), whatever the reward does. While the reward still improves and the KL is not running away, an info
    (kl_level); a KL that levelled off high stays quiet (it was reported when it climbed)."""
    name = "kl_high"

    def initial(self):
        return {"armed": True, "info_armed": True}

    def check(self, mon, step, v, fired):
        key = kl_key(v)
        kl = v.get(key)
        if kl is None or not math.isfinite(kl):
            return []
        h = mon.h
        lab = "KL per token" if key == TOKEN_KL else "KL"
        n = self.sustained("kl", kl > h.kl_high)
        if n == 0:
            self.state["armed"] = True
            self.state["info_armed"] = True
            return []
        if n < h.window or not self.state["armed"]:
            return []
        window = mon.recent(key, h.window - 1) + [kl]
        r_now = v.get("reward/mean")
        r_hist = mon.recent("reward/mean", 3 * h.window) + ([r_now] if _finite(r_now) else [])
        improving = mon.reward_improving(r_hist, v)
        creeping = len(r_hist) >= 2 * h.window and 0 < (
            statistics.fmean(r_hist[-h.window:]) - statistics.fmean(r_hist[:h.window]))
        kl_mean = statistics.fmean(window)
        kh = mon.recent(key, 2 * h.window - 1) + [kl]
        climbing = len(kh) < 2 * h.window or statistics.fmean(kh[h.window:]) >= 1.2 * statistics.fmean(kh[:h.window])
        # a KL at twice the level that still grows >= 1.5x per step over the window is a runaway,
        # reward gain or not (a fast but sound learner grows ~1.2x per step by then)
        first = window[0]
        growth = (kl / first) ** (1.0 / (len(window) - 1)) if first > 0 and len(window) > 1 else 1.0
        runaway = kl_mean > RUNAWAY * h.kl_high and growth >= RUNAWAY_GROWTH
        if not improving and not climbing:
            return []
        if improving and not runaway:
            if not self.state["info_armed"]:
                return []
            self.state["info_armed"] = False
            ch, lines = A.for_kl_level(mon.recipe, _rd(kl_mean, 3))
            return [Event(step, "kl_level", "info",
                          f"{lab} {A.fmt(_rd(kl, 3))} > {A.fmt(h.kl_high)} for {n} steps (since step {step - n + 1})"
                          f" while the reward still improves: the policy moves far from the reference to earn it",
                          {"kl": _rd(kl), "kl_mean": _rd(kl_mean), "threshold": h.kl_high, "steps": n,
                           "kl_key": key, "role": "actor"}, lines, ch)]
        self.state["armed"] = False
        ch, lines = A.for_kl_high(mon.recipe, kl_mean, creeping)
        why = (f"running away ({growth:.1f}x per step)" if runaway
               else "climbing while the reward has stopped improving")
        msg = (f"{lab} {A.fmt(_rd(kl, 3))} > {A.fmt(h.kl_high)} sustained for {n} steps (since step {step - n + 1})"
               f" and {why}: policy drifting from the reference; raise the KL coefficient")
        return [Event(step, "kl_high", "warning", msg,
                      {"kl": _rd(kl), "kl_mean": _rd(kl_mean), "threshold": h.kl_high, "steps": n,
                       "kl_coef": v.get("kl_coef", mon.recipe.algorithm.kl.coef), "kl_key": key, "role": "actor"}, lines, ch)]


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
            self.state["armed"] = True
            return []
        if not self.state["armed"]:
            return []
        self.state["armed"] = False
        ch, lines = A.for_spike(mon.recipe)
        msg = (f"KL spike at step {step}: {A.fmt(_rd(max(hist[-1], 0.0), 3))} -> {A.fmt(_rd(kl, 3))} "
               f"({kl / ref:.0f}x its recent max {A.fmt(_rd(ref, 3))}); reward can still look fine: the spike is the warning")
        return [Event(step, "kl_spike", "error", msg,
                      {"kl": _rd(kl), "recent_max": _rd(ref), "factor": _rd(kl / ref, 3), "role": "actor"}, lines, ch)]


ROLES = (("actor", "actor/grad_norm", "Actor"), ("critic", "critic/grad_norm", "Critic"))


class GradSpike(Detector):
    """Grad-norm spikes far above the running median (per role)."""
    name = "grad_spike"

    def initial(self):
        return {"armed": {"actor": True, "critic": True}}

    def check(self, mon, step, v, fired):
        out = []
        h = mon.h
        for role, key, lab in ROLES:
            g = v.get(key)
            if g is None or not math.isfinite(g):
                continue
            hist = mon.recent(key, 4 * h.window)
            if len(hist) < max(2, h.warmup_steps):
                continue
            med = max(statistics.median(hist), 1e-8)
            if g <= h.grad_spike_factor * med:
                self.state["armed"][role] = True
                continue
            if not self.state["armed"][role]:
                continue
            self.state["armed"][role] = False
            ch, lines = A.for_spike(mon.recipe, role)
            out.append(Event(step, "grad_spike", "error",
                             f"{lab} grad-norm spike at step {step}: {A.fmt(_rd(g, 3))} is "
                             f"{g / med:.0f}x its running median {A.fmt(_rd(med, 3))}",
                             {"grad_norm": _rd(g), "running_median": _rd(med),
                              "factor": _rd(g / med, 3), "role": role}, lines, ch))
        return out


class GradClip(Detector):
    """Pre-clip grad norms above `ROLE.grad_clip` on most steps. Ordinary in healthy runs: an info
    (the effective lr is lower than set). A warning when it coincides with a rising loss (critic) or
    a rising KL / actor loss (actor), or lasts `clip_long_steps`."""
    name = "grad_clip"

    def initial(self):
        return {"at": {"actor": [], "critic": []}, "info_armed": {"actor": True, "critic": True},
                "warn_armed": {"actor": True, "critic": True}, "long": {"actor": [], "critic": []}}

    def _rising(self, mon, role, v) -> tuple[bool, str]:
        """Critic: its loss doubled window over window (every value of the last window above the
        previous one's max). Actor: KL did so, at a level that matters (> half health.kl_high)."""
        w = mon.h.window
        key, lab, floor = (("critic/loss", "critic loss", 1e-3) if role == "critic"
                           else (kl_key(v), "KL", 0.5 * mon.h.kl_high))
        if key not in v or not math.isfinite(v[key]):
            return False, ""
        hist = mon.recent(key, 2 * w - 1) + [v[key]]
        if len(hist) < 2 * w:
            return False, ""
        prev, cur = hist[:w], hist[w:]
        if rising(prev, cur, 2.0, floor) and min(cur) > max(prev):
            return True, f"{lab} rising {A.fmt(_rd(mean(prev), 3))} -> {A.fmt(_rd(mean(cur), 3))}"
        return False, ""

    def check(self, mon, step, v, fired):
        out = []
        h = mon.h
        for role, key, lab in ROLES:
            g = v.get(key)
            clip = getattr(mon.recipe, role).grad_clip
            if g is None or not math.isfinite(g) or clip is None:
                continue
            clipped = g > clip
            span = 2 * h.window
            at = [s for s in self.state["at"][role] if s > step - span] + ([step] if clipped else [])
            self.state["at"][role] = at
            lng = (self.state["long"][role] + [1 if clipped else 0])[-h.clip_long_steps:]
            self.state["long"][role] = lng
            if not at:
                self.state["info_armed"][role] = True
                self.state["warn_armed"][role] = True
                continue
            if len(at) < h.window or not clipped:
                continue
            lr = getattr(mon.recipe, role).lr
            nums = {"grad_norm": _rd(g), "grad_clip": clip, "steps_clipped": len(at), "of_steps": span,
                    f"{role}_lr": lr, "role": role}
            rise, why = self._rising(mon, role, v)
            long_ = len(lng) >= h.clip_long_steps and sum(lng) >= 0.9 * len(lng)
            if (rise or long_) and self.state["warn_armed"][role]:
                self.state["warn_armed"][role] = False
                self.state["info_armed"][role] = False
                reason = why if rise else f"on {sum(lng)} of the last {len(lng)} steps"
                ch, lines = A.for_grad_clip(mon.recipe, role, True, reason)
                out.append(Event(step, "grad_clip", "warning",
                                 f"{lab} grad norm {A.fmt(_rd(g, 3))} above {role}.grad_clip {A.fmt(clip)} on {len(at)} of "
                                 f"the last {span} steps at step {step}, with {reason}: {role} lr too high",
                                 {**nums, "reason": reason}, lines, ch))
            elif self.state["info_armed"][role]:
                self.state["info_armed"][role] = False
                ch, lines = A.for_grad_clip(mon.recipe, role, False)
                out.append(Event(step, "grad_clip", "info",
                                 f"{lab} grad norm {A.fmt(_rd(g, 3))} above {role}.grad_clip {A.fmt(clip)} on {len(at)} of "
                                 f"the last {span} steps (step {step}): the effective {role} lr is lower than"
                                 f" {role}.lr {A.fmt(lr)}", nums, lines, ch))
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
                                      "drop_of_rise": _rd(drop / rise, 3), "role": "reward"}, lines, ch))
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
                                      "train_reward": _rd(train_now), "role": "reward"}, lines, ch))
                elif ev >= best[1]:
                    st["hack_armed"] = True
        return out




class EntropyCollapse(Sustained):
    name = "entropy_collapse"
    key = "actor/entropy"

    def condition(self, mon, x):
        return x < mon.h.entropy_floor

    def event(self, mon, step, x, n):
        ch, lines = A.for_entropy_collapse(mon.recipe)
        start = mon.first("actor/entropy")
        return Event(step, "entropy_collapse", "warning",
                     f"Policy entropy collapsed to {A.fmt(_rd(x, 3))} < {A.fmt(mon.h.entropy_floor)} nats/token for {n} steps"
                     f" (since step {step - n + 1}; started at {A.fmt(_rd(start, 3)) if start is not None else '?'})",
                     {"entropy": _rd(x), "floor": mon.h.entropy_floor, "start": start, "steps": n, "role": "actor"},
                     lines, ch)


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
                     {"length": _rd(x), "start": _rd(start), "ratio": _rd(x / start, 3), "steps": n, "role": "actor"},
                     lines, ch)


class LengthRunaway(Sustained):
    """Mean response length grown well beyond its start: to `length_growth` x the start, or pinned at
    rollout.max_new_tokens after starting clearly below it. A run whose responses start at the limit
    (a short max_new_tokens) has not run away."""
    name = "length_runaway"
    key = "response/length_mean"

    def ready(self, mon):
        return len(mon.hist.get(self.key, [])) >= mon.h.window and mon.first_mean(self.key) is not None

    def condition(self, mon, x):
        start = max(mon.first_mean(self.key), 1e-9)
        cap = mon.h.length_runaway * mon.recipe.rollout.max_new_tokens
        return x > mon.h.length_growth * start or (x > cap and x > 1.25 * start)

    def event(self, mon, step, x, n):
        mnt = mon.recipe.rollout.max_new_tokens
        start = mon.first_mean(self.key)
        ch, lines = A.for_length_runaway(mon.recipe)
        return Event(step, "length_runaway", "warning",
                     f"Response length runaway: mean {A.fmt(_rd(x, 3))} tokens, {x / start:.1f}x its start "
                     f"{A.fmt(_rd(start, 3))} and {x / mnt * 100:.0f}% of rollout.max_new_tokens {mnt}, for {n} steps",
                     {"length": _rd(x), "start": _rd(start), "max_new_tokens": mnt, "steps": n, "role": "rollout"},
                     lines, ch)


class SyncSlow(Sustained):
    """Weight sync slower than the threshold for the model size (playbook: 200 ms at 7B, scaled up
    for larger models), 2 steps in a row; small models: 5x the run's own early syncs when those are
    slower (checked once the first window of syncs is known). The first sync (warm-up) is ignored."""
    name = "sync_slow"
    key = "timing/sync_ms"

    def steps_needed(self, mon):
        return 2

    def ready(self, mon):
        if mon.sync_adaptive():
            return len(mon.firsts.get(self.key, [])) >= mon.h.window
        return mon.n >= 1

    def condition(self, mon, x):
        return x > mon.sync_threshold()

    def event(self, mon, step, x, n):
        ch, lines = A.for_sync_slow(mon.recipe)
        thr = mon.sync_threshold()
        return Event(step, "sync_slow", "warning",
                     f"Actor resharding time: {x:.0f} ms (> {thr:.0f} ms) for {n} steps at step {step}",
                     {"sync_ms": _rd(x), "threshold_ms": _rd(thr), "steps": n, "role": "rollout"}, lines, ch)


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
                     {"logprob_diff_mean": _rd(x), "tolerance": tol, "steps": n, "role": "rollout"}, lines, ch)


class LogprobDrift(Sustained):
    """rollout/logprob_diff_mean trending up: its window mean `logprob_drift` x its start and above
    half the tolerance, still below it (above it the stale-weight guard fires)."""
    name = "logprob_drift"
    key = "rollout/logprob_diff_mean"

    def ready(self, mon):
        return len(mon.hist.get(self.key, [])) >= 2 * mon.h.window

    def condition(self, mon, x):
        w = mon.h.window
        cur = mon.recent(self.key, w - 1) + [x]
        start = max(mon.first_mean(self.key) or 0.0, 1e-6)
        tol = mon.recipe.rollout.logprob_tolerance
        return mean(cur) > mon.h.logprob_drift * start and 0.5 * tol < x <= tol and mean(cur) > 0.5 * tol

    def event(self, mon, step, x, n):
        w = mon.h.window
        cur = mean(mon.recent(self.key, w - 1) + [x])
        start = mon.first_mean(self.key)
        ch, lines = A.for_logprob_drift(mon.recipe)
        return Event(step, "logprob_drift", "warning",
                     f"Rollout/trainer log-prob mismatch growing: mean |rollout logp - actor logp| {A.fmt(_rd(cur, 3))}"
                     f" over the last {w} steps, {cur / max(start, 1e-9):.0f}x its start {A.fmt(_rd(start, 3))}"
                     f" (step {step})",
                     {"logprob_diff_mean": _rd(cur), "start": _rd(start), "steps": n,
                      "tolerance": mon.recipe.rollout.logprob_tolerance, "role": "rollout"}, lines, ch)


class ISWeightExtreme(Sustained):
    """rollout/is_weight_max (pi_trainer / pi_rollout, max over tokens) above `is_weight_max` and 5x
    its running median, 2 steps in a row."""
    name = "is_weight_extreme"
    key = "rollout/is_weight_max"

    def steps_needed(self, mon):
        return 2

    def condition(self, mon, x):
        hist = mon.recent(self.key, 4 * mon.h.window)
        med = statistics.median(hist) if hist else 1.0
        return x > mon.h.is_weight_max and x > 5 * max(med, 1.0)

    def event(self, mon, step, x, n):
        ch, lines = A.for_is_weight(mon.recipe)
        hist = mon.recent(self.key, 4 * mon.h.window)
        nums = {"is_weight_max": _rd(x), "running_median": _rd(statistics.median(hist)) if hist else None,
                "threshold": mon.h.is_weight_max, "steps": n, "role": "rollout"}
        capped = mon.last("rollout/is_capped_frac", None)
        if capped is not None:
            nums["is_capped_frac"] = _rd(capped)
        return Event(step, "is_weight_extreme", "warning",
                     f"Importance ratio extreme: rollout/is_weight_max {A.fmt(_rd(x, 3))} > {A.fmt(mon.h.is_weight_max)}"
                     f" for {n} steps (step {step}): rollout engine and trainer disagree", nums, lines, ch)


class ZeroAdvantage(Sustained):
    """The share of groups whose samples all scored the same above `zero_adv_max` for 2 x window
    steps: rollout/zero_std_frac (every generated group, before dynamic sampling drops any) where
    logged, else batch/zero_adv_frac (other tools' logs). Skipped when neither is logged."""
    name = "zero_advantage"
    key = "batch/zero_adv_frac"

    def check(self, mon, step, v, fired):
        self.key = "rollout/zero_std_frac" if "rollout/zero_std_frac" in v else "batch/zero_adv_frac"
        return super().check(mon, step, v, fired)

    def steps_needed(self, mon):
        return 2 * mon.h.window

    def condition(self, mon, x):
        return x > mon.h.zero_adv_max

    def event(self, mon, step, x, n):
        ch, lines = A.for_zero_adv(mon.recipe)
        if getattr(mon.recipe.algorithm, "filter_groups", None) is not None and x < 1:
            lines.append(f"dynamic sampling (algorithm.filter_groups) generates ~{1 / (1 - x):.1f}x the "
                         "sequences it trains on at this share")
        return Event(step, "zero_advantage", "warning",
                     f"{x * 100:.0f}% of the groups have zero advantage (> {mon.h.zero_adv_max * 100:.0f}%) for {n} steps"
                     f" (since step {step - n + 1}): the batch teaches almost nothing",
                     {"zero_adv_frac": _rd(x), "threshold": mon.h.zero_adv_max, "steps": n, "role": "data"}, lines, ch)


class ClipfracHigh(Sustained):
    """actor/clipfrac above `clipfrac_max` and 3x its start, for window steps."""
    name = "clipfrac_high"
    key = "actor/clipfrac"

    def ready(self, mon):
        return mon.first_mean(self.key) is not None and len(mon.hist.get(self.key, [])) >= mon.h.window

    def condition(self, mon, x):
        return x > mon.h.clipfrac_max and x > 3 * mon.first_mean(self.key)

    def event(self, mon, step, x, n):
        ch, lines = A.for_clipfrac(mon.recipe)
        start = mon.first_mean(self.key)
        return Event(step, "clipfrac_high", "warning",
                     f"Actor clip fraction {A.fmt(_rd(x, 3))} > {A.fmt(mon.h.clipfrac_max)} for {n} steps (started at"
                     f" {A.fmt(_rd(start, 3))}): actor updates run away from the rollout policy; actor lr too high",
                     {"clipfrac": _rd(x), "start": _rd(start), "threshold": mon.h.clipfrac_max, "steps": n,
                      "role": "actor"}, lines, ch)


DETECTORS = [NonFinite, SkippedStep, KLSpike, GradSpike, RewardCollapse, KLHigh, RewardSwing, GradClip,
             EntropyCollapse, LengthCollapse, LengthRunaway, StaleWeights, LogprobDrift, ISWeightExtreme,
             ZeroAdvantage, ClipfracHigh, SyncSlow]
