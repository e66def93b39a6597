"""Pure-torch RL algorithm core of rltune: advantages, losses, KL, logits, aggregation.

No I/O, no distributed code, no model objects. See ``docs/algorithms.md``.
"""

from .advantages import (
    broadcast_to_tokens,
    discounted_returns,
    gae,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    zero_advantage_share,
)
from .aggregate import (
    AGG_MODES,
    aggregate,
    last_token_index,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from .kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl,
    kl_in_reward,
    kl_penalty,
    make_kl_controller,
)
from .correction import CORRECTION_MODES, rollout_correction_weights
from .logits import entropy_from_logits, logprobs_from_logits, token_logprobs_entropy
from .losses import policy_loss, value_loss

__all__ = [
    "AGG_MODES",
    "CORRECTION_MODES",
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "aggregate",
    "broadcast_to_tokens",
    "discounted_returns",
    "entropy_from_logits",
    "gae",
    "grpo_advantages",
    "kl",
    "kl_in_reward",
    "kl_penalty",
    "last_token_index",
    "logprobs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "rollout_correction_weights",
    "token_logprobs_entropy",
    "value_loss",
    "zero_advantage_share",
]
