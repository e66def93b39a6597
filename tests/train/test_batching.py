"""Micro-batch planning (group-wise shuffle, length sorting, padding trimmed) and the fused
log-prob path change nothing that is learned: losses, gradients, updates and the no-grad
passes equal the plain computation on the untrimmed batch (fp32, tolerances stated)."""

from __future__ import annotations

import pytest
import torch

from rltune.recipe.schema import Recipe

GROUP = 4


@pytest.fixture(autouse=True)
def always_share(monkeypatch):
    """Tiny models save too little to share prompts by default (`shared_prompt.pays_off`)."""
    monkeypatch.setattr("rltune.train.shared_prompt.MIN_SAVED_FLOP", 0.0)


@pytest.fixture(scope="module")
def dist():
    from rltune.engine.distributed import init_distributed

    return init_distributed("cpu")


def _recipe(name="grpo", agg="token-mean", share=False, micro=4, entropy=0.0):
    algo = {"name": name, "loss_agg": agg, "group_size": GROUP, "entropy_coef": entropy}
    return Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
        "reward": {"functions": ["builtin:format"]}, "algorithm": algo,
        "actor": {"lr": 1e-2, "warmup_steps": 0, "eps": 1e-2}, "critic": {"lr": 2e-2, "warmup_steps": 0, "eps": 1e-2},
        "rollout": {"batch_size": 16, "max_new_tokens": 9},
        "train": {"batch_size": 16, "micro_batch_size": micro, "share_prompts": share}})


def _experience(seed=0, groups=4):
    """`groups` prompts of different lengths (left-padded to a common width wider than any),
    GROUP samples each with responses of different lengths (right-padded past the longest)."""
    from rltune.rollout.experience import Experience

    g = torch.Generator().manual_seed(seed)
    B, P, T = groups * GROUP, 12, 9
    plen = torch.tensor([3, 7, 5, 9])[:groups].repeat_interleave(GROUP)            # (B,)
    prompt_mask = (torch.arange(P)[None, :] >= P - plen[:, None]).long()           # (B, P) left pad
    prompt_ids = torch.randint(4, 60, (groups, P), generator=g).repeat_interleave(GROUP, 0) * prompt_mask
    rlen = torch.randint(1, T - 1, (B,), generator=g)                              # never T: trimmable
    mask = (torch.arange(T)[None, :] < rlen[:, None]).float()
    return Experience(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                      response_ids=torch.randint(4, 60, (B, T), generator=g) * mask.long(), response_mask=mask,
                      advantages=torch.randn(B, T, generator=g) * mask, returns=torch.randn(B, T, generator=g) * mask,
                      old_values=torch.randn(B, T, generator=g) * mask * 0.1,
                      ref_logp=-torch.rand(B, T, generator=g) * mask * 3)


def _params(engine):
    return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def test_trimmed_drops_only_padding_columns():
    exp = _experience()
    mb = exp.select(torch.arange(0, 4)).trimmed()                 # one group: prompt length 3
    assert mb.prompt_ids.shape[1] == 3 and bool(mb.prompt_mask.all())
    assert mb.response_width == int(exp.response_mask[:4].sum(-1).max()) < exp.response_width
    assert mb.advantages.shape == mb.response_ids.shape == mb.ref_logp.shape
    torch.testing.assert_close(mb.advantages.sum(), exp.advantages[:4].sum())
    # a trimmed batch's forward inputs are the untrimmed ones without the all-padding columns
    full, cut = exp.select(torch.arange(0, 4)).model_inputs(), mb.model_inputs()
    keep = torch.cat([torch.arange(9, 12), 12 + torch.arange(mb.response_width)])
    for k in full:
        assert torch.equal(full[k][:, keep], cut[k]), k


