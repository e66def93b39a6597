"""Hand-computed checks of masked reductions and loss aggregation."""

import math

import pytest
import torch

from rltune.algo import (
    AGG_MODES,
    aggregate,
    last_token_index,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
# valid entries: 1, 2, 4


def test_masked_mean_and_sum():
    assert masked_sum(X, M).item() == pytest.approx(7.0)  # 1 + 2 + 4
    assert masked_mean(X, M).item() == pytest.approx(7.0 / 3.0)
    # per row: (1+2)/2 = 1.5 ; 4/1 = 4
    torch.testing.assert_close(masked_mean(X, M, dim=-1), torch.tensor([1.5, 4.0]))
    # bool masks are accepted too
    assert masked_mean(X, M.bool()).item() == pytest.approx(7.0 / 3.0)


def test_masked_var():
    # mean 7/3; deviations -4/3, -1/3, 5/3; squares 16/9 + 1/9 + 25/9 = 42/9
    assert masked_var(X, M).item() == pytest.approx(42 / 9 / 2)  # unbiased: / (n-1) = 7/3
    assert masked_var(X, M, unbiased=False).item() == pytest.approx(42 / 9 / 3)  # 14/9
    # a single valid element: unbiased variance undefined -> 0 (never nan)
    one = torch.tensor([[1.0, 0.0, 0.0]])
    assert masked_var(X[:1], one).item() == 0.0


def test_masked_whiten():
    mean, std = 7.0 / 3.0, math.sqrt(7.0 / 3.0 + 1e-8)
    y = masked_whiten(X, M)
    exp = torch.tensor([[(1 - mean) / std, (2 - mean) / std, 0.0], [(4 - mean) / std, 0.0, 0.0]])
    torch.testing.assert_close(y, exp)
    # whitened valid entries have mean 0 and unbiased variance ~1
    assert masked_mean(y, M).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(y, M).item() == pytest.approx(1.0, abs=1e-5)
    # shift_mean=False: scale only, mean added back
    y2 = masked_whiten(X, M, shift_mean=False)
    torch.testing.assert_close(y2, torch.where(M.bool(), exp + mean, torch.zeros(())))


def test_whiten_ignores_nan_padding():
    Xg = X.clone()
    Xg[~M.bool()] = float("nan")
    torch.testing.assert_close(masked_whiten(Xg, M), masked_whiten(X, M))


def test_aggregate_modes_by_hand():
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    # valid: row0 1,2,3 (sum 6, mean 2); row1 5 (sum 5, mean 5); T = 4, B = 2
    expected = {
        "token-mean": 11 / 4,  # (1+2+3+5)/4
        "token-sum": 11.0,
        "seq-mean-token-sum": (6 + 5) / 2,
        "seq-mean-token-mean": (2 + 5) / 2,
        "seq-mean-token-sum-norm": (6 / 4 + 5 / 4) / 2,  # = 11 / (B*T) = 11/8
    }
    assert set(expected) == set(AGG_MODES)
    for mode, val in expected.items():
        assert aggregate(x, m, mode).item() == pytest.approx(val), mode


def test_aggregate_empty_rows_are_not_sequences():
    x = torch.tensor([[1.0, 2.0], [9.0, 9.0]])
    m = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    # only row 0 counts: sums 3, mean 1.5, norm 3/2
    assert aggregate(x, m, "seq-mean-token-sum").item() == pytest.approx(3.0)
    assert aggregate(x, m, "seq-mean-token-mean").item() == pytest.approx(1.5)
    assert aggregate(x, m, "seq-mean-token-sum-norm").item() == pytest.approx(1.5)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_aggregate_empty_mask_is_zero_with_grad(mode):
    x = torch.full((2, 3), float("nan"), requires_grad=True)
    out = aggregate(x, torch.zeros(2, 3), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(x.grad, torch.zeros(2, 3))


def test_aggregate_unknown_mode():
    with pytest.raises(ValueError) as ei:
        aggregate(X, M, "mean")
    for mode in AGG_MODES:
        assert mode in str(ei.value)


def test_last_token_index():
    m = torch.tensor(
        [
            [1.0, 1.0, 0.0, 0.0],  # last valid at 1
            [1.0, 0.0, 0.0, 0.0],  # 0
            [1.0, 1.0, 1.0, 1.0],  # 3
            [0.0, 0.0, 0.0, 0.0],  # empty -> 0 by convention
            [1.0, 0.0, 1.0, 0.0],  # interior zero -> 2
        ]
    )
    idx = last_token_index(m)
    assert idx.dtype == torch.long
    assert idx.tolist() == [1, 0, 3, 0, 2]
