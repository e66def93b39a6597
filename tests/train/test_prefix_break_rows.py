"""Issue 49 item 6: the samples before a prefix break are rows of their own, trained with their
episode's advantage (docs/agents.md, "Tokens"). The learner's side, on hand-made rows: the batch
(`Experience.rows`, select, concat), the advantages, the cut into updates and micro-batches, the
fillers that keep ranks in step, and the in-flight batches of generation ahead. The matrix
(tests/train/test_matrix.py, BREAK_CASES) runs them on real engines, 2 ranks == 1 rank."""

from __future__ import annotations

import pytest
import torch

from rltune.recipe.schema import Recipe
from rltune.rollout.experience import Experience


def _rows(prompts: list[list[int]], responses: list[list[int]]) -> Experience:
    B, P, T = len(prompts), max(map(len, prompts)), max(map(len, responses))
    e = Experience(prompt_ids=torch.zeros(B, P, dtype=torch.long), prompt_mask=torch.zeros(B, P, dtype=torch.long),
                   response_ids=torch.zeros(B, T, dtype=torch.long), response_mask=torch.zeros(B, T),
                   loss_mask=torch.zeros(B, T), rollout_logp=torch.zeros(B, T))
    for b, (p, r) in enumerate(zip(prompts, responses)):
        e.prompt_ids[b, P - len(p):], e.prompt_mask[b, P - len(p):] = torch.tensor(p), 1
        e.response_ids[b, :len(r)], e.response_mask[b, :len(r)], e.loss_mask[b, :len(r)] = torch.tensor(r), 1, 1
        e.rollout_logp[b, :len(r)] = -torch.tensor(r, dtype=torch.float32) / 100
    return e


def _batch() -> Experience:
    """4 episodes (2 groups of 2); episode 0 broke twice, episode 3 once."""
    exp = _rows([[1], [2], [3], [4]], [[10, 11], [20], [30, 31, 32], [40]])
    exp.scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    exp.truncated = torch.zeros(4, dtype=torch.bool)
    exp.turn_tokens = torch.tensor([2, 1, 3, 1])
    exp.earlier = _rows([[1], [1, 5], [4]], [[7], [8, 9], [41, 42]])
    exp.earlier.owner = torch.tensor([0, 0, 3])
    return exp


def test_rows_puts_each_episodes_samples_together_in_sampling_order():
    rows = _batch().rows(0)
    assert rows.episode.tolist() == [0, 0, 0, 1, 2, 3, 3]
    firsts = [int(rows.response_ids[i, 0]) for i in range(rows.size)]
    assert firsts == [7, 8, 10, 20, 30, 41, 40]
    assert rows.scores.tolist() == [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]         # the episode's score on every row
    assert rows.rollout_logp[1, :2].tolist() == pytest.approx([-0.08, -0.09])
    assert rows.earlier is None and rows.owner is None
    plain = _batch()
    plain.earlier = None
    assert plain.rows(0).episode.tolist() == [0, 1, 2, 3]


def test_select_and_concat_keep_each_rows_earlier_samples():
    exp = _batch()
    picked = exp.select(torch.tensor([3, 0]))                                    # episodes 3 then 0
    assert picked.earlier.owner.tolist() == [1, 1, 0]
    assert picked.rows(0).episode.tolist() == [0, 0, 1, 1, 1]
    assert exp.select(torch.tensor([1, 2])).earlier is None
    both = Experience.concat([exp.select(torch.tensor([0, 1])), exp.select(torch.tensor([2, 3]))], 0)
    assert both.earlier.owner.tolist() == [0, 0, 3]
    assert torch.equal(both.rows(0).response_ids, exp.rows(0).response_ids)


def _c(algo: str, **extra):
    from types import SimpleNamespace

    r = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                               "reward": {"functions": ["builtin:exact_answer"]},
                               "algorithm": {"name": algo, "group_size": 2, "kl": {"coef": 0.1, "mode": "loss"},
                                             **extra}})
    return SimpleNamespace(recipe=r)


