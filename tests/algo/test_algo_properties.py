"""Hypothesis property tests: random shapes, right-padded and interior masks, garbage padding."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rltune.algo import (
    AGG_MODES,
    KL_ESTIMATORS,
    aggregate,
    broadcast_to_tokens,
    gae,
    grpo_advantages,
    kl,
    kl_in_reward,
    masked_whiten,
    policy_loss,
    reinforce_pp_advantages,
    rloo_advantages,
    value_loss,
)

SETTINGS = settings(max_examples=40, deadline=None)
GARBAGE = [float("nan"), float("inf"), float("-inf"), 1e6, -1e6, 3.0]


@st.composite
def batches(draw, max_b=5, max_t=7, interior=False):
    """(B, T, mask, generator): right-padded mask with >= 1 valid token per row
    (``interior=True``: arbitrary 0/1 pattern with >= 1 valid token per row)."""
    B = draw(st.integers(1, max_b))
    T = draw(st.integers(1, max_t))
    if interior:
        rows = [draw(st.lists(st.booleans(), min_size=T, max_size=T)) for _ in range(B)]
        rows = [r if any(r) else [True] + r[1:] for r in rows]
        mask = torch.tensor(rows, dtype=torch.float32)
    else:
        lengths = draw(st.lists(st.integers(1, T), min_size=B, max_size=B))
        mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).float()
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    return B, T, mask, gen


def rand(gen, *shape, scale=1.0):
    return torch.randn(*shape, generator=gen) * scale


def with_garbage(x, mask, gen):
    """Copy of ``x`` with random garbage (nan/inf/huge) at masked positions."""
    idx = torch.randint(0, len(GARBAGE), x.shape, generator=gen)
    junk = torch.tensor(GARBAGE)[idx]
    return torch.where(mask.bool(), x, junk)


def close(a, b, **kw):
    torch.testing.assert_close(a, b, **kw)


# ---- GAE ---------------------------------------------------------------------


@SETTINGS
@given(batches())
def test_gae_lam1_gamma1_is_reward_to_go_minus_values(b):
    B, T, m, g = b
    r, v = rand(g, B, T), rand(g, B, T)
    adv, ret = gae(r, v, m, 1.0, 1.0)
    rz = r * m
    rtg = rz.flip(-1).cumsum(-1).flip(-1)  # reward-to-go (right padding contributes 0)
    close(adv, (rtg - v) * m, atol=1e-5, rtol=1e-5)
    close(ret, rtg * m, atol=1e-5, rtol=1e-5)


@SETTINGS
@given(batches(interior=True), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_gae_equals_per_row_compressed_and_ignores_garbage(b, gamma, lam):
    B, T, m, g = b
    r, v = rand(g, B, T), rand(g, B, T)
    adv, ret = gae(with_garbage(r, m, g), with_garbage(v, m, g), m, gamma, lam)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.all(adv[m == 0] == 0) and torch.all(ret[m == 0] == 0)
    for i in range(B):
        keep = m[i].bool()
        n = int(keep.sum())
        a_i, r_i = gae(r[i, keep][None], v[i, keep][None], torch.ones(1, n), gamma, lam)
        close(adv[i, keep], a_i[0])
        close(ret[i, keep], r_i[0])


# ---- outcome advantages ------------------------------------------------------


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31 - 1), st.booleans(), st.booleans())
def test_group_advantages_sum_to_zero(n_groups, group_size, seed, scale, binary):
    g = torch.Generator().manual_seed(seed)
    s = torch.randint(0, 2, (n_groups * group_size,), generator=g).float() if binary else rand(g, n_groups * group_size)
    a = grpo_advantages(s, group_size, scale_by_std=scale).view(n_groups, group_size)
    close(a.sum(-1), torch.zeros(n_groups), atol=1e-4, rtol=0)
    assert torch.isfinite(a).all()
    if group_size >= 2:
        a2 = rloo_advantages(s, group_size).view(n_groups, group_size)
        close(a2.sum(-1), torch.zeros(n_groups), atol=1e-4, rtol=0)
        # RLOO = n/(n-1) * (Dr.GRPO advantage)
        dr = grpo_advantages(s, group_size, scale_by_std=False).view(n_groups, group_size)
        close(a2, dr * group_size / (group_size - 1), atol=1e-5, rtol=1e-5)


# ---- padding invariance ----------------------------------------------------


@SETTINGS
@given(batches(), st.floats(0.5, 1.0))
def test_token_level_functions_ignore_padding(b, gamma):
    B, T, m, g = b
    x, s = rand(g, B, T), rand(g, B)
    close(masked_whiten(with_garbage(x, m, g), m), masked_whiten(x, m))
    close(reinforce_pp_advantages(with_garbage(x, m, g), m, gamma), reinforce_pp_advantages(x, m, gamma))
    bt = broadcast_to_tokens(s, m)
    assert torch.all(bt[m == 0] == 0) and torch.all(bt == s[:, None] * m)
    lp, ref = -rand(g, B, T).abs(), -rand(g, B, T).abs()
    for est in KL_ESTIMATORS:
        clean = kl_in_reward(s, lp, ref, m, 0.05, est)
        dirty = kl_in_reward(s, with_garbage(lp, m, g), with_garbage(ref, m, g), m, 0.05, est)
        close(dirty, clean)
        assert torch.all(clean[m == 0] == 0)
        # the sum of token rewards is score - coef * sum(kl)
        close(clean.sum(-1), s - 0.05 * (kl(lp, ref, est) * m).sum(-1), atol=1e-5, rtol=1e-5)


@SETTINGS
@given(batches(), st.sampled_from(AGG_MODES), st.sampled_from([None, 3.0]))
def test_losses_ignore_padding_values_and_grads(b, agg, dual):
    B, T, m, g = b
    lp = (-rand(g, B, T).abs()).requires_grad_(True)
    old = lp.detach() + 0.3 * rand(g, B, T)
    adv = rand(g, B, T)
    lp_dirty = with_garbage(lp.detach(), m, g).requires_grad_(True)
    l1, s1 = policy_loss(lp, old, adv, m, 0.2, 0.28, dual, agg)
    l2, s2 = policy_loss(lp_dirty, with_garbage(old, m, g), with_garbage(adv, m, g), m, 0.2, 0.28, dual, agg)
    close(l1, l2)
    for k in ("clipfrac", "clipfrac_lower", "approx_kl"):
        close(s1[k], s2[k])
    l1.backward()
    l2.backward()
    assert torch.isfinite(lp_dirty.grad).all() and torch.all(lp_dirty.grad[m == 0] == 0)
    close(lp.grad, lp_dirty.grad)

    v = rand(g, B, T).requires_grad_(True)
    vo, R = v.detach() + 0.5 * rand(g, B, T), rand(g, B, T)
    v_dirty = with_garbage(v.detach(), m, g).requires_grad_(True)
    a1, _ = value_loss(v, vo, R, m, 0.2, agg)
    a2, _ = value_loss(v_dirty, with_garbage(vo, m, g), with_garbage(R, m, g), m, 0.2, agg)
    close(a1, a2)
    a1.backward()
    a2.backward()
    assert torch.isfinite(v_dirty.grad).all()
    close(v.grad, v_dirty.grad)


# ---- micro-batch recombination --------------------------------------------


@SETTINGS
@given(batches(max_b=6), st.integers(1, 6))
def test_token_mean_microbatch_recombination(b, micro):
    B, T, m, g = b
    lp = (-rand(g, B, T).abs()).requires_grad_(True)
    old = lp.detach() + 0.3 * rand(g, B, T)
    adv = rand(g, B, T)
    full, _ = policy_loss(lp, old, adv, m, 0.2)
    (g_full,) = torch.autograd.grad(full, lp)
    n_total = m.sum()
    combined = 0.0
    for idx in torch.arange(B).split(micro):
        part, _ = policy_loss(lp[idx], old[idx], adv[idx], m[idx], 0.2)
        combined = combined + part * m[idx].sum() / n_total
    close(combined, full)
    (g_comb,) = torch.autograd.grad(combined, lp)
    close(g_comb, g_full)
    # and for aggregate() itself
    x = rand(g, B, T)
    parts = sum(aggregate(x[i], m[i], "token-mean") * m[i].sum() / n_total for i in torch.arange(B).split(micro))
    close(parts, aggregate(x, m, "token-mean"))


# ---- KL / extremes ---------------------------------------------------------


@SETTINGS
@given(batches(), st.sampled_from(KL_ESTIMATORS))
def test_kl_zero_when_equal_and_k3_k2_abs_nonnegative(b, est):
    B, T, m, g = b
    lp = -rand(g, B, T, scale=10.0).abs()
    assert torch.all(kl(lp, lp.clone(), est) == 0)
    ref = -rand(g, B, T, scale=10.0).abs()
    if est != "k1":
        assert torch.all(kl(lp, ref, est) >= 0)


@pytest.mark.parametrize("est", KL_ESTIMATORS)
def test_extreme_grads_through_policy_loss_plus_kl(est):
    # a combined loss: PPO + 0.1 * k3/k-any KL (loss mode) with log-probs at -50 and 0
    lp = torch.tensor([[-50.0, 0.0, -50.0], [0.0, -50.0, 0.0]], requires_grad=True)
    old = torch.tensor([[0.0, -50.0, -50.0], [0.0, 0.0, -50.0]])
    ref = torch.tensor([[-50.0, 0.0, 0.0], [-50.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, -1.0, 2.0], [-2.0, 1.0, -1.0]])
    m = torch.ones(2, 3)
    loss, _ = policy_loss(lp, old, adv, m, 0.2, dual_clip=3.0)
    total = loss + 0.1 * aggregate(kl(lp, ref, est), m)
    total.backward()
    assert torch.isfinite(total) and torch.isfinite(lp.grad).all()
