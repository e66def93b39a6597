"""Multi-rank edge cases (issue 10, item 9): drop_last false, seed null, attn auto on cuda:N."""

from __future__ import annotations

import importlib.util

import pytest

from rltune.data import PromptSampler
from trainlib import free_port


def _ranks(n, bs, world, seed=7, drop_last=False):
    return [PromptSampler(n, bs, seed, True, drop_last, rank, world) for rank in range(world)]


@pytest.mark.parametrize("n,bs,world", [(10, 3, 2), (7, 2, 2), (5, 4, 2), (10, 3, 1)])
def test_drop_last_false_gives_every_rank_full_batches_and_covers_every_prompt(n, bs, world):
    samplers = _ranks(n, bs, world)
    stream = []
    for _ in range(12):
        batches = [s.next_batch() for s in samplers]
        assert [len(b) for b in batches] == [bs] * world
        stream += [i for b in batches for i in b]
    # the global stream is one permutation per epoch, back to back: nothing dropped, nothing twice
    assert len(stream) >= 2 * n
    for e in range(len(stream) // n):
        assert sorted(stream[e * n:(e + 1) * n]) == list(range(n))


def _epoch_order(n, seed, epoch):
    s = PromptSampler(n, 1, seed, True, False)
    s.load_state_dict({"epoch": epoch, "cursor": 0, "seed": seed})
    return s._order


def test_drop_last_false_tops_up_from_the_next_epoch():
    s0, s1 = _ranks(5, 2, 2)
    first = s0.next_batch() + s1.next_batch()
    second = s0.next_batch() + s1.next_batch()
    assert s0.state_dict() == s1.state_dict() == {"epoch": 1, "cursor": 3, "seed": 7, "n": 5}
    e0, e1 = _epoch_order(5, 7, 0), _epoch_order(5, 7, 1)
    assert e0 != e1
    # the last prompt of epoch 0, then the first 3 of epoch 1; epoch 1 goes on from its 4th
    assert first == e0[:4] and second == e0[4:] + e1[:3]
    assert s0.next_batch() + s1.next_batch() == e1[3:] + _epoch_order(5, 7, 2)[:2]


def test_drop_last_true_skips_the_remainder():
    s0, s1 = _ranks(10, 3, 2, drop_last=True)
    for _ in range(5):
        a, b = s0.next_batch(), s1.next_batch()
        assert len(a) == len(b) == 3 and not set(a) & set(b)
    assert s0.epoch == 4  # 6 of 10 prompts per epoch, 4 dropped


@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_mid_epoch_draws_the_same_prompts(drop_last):
    ref = _ranks(11, 2, 2, drop_last=drop_last)
    expected = [[s.next_batch() for s in ref] for _ in range(9)]
    run = _ranks(11, 2, 2, drop_last=drop_last)
    got = [[s.next_batch() for s in run] for _ in range(4)]
    states = [s.state_dict() for s in run]
    # a resumed run; with trainer.seed null it would draw another seed: the saved one wins
    resumed = _ranks(11, 2, 2, seed=12345, drop_last=drop_last)
    for s, st in zip(resumed, states):
        s.load_state_dict(st)
    got += [[s.next_batch() for s in resumed] for _ in range(5)]
    assert got == expected


def test_sampler_errors_name_the_fix():
    with pytest.raises(ValueError, match="data.drop_last: false"):
        PromptSampler(3, 2, 0, drop_last=True, world_size=2)
    with pytest.raises(ValueError, match="no prompts"):
        PromptSampler(0, 2, 0, drop_last=False)


# ---- trainer.seed: null -> one seed for all ranks

def test_broadcast_int_one_rank_is_the_value():
    from rltune.train.collective import broadcast_int

    assert broadcast_int(123) == 123




def _broadcast_worker(rank, world, port, out_dir):
    import random

    import torch.distributed as dist

    from rltune.train.collective import broadcast_int

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        value = broadcast_int(random.Random(rank).randrange(2**31))  # every rank draws its own
        (out_dir / f"rank{rank}").write_text(str(value))
    finally:
        dist.destroy_process_group()


def test_broadcast_int_two_ranks_share_rank0s_value(tmp_path):
    import random

    import torch.multiprocessing as mp

    mp.spawn(_broadcast_worker, args=(2, free_port(), tmp_path), nprocs=2, join=True)
    values = [int((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    assert values == [random.Random(0).randrange(2**31)] * 2


def _shutdown_worker(rank, world, port, out_dir):
    import time

    import torch.distributed as dist

    from rltune.engine.distributed import shutdown_distributed

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    if rank == 1:
        time.sleep(1.0)  # rank 1 is still at work when rank 0 is done
    arrived = time.time()
    shutdown_distributed()
    left = time.time()
    (out_dir / f"rank{rank}").write_text(f"{arrived} {left} {dist.is_initialized()}")


def test_shutdown_waits_for_every_rank_then_destroys_the_group(tmp_path):
    """The end of a multi-rank run: no rank tears its connections down while a peer is still
    working (a barrier first), and every rank leaves with its process group destroyed."""
    import torch.multiprocessing as mp

    mp.spawn(_shutdown_worker, args=(2, free_port(), tmp_path), nprocs=2, join=True)
    (a0, l0, init0), (a1, l1, init1) = [(tmp_path / f"rank{r}").read_text().split() for r in range(2)]
    assert float(l0) >= float(a1)   # rank 0 waited for rank 1 to arrive
    assert (init0, init1) == ("False", "False")


class _Zero3Stub:
    """What `shared_prompt.pays_off` reads of a DeepSpeed engine: its ZeRO stage and the full
    parameter count of its module (100M: 18 repeated prompt tokens pay off, 0 do not)."""

    def __init__(self, stage):
        self.module = type("M", (), {"_rltune_param_count": 100_000_000})()
        self.zero_optimization_stage = lambda: stage


def _prompt_rows(rank):
    """Rank 0: one prompt of 6 tokens 4 times (saves 3 x 6 tokens); rank 1: 4 distinct prompts."""
    import torch

    from rltune.rollout.experience import Experience

    ids = torch.tensor([[0, 5, 6, 7, 8, 9, 10]] * 4) if rank == 0 else torch.arange(28).view(4, 7) + 1
    mask = (ids > 0).long()
    resp = torch.ones(4, 2, dtype=torch.long)
    return Experience(prompt_ids=ids, prompt_mask=mask, response_ids=resp, response_mask=resp.float())


def _pays_off_worker(rank, world, port, out_dir):
    import torch.distributed as dist

    from rltune.train.shared_prompt import pays_off

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        mb = _prompt_rows(rank)
        (out_dir / f"rank{rank}").write_text(f"{pays_off(_Zero3Stub(3), mb)} {pays_off(_Zero3Stub(2), mb)}")
    finally:
        dist.destroy_process_group()


def test_shared_prompt_decision_is_the_same_on_every_zero3_rank(tmp_path):
    """ZeRO-3 gathers weights around every forward call on all ranks together: the rank whose
    micro-batch repeats no prompt takes the shared pass when another rank's pays off (two calls
    each), instead of one plain call against two (a hang). Below ZeRO-3 each rank decides alone."""
    import torch.multiprocessing as mp

    from rltune.train.shared_prompt import pays_off

    assert [pays_off(_Zero3Stub(3), _prompt_rows(r)) for r in (0, 1)] == [True, False]   # one rank: alone
    mp.spawn(_pays_off_worker, args=(2, free_port(), tmp_path), nprocs=2, join=True)
    assert [(tmp_path / f"rank{r}").read_text() for r in range(2)] == ["True True", "True False"]


# ---- model.attn_implementation: auto on cuda:N

@pytest.mark.parametrize("device,want", [("cuda:0", "flash_attention_2"), ("cuda:3", "flash_attention_2"),
                                         ("cuda", "flash_attention_2"), ("cpu", "sdpa")])
def test_attn_auto_detects_cuda_devices(monkeypatch, device, want):
    from rltune.models.loading import attn_impl

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: object() if name == "flash_attn" else real(name, *a, **k))
    assert attn_impl("auto", device) == want
    assert attn_impl("eager", device) == "eager"


def test_reward_normaliser_sees_the_global_batch():
    """Two ranks scoring different completions end with the same normaliser state: the one a
    single rank scoring all of them has."""
    from rltune.recipe.schema import RewardCfg
    from rltune.reward import RewardComputer

    cfg = RewardCfg(functions=["builtin:format"], normalize=True)
    completions = {0: ["12", "twelve"], 1: ["7", "the answer is 7 because"]}
    single = RewardComputer(cfg)
    single(["p"] * 4, completions[0] + completions[1], {})
    raw = {r: RewardComputer(cfg)(["p"] * 2, completions[r], {}, training=False).scores for r in (0, 1)}
    assert raw[0] != raw[1]
    for rank in (0, 1):
        rc = RewardComputer(cfg, gather=lambda values, rank=rank: values + raw[1 - rank] if rank == 0
                            else raw[0] + values)
        rc(["p"] * 2, completions[rank], {})
        assert rc.state_dict() == single.state_dict()


def test_eval_rewards_leave_the_normaliser_alone():
    from rltune.recipe.schema import RewardCfg
    from rltune.reward import RewardComputer

    rc = RewardComputer(RewardCfg(functions=["builtin:format"], normalize=True))
    before = rc.state_dict()
    res = rc(["1+1="], ["2"], {}, training=False)
    assert rc.state_dict() == before
    assert res.scores == res.raw["builtin:format"]


@pytest.mark.parametrize("worlds", [(2, 1, 4), (4, 2, 1), (1, 4, 2)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_sampler_position_survives_a_world_size_change(worlds, drop_last):
    """Resume on another world size (docs/scale.md): the sampler's state is global, so ranks of any
    number that load it go on with the same prompt stream. Three calls on each world size in turn,
    the state handed over as a checkpoint carries it: the prompts drawn, all ranks together, are
    exactly those of one rank drawing throughout; every prompt once per epoch."""
    from rltune.data.sampler import PromptSampler

    n, per_call, seed = 20, 8, 3                       # prompts per generation call, all ranks together
    one = PromptSampler(n, per_call, seed, True, drop_last)
    expected = [one.next_batch() for _ in range(9)]
    state, drawn = None, []
    for world in worlds:
        ranks = [PromptSampler(n, per_call // world, seed, True, drop_last, r, world) for r in range(world)]
        for s in ranks:
            if state is not None:
                s.load_state_dict(state)
        for _ in range(3):
            drawn.append(sum((s.next_batch() for s in ranks), []))
        assert len({str(s.state_dict()) for s in ranks}) == 1
        state = ranks[0].state_dict()
    assert drawn == expected
