"""Hand-computed checks of the 2026 RL toolbox: GSPO / GSPO-token ratios, CISPO, the new loss
stats, DAPO's overlong penalty, truncation detection and dynamic-sampling group filters."""

import itertools
import math

import pytest
import torch

from rltune.algo import (
    AGG_MODES,
    POLICY_OBJECTIVES,
    RATIO_LEVELS,
    aggregate,
    group_row_mask,
    groups_with_signal,
    level_log_ratio,
    masked_mean,
    overlong_penalty,
    policy_loss,
    sequence_log_ratio,
    truncated_rows,
)

NAN = float("nan")


def _grad(loss, x):
    (g,) = torch.autograd.grad(loss, x)
    return g


# ---- GSPO: sequence-level ratio -------------------------------------------------------------
#
# Two rows of different lengths, old_logp = 0 so logp is the log-ratio:
#   row 0: log r = [0.1, -0.2, 0.4]         (3 tokens) -> mean 0.1   -> s0 = e^0.1  = 1.1051709
#   row 1: log r = [0.02, -0.04, <pad>]      (2 tokens) -> mean -0.01 -> s1 = e^-0.01 = 0.9900498
# A0 = +1, A1 = -2 (per sequence), clip 0.2: both ratios lie inside [0.8, 1.2], nothing clipped.
S0, S1 = math.exp(0.1), math.exp(-0.01)
MASK2 = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
ADV2 = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, NAN]])  # garbage in the padding


def _logp2():
    return torch.tensor([[0.1, -0.2, 0.4], [0.02, -0.04, NAN]], requires_grad=True)


def test_sequence_log_ratio_by_hand():
    lr = sequence_log_ratio(_logp2(), torch.zeros(2, 3), MASK2)
    torch.testing.assert_close(lr, torch.tensor([0.1, -0.01]))
    # broadcast to the valid tokens, 0 (ratio 1) on padding, for both sequence levels
    for level in ("sequence", "sequence-token"):
        full = level_log_ratio(_logp2(), torch.zeros(2, 3), MASK2, level)
        torch.testing.assert_close(full, torch.tensor([[0.1, 0.1, 0.1], [-0.01, -0.01, 0.0]]))
    # old_logp shifts every token: mean(logp - old) per row
    old = torch.tensor([[0.1, 0.1, 0.1], [1.0, 0.0, 5.0]])
    lr = sequence_log_ratio(_logp2(), old, MASK2)
    torch.testing.assert_close(lr, torch.tensor([0.0, (0.02 - 1.0 - 0.04) / 2]))


def test_gspo_sequence_value_and_gradient_seq_mean_token_mean():
    # per token L = -A_i * s_i; row means -s0 and 2*s1; loss = (-s0 + 2 s1) / 2
    # d s_i / d logp_t = s_i / |y_i|, so grad row 0 = -(1/2) * A0 * s0 / 3 = -s0/6,
    #                                   grad row 1 = -(1/2) * A1 * s1 / 2 = +s1/2, padding 0
    logp = _logp2()
    loss, stats = policy_loss(logp, torch.zeros(2, 3), ADV2, MASK2, 0.2, agg="seq-mean-token-mean",
                              ratio_level="sequence")
    assert loss.item() == pytest.approx((-S0 + 2 * S1) / 2, rel=1e-6)
    g = _grad(loss, logp)
    expected = torch.tensor([[-S0 / 6] * 3, [S1 / 2, S1 / 2, 0.0]])
    torch.testing.assert_close(g, expected)
    assert float(stats["clipfrac"]) == 0.0 and float(stats["clipfrac_seq"]) == 0.0


