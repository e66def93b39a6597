"""The detectors: one class per symptom (docs/health.md lists every kind, its severity and when it
fires), grouped by what they read:

- `faults`: non-finite losses, gradients, KL or reward; skipped steps;
- `policy`: KL (level, spikes), the PPO clip fraction, entropy;
- `gradients`: grad-norm spikes and clipping, per role;
- `swing`, `reward`: early reward swings and oscillation; reward collapse and reward hacking;
- `samples`: response length, responses masked out of the loss, groups with zero advantage;
- `rollout`: the rollout engine (stale or drifting weights, importance ratios, sync time; with
  generation ahead, the stale samples' importance weights);
- `episodes`: the tools of an environment failing, or the policy no longer calling them.

Each warning is a departure from the run's own recent behaviour or a hard fault (non-finite
values, stale weights); a fixed playbook figure that healthy runs cross gives at most an `info`.
Every event names its role in `numbers["role"]` (actor, critic, rollout, reward, data), and its
message and first recipe change speak of that same role. No torch import.
"""

from __future__ import annotations

from .episodes import ToolErrorStorm, ToolUseDropped
from .faults import NonFinite, SkippedStep
from .gradients import GradClip, GradSpike
from .policy import ClipfracHigh, EntropyCollapse, KLHigh, KLSpike
from .reward import RewardCollapse, RewardHacking
from .rollout import AsyncDrift, ISWeightExtreme, LogprobDrift, StaleWeights, SyncSlow
from .samples import LengthCollapse, LengthRunaway, MaskedOut, ZeroAdvantage
from .swing import RewardSwing

# the order they run in each step (a detector sees the events fired before it in the same step)
DETECTORS = [NonFinite, SkippedStep, KLSpike, GradSpike, RewardCollapse, RewardHacking, KLHigh, RewardSwing,
             GradClip, EntropyCollapse, LengthCollapse, LengthRunaway, MaskedOut, StaleWeights, LogprobDrift,
             ISWeightExtreme, AsyncDrift, ZeroAdvantage, ClipfracHigh, SyncSlow, ToolErrorStorm, ToolUseDropped]

__all__ = ["DETECTORS"] + [d.__name__ for d in DETECTORS]