def test_grpo_gives_every_row_its_episodes_advantage():
    from rltune.train.loop import compute_advantages

    rows = _batch().rows(0)
    compute_advantages(_c("grpo", scale_by_std=False), rows, 0.0)
    # groups (episodes 0, 1) and (2, 3), scores 1 / 0: +0.5 and -0.5 on every model token of every row
    per_row = [float(rows.advantages[i, 0]) for i in range(rows.size)]
    assert per_row == [0.5, 0.5, 0.5, -0.5, 0.5, -0.5, -0.5]
    assert float(rows.advantages[rows.train_mask == 0].abs().sum()) == 0


def test_grpo_with_the_kl_in_the_reward_sums_it_over_the_episodes_rows():
    from rltune.train.loop import compute_advantages

    rows = _batch().rows(0)
    rows.behavior_logp = rows.train_mask * 0.1                                   # k1: 0.1 per model token
    rows.ref_logp = torch.zeros_like(rows.train_mask)
    compute_advantages(_c("grpo", scale_by_std=False, kl={"coef": 0.1, "mode": "reward", "estimator": "k1"}), rows, 0.1)
    # episode 0 has 1 + 2 + 2 = 5 model tokens (KL 0.05), episode 1 has 1 (0.01): 1 - 0.05 vs 0 - 0.01
    assert float(rows.advantages[0, 0]) == pytest.approx((0.95 - (-0.01)) / 2)
    assert float(rows.advantages[3, 0]) == pytest.approx(-(0.95 - (-0.01)) / 2)


def test_ppo_runs_gae_over_the_episodes_model_tokens_across_its_rows():
    from rltune.train.loop import compute_advantages

    rows = _batch().rows(0)
    rows.old_values = torch.zeros_like(rows.train_mask)
    compute_advantages(_c("ppo", gamma=0.5, lam=1.0, whiten_advantages=False), rows, 0.0)
    # episode 0: model tokens 7 | 8 9 | 10 11 (three rows), its score 1 on token 11: 0.5^4 ... 1
    assert rows.advantages[0, 0] == pytest.approx(0.0625)
    assert rows.advantages[1, :2].tolist() == pytest.approx([0.125, 0.25])
    assert rows.advantages[2, :2].tolist() == pytest.approx([0.5, 1.0])
    assert rows.token_rewards[:2].abs().sum() == 0 and rows.token_rewards[2, 1] == 1.0   # the score: last token only
    # without breaks the episode path is the plain one
    plain = _batch()
    plain.earlier = None
    a, b = plain.rows(0), plain.select(torch.arange(4))
    a.old_values = b.old_values = torch.zeros_like(a.train_mask)
    compute_advantages(_c("ppo"), a, 0.0)
    compute_advantages(_c("ppo"), b, 0.0)
    assert torch.equal(a.advantages, b.advantages) and torch.equal(a.returns, b.returns)


def test_an_update_holds_whole_episodes_and_single_row_episodes_cut_as_before():
    from rltune.train import batching

    rows = _batch().rows(0)
    rows.index = torch.arange(rows.size)                                           # as `learn` numbers them
    updates = batching.micro_batches(rows, 2, 2, torch.Generator().manual_seed(0), group=2)
    assert len(updates) == 2
    seen = []
    for mbs in updates:
        ids = sorted(i for mb in mbs for i in mb.index.tolist())
        eps = {int(rows.episode[i]) for i in ids}
        assert len(eps) == 2 and ids == sorted(i for i in range(rows.size) if int(rows.episode[i]) in eps)
        assert eps in ({0, 1}, {2, 3})                                            # the groups stay whole
        seen += ids
    assert sorted(seen) == list(range(rows.size))
    # one row per episode: the very micro-batches of the plain batch (the same shuffle draw)
    plain = _batch()
    plain.earlier = None
    a = plain.rows(0)
    a.index = torch.arange(4)
    a = batching.micro_batches(a, 1, 2, torch.Generator().manual_seed(3), group=2)
    p = plain.select(torch.arange(4))
    p.index = torch.arange(4)
    b = batching.micro_batches(p, 1, 2, torch.Generator().manual_seed(3), group=2)
    assert [[mb.index.tolist() for mb in u] for u in a] == [[mb.index.tolist() for mb in u] for u in b]


