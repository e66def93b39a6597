"""The knob values the trainer reads every step and autotune may change. No torch."""

from __future__ import annotations

from dataclasses import dataclass

# knob name -> the recipe key it starts from (and whose lint bounds autotune respects)
KNOB_KEYS = {
    "actor_lr": "actor.lr",
    "critic_lr": "critic.lr",
    "kl_coef": "algorithm.kl.coef",
    "clip_range": "algorithm.clip_range",
    "entropy_coef": "algorithm.entropy_coef",
}


@dataclass
class Knobs:
    actor_lr: float
    critic_lr: float
    kl_coef: float
    clip_range: float
    entropy_coef: float

    @classmethod
    def from_recipe(cls, r) -> "Knobs":
        a = r.algorithm
        return cls(r.actor.lr, r.critic.lr, a.kl.coef, a.clip_range, a.entropy_coef)
