"""Episodes in the batch container (issue 27, item 3): environment and tool tokens are attended
(`response_mask`), never trained (`loss_mask`, read as `Experience.train_mask`). Perturbing
anything at an environment position, except its token id (the later model tokens attend to it),
leaves the loss, its gradient, the KL, the advantages and the token counts unchanged."""

from __future__ import annotations

import pytest
import torch

from rltune.recipe.schema import Recipe


@pytest.fixture(scope="module")
def dist():
    from rltune.engine.distributed import init_distributed

    return init_distributed("cpu")


def _recipe(agg="token-mean", algo="grpo"):
    return Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
        "reward": {"functions": ["builtin:format"]},
        "algorithm": {"name": algo, "loss_agg": agg, "entropy_coef": 0.01},
        "actor": {"lr": 1e-2, "warmup_steps": 0, "eps": 1e-2},
        "rollout": {"batch_size": 4}, "train": {"batch_size": 4, "micro_batch_size": 4}})


def _episodes(seed=0):
    """4 episodes, T = 9: model turn, environment turn, model turn (rows end at different places)."""
    from rltune.rollout.experience import Experience

    g = torch.Generator().manual_seed(seed)
    B, P, T = 4, 3, 9
    lengths = torch.tensor([9, 7, 9, 4])
    attended = (torch.arange(T)[None, :] < lengths[:, None]).float()                  # (B, T)
    env = torch.zeros(B, T)
    env[:, 2:5] = 1.0                                                                 # tokens 2-4: the env's turn
    model = attended * (1 - env)
    return Experience(
        prompt_ids=torch.randint(4, 60, (B, P), generator=g), prompt_mask=torch.ones(B, P, dtype=torch.long),
        response_ids=torch.randint(4, 60, (B, T), generator=g), response_mask=attended, loss_mask=model,
        behavior_logp=-torch.rand(B, T, generator=g) * attended, ref_logp=-torch.rand(B, T, generator=g) * attended,
        rollout_logp=-torch.rand(B, T, generator=g) * attended,
        advantages=torch.randn(B, T, generator=g) * model, scores=torch.rand(B, generator=g))


def _perturbed(exp):
    """The same episodes with every per-token float at the environment's positions changed."""
    env = (exp.response_mask - exp.loss_mask).bool()
    out = exp.select(torch.arange(exp.size))
    for name in ("behavior_logp", "ref_logp", "rollout_logp", "advantages"):
        setattr(out, name, torch.where(env, getattr(out, name) - 3.7, getattr(out, name)))
    return out


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_environment_tokens_never_reach_the_loss(dist, agg):
    """One optimizer update from the same weights on the episodes and on the perturbed episodes:
    the same loss, the same stats (KL, entropy, clipfrac, correction weights), the same weights."""
    from rltune.engine.roles import build_actor
    from rltune.recipe.knobs import Knobs
    from rltune.train.update import make_actor_loss, run_update

    r = _recipe(agg)
    k = Knobs(1e-2, 3e-2, 0.01, 0.2, 0.05)
    exp = _episodes()
    results, weights = [], []
    for e in (exp, _perturbed(exp)):
        actor = build_actor(r, "cpu", 10)
        results.append(run_update(actor, [e], make_actor_loss(actor, r, k, correction="tis"), agg))
        weights.append([p.detach().clone() for p in actor.module.parameters()])
    assert results[0].loss == results[1].loss and results[0].stats == results[1].stats
    assert all(torch.equal(a, b) for a, b in zip(*weights))
    # and the loss mask is not the attention mask: training the env tokens too would change it
    everywhere = _perturbed(exp)
    everywhere.loss_mask = None
    actor = build_actor(r, "cpu", 10)
    assert run_update(actor, [everywhere], make_actor_loss(actor, r, k, correction="tis"), agg).loss != results[0].loss


def test_token_counts_and_weights_count_the_models_tokens_only(dist):
    from rltune.engine.roles import build_actor
    from rltune.recipe.knobs import Knobs
    from rltune.train.update import make_actor_loss, run_update

    r = _recipe("token-mean")
    exp = _episodes()
    k = Knobs(1e-2, 3e-2, 0.0, 0.2, 0.0)
    # 1 micro-batch of 4 == 4 of 1: the accumulation weights come from the trained tokens
    one, four = build_actor(r, "cpu", 10), build_actor(r, "cpu", 10)
    a = run_update(one, [exp], make_actor_loss(one, r, k), "token-mean")
    b = run_update(four, [exp.select(torch.tensor([i])) for i in range(4)], make_actor_loss(four, r, k), "token-mean")
    assert abs(a.loss - b.loss) < 1e-6
    for p1, p4 in zip(one.module.parameters(), four.module.parameters()):
        torch.testing.assert_close(p1, p4, rtol=1e-5, atol=1e-6)


def test_advantages_and_kl_skip_environment_tokens():
    """PPO: the score lands on the last model token and GAE runs over the model's tokens as if the
    environment's were deleted; GRPO broadcasts over model tokens only; the KL sums model tokens."""
    from rltune.algo import gae, kl_in_reward

    exp = _episodes()
    m = exp.train_mask
    values = torch.rand(exp.size, exp.response_width) * exp.response_mask
    rewards = kl_in_reward(exp.scores, exp.behavior_logp, exp.ref_logp, m, 0.1)
    adv, ret = gae(rewards, values, m, 0.99, 0.95)
    p = _perturbed(exp)
    values2 = torch.where((exp.response_mask - m).bool(), values + 5.0, values)
    rewards2 = kl_in_reward(p.scores, p.behavior_logp, p.ref_logp, m, 0.1)
    adv2, ret2 = gae(rewards2, values2, m, 0.99, 0.95)
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    assert float((adv * (1 - m)).abs().sum()) == 0.0
    for i in range(exp.size):                      # the same as the row with its env tokens deleted
        keep = m[i].bool()
        a1, _ = gae(rewards[i, keep][None], values[i, keep][None], torch.ones(1, int(keep.sum())), 0.99, 0.95)
        torch.testing.assert_close(adv[i, keep], a1[0])
        last = int(keep.nonzero().max())
        assert rewards[i, last] != 0 and float(rewards[i, ~keep].abs().sum()) == 0.0


def test_concat_and_select_keep_the_loss_mask():
    from rltune.rollout.experience import Experience

    exp = _episodes()
    single = Experience(prompt_ids=exp.prompt_ids[:2, :2], prompt_mask=exp.prompt_mask[:2, :2],
                        response_ids=exp.response_ids[:2, :5], response_mask=torch.ones(2, 5))
    joined = Experience.concat([exp, single], pad_id=0)
    assert joined.loss_mask.shape == (6, 9)
    torch.testing.assert_close(joined.loss_mask[:4], exp.loss_mask)
    torch.testing.assert_close(joined.loss_mask[4:, :5], torch.ones(2, 5))        # single-turn: every token
    assert float(joined.loss_mask[4:, 5:].sum()) == 0.0
    assert torch.equal(exp.select(torch.tensor([1, 3])).train_mask, exp.loss_mask[[1, 3]])
    assert torch.equal(single.train_mask, single.response_mask)
