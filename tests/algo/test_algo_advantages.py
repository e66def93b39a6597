"""Hand-computed checks of GAE, GRPO/Dr.GRPO, RLOO, REINFORCE++ and broadcasting."""

import math

import pytest
import torch

from rltune.algo import (
    broadcast_to_tokens,
    gae,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)

# ---- GAE -------------------------------------------------------------------
# rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma 0.9, lam 0.8 (gamma*lam = 0.72)
# t=2: delta = 1 + 0.9*0 - 0.7 = 0.3                 A2 = 0.3
# t=1: delta = 0 + 0.9*0.7 - 0.6 = 0.03              A1 = 0.03 + 0.72*0.3   = 0.246
# t=0: delta = 0 + 0.9*0.6 - 0.5 = 0.04              A0 = 0.04 + 0.72*0.246 = 0.21712
# returns = A + V = [0.71712, 0.846, 1.0]
GAE_ADV = [0.21712, 0.246, 0.3]
GAE_RET = [0.71712, 0.846, 1.0]


def test_gae_by_hand():
    r = torch.tensor([[0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = gae(r, v, torch.ones(1, 3), gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv, torch.tensor([GAE_ADV]))
    torch.testing.assert_close(ret, torch.tensor([GAE_RET]))


def test_gae_right_padding_ignored():
    # same row with two garbage padding steps: the value after the last valid token is 0
    r = torch.tensor([[0.0, 0.0, 1.0, 7.0, float("nan")]])
    v = torch.tensor([[0.5, 0.6, 0.7, 123.0, float("inf")]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]])
    adv, ret = gae(r, v, m, 0.9, 0.8)
    torch.testing.assert_close(adv, torch.tensor([GAE_ADV + [0.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([GAE_RET + [0.0, 0.0]]))


def test_gae_interior_zeros_are_skipped():
    # masked step at t=1 is skipped: equals the compressed row [0,0,1] / [0.5,0.6,0.7]
    r = torch.tensor([[0.0, 99.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, -99.0, 0.6, 0.7]])
    m = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    adv, ret = gae(r, v, m, 0.9, 0.8)
    torch.testing.assert_close(adv, torch.tensor([[0.21712, 0.0, 0.246, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[0.71712, 0.0, 0.846, 1.0]]))


def test_gae_lam1_gamma1_is_reward_to_go_minus_values():
    # rewards [1, 2, 3] -> reward-to-go [6, 5, 3]; values [1, 1, 1] -> A = [5, 4, 2]
    r = torch.tensor([[1.0, 2.0, 3.0]])
    v = torch.ones(1, 3)
    adv, ret = gae(r, v, torch.ones(1, 3), 1.0, 1.0)
    torch.testing.assert_close(adv, torch.tensor([[5.0, 4.0, 2.0]]))
    torch.testing.assert_close(ret, torch.tensor([[6.0, 5.0, 3.0]]))


def test_gae_no_grad():
    v = torch.ones(1, 2, requires_grad=True)
    adv, ret = gae(torch.ones(1, 2), v, torch.ones(1, 2), 1.0, 0.95)
    assert not adv.requires_grad and not ret.requires_grad


# ---- GRPO ------------------------------------------------------------------


def test_grpo_by_hand():
    # group 1: [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3) = 0.57735
    #   A = +-0.5 / (0.57735 + 1e-6) = +-0.866024
    # group 2: [2, 2, 2, 2] all equal -> exactly 0
    s = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    a = grpo_advantages(s, group_size=4)
    k = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    torch.testing.assert_close(a, torch.tensor([k, -k, -k, k, 0.0, 0.0, 0.0, 0.0]))
    assert torch.all(a[4:] == 0.0)


def test_dr_grpo_mean_centred_only():
    s = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0, 2.0, 2.0])
    # group means 0.5 and 2.0
    a = grpo_advantages(s, 4, scale_by_std=False)
    torch.testing.assert_close(a, torch.tensor([0.5, -0.5, -0.5, 0.5, 1.0, -1.0, 0.0, 0.0]))


def test_grpo_all_equal_non_representable_is_exact_zero():
    # 0.1 is not exactly representable; the mean could differ by an ulp -> still exactly 0
    a = grpo_advantages(torch.full((6,), 0.1), 3)
    assert torch.all(a == 0.0)
    assert torch.all(grpo_advantages(torch.tensor([5.0, -2.0]), 1) == 0.0)


def test_grpo_group_sums_to_zero():
    s = torch.tensor([0.3, 1.7, -2.0, 0.9, 4.0, 4.5])
    a = grpo_advantages(s, 3).view(2, 3)
    torch.testing.assert_close(a.sum(-1), torch.zeros(2), atol=1e-5, rtol=0)


def test_grpo_not_divisible():
    with pytest.raises(ValueError, match="not divisible by group_size 4"):
        grpo_advantages(torch.zeros(6), 4)


def test_grpo_int_scores_give_float():
    a = grpo_advantages(torch.tensor([1, 0]), 2, scale_by_std=False)
    assert a.dtype == torch.float32 and a.tolist() == [0.5, -0.5]


# ---- RLOO ------------------------------------------------------------------


def test_rloo_by_hand():
    # [1, 2, 3]: A0 = 1 - (2+3)/2 = -1.5 ; A1 = 2 - (1+3)/2 = 0 ; A2 = 3 - (1+2)/2 = 1.5
    # [4, 0]:    A0 = 4 - 0 = 4 ; A1 = 0 - 4 = -4 (second batch, group_size 2)
    torch.testing.assert_close(rloo_advantages(torch.tensor([1.0, 2.0, 3.0]), 3), torch.tensor([-1.5, 0.0, 1.5]))
    torch.testing.assert_close(rloo_advantages(torch.tensor([4.0, 0.0]), 2), torch.tensor([4.0, -4.0]))


def test_rloo_errors():
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(torch.zeros(3), 1)
    with pytest.raises(ValueError, match="divisible"):
        rloo_advantages(torch.zeros(3), 2)


# ---- REINFORCE++ -------------------------------------------------------------


def test_reinforce_pp_by_hand():
    # gamma 0.5
    # row0 rewards [0, 0, 1] -> returns [0.25, 0.5, 1]
    # row1 rewards [0, 2, pad] -> returns [1, 2, -]
    # valid returns 0.25, 0.5, 1, 1, 2: mean 0.95; deviations -0.7 -0.45 0.05 0.05 1.05
    # squares .49 .2025 .0025 .0025 1.1025 = 1.8 ; unbiased var 1.8/4 = 0.45
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 55.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    a = reinforce_pp_advantages(r, m, gamma=0.5)
    s = math.sqrt(0.45 + 1e-8)
    exp = torch.tensor([[-0.7 / s, -0.45 / s, 0.05 / s], [0.05 / s, 1.05 / s, 0.0]])
    torch.testing.assert_close(a, exp)


def test_reinforce_pp_resets_per_sequence():
    # a reward on row 0 must not leak into row 1 (no cross-row discounting)
    r = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    m = torch.ones(2, 2)
    a = reinforce_pp_advantages(r, m, 1.0)
    # returns row0 [1, 0] row1 [0, 0]; row1 entries are all equal after whitening
    assert a[1, 0] == a[1, 1] and a[0, 0] > a[0, 1]


# ---- broadcast -------------------------------------------------------------


def test_broadcast_to_tokens():
    adv = torch.tensor([1.0, -2.0])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(broadcast_to_tokens(adv, m), torch.tensor([[1.0, 1.0, 0.0], [-2.0, 0.0, 0.0]]))
    with pytest.raises(ValueError):
        broadcast_to_tokens(torch.zeros(3), m)


def test_zero_advantage_share_by_hand():
    from rltune.algo import grpo_advantages, zero_advantage_share

    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0])   # 3 groups of 3
    assert zero_advantage_share(scores, 3) == pytest.approx(2 / 3)
    # exactly the groups whose GRPO advantages are all zero
    adv = grpo_advantages(scores, 3).view(-1, 3)
    assert [bool((g == 0).all()) for g in adv] == [True, False, True]