def test_gspo_sequence_gradient_token_mean_single_sequence():
    # one sequence, token-mean: loss = -A s, grad per token = -A * s / |y|
    logp = torch.tensor([[0.1, -0.2, 0.4]], requires_grad=True)
    adv = torch.full((1, 3), 0.5)
    loss, _ = policy_loss(logp, torch.zeros(1, 3), adv, torch.ones(1, 3), 0.2, ratio_level="sequence")
    assert loss.item() == pytest.approx(-0.5 * S0, rel=1e-6)
    torch.testing.assert_close(_grad(loss, logp), torch.full((1, 3), -0.5 * S0 / 3))


def test_gspo_sequence_token_mean_two_rows():
    # token-mean over 5 tokens: loss = (-3 A0 s0 - 2 A1 s1) / 5 = (-3 s0 + 4 s1) / 5
    # grad row i = -A_i * s_i / 5 (|y_i| tokens each carrying d s_i / d logp_t = s_i / |y_i|)
    logp = _logp2()
    loss, _ = policy_loss(logp, torch.zeros(2, 3), ADV2, MASK2, 0.2, ratio_level="sequence")
    assert loss.item() == pytest.approx((-3 * S0 + 4 * S1) / 5, rel=1e-6)
    expected = torch.tensor([[-S0 / 5] * 3, [2 * S1 / 5, 2 * S1 / 5, 0.0]])
    torch.testing.assert_close(_grad(loss, logp), expected)


def test_gspo_clips_whole_sequences():
    # row 0: log r = [0.5, 0.6, 0.4] -> s = e^0.5 = 1.6487 > 1.2, A = +1: clipped term -1.2 taken,
    #        zero gradient on every token
    # row 1: log r = [0.9, -0.5, -0.4] -> s = e^0 = 1: not clipped although tokens 0 and 1
    #        would be clipped at token level; A = +1: grad = -s / 3 per token (seq-mean-token-mean
    #        over 3 rows -> / 3 again)
    # row 2: same ratio as row 0 but A = -1: -A*s = 1.6487 > -A*1.2 = 1.2 -> unclipped taken
    # row 3: padding only
    logp = torch.tensor([[0.5, 0.6, 0.4], [0.9, -0.5, -0.4], [0.5, 0.6, 0.4], [NAN, NAN, NAN]],
                        requires_grad=True)
    mask = torch.tensor([[1.0] * 3, [1.0] * 3, [1.0] * 3, [0.0] * 3])
    adv = torch.tensor([[1.0] * 3, [1.0] * 3, [-1.0] * 3, [NAN] * 3])
    s = math.exp(0.5)
    loss, stats = policy_loss(logp, torch.zeros(4, 3), adv, mask, 0.2, agg="seq-mean-token-mean",
                              ratio_level="sequence")
    assert loss.item() == pytest.approx((-1.2 - 1.0 + s) / 3, rel=1e-6)
    g = _grad(loss, logp)
    expected = torch.tensor([[0.0] * 3, [-1 / 9] * 3, [s / 9] * 3, [0.0] * 3])
    torch.testing.assert_close(g, expected)
    assert float(stats["clipfrac_seq"]) == pytest.approx(1 / 3)  # 1 of the 3 non-empty rows
    assert float(stats["clipfrac"]) == pytest.approx(3 / 9)  # its 3 tokens of 9
    # ratio used: s on rows 0 and 2, 1 on row 1
    assert float(stats["ratio_mean"]) == pytest.approx((6 * s + 3) / 9, rel=1e-6)
    assert float(stats["ratio_max"]) == pytest.approx(s, rel=1e-6)
    # the token-level PPO loss on the same data clips tokens of row 1 (e^0.9 > 1.2, e^-0.5 < 0.8
    # with A > 0 is not clipped: -A*0.61 > -A*0.8 is false -> only e^0.9) -> clipfrac > 0 there
    _, tok_stats = policy_loss(logp, torch.zeros(4, 3), adv, mask, 0.2)
    assert "clipfrac_seq" not in tok_stats
    # tokens clipped at token level: row0 e^0.5, e^0.6, e^0.4 (all > 1.2, A>0); row1 e^0.9;
    # row2 (A<0): none (clip takes the lower bound only below 0.8)
    assert float(tok_stats["clipfrac"]) == pytest.approx(4 / 9)


