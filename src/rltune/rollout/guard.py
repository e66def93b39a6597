"""Stale-weight guard: does the rollout engine sample from the actor's current weights?

The rollout engine returns the log-probs of the tokens it sampled (`rollout_logp`). The
trainer computes the actor's log-probs of the same tokens on its first micro-batch. Right
after a weight sync both are log-probs of one distribution (up to kernel/precision noise),
so a mean absolute difference beyond `rollout.logprob_tolerance` means the engine is
sampling from other weights than the actor's: a missed or partial sync ("stale weights").
A stale rollout engine does not crash anything; PPO's importance ratio silently absorbs the
mismatch and training drifts, which is why this is checked every step.
"""

from __future__ import annotations


def logprob_diff(rollout_logp, actor_logp, mask) -> tuple[float, float]:
    """(mean, max) of |rollout_logp - actor_logp| over the tokens where `mask` is set.

    All three are (B, T) tensors (the actor's may carry grad: it is detached here).
    Returns (0.0, 0.0) when the mask selects nothing.
    """
    import torch

    m = mask.to(torch.bool)
    if not bool(m.any()):
        return 0.0, 0.0
    diff = (rollout_logp.detach().float() - actor_logp.detach().float()).abs()[m]
    diff = torch.nan_to_num(diff, nan=float("inf"))
    return float(diff.mean()), float(diff.max())


class StaleWeightGuard:
    """Compares the mean log-prob difference with a tolerance; returns a warning or None.

    Warns once per distinct episode: after a warning it stays quiet until the difference
    has come back within tolerance (so a persistent problem is one line, not one per step),
    unless `repeat=True`.
    """

    def __init__(self, tolerance: float = 0.05, repeat: bool = False):
        if tolerance <= 0:
            raise ValueError("tolerance must be > 0")
        self.tolerance = float(tolerance)
        self.repeat = repeat
        self.tripped = 0          # how many checks exceeded the tolerance
        self._warned = False
        self.last: tuple[float, float] | None = None

    def check(self, step: int, mean: float, max_: float) -> str | None:
        self.last = (mean, max_)
        if mean == mean and mean <= self.tolerance:  # not NaN and within tolerance
            self._warned = False
            return None
        self.tripped += 1
        if self._warned and not self.repeat:
            return None
        self._warned = True
        return (f"rollout log-probs differ from the actor's by mean {mean:.2g} (max {max_:.2g}) "
                f"at step {step}: the rollout engine may be sampling from stale weights — check "
                f"weight sync (tolerance rollout.logprob_tolerance={self.tolerance:g})")
