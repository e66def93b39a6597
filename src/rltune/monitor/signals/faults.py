"""Hard faults: non-finite losses, gradients, KL or reward, and steps the trainer skipped."""

from __future__ import annotations

import math

from .. import advice as A
from ..base import Detector, Event


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
