"""KL penalties against a reference policy and KL-coefficient controllers.

Estimators follow J. Schulman, "Approximating KL Divergence" (2020,
http://joschu.net/blog/kl-approx.html). With samples from the current policy
``pi`` and ``d = logp - ref_logp``:

* ``k1 = d``                      (unbiased, high variance, can be negative)
* ``abs = |d|``
* ``k2 = 0.5 * d**2``             (biased, low variance)
* ``k3 = exp(-d) - (-d) - 1``     (unbiased, low variance, always >= 0)

The adaptive controller is the proportional controller of Ziegler et al. 2019,
"Fine-Tuning Language Models from Human Preferences", arXiv:1909.08593.
"""

from __future__ import annotations

from typing import Dict, Optional, Union

import torch

from .aggregate import _bool_mask, _zero_padding, last_token_index

__all__ = [
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "kl",
    "kl_in_reward",
    "kl_penalty",
    "make_kl_controller",
]

#: Valid values of ``algorithm.kl.estimator``.
KL_ESTIMATORS = ("k1", "k2", "k3", "abs")


def kl(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference policy.

    Shapes: ``logp``, ``ref_logp`` ``(B, T)`` (log-probs of the sampled tokens)
    -> ``(B, T)`` (no masking: mask or aggregate afterwards). Estimators (see
    module docstring; Schulman 2020):

    * ``k1``: ``logp - ref_logp``
    * ``abs``: ``|logp - ref_logp|``
    * ``k2``: ``0.5 * (logp - ref_logp)**2``
    * ``k3``: ``exp(x) - x - 1`` with ``x = clamp(ref_logp - logp, -20, 20)``,
      result clamped to ``[-10, 10]`` (so gradients stay finite for extreme
      log-probs; GRPO, Shao et al. 2024, arXiv:2402.03300, eq. 4).

    Selected by ``algorithm.kl.estimator``. Unknown estimator -> ValueError.
    """
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "abs":
        return (logp - ref_logp).abs()
    if estimator == "k2":
        return 0.5 * (logp - ref_logp) ** 2
    if estimator == "k3":
        x = (ref_logp - logp).clamp(-20.0, 20.0)
        return (torch.exp(x) - x - 1.0).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}; valid estimators: {', '.join(KL_ESTIMATORS)}")


#: Alias of :func:`kl`.
kl_penalty = kl


@torch.no_grad()
def kl_in_reward(
    scores: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    coef: float,
    estimator: str = "k1",
) -> torch.Tensor:
    """Token rewards with the KL penalty folded in (``algorithm.kl.mode: reward``).

    Ziegler et al. 2019 (arXiv:1909.08593); Ouyang et al. 2022 (InstructGPT,
    arXiv:2203.02155)::

        r_t = -coef * KL_t                 on every valid token
        r_T += score                       at the last valid token of each row

    Shapes: ``scores`` ``(B,)``, ``logp``, ``ref_logp``, ``mask`` ``(B, T)``
    -> ``(B, T)`` (0 at masked positions; rows with no valid token get no
    score). Computed without gradient.
    """
    m = _bool_mask(mask)  # (B, T)
    if scores.shape != (m.shape[0],):
        raise ValueError(f"scores must have shape (B,)=({m.shape[0]},), got {tuple(scores.shape)}")
    per_tok = kl(_zero_padding(logp, m), _zero_padding(ref_logp, m), estimator).float()  # (B, T)
    rewards = _zero_padding(-coef * per_tok, m)  # (B, T)
    last = last_token_index(m)  # (B,)
    has_tok = m.any(dim=-1)  # (B,)
    bonus = torch.where(has_tok, scores.float(), torch.zeros_like(scores, dtype=torch.float32))
    rewards = rewards.scatter_add(1, last[:, None], bonus[:, None])
    return rewards.to(logp.dtype if logp.is_floating_point() else torch.float32)


class FixedKLController:
    """Constant KL coefficient (``algorithm.kl.coef`` with no ``algorithm.kl.target``)."""

    def __init__(self, coef: float):
        if coef < 0:
            raise ValueError(f"KL coef must be >= 0, got {coef}")
        self.coef = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept for interface parity with :class:`AdaptiveKLController`)."""

    def state_dict(self) -> Dict[str, Union[float, str]]:
        return {"type": "fixed", "coef": self.coef}

    def load_state_dict(self, d: Dict[str, Union[float, str]]) -> None:
        self.coef = float(d["coef"])

    def __repr__(self) -> str:
        return f"FixedKLController(coef={self.coef})"


class AdaptiveKLController:
    """Proportional KL controller of Ziegler et al. 2019 (arXiv:1909.08593, sec. 2.2).

    ::

        error = clip(current_kl / target - 1, -0.2, 0.2)
        coef *= 1 + error * n_steps / horizon

    Selected when ``algorithm.kl.target`` is set; ``algorithm.kl.coef`` is the
    initial value and ``algorithm.kl.horizon`` the horizon.
    """

    def __init__(self, init_coef: float, target: float, horizon: float):
        if init_coef < 0:
            raise ValueError(f"KL init_coef must be >= 0, got {init_coef}")
        if target <= 0:
            raise ValueError(f"KL target must be > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"KL horizon must be > 0, got {horizon}")
        self.coef = float(init_coef)
        self.target = float(target)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Update ``coef`` from the measured KL after ``n_steps`` (samples/steps)."""
        current_kl = float(current_kl)
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.coef *= 1.0 + error * float(n_steps) / self.horizon

    def state_dict(self) -> Dict[str, Union[float, str]]:
        return {"type": "adaptive", "coef": self.coef, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, d: Dict[str, Union[float, str]]) -> None:
        self.coef = float(d["coef"])
        self.target = float(d.get("target", self.target))
        self.horizon = float(d.get("horizon", self.horizon))

    def __repr__(self) -> str:
        return f"AdaptiveKLController(coef={self.coef}, target={self.target}, horizon={self.horizon})"


def make_kl_controller(
    coef: float, target: Optional[float] = None, horizon: float = 10000
) -> Union[FixedKLController, AdaptiveKLController]:
    """Build the controller from ``algorithm.kl.{coef,target,horizon}``.

    ``target=None`` -> :class:`FixedKLController`; otherwise
    :class:`AdaptiveKLController` starting at ``coef``.
    """
    if target is None:
        return FixedKLController(coef)
    return AdaptiveKLController(coef, target, horizon)
