"""Rollout correction weights, Dr.GRPO's constant normaliser and weighted policy loss, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rltune.algo import aggregate, policy_loss, rollout_correction_weights

# behaviour / rollout log-probs of 4 tokens; the last one is padding
BEH = torch.tensor([[math.log(0.5), math.log(0.9), math.log(0.2), 0.0]])
ROL = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.8), 5.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
# raw weights pi_b / pi_r: 1.0, 3.0, 0.25 (padding ignored)


def test_tis_truncates_at_the_cap():
    w, st = rollout_correction_weights(BEH, ROL, MASK, "tis", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 0.25, 0.0]]))
    assert float(st["w_sum"]) == pytest.approx(4.25)
    assert float(st["w_max"]) == pytest.approx(3.0)
    assert float(st["capped"]) == 1 and float(st["n"]) == 3


def test_mis_masks_tokens_outside_the_band():
    w, st = rollout_correction_weights(BEH, ROL, MASK, "mis", cap=2.0)
    # 3.0 > 2 and 0.25 < 1/2 are dropped; 1.0 kept as is
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    assert float(st["capped"]) == 2


def test_none_is_all_ones_on_valid_tokens():
    w, st = rollout_correction_weights(BEH, ROL, MASK, "none", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    assert float(st["w_max"]) == pytest.approx(3.0)


def test_bad_mode_and_cap_are_refused():
    with pytest.raises(ValueError, match="mode"):
        rollout_correction_weights(BEH, ROL, MASK, "icepop", 2.0)
    with pytest.raises(ValueError, match="cap"):
        rollout_correction_weights(BEH, ROL, MASK, "tis", 1.0)


def test_weighted_policy_loss_scales_each_token():
    # ratio 1 (logp == old): per-token loss is -A; weights multiply it token by token
    logp = torch.zeros(1, 3, requires_grad=True)
    adv = torch.tensor([[1.0, 2.0, -1.0]])
    mask = torch.ones(1, 3)
    w = torch.tensor([[1.0, 0.5, 2.0]])
    loss, _ = policy_loss(logp, logp.detach(), adv, mask, 0.2, weights=w, agg="token-sum")
    # detach: float() of a tensor that requires grad warns (UserWarning) in torch >= 2.13
    assert float(loss.detach()) == pytest.approx(-(1.0 * 1 + 0.5 * 2 + 2.0 * -1))   # = 0
    loss.backward()
    # d/dlogp of -w*A*ratio at ratio 1 is -w*A
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, -1.0, 2.0]]))


def test_sum_norm_uses_the_constant_not_the_batch_width():
    x = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    # (6/16 + 4/16) / 2 with the generation budget 16
    assert float(aggregate(x, m, "seq-mean-token-sum-norm", norm_len=16)) == pytest.approx(10 / 32)
    # the same rows cut to their own width (a narrower micro-batch / rank) give the same value
    assert float(aggregate(x[:, :3], m[:, :3], "seq-mean-token-sum-norm", norm_len=16)) == pytest.approx(10 / 32)
    assert float(aggregate(x[1:, :1], m[1:, :1], "seq-mean-token-sum-norm", norm_len=16)) == pytest.approx(4 / 16)


def test_this_file_runs_without_user_warnings():
    """`make test` stays quiet where nothing is wrong: these tests raise no UserWarning of their
    own (e.g. float() of a tensor that requires grad)."""
    import os
    import subprocess
    import sys

    if os.environ.get("RLTUNE_WARNINGS_SUBRUN"):
        return
    env = dict(os.environ, RLTUNE_WARNINGS_SUBRUN="1", OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error::UserWarning",
                        __file__], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
