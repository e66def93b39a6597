"""Hand-computed checks of the PPO policy and value losses."""

import math

import pytest
import torch

from rltune.algo import policy_loss, value_loss


def _logp(ratios):
    return torch.log(torch.tensor([ratios])).requires_grad_(True)


# ratios [1.5, 0.5, 1.1, 0.9] (old_logp = 0), advantages [1, -1, 1, -1], clip 0.2
# tok0: A=+1, r=1.5: -1.5 vs -1.2 (clipped at 1.2) -> max = -1.2  (clipped taken)
# tok1: A=-1, r=0.5:  0.5 vs  0.8 (clipped at 0.8) -> max =  0.8  (clipped taken)
# tok2: A=+1, r=1.1: -1.1 vs -1.1                  -> -1.1       (not clipped)
# tok3: A=-1, r=0.9:  0.9 vs  0.9                  ->  0.9       (not clipped)
# token-mean = (-1.2 + 0.8 - 1.1 + 0.9) / 4 = -0.15 ; clipfrac = 2/4
RATIOS = [1.5, 0.5, 1.1, 0.9]
ADV = torch.tensor([[1.0, -1.0, 1.0, -1.0]])


def test_policy_loss_by_hand():
    logp = _logp(RATIOS)
    loss, stats = policy_loss(logp, torch.zeros(1, 4), ADV, torch.ones(1, 4), clip_low=0.2)
    assert loss.item() == pytest.approx(-0.15, abs=1e-6)
    assert float(stats["clipfrac"]) == pytest.approx(0.5)
    assert float(stats["clipfrac_lower"]) == 0.0
    # approx_kl is k3 of KL(old||new): mean of (r - 1) - log r
    k3 = sum((r - 1) - math.log(r) for r in RATIOS) / 4  # = 0.0744331
    assert float(stats["approx_kl"]) == pytest.approx(k3, rel=1e-5)
    for v in stats.values():
        assert not (isinstance(v, torch.Tensor) and v.requires_grad)
    # d/dlogp of -A*r is -A*r; clipped tokens have zero gradient; / 4 for the mean
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 0.0, -1.1 / 4, 0.9 / 4]]))


def test_policy_loss_clip_higher():
    # clip_high 0.28: tok0 is clipped at 1.28 -> -1.28; others as above
    # (-1.28 + 0.8 - 1.1 + 0.9) / 4 = -0.17
    loss, stats = policy_loss(_logp(RATIOS), torch.zeros(1, 4), ADV, torch.ones(1, 4), 0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(-0.17, abs=1e-6)
    assert float(stats["clipfrac"]) == pytest.approx(0.5)


def test_policy_loss_dual_clip():
    # A = -1 everywhere; c = 3
    # r = 5: max(5, 1.2) = 5 > 3 -> 3 (dual bound taken, zero gradient)
    # r = 2: max(2, 1.2) = 2 < 3 -> 2 (gradient -A*r = 2)
    # r = 0.5: max(0.5, 0.8) = 0.8 (lower PPO clip) < 3 -> 0.8
    # mean = (3 + 2 + 0.8) / 3
    logp = _logp([5.0, 2.0, 0.5])
    adv = -torch.ones(1, 3)
    loss, stats = policy_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), 0.2, dual_clip=3.0)
    assert loss.item() == pytest.approx(5.8 / 3, rel=1e-6)
    assert float(stats["clipfrac_lower"]) == pytest.approx(1 / 3)
    assert float(stats["clipfrac"]) == pytest.approx(1 / 3)  # tok2 (pos. 0 and 1 take the unclipped term)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, 2.0 / 3, 0.0]]))


def test_policy_loss_dual_clip_does_not_touch_positive_advantages():
    # A = +1, r = 5: clipped loss -1.2; -A*c = -3 would be smaller but only applies to A < 0
    loss, stats = policy_loss(_logp([5.0]), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), 0.2, dual_clip=3.0)
    assert loss.item() == pytest.approx(-1.2)
    assert float(stats["clipfrac_lower"]) == 0.0


def test_policy_loss_validation():
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), 0.2)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(*args, dual_clip=1.0)
    with pytest.raises(ValueError, match="loss aggregation"):
        policy_loss(*args, agg="bogus")


def test_policy_loss_seq_mean_token_mean():
    # row0 tokens (per-token loss) [-1.2, 0.8] mean -0.2 ; row1 [-1.1, pad] mean -1.1
    # seq-mean-token-mean = (-0.2 - 1.1) / 2 = -0.65
    logp = torch.log(torch.tensor([[1.5, 0.5], [1.1, 1.0]]))
    adv = torch.tensor([[1.0, -1.0], [1.0, 0.0]])
    m = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = policy_loss(logp, torch.zeros(2, 2), adv, m, 0.2, agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx(-0.65, abs=1e-6)


@pytest.mark.parametrize("logp_val,old_val", [(-50.0, 0.0), (0.0, -50.0), (-50.0, -50.0)])
@pytest.mark.parametrize("adv_val", [1.0, -1.0])
def test_policy_loss_extreme_logprobs_finite_grads(logp_val, old_val, adv_val):
    logp = torch.full((2, 3), logp_val, requires_grad=True)
    loss, stats = policy_loss(
        logp, torch.full((2, 3), old_val), torch.full((2, 3), adv_val), torch.ones(2, 3), 0.2, dual_clip=3.0
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert all(math.isfinite(float(v)) for v in stats.values())


# ---- value loss --------------------------------------------------------------
# values [1, 2], old [0.5, 2], returns [2, 0], clip 0.2
# tok0: unclipped (1-2)^2 = 1; v clipped to 0.7 -> (0.7-2)^2 = 1.69 -> 0.5*1.69 = 0.845 (clipped taken)
# tok1: v = old = 2 -> both (2-0)^2 = 4 -> 0.5*4 = 2 (not strictly larger)
# token-mean = (0.845 + 2) / 2 = 1.4225 ; clipfrac 0.5 ; unclipped = 0.5*(1+4)/2 = 1.25


def test_value_loss_by_hand():
    v = torch.tensor([[1.0, 2.0]], requires_grad=True)
    old = torch.tensor([[0.5, 2.0]])
    ret = torch.tensor([[2.0, 0.0]])
    loss, stats = value_loss(v, old, ret, torch.ones(1, 2), clip=0.2)
    assert loss.item() == pytest.approx(1.4225)
    assert float(stats["clipfrac"]) == pytest.approx(0.5)
    loss.backward()
    # tok0 clipped -> 0 grad; tok1: d/dv 0.5 (v-R)^2 / 2 = (2 - 0) / 2 = 1
    torch.testing.assert_close(v.grad, torch.tensor([[0.0, 1.0]]))
    loss2, stats2 = value_loss(v, old, ret, torch.ones(1, 2), clip=None)
    assert loss2.item() == pytest.approx(1.25)
    assert float(stats2["clipfrac"]) == 0.0


def test_value_loss_padding_and_token_sum():
    v = torch.tensor([[1.0, float("nan")]])
    old = torch.tensor([[0.5, float("inf")]])
    ret = torch.tensor([[2.0, -1e30]])
    loss, _ = value_loss(v, old, ret, torch.tensor([[1.0, 0.0]]), 0.2, agg="token-sum")
    assert loss.item() == pytest.approx(0.845)