# ---- GSPO-token ---------------------------------------------------------------------------


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("objective", POLICY_OBJECTIVES)
def test_gspo_token_equals_gspo_with_sequence_advantages(agg, objective):
    # same value bit for bit; same gradient when A is constant per sequence, for every loss_agg
    # (each aggregation weighs the tokens of a row equally). Row 2 has s = e^0.5, clipped.
    logp0 = torch.tensor([[0.1, -0.2, 0.4, 0.0], [0.02, -0.04, NAN, NAN], [0.5, 0.6, 0.4, 0.5],
                          [NAN] * 4])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    adv = torch.tensor([[1.0] * 4, [-2.0] * 4, [0.7] * 4, [NAN] * 4])
    old = torch.tensor([[0.0, 0.1, -0.1, 0.0], [0.01, 0.0, 0.0, 0.0], [0.0] * 4, [0.0] * 4])
    out = {}
    for level in ("sequence", "sequence-token"):
        logp = logp0.clone().requires_grad_(True)
        loss, stats = policy_loss(logp, old, adv, mask, 0.2, 0.28, agg=agg, norm_len=4,
                                  ratio_level=level, objective=objective)
        out[level] = (loss.detach(), _grad(loss, logp), stats)
    (l1, g1, s1), (l2, g2, s2) = out["sequence"], out["sequence-token"]
    assert torch.equal(l1, l2)
    torch.testing.assert_close(g1, g2)
    assert torch.isfinite(g1).all() and torch.all(g1[mask == 0] == 0)
    for k in s1:
        assert torch.equal(s1[k], s2[k]), k


def test_gspo_token_gradient_with_per_token_advantages():
    # sequence-token: L_t = -A_t * s_i (value), grad_t = -A_t * s_i / N for token-mean
    # row 0: log r [0.1, -0.2, 0.4] -> s0; A = [1, -1, 2]; row 1: log r [0.02, -0.04] -> s1; A = [3, 0]
    logp = _logp2()
    adv = torch.tensor([[1.0, -1.0, 2.0], [3.0, 0.0, NAN]])
    loss, _ = policy_loss(logp, torch.zeros(2, 3), adv, MASK2, 0.2, ratio_level="sequence-token")
    assert loss.item() == pytest.approx((-(1 - 1 + 2) * S0 - 3 * S1) / 5, rel=1e-6)
    expected = torch.tensor([[-S0 / 5, S0 / 5, -2 * S0 / 5], [-3 * S1 / 5, 0.0, 0.0]])
    torch.testing.assert_close(_grad(loss, logp), expected)


# ---- CISPO --------------------------------------------------------------------------------
#
# ratios r = [1.5, 0.5, 1.1], A = [1, -1, 1], clip_low 0.2, clip_high 0.28:
#   w = sg(clip(r, 0.8, 1.28)) = [1.28, 0.8, 1.1]
#   old_logp = [-1, -2, -0.5] -> logp = old + log r
#   L_t = -w A logp: token-mean = (-1.28*lp0 + 0.8*lp1 - 1.1*lp2) / 3
#   grad = -w A / 3 = [-1.28/3, 0.8/3, -1.1/3]   (PPO would give 0 on tokens 0 and 1)
CISPO_R = [1.5, 0.5, 1.1]
CISPO_OLD = [-1.0, -2.0, -0.5]
CISPO_ADV = torch.tensor([[1.0, -1.0, 1.0]])


def _cispo_logp():
    return torch.tensor([[o + math.log(r) for o, r in zip(CISPO_OLD, CISPO_R)]], requires_grad=True)


