"""algo/episodes.py: an episode's rows (a prefix break's samples) laid end to end, hand-computed."""

from __future__ import annotations

import pytest
import torch

from rltune.algo import discounted_returns, gae
from rltune.algo.episodes import chain, episode_sums, last_rows, unchain


def test_last_rows_and_sums_per_episode():
    ep = torch.tensor([0, 0, 1, 2, 2, 2])
    assert last_rows(ep).tolist() == [False, True, True, False, False, True]
    assert episode_sums(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), ep, 3).tolist() == [3.0, 3.0, 15.0]


def test_chain_lays_an_episodes_rows_end_to_end_and_unchain_undoes_it():
    ep = torch.tensor([0, 0, 1, 2])
    x = torch.arange(1.0, 13.0).reshape(4, 3)                                   # (R, T) = (4, 3)
    y = chain(x, ep, 3)                                                         # (E, K*T) = (3, 6)
    assert y.tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 0, 0, 0], [10, 11, 12, 0, 0, 0]]
    assert torch.equal(unchain(y, ep), x)


def test_gae_runs_across_the_break_as_over_one_row_of_the_episodes_model_tokens():
    """Episode 0: row 0 holds model tokens a, b (then padding), row 1 the token c after the break
    (its re-rendered prompt is not a step). Values 0, the score 1 on c, gamma 0.5, lambda 1: the
    advantages are the discounted score, 0.25, 0.5, 1, as on one row [a, b, c]."""
    ep = torch.tensor([0, 0])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    values = torch.zeros(2, 3)
    adv, ret = gae(chain(rewards, ep, 1), chain(values, ep, 1), chain(mask, ep, 1), 0.5, 1.0)
    assert unchain(adv, ep).tolist() == [[0.25, 0.5, 0.0], [1.0, 0.0, 0.0]]
    assert unchain(ret, ep).tolist() == [[0.25, 0.5, 0.0], [1.0, 0.0, 0.0]]
    # the value of the first token after the break bootstraps the last one before it (lambda 0)
    values = torch.tensor([[0.0, 0.0, 0.0], [0.8, 0.0, 0.0]])
    adv, _ = gae(chain(rewards, ep, 1), chain(values, ep, 1), chain(mask, ep, 1), 0.5, 0.0)
    assert unchain(adv, ep)[0, 1] == pytest.approx(0.5 * 0.8)
    ret = discounted_returns(chain(rewards, ep, 1), chain(mask, ep, 1), 0.5)
    assert unchain(ret, ep).tolist() == [[0.25, 0.5, 0.0], [1.0, 0.0, 0.0]]
