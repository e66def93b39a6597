"""Stale-weight guard: pure tensor math, no vLLM needed."""

import math

import pytest
import torch

from rltune.rollout.guard import StaleWeightGuard, logprob_diff


def test_logprob_diff_masks_and_reduces():
    r = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    a = torch.tensor([[-1.1, -2.0, -9.0], [-0.5, -1.5, 5.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    mean, mx = logprob_diff(r, a, m)
    assert mean == pytest.approx((0.1 + 0 + 0 + 1.0) / 4)
    assert mx == pytest.approx(1.0)


def test_logprob_diff_empty_mask_and_nan():
    z = torch.zeros(2, 3)
    assert logprob_diff(z, z, z) == (0.0, 0.0)
    a = torch.tensor([[float("nan"), 0.0, 0.0]] * 2)
    mean, mx = logprob_diff(z, a, torch.ones(2, 3))
    assert math.isinf(mean) and math.isinf(mx)


def test_guard_message_and_episodes():
    g = StaleWeightGuard(0.05)
    assert g.check(1, 0.001, 0.01) is None
    msg = g.check(5, 0.41, 3.2)
    assert msg.startswith("rollout log-probs differ from the actor's by mean 0.41 (max 3.2) at step 5")
    assert "stale weights" in msg and "check weight sync" in msg
    assert g.check(6, 0.5, 3.0) is None          # same episode: once
    assert g.check(7, 0.01, 0.1) is None         # back within tolerance
    assert g.check(8, 0.2, 1.0) is not None      # a new episode warns again
    assert g.tripped == 3
    assert StaleWeightGuard(0.05, repeat=True).check(1, float("nan"), 0.0) is not None
    with pytest.raises(ValueError):
        StaleWeightGuard(0.0)