def test_cispo_value_gradient_and_clipfrac():
    logp = _cispo_logp()
    lp = [o + math.log(r) for o, r in zip(CISPO_OLD, CISPO_R)]
    loss, stats = policy_loss(logp, torch.tensor([CISPO_OLD]), CISPO_ADV, torch.ones(1, 3), 0.2, 0.28,
                              objective="cispo")
    assert loss.item() == pytest.approx((-1.28 * lp[0] + 0.8 * lp[1] - 1.1 * lp[2]) / 3, rel=1e-6)
    torch.testing.assert_close(_grad(loss, logp), torch.tensor([[-1.28 / 3, 0.8 / 3, -1.1 / 3]]))
    assert float(stats["clipfrac"]) == pytest.approx(2 / 3)  # weights of tokens 0 and 1 changed
    assert float(stats["clipfrac_lower"]) == 0.0
    assert float(stats["ratio_mean"]) == pytest.approx(sum(CISPO_R) / 3, rel=1e-6)
    assert float(stats["ratio_max"]) == pytest.approx(1.5, rel=1e-6)
    # PPO on the same tokens: the clipped tokens 0 and 1 get no gradient
    logp2 = _cispo_logp()
    ppo, _ = policy_loss(logp2, torch.tensor([CISPO_OLD]), CISPO_ADV, torch.ones(1, 3), 0.2, 0.28)
    torch.testing.assert_close(_grad(ppo, logp2), torch.tensor([[0.0, 0.0, -1.1 / 3]]))


def test_cispo_no_lower_bound_and_weights():
    # clip_low = 1.0: lower bound 0, r = 0.5 keeps weight 0.5; rollout weights [2, 0.5, 1] multiply
    # grad = -w_roll * clip(r) * A / 3 = [-2*1.28/3, 0.5*0.5/3, -1.1/3]
    logp = _cispo_logp()
    wr = torch.tensor([[2.0, 0.5, 1.0]])
    loss, stats = policy_loss(logp, torch.tensor([CISPO_OLD]), CISPO_ADV, torch.ones(1, 3), 1.0, 0.28,
                              weights=wr, objective="cispo")
    torch.testing.assert_close(_grad(loss, logp), torch.tensor([[-2 * 1.28 / 3, 0.25 / 3, -1.1 / 3]]))
    assert float(stats["clipfrac"]) == pytest.approx(1 / 3)


