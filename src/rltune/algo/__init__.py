"""Pure-torch RL algorithm core of rltune: advantages, losses, ratios, KL, logits, aggregation,
reward shaping and group filters.

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
from .filters import group_row_mask, groups_with_signal
from .logits import entropy_from_logits, logprobs_from_logits, token_logprobs_entropy
from .losses import LOG_RATIO_CLAMP, POLICY_OBJECTIVES, policy_loss, value_loss
from .ratios import RATIO_LEVELS, level_log_ratio, sequence_log_ratio, token_log_ratio
from .shaping import overlong_penalty, truncated_rows

__all__ = [
    "AGG_MODES",
    "CORRECTION_MODES",
    "KL_ESTIMATORS",
    "LOG_RATIO_CLAMP",
    "POLICY_OBJECTIVES",
    "RATIO_LEVELS",
    "AdaptiveKLController",
    "FixedKLController",
    "aggregate",
    "broadcast_to_tokens",
    "discounted_returns",
    "entropy_from_logits",
    "gae",
    "group_row_mask",
    "groups_with_signal",
    "grpo_advantages",
    "kl",
    "kl_in_reward",
    "kl_penalty",
    "last_token_index",
    "level_log_ratio",
    "logprobs_from_logits",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "policy_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "rollout_correction_weights",
    "sequence_log_ratio",
    "token_log_ratio",
    "token_logprobs_entropy",
    "truncated_rows",
    "value_loss",
    "zero_advantage_share",
]