def test_a_filler_trains_nothing_and_writes_nowhere():
    from rltune.models.loading import load_causal_lm
    from rltune.recipe.knobs import Knobs
    from rltune.train import batching, update

    rows = _batch().rows(0)
    rows.index = torch.arange(rows.size)
    rows.advantages = torch.ones_like(rows.train_mask)
    mb = batching.filler(rows, torch.tensor([2, 3]))
    assert mb.filler and mb.size == 1 and float(mb.train_mask.sum()) == 0
    out = batching.scatter([(mb, torch.full((1, mb.response_width), 5.0))], rows.response_mask)
    assert float(out.abs().sum()) == 0                                          # its outputs go nowhere
    # the single update's forward records pi_behaviour into the sink: not a filler's
    r = _c("grpo").recipe
    model = load_causal_lm("builtin:tiny-llama", "fp32", "eager", "cpu")
    sink = torch.full_like(rows.train_mask, 7.0)
    loss_fn = update.make_actor_loss(model, r, Knobs.from_recipe(r), behavior_sink=sink)
    loss, _ = loss_fn(mb)
    assert float(loss.detach()) == 0 and bool((sink == 7.0).all())
    assert update.micro_weight(mb.train_mask, 10.0, 4.0, "token-mean") == 0
    assert update.micro_weight(mb.train_mask, 10.0, 4.0, "seq-mean-token-mean") == 0


def test_an_inflight_batch_keeps_its_earlier_samples_and_a_crafted_owner_is_refused():
    from rltune.train.pipeline import check_batch, pack, unpack
    from rltune.train.sampling import Scored, StepBatch

    exp = _batch()
    s = Scored(exp, ["p"] * 4, ["c"] * 4, [{"prompt": "p"}] * 4, [[]] * 4)
    back = unpack(pack(StepBatch(s, torch.ones(4), {})))
    check_batch(back, vocab=100)
    assert torch.equal(back.batch.exp.rows(0).response_ids, exp.rows(0).response_ids)
    back.batch.exp.earlier.owner[0] = 9
    with pytest.raises(ValueError, match="prefix break name no row"):
        check_batch(back, vocab=100)


def test_a_stale_sample_before_a_break_makes_its_group_stale():
    from rltune.train.pipeline import Pipeline
    from rltune.train.sampling import Scored, StepBatch

    exp = _batch()
    exp.versions = torch.full(exp.response_ids.shape, 5)
    exp.earlier.versions = torch.tensor([[5, 5], [5, 5], [2, 5]])               # episode 3's first sample: lag 3
    p = Pipeline.__new__(Pipeline)
    p.K, p.group, p.policy, p.on_stale, p.world = 1, 2, 5, "drop", 1
    s = Scored(exp, ["a", "a", "b", "b"], ["c"] * 4, [{"prompt": "a"}] * 2 + [{"prompt": "b"}] * 2, [[]] * 4)
    drawn, m = p._enforce_bound(StepBatch(s, torch.ones(4), {}))
    assert m["async/dropped"] == 1 and drawn.batch.prompts == ["a", "a"]         # episode 3's group went
    assert drawn.batch.exp.earlier.owner.tolist() == [0, 0]


def test_mask_truncated_masks_a_truncated_episodes_earlier_samples_too():
    from types import SimpleNamespace

    from rltune.train.sampling import mask_truncated

    exp = _batch()
    exp.truncated = torch.tensor([True, False, False, False])
    c = SimpleNamespace(recipe=Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"},
                                                      "data": {"train": "builtin:arithmetic"},
                                                      "reward": {"functions": ["builtin:exact_answer"]},
                                                      "rollout": {"mask_truncated": True}}),
                        rollout=SimpleNamespace(eos_ids=[2]))
    lengths, _ = mask_truncated(c, exp)
    assert lengths.tolist() == [5.0, 1.0, 3.0, 3.0]                            # every sample's model tokens
    assert exp.earlier.loss_mask[:2].sum() == 0 and exp.earlier.loss_mask[2].sum() == 2
