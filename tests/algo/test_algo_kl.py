"""KL estimators, KL-in-reward shaping and KL-coefficient controllers."""

import math

import pytest
import torch

from rltune.algo import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl,
    kl_in_reward,
    kl_penalty,
    make_kl_controller,
)


def test_kl_estimators_by_hand():
    # d = logp - ref: column 0 d = +1 (logp -1, ref -2); column 1 d = -1 (logp -2, ref -1)
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-2.0, -1.0]])
    torch.testing.assert_close(kl(logp, ref, "k1"), torch.tensor([[1.0, -1.0]]))
    torch.testing.assert_close(kl(logp, ref, "abs"), torch.tensor([[1.0, 1.0]]))
    torch.testing.assert_close(kl(logp, ref, "k2"), torch.tensor([[0.5, 0.5]]))
    # k3 with x = ref - logp: x = -1 -> e^-1 + 1 - 1 = 0.367879 ; x = +1 -> e - 1 - 1 = 0.718282
    torch.testing.assert_close(kl(logp, ref, "k3"), torch.tensor([[math.exp(-1), math.e - 2]]))


def test_kl_alias_and_unknown():
    assert kl_penalty is kl
    with pytest.raises(ValueError, match="k1, k2, k3, abs"):
        kl(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


@pytest.mark.parametrize("est", KL_ESTIMATORS)
def test_kl_zero_when_equal(est):
    lp = torch.tensor([[-0.1, -3.0, -50.0, 0.0]])
    assert torch.equal(kl(lp, lp.clone(), est), torch.zeros(1, 4))


def test_kl_k3_clamps():
    # logp -50, ref 0: x = 50 -> clamped to 20 -> e^20 - 21 -> clamped to 10
    # logp 0, ref -50: x = -50 -> clamped to -20 -> e^-20 + 19 -> clamped to 10
    out = kl(torch.tensor([[-50.0, 0.0]]), torch.tensor([[0.0, -50.0]]), "k3")
    torch.testing.assert_close(out, torch.tensor([[10.0, 10.0]]))


@pytest.mark.parametrize("est", KL_ESTIMATORS)
def test_kl_extreme_logprob_grads_finite(est):
    logp = torch.tensor([[-50.0, 0.0, -50.0, -1e-3]], requires_grad=True)
    ref = torch.tensor([[0.0, -50.0, -50.0, -60.0]])
    kl(logp, ref, est).sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_k3_gradient_by_hand():
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = -exp(ref - logp) + 1 ; logp=-1, ref=-2: 1 - e^-1
    logp = torch.tensor([[-1.0]], requires_grad=True)
    kl(logp, torch.tensor([[-2.0]]), "k3").sum().backward()
    assert logp.grad.item() == pytest.approx(1 - math.exp(-1))


def test_kl_in_reward_by_hand():
    # coef 0.1, k1
    # row0: kl [1, 0, 0] -> [-0.1, 0, 0] ; + score 1.0 at t=2 -> [-0.1, 0, 1.0]
    # row1: kl [-1, 0, pad] -> [0.1, 0, 0] ; + score 2.0 at t=1 -> [0.1, 2.0, 0]
    g = float("nan")
    logp = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, g]])
    ref = torch.tensor([[-2.0, -1.0, -1.0], [-1.0, -2.0, g]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    r = kl_in_reward(torch.tensor([1.0, 2.0]), logp, ref, m, coef=0.1)
    torch.testing.assert_close(r, torch.tensor([[-0.1, 0.0, 1.0], [0.1, 2.0, 0.0]]))
    # k2: row0 kl [0.5, 0, 0] -> [-0.05, 0, 1] ; row1 [0.5, 0] -> [-0.05, 2, 0]
    r2 = kl_in_reward(torch.tensor([1.0, 2.0]), logp, ref, m, 0.1, estimator="k2")
    torch.testing.assert_close(r2, torch.tensor([[-0.05, 0.0, 1.0], [-0.05, 2.0, 0.0]]))


def test_kl_in_reward_empty_row_gets_nothing():
    r = kl_in_reward(torch.tensor([5.0]), torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), 0.1)
    assert torch.equal(r, torch.zeros(1, 2))


# ---- controllers -------------------------------------------------------------


def test_fixed_controller():
    c = FixedKLController(0.05)
    c.update(100.0, 1000)
    assert c.coef == 0.05
    d = c.state_dict()
    c2 = FixedKLController(1.0)
    c2.load_state_dict(d)
    assert c2.coef == 0.05 and c2.state_dict() == d


def test_adaptive_controller_by_hand():
    # target 6, horizon 10000, n_steps 256
    # kl 12 : error = 12/6 - 1 = 1 -> clipped 0.2 : coef = 0.1 * (1 + 0.2*256/1e4) = 0.1 * 1.00512
    c = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    c.update(12.0, 256)
    assert c.coef == pytest.approx(0.100512)
    # kl 6.6: error 0.1 (inside the clip): coef *= 1 + 0.1*256/1e4 = 1.00256
    c.update(6.6, 256)
    assert c.coef == pytest.approx(0.100512 * 1.00256)
    # kl 0: error -1 -> clipped -0.2: from 0.1 -> 0.1 * (1 - 0.00512) = 0.099488
    c3 = AdaptiveKLController(0.1, 6.0, 10000)
    c3.update(0.0, 256)
    assert c3.coef == pytest.approx(0.099488)
    # kl above target moves coef up, below moves it down, at target leaves it
    c4 = AdaptiveKLController(0.2, 1.0, 100)
    c4.update(1.0, 50)
    assert c4.coef == pytest.approx(0.2)
    c4.update(torch.tensor(1.5), 50)  # 0-dim tensors accepted: error 0.2 -> * 1.1
    assert c4.coef == pytest.approx(0.22)


def test_adaptive_error_clipped_at_plus_minus_0_2():
    a, b = AdaptiveKLController(1.0, 1.0, 10), AdaptiveKLController(1.0, 1.0, 10)
    a.update(1.2, 1)  # error exactly 0.2
    b.update(1e9, 1)  # error clipped to 0.2
    assert a.coef == pytest.approx(b.coef) == pytest.approx(1.02)
    a.update(0.0, 1)
    b.update(0.8, 1)  # error -0.2 in both
    assert a.coef == pytest.approx(b.coef) == pytest.approx(1.02 * 0.98)


def test_adaptive_state_dict_round_trip():
    c = AdaptiveKLController(0.1, 6.0, 10000)
    c.update(9.0, 512)
    d = c.state_dict()
    assert all(isinstance(v, (float, str)) for v in d.values())
    c2 = AdaptiveKLController(1.0, 1.0, 1.0)
    c2.load_state_dict(d)
    assert c2.state_dict() == d
    c.update(3.0, 10)
    c2.update(3.0, 10)
    assert c.coef == c2.coef


def test_make_kl_controller():
    assert isinstance(make_kl_controller(0.1), FixedKLController)
    a = make_kl_controller(0.1, target=6.0)
    assert isinstance(a, AdaptiveKLController) and a.horizon == 10000 and a.coef == 0.1
    with pytest.raises(ValueError):
        make_kl_controller(0.1, target=0.0)