def test_cispo_sequence_level():
    # row: log r = [0.5, 0.6, 0.4] (old 0) -> s = e^0.5 > 1.28 -> w = 1.28 for every token, A = 1
    # L = -1.28 * sum(logp) / 3 ; grad = -1.28 / 3 per token; the sequence counts as clipped
    logp = torch.tensor([[0.5, 0.6, 0.4]], requires_grad=True)
    for level in ("sequence", "sequence-token"):
        loss, stats = policy_loss(logp, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3), 0.2, 0.28,
                                  ratio_level=level, objective="cispo")
        assert loss.item() == pytest.approx(-1.28 * 1.5 / 3, rel=1e-6)
        torch.testing.assert_close(_grad(loss, logp), torch.full((1, 3), -1.28 / 3))
        assert float(stats["clipfrac_seq"]) == 1.0 and float(stats["clipfrac"]) == 1.0


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("level", RATIO_LEVELS)
def test_cispo_at_ratio_one_has_the_ppo_gradient(agg, level):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g)
    mask = torch.tensor([[1.0] * 5, [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    # "sequence" spreads the row's advantages over its tokens: equal to cispo for per-row A only
    adv = torch.randn(3, 1, generator=g).expand(3, 5) if level == "sequence" else torch.randn(3, 5, generator=g)
    grads = []
    for objective in POLICY_OBJECTIVES:
        logp = old.clone().requires_grad_(True)  # ratio exactly 1
        loss, _ = policy_loss(logp, old, adv, mask, 0.2, agg=agg, norm_len=6, ratio_level=level,
                              objective=objective)
        grads.append(_grad(loss, logp))
    torch.testing.assert_close(grads[0], grads[1])
    if level == "token":
        # and the hand form: -A * m / n_tokens for token-mean
        if agg == "token-mean":
            torch.testing.assert_close(grads[1], -adv * mask / mask.sum())


def test_argument_errors():
    args = (torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(*args, 0.2, dual_clip=3.0, objective="cispo")
    with pytest.raises(ValueError, match="ratio_level"):
        policy_loss(*args, 0.2, ratio_level="seq")
    with pytest.raises(ValueError, match="objective"):
        policy_loss(*args, 0.2, objective="grpo")
    with pytest.raises(ValueError, match="clip"):
        policy_loss(*args, 1.5)
    with pytest.raises(ValueError, match="clip"):
        policy_loss(*args, -0.1)
    # clip_low = 1.0 (no lower bound) is allowed for both objectives; dual clip at sequence level too
    for objective in POLICY_OBJECTIVES:
        policy_loss(*args, 1.0, objective=objective)
    policy_loss(*args, 0.2, dual_clip=3.0, ratio_level="sequence")


# ---- stats --------------------------------------------------------------------------------


def test_ratio_stats_token_level_ignore_padding():
    # valid ratios [1.5, 0.5, 1.1, 0.9] -> mean 1.0, max 1.5; the padded 3.0 is not read
    logp = torch.log(torch.tensor([[1.5, 0.5, 3.0], [1.1, 0.9, 3.0]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    _, stats = policy_loss(logp, torch.zeros(2, 3), torch.ones(2, 3), mask, 0.2)
    assert float(stats["ratio_mean"]) == pytest.approx(1.0, rel=1e-6)
    assert float(stats["ratio_max"]) == pytest.approx(1.5, rel=1e-6)
    assert set(stats) == {"clipfrac", "clipfrac_lower", "approx_kl", "ratio_mean", "ratio_max"}


def test_ratio_stats_sequence_level_and_approx_kl_stays_token_level():
    # ratio used: s0 on 3 tokens, s1 on 2 -> mean (3 s0 + 2 s1) / 5, max s0
    logp = _logp2()
    _, stats = policy_loss(logp, torch.zeros(2, 3), ADV2, MASK2, 0.2, ratio_level="sequence")
    assert float(stats["ratio_mean"]) == pytest.approx((3 * S0 + 2 * S1) / 5, rel=1e-6)
    assert float(stats["ratio_max"]) == pytest.approx(S0, rel=1e-6)
    tok = [0.1, -0.2, 0.4, 0.02, -0.04]
    k3 = sum(math.exp(x) - 1 - x for x in tok) / 5
    assert float(stats["approx_kl"]) == pytest.approx(k3, rel=1e-5)
    assert set(stats) == {"clipfrac", "clipfrac_lower", "approx_kl", "ratio_mean", "ratio_max",
                          "clipfrac_seq"}
    for v in stats.values():
        assert v.dim() == 0 and not v.requires_grad


def test_clipfrac_seq_with_dual_clip_and_cispo():
    # 3 rows, A per row [+1, -1, +1], clip 0.2, seq log-ratios [0.5, 0.5, 0.0]
    # ppo: row 0 clipped (s > 1.2, A > 0); row 1 unclipped (A < 0 takes -A*s); row 2 inside -> 1/3
    # cispo: the weight is changed on rows 0 and 1 (s outside [0.8, 1.2] whatever A) -> 2/3
    logp = torch.tensor([[0.5, 0.5], [0.4, 0.6], [0.1, -0.1]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]])
    m = torch.ones(3, 2)
    _, ppo = policy_loss(logp, torch.zeros(3, 2), adv, m, 0.2, ratio_level="sequence")
    _, cis = policy_loss(logp, torch.zeros(3, 2), adv, m, 0.2, ratio_level="sequence", objective="cispo")
    assert float(ppo["clipfrac_seq"]) == pytest.approx(1 / 3)
    assert float(cis["clipfrac_seq"]) == pytest.approx(2 / 3)
    # dual clip c = 1.5 at sequence level: row 1 has -A*s = 1.6487 > 1.5 -> bound taken
    _, dual = policy_loss(logp, torch.zeros(3, 2), adv, m, 0.2, dual_clip=1.5, ratio_level="sequence")
    assert float(dual["clipfrac_lower"]) == pytest.approx(2 / 6)


def test_empty_batch_stats():
    logp = torch.full((2, 3), NAN, requires_grad=True)
    for level, objective in itertools.product(RATIO_LEVELS, POLICY_OBJECTIVES):
        loss, stats = policy_loss(logp, torch.full((2, 3), NAN), torch.full((2, 3), NAN), torch.zeros(2, 3),
                                  0.2, ratio_level=level, objective=objective)
        assert loss.item() == 0.0
        assert float(stats["ratio_max"]) == 1.0 and float(stats["ratio_mean"]) == 1.0
        assert float(stats["clipfrac"]) == 0.0
        if level != "token":
            assert float(stats["clipfrac_seq"]) == 0.0
        g = _grad(loss, logp)
        assert torch.all(g == 0)


# ---- padding rows / combinations ----------------------------------------------------------


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("level,objective", list(itertools.product(RATIO_LEVELS, POLICY_OBJECTIVES)))
def test_full_padding_row_and_garbage_never_leak(agg, level, objective):
    g = torch.Generator().manual_seed(1)
    B, T = 4, 5
    mask = torch.tensor([[1.0] * 5, [1, 1, 1, 0, 0], [0.0] * 5, [1, 1, 0, 0, 0]])
    clean_lp = -torch.rand(B, T, generator=g)
    clean_old = clean_lp + 0.3 * torch.randn(B, T, generator=g)
    clean_adv = torch.randn(B, T, generator=g)
    w = torch.rand(B, T, generator=g) + 0.5

    def dirty(x, fill):
        return torch.where(mask > 0, x, torch.full_like(x, fill))

    results = []
    for fill in (0.0, NAN, float("inf")):
        lp = dirty(clean_lp, fill).requires_grad_(True)
        loss, stats = policy_loss(lp, dirty(clean_old, -fill if fill == fill else fill), dirty(clean_adv, fill),
                                  mask, 0.2, 0.28, agg=agg, weights=dirty(w, fill), norm_len=7,
                                  ratio_level=level, objective=objective)
        grad = _grad(loss, lp)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert torch.all(grad[mask == 0] == 0)
        assert all(torch.isfinite(v) for v in stats.values())
        results.append((loss.detach(), grad, stats))
    for loss, grad, stats in results[1:]:
        assert torch.equal(loss, results[0][0])
        assert torch.equal(grad, results[0][1])
        for k in stats:
            assert torch.equal(stats[k], results[0][2][k]), k


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("level,objective", list(itertools.product(RATIO_LEVELS, POLICY_OBJECTIVES)))
def test_rollout_weights_scale_every_combination(agg, level, objective):
    # constant weights c scale loss and gradient by c; weight 0 on a row removes its gradient
    g = torch.Generator().manual_seed(2)
    mask = torch.tensor([[1.0] * 4, [1, 1, 0, 0]])
    old = -torch.rand(2, 4, generator=g)
    lp0 = old + 0.3 * torch.randn(2, 4, generator=g)
    adv = torch.randn(2, 4, generator=g)
    lp = lp0.clone().requires_grad_(True)
    base, _ = policy_loss(lp, old, adv, mask, 0.2, agg=agg, ratio_level=level, objective=objective)
    g_base = _grad(base, lp)
    lp = lp0.clone().requires_grad_(True)
    half, _ = policy_loss(lp, old, adv, mask, 0.2, agg=agg, weights=torch.full((2, 4), 0.5),
                          ratio_level=level, objective=objective)
    torch.testing.assert_close(half, 0.5 * base)
    torch.testing.assert_close(_grad(half, lp), 0.5 * g_base)
    lp = lp0.clone().requires_grad_(True)
    w = torch.tensor([[0.0] * 4, [1.0] * 4])
    only1, _ = policy_loss(lp, old, adv, mask, 0.2, agg=agg, weights=w, ratio_level=level, objective=objective)
    g1 = _grad(only1, lp)
    assert torch.all(g1[0] == 0)
    torch.testing.assert_close(g1[1], g_base[1])


# ---- default path is the old formula, bit for bit -----------------------------------------


def _old_policy_loss(logp, old_logp, advantages, mask, clip_low, clip_high=None, dual_clip=None,
                     agg="token-mean", weights=None, norm_len=None):
    """Copy of policy_loss before the toolbox (token ratio, PPO only)."""
    if clip_high is None:
        clip_high = clip_low
    m = mask > 0
    zero = lambda x: torch.where(m, x, torch.zeros((), dtype=x.dtype))  # noqa: E731
    adv = zero(advantages).detach()
    log_ratio = zero(logp - old_logp.detach()).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_tok = torch.maximum(pg_unclipped, pg_clipped)
    clip_taken = pg_clipped > pg_unclipped
    if dual_clip is not None:
        bound = -adv * dual_clip
        lower_taken = (adv < 0) & (bound < per_tok)
        per_tok = torch.where(lower_taken, bound, per_tok)
    else:
        lower_taken = torch.zeros_like(clip_taken)
    if weights is not None:
        per_tok = per_tok * zero(weights).detach()
    loss = aggregate(per_tok, m, agg, norm_len)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean(clip_taken.float(), m),
            "clipfrac_lower": masked_mean(lower_taken.float(), m),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, m),
        }
    return loss, stats


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("dual", [None, 3.0])
@pytest.mark.parametrize("use_w", [False, True])
def test_default_path_bit_identical(agg, dual, use_w):
    g = torch.Generator().manual_seed(3)
    B, T = 5, 7
    mask = (torch.rand(B, T, generator=g) > 0.3).float()
    mask[2] = 0
    old = -torch.rand(B, T, generator=g) * 3
    lp0 = torch.where(mask > 0, old + 0.5 * torch.randn(B, T, generator=g), torch.full((B, T), NAN))
    adv = torch.randn(B, T, generator=g) * 2
    w = torch.rand(B, T, generator=g) * 2 if use_w else None
    lp_a, lp_b = lp0.clone().requires_grad_(True), lp0.clone().requires_grad_(True)
    new, s_new = policy_loss(lp_a, old, adv, mask, 0.2, 0.28, dual, agg, w, 9)
    ref, s_ref = _old_policy_loss(lp_b, old, adv, mask, 0.2, 0.28, dual, agg, w, 9)
    assert torch.equal(new, ref)
    assert torch.equal(_grad(new, lp_a), _grad(ref, lp_b))
    for k in s_ref:
        assert torch.equal(s_new[k], s_ref[k]), k
    # the explicit defaults are the same call
    lp_c = lp0.clone().requires_grad_(True)
    again, _ = policy_loss(lp_c, old, adv, mask, 0.2, 0.28, dual, agg, w, 9, ratio_level="token", objective="ppo")
    assert torch.equal(again, ref)


# ---- overlong penalty (DAPO eq. 13) -------------------------------------------------------


def test_overlong_penalty_piecewise():
    # max_new_tokens 10, buffer 4 -> start 6; penalty 0.5
    # len <= 6: 0; 7: -0.5*1/4; 8: -0.5*2/4; 9: -0.5*3/4; >= 10: -0.5
    lengths = torch.tensor([0, 5, 6, 7, 8, 9, 10, 12])
    out = overlong_penalty(lengths, 10, 4, 0.5)
    assert out.dtype == torch.float32 and out.shape == (8,)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, 0.0, -0.125, -0.25, -0.375, -0.5, -0.5]))
    # float lengths and penalty 0
    torch.testing.assert_close(overlong_penalty(torch.tensor([9.0]), 10, 4, 0.0), torch.zeros(1))


def test_overlong_penalty_buffer_edges():
    # buffer == max_new_tokens: the penalty grows from length 0
    torch.testing.assert_close(overlong_penalty(torch.tensor([0, 2, 4]), 4, 4, 1.0),
                               torch.tensor([0.0, -0.5, -1.0]))
    # buffer 1: only the full-length response is punished
    torch.testing.assert_close(overlong_penalty(torch.tensor([8, 9, 10]), 10, 1, 2.0),
                               torch.tensor([0.0, 0.0, -2.0]))
    # buffer > max_new_tokens is allowed (start -2): length 0 -> -2/6
    torch.testing.assert_close(overlong_penalty(torch.tensor([0]), 4, 6, 1.0), torch.tensor([-2 / 6]))
    for bad in (0, -3):
        with pytest.raises(ValueError, match="buffer"):
            overlong_penalty(torch.tensor([1]), 10, bad, 1.0)
    with pytest.raises(ValueError, match="penalty"):
        overlong_penalty(torch.tensor([1]), 10, 4, -1.0)


# ---- truncated rows -----------------------------------------------------------------------


def test_truncated_rows():
    # max_new_tokens 4, EOS ids {2, 7}; width 5 (padding id 0)
    ids = torch.tensor([
        [5, 6, 8, 9, 0],  # 4 tokens, last not EOS                  -> truncated
        [5, 6, 8, 2, 0],  # 4 tokens, ends in EOS                   -> not
        [5, 7, 0, 0, 0],  # EOS earlier (short)                     -> not
        [5, 6, 8, 0, 0],  # stopped short (stop string), no EOS     -> not
        [0, 0, 0, 0, 0],  # empty                                   -> not
        [5, 6, 8, 9, 4],  # over the budget, no EOS                 -> truncated
        [3, 3, 3, 9, 9],  # padding id after the budget is masked   -> truncated (last valid 9)
    ])
    mask = torch.tensor([
        [1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1],
        [1, 1, 1, 1, 0],
    ])
    out = truncated_rows(ids, mask, {2, 7}, 4)
    assert out.dtype == torch.bool
    assert out.tolist() == [True, False, False, False, False, True, True]
    # no EOS ids: every full-length row counts as cut
    assert truncated_rows(ids, mask, set(), 4).tolist() == [True, True, False, False, False, True, True]
    # float mask and a list of ids work too
    assert truncated_rows(ids, mask.float(), [7, 2], 4).tolist() == out.tolist()


# ---- dynamic sampling group filter --------------------------------------------------------


def test_groups_with_signal():
    metric = torch.tensor([
        1.0, 1.0, 1.0,          # all right          -> no signal
        0.0, 1.0, 0.0,          # mixed              -> signal
        NAN, 1.0, 0.0,          # nan                -> no signal
        0.5, 0.5, 0.5 + 1e-12,  # spread below 1e-9  -> no signal
        float("inf"), 0.0, 1.0,  # inf               -> no signal
        0.2, 0.2, 0.2 + 1e-6,   # small real spread  -> signal
    ])
    out = groups_with_signal(metric, 3)
    assert out.dtype == torch.bool and out.shape == (6,)
    assert out.tolist() == [False, True, False, False, False, True]
    assert groups_with_signal(torch.tensor([1.0, 2.0]), 1).tolist() == [False, False]
    with pytest.raises(ValueError, match="divisible"):
        groups_with_signal(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="1-D"):
        groups_with_signal(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="group_size"):
        groups_with_signal(torch.zeros(4), 0)


def test_group_row_mask():
    keep = torch.tensor([True, False, True])
    rows = group_row_mask(keep, 2)
    assert rows.tolist() == [True, True, False, False, True, True]
    assert rows.nonzero().squeeze(-1).tolist() == [0, 1, 4, 5]
    assert group_row_mask(torch.tensor([1, 0]), 3).tolist() == [True] * 3 + [False] * 3
    with pytest.raises(ValueError):
        group_row_mask(keep, 0)