def test_micro_batches_keep_groups_together_and_sort_by_length():
    from rltune.train.batching import micro_batches

    exp = _experience()
    exp.index = torch.arange(exp.size)
    updates = micro_batches(exp, 4, 16, torch.Generator().manual_seed(3), GROUP)
    assert len(updates) == 1 and len(updates[0]) == 4
    rows = torch.cat([mb.index for mb in updates[0]])
    assert sorted(rows.tolist()) == list(range(16))               # every row once
    for mb in updates[0]:                                         # one whole group per micro-batch
        assert len(set((mb.index // GROUP).tolist())) == 1
    longest = [int((mb.prompt_mask.sum(-1) + mb.response_mask.sum(-1)).max()) for mb in updates[0]]
    assert longest == sorted(longest)


# train.max_tokens_per_micro_batch: `pack` on rows given as (prompt, response) widths, hand-computed
PACKINGS = [
    # one row at a time, budget 20: 2 x (4 + 3) = 14 fits, a third row 3 x 9 = 27 does not; 2 x 10 = 20
    # fits exactly; the 16-token response 3 x 20 > 20 opens its own (alone 20)
    ([4, 4, 4, 4, 4], [2, 3, 5, 6, 16], 1, 20, [0, 2, 4, 5]),
    # groups of 2, budget 24: group 0 alone 2 x 7 = 14; with group 1, 4 x (5 + 4) = 36 > 24: group 1
    # opens the next (2 x 8 = 16); group 2 alone 2 x 22 = 44 > 24 is split: row 4 with group 1
    # 3 x (5 + 9) = 42 > 24 opens one, row 5 with it 2 x 22 = 44 > 24 another
    ([3, 3, 5, 5, 2, 2], [1, 4, 2, 3, 9, 20], 2, 24, [0, 2, 4, 5, 6]),
    # groups of 2, budget 40: group 1 (2 x 22 = 44) is split and its first row joins group 0
    # (3 x 12 = 36), the second 4 x 22 = 88 does not
    ([2, 2, 2, 2], [3, 3, 10, 20], 2, 40, [0, 3, 4]),
    # a row longer than the budget (1 + 50 > 10) goes alone, and the next row does not join it
    ([1, 1, 1], [2, 50, 2], 1, 10, [0, 1, 2, 3]),
    # everything fits one micro-batch: 3 x (5 + 4) = 27 <= 27
    ([5, 2, 1], [1, 4, 3], 1, 27, [0, 3]),
]


@pytest.mark.parametrize("prompt,response,unit,budget,want", PACKINGS)
def test_pack_by_tokens(prompt, response, unit, budget, want):
    from rltune.train.batching import pack

    cuts = pack(prompt, response, unit, budget)
    assert cuts == want
    for a, b in zip(cuts, cuts[1:]):   # within the budget, or a single row
        assert (b - a) * (max(prompt[a:b]) + max(response[a:b])) <= budget or b - a == 1


def test_even_out_splits_the_largest_micro_batch():
    from rltune.train.batching import even_out

    assert even_out([0, 3, 4], 2) == [0, 3, 4]
    assert even_out([0, 3, 4], 3) == [0, 1, 3, 4]                  # 3 rows -> 1 + 2
    assert even_out([0, 3, 4], 4) == [0, 1, 2, 3, 4]
    assert even_out([0, 3, 4], 9) == [0, 1, 2, 3, 4]               # one row each at most


def test_widths_are_what_trimmed_keeps():
    from rltune.train.batching import widths

    exp = _experience()
    rows = torch.arange(exp.size)
    prompt, response = widths(exp, rows)
    for i in range(exp.size):
        mb = exp.select(torch.tensor([i])).trimmed()
        assert (prompt[i], response[i]) == (mb.prompt_width, mb.response_width)


def test_token_budget_micro_batches(dist):
    """Budget 45 on groups of 4: the groups of 3-token prompts fit whole (4 x (3 + 7) = 40), the
    9-token prompts' group (4 x 16 = 64) is split by rows; every row once, length-sorted."""
    from rltune.train.batching import micro_batches

    exp = _experience()
    exp.index = torch.arange(exp.size)
    mbs = micro_batches(exp, 4, 16, torch.Generator().manual_seed(3), GROUP, max_tokens=45)[0]
    rows = torch.cat([mb.index for mb in mbs])
    assert sorted(rows.tolist()) == list(range(16))
    sizes = [mb.size for mb in mbs]
    assert len(set(sizes)) > 1, sizes                              # uneven micro-batches
    for mb in mbs:
        assert mb.size * (mb.prompt_width + mb.response_width) <= 45 or mb.size == 1
    whole = [mb for mb in mbs if mb.prompt_width == 3]
    assert whole and all(mb.size % GROUP == 0 for mb in whole)     # the short group stays whole
    longest = [int((mb.prompt_mask.sum(-1) + mb.response_mask.sum(-1)).max()) for mb in mbs]
    assert longest == sorted(longest)


def test_no_shared_prompts_with_a_token_budget_under_zero3_on_several_ranks(monkeypatch):
    """The ranks' budget-packed micro-batches differ: a shared pass (two forward calls) on one rank and a
    single call on another would hang ZeRO-3's weight gathers."""
    from rltune.train import update

    class Zero3:
        def zero_optimization_stage(self):
            return 3

    r = _recipe(share=True)
    budget = r.model_copy(update={"train": r.train.model_copy(update={"max_tokens_per_micro_batch": 40})})
    monkeypatch.setattr(update.shared_prompt, "shared_prompt_reason", lambda model: None)
    monkeypatch.setattr(update, "world_size", lambda: 2)
    assert update.use_shared_prompts(r, Zero3()) and not update.use_shared_prompts(budget, Zero3())
    monkeypatch.setattr(update, "world_size", lambda: 1)
    assert update.use_shared_prompts(budget, Zero3())


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_token_budget_update_equals_one_batch(dist, agg):
    """An update cut by a 30-token budget (7 uneven micro-batches of 2-3 rows, groups split) == the
    same update as one untrimmed micro-batch: loss, stats, grad norm and weights (rtol 1e-5)."""
    from rltune.engine.roles import build_actor
    from rltune.recipe.knobs import Knobs
    from rltune.train.batching import micro_batches
    from rltune.train.update import make_actor_loss, run_update

    r = _recipe(agg=agg, entropy=0.01)
    exp = _experience(1)
    exp.index = torch.arange(exp.size)
    exp.behavior_logp = exp.ref_logp + 0.05 * exp.response_mask   # ratio != 1: clipping matters
    knobs = Knobs(1e-2, 2e-2, 0.0, 0.2, 0.01)
    one, packed = build_actor(r, "cpu", 10), build_actor(r, "cpu", 10)
    before = _params(one)
    res1 = run_update(one, [exp], make_actor_loss(one, r, knobs), agg)
    mbs = micro_batches(exp, 4, 16, torch.Generator().manual_seed(0), GROUP, max_tokens=30)[0]
    assert len({mb.size for mb in mbs}) > 1 and len(mbs) > 4, [mb.size for mb in mbs]
    res2 = run_update(packed, mbs, make_actor_loss(packed, r, knobs), agg)
    _assert_same_update(res1, res2, before, _params(one), _params(packed))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("entropy", [0.0, 0.01])
def test_planned_update_equals_one_untrimmed_batch(dist, agg, entropy):
    """Group-shuffled, length-sorted, trimmed micro-batches of 4 == one untrimmed batch of 16:
    same loss, same stats, same weights after the step (rtol 1e-5, atol 1e-6)."""
    from rltune.engine.roles import build_actor
    from rltune.recipe.knobs import Knobs
    from rltune.train.batching import micro_batches
    from rltune.train.update import make_actor_loss, run_update

    r = _recipe(agg=agg, entropy=entropy)
    exp = _experience(1)
    exp.index = torch.arange(exp.size)
    exp.behavior_logp = exp.ref_logp + 0.05 * exp.response_mask   # ratio != 1: clipping matters
    knobs = Knobs(1e-2, 2e-2, 0.0, 0.2, entropy)
    one, planned = build_actor(r, "cpu", 10), build_actor(r, "cpu", 10)
    before = _params(one)
    res1 = run_update(one, [exp], make_actor_loss(one, r, knobs), agg)
    mbs = micro_batches(exp, 4, 16, torch.Generator().manual_seed(0), GROUP)[0]
    assert sum(mb.response_ids.numel() for mb in mbs) < exp.response_ids.numel()  # something was trimmed
    res2 = run_update(planned, mbs, make_actor_loss(planned, r, knobs), agg)
    _assert_same_update(res1, res2, before, _params(one), _params(planned))


def _assert_same_update(res1, res2, before, after1, after2):
    """Two updates of the same rows, cut differently: the same loss, grad norm and stats, and the
    same weights after the step, which moved (rtol 1e-5, atol 1e-6)."""
    assert res1.loss == pytest.approx(res2.loss, rel=1e-5, abs=1e-7)
    assert res1.grad_norm == pytest.approx(res2.grad_norm, rel=1e-5)
    for k in res1.stats:
        assert res1.stats[k] == pytest.approx(res2.stats[k], rel=1e-5, abs=1e-6), k
    assert max(float((after1[n] - before[n]).abs().max()) for n in before) > 1e-4
    for n in after1:
        torch.testing.assert_close(after1[n], after2[n], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("share,budget", [(False, None), (True, None), (True, 40)])
def test_no_grad_passes_equal_row_by_row_forward(dist, share, budget):
    """forward_logp / forward_values over sorted, trimmed (and shared-prompt) micro-batches, of 4
    rows or packed into `budget` tokens, == one sequence at a time, untrimmed (atol 1e-5)."""
    from rltune.algo import logprobs_from_logits
    from rltune.engine.roles import build_actor, build_critic
    from rltune.train.update import forward_logp, forward_values, use_shared_prompts

    r = _recipe(name="ppo", share=share)
    torch.manual_seed(0)
    actor, critic = build_actor(r, "cpu", 10), build_critic(r, "cpu", 10)
    exp = _experience(2)
    assert use_shared_prompts(r, actor) is share
    got = forward_logp(actor.module, exp, 0.7, 4, GROUP, share, budget)
    values = forward_values(critic.module, exp, 4, GROUP, share, budget)
    T = exp.response_width
    with torch.no_grad():
        for i in range(exp.size):
            one = exp.select(torch.tensor([i]))
            logits = actor.module(**one.model_inputs(), use_cache=False).logits[:, -T - 1:-1] / 0.7
            want = logprobs_from_logits(logits, one.response_ids) * one.response_mask
            torch.testing.assert_close(got[i:i + 1], want, atol=1e-5, rtol=1e-5)
            want_v = critic.module(**one.model_inputs())[:, -T - 1:-1] * one.response_mask
            torch.testing.assert_close(values[i:i + 1], want_v, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_shared_prompt_update_equals_unshared(dist, name):
    """Actor (and for PPO critic) updates with each prompt computed once per group == every
    sequence computed whole (rtol 1e-5, atol 1e-6)."""
    from rltune.engine.roles import build_actor, build_critic
    from rltune.recipe.knobs import Knobs
    from rltune.train.batching import micro_batches
    from rltune.train.update import make_actor_loss, make_critic_loss, run_update

    exp = _experience(3)
    exp.index = torch.arange(exp.size)
    knobs = Knobs(1e-2, 2e-2, 0.0, 0.2, 0.0)
    results = []
    for share in (False, True):
        r = _recipe(name=name, share=share, micro=8)
        actor = build_actor(r, "cpu", 10)
        mbs = micro_batches(exp, 8, 16, torch.Generator().manual_seed(0), GROUP)[0]
        res = [run_update(actor, mbs, make_actor_loss(actor, r, knobs), "token-mean")]
        engines = [actor]
        if name == "ppo":
            torch.manual_seed(0)                                  # the value head's random init
            critic = build_critic(r, "cpu", 10)
            res.append(run_update(critic, mbs, make_critic_loss(critic, r), "token-mean"))
            engines.append(critic)
        results.append((res, [_params(e) for e in engines]))
    (res_a, params_a), (res_b, params_b) = results
    for x, y in zip(res_a, res_b):
        assert x.loss == pytest.approx(y.loss, rel=1e-5, abs=1e-7)
        assert x.grad_norm == pytest.approx(y.grad_norm, rel=1e-5)
    for pa, pb in zip(params_a, params_b):
        for n in pa:
            torch.testing.assert_close(pa[n], pb[n], rtol=1e-5, atol=1e-6)


def test_sharing_pays_off_only_above_the_flop_threshold(dist):
    """saved FLOPs = 2 x params x prompt tokens not recomputed per row: a tiny model's 12 repeated
    prompt rows of ~6 tokens save ~10^7 FLOPs, far below the threshold; at threshold 0 it shares."""
    import rltune.train.shared_prompt as sp
    from rltune.engine.roles import build_actor

    actor = build_actor(_recipe(share=True), "cpu", 10)
    mb = _experience().select(torch.arange(16))
    n = sum(p.numel() for p in actor.module.parameters())
    saved = 2.0 * n * (16 - 4) * float(mb.prompt_mask.sum()) / 16
    assert sp.pays_off(actor, mb) is True                       # threshold 0 (fixture)
    sp.MIN_SAVED_FLOP = saved + 1.0
    assert sp.pays_off(actor, mb) is False
    sp.MIN_SAVED_FLOP = saved
    assert sp.pays_off(actor, mb) is True
