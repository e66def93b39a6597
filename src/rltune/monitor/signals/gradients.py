"""Gradients, per role (actor, critic): spikes against the running median, and clipping that sets
the step size."""

from __future__ import annotations

import math
import statistics
from itertools import chain

from .. import advice as A
from ..base import Detector, Event, _finite, _rd, kl_key, mean, reward_falling, rising


ROLES = (("actor", "actor/grad_norm", "Actor"), ("critic", "critic/grad_norm", "Critic"))


NO_GRADIENT = 1e-6   # a grad norm at or below this: a step without signal (all advantages zero)

class GradSpike(Detector):
    """Grad-norm spikes far above the running median of the steps that had a gradient (per role)."""
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
            # steps with no gradient at all (every advantage zero: nothing to learn from) set no
            # scale; against their ~0 median the first real gradient read as a 10^7x "spike"
            hist = [x for x in mon.recent(key, 4 * h.window) if x > NO_GRADIENT]
            if len(hist) < max(2, h.warmup_steps) or g <= NO_GRADIENT:
                continue
            med = statistics.median(hist)
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


# events that show harm while a role's gradients are clipped for long (the clip did not prevent it)
HARM_KINDS = {"actor": ("kl_spike", "grad_spike", "actor_nan", "skipped_step"),
              "critic": ("grad_spike", "critic_nan")}


def _kl_or_loss_rising(mon, role, v) -> str:
    """Critic: its loss doubled window over window (every value of the last window above the
    previous one's max). Actor: KL did so, at a level that matters (> half health.kl_high).
    Returns the reason, or "" when it does not rise."""
    w = mon.h.window
    key, lab, floor = (("critic/loss", "critic loss", 1e-3) if role == "critic"
                       else (kl_key(v), "KL", 0.5 * mon.h.kl_high))
    if key not in v or not math.isfinite(v[key]):
        return ""
    hist = mon.recent(key, 2 * w - 1) + [v[key]]
    if len(hist) < 2 * w:
        return ""
    prev, cur = hist[:w], hist[w:]
    if rising(prev, cur, 2.0, floor) and min(cur) > max(prev):
        return f"{lab} rising {A.fmt(_rd(mean(prev), 3))} -> {A.fmt(_rd(mean(cur), 3))}"
    return ""


def _recent_harm_event(mon, role, fired, since: int) -> str:
    """A spike or non-finite event of this role after step `since` (this step's included)."""
    for e in chain(fired, reversed(mon.events)):
        if e.step <= since:
            break
        if e.kind in HARM_KINDS[role] and e.numbers.get("role", role) == role:
            return f"a {e.kind} at step {e.step}"
    return ""


def _reward_falling(mon, v) -> str:
    """The reward's mean over the last 2 x window steps below that of the 2 x window before,
    beyond its noise (`reward_falling`)."""
    r = v.get("reward/mean")
    if not _finite(r):
        return ""
    w = 2 * mon.h.window
    fell = reward_falling(mon.recent("reward/mean", 2 * w - 1) + [r], w)
    return f"reward falling {A.fmt(_rd(fell[0], 3))} -> {A.fmt(_rd(fell[1], 3))}" if fell else ""


class GradClip(Detector):
    """Pre-clip grad norms above `ROLE.grad_clip` on most steps. Ordinary in healthy runs, also
    for hundreds of steps: an info (the effective lr is lower than set). A warning when it comes
    with harm: a rising loss (critic) or KL (actor); or, clipped on >= 90% of `clip_long_steps`
    steps, a spike / non-finite event of that role during the stretch or a falling reward."""
    name = "grad_clip"

    def initial(self):
        return {"at": {"actor": [], "critic": []}, "info_armed": {"actor": True, "critic": True},
                "warn_armed": {"actor": True, "critic": True}, "long": {"actor": [], "critic": []}}

    def _harm(self, mon, role, v, fired, step, long_steps: list[int]) -> str:
        """Why clipping here is a problem, or "" when it is not."""
        rise = _kl_or_loss_rising(mon, role, v)
        if rise:
            return rise
        if len(long_steps) < mon.h.clip_long_steps or sum(long_steps) < 0.9 * len(long_steps):
            return ""
        harm = (_recent_harm_event(mon, role, fired, step - len(long_steps))
                or _reward_falling(mon, v))
        return f"clipped on {sum(long_steps)} of the last {len(long_steps)} steps and {harm}" if harm else ""

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
            reason = self._harm(mon, role, v, fired, step, lng) if self.state["warn_armed"][role] else ""
            if reason:
                self.state["warn_armed"][role] = False
                self.state["info_armed"][role] = False
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
