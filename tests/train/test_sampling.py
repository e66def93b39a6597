"""Steps 1-2 (`train.sampling`): DAPO dynamic sampling fills the batch with groups that carry
signal and its counts add up; the overlong penalty and the truncation mask reach the batch.

A scripted rollout engine and reward stand in for the models (the real ones are exercised by the
CLI runs in test_toolbox.py): prompts alternate between ones whose samples score differently
and ones whose samples all score alike, so every count is known in advance."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from rltune.data.sampler import PromptSampler
from rltune.recipe.schema import Recipe
from rltune.reward import RewardResult
from rltune.rollout.experience import Experience
from rltune.train.sampling import sample_step

EOS, PAD = 2, 0
G = 4


class ScriptedRollout:
    """Responses of `lengths[prompt % len(lengths)]` tokens; EOS last unless the row is cut."""
    eos_ids = {EOS}
    pad_id = PAD

    def __init__(self, max_new: int, lengths=(3,), cut=(False,)):
        self.max_new, self.lengths, self.cut, self.calls = max_new, lengths, cut, []

    def generate(self, prompt_ids, sampling):
        self.calls.append(len(prompt_ids))
        B, n = len(prompt_ids), sampling.n
        P = max(len(p) for p in prompt_ids)
        prompt = torch.full((B, P), PAD, dtype=torch.long)
        pmask = torch.zeros((B, P), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            prompt[i, P - len(p):] = torch.tensor(p)
            pmask[i, P - len(p):] = 1
        resp = torch.full((B * n, self.max_new), PAD, dtype=torch.long)
        rmask = torch.zeros((B * n, self.max_new))
        for i, p in enumerate(prompt_ids):
            k = (p[-1] - 10) % len(self.lengths)      # the prompt's digit picks its script
            L, cut = self.lengths[k], self.cut[k]
            for j in range(n):
                resp[i * n + j, :L] = 5 + j
                if not cut:
                    resp[i * n + j, L - 1] = EOS
                rmask[i * n + j, :L] = 1
        return Experience(prompt.repeat_interleave(n, 0), pmask.repeat_interleave(n, 0), resp, rmask,
                          rollout_logp=torch.zeros((B * n, self.max_new)))

    def sleep(self):
        pass


class Tok:
    chat_template = None
    eos_token_id = EOS
    pad_token_id = PAD
    bos_token_id = None

    def __call__(self, text, add_special_tokens=False, **kw):
        return {"input_ids": [10 + int(text)]}

    def encode(self, text, add_special_tokens=False, **kw):
        return [10 + int(text)]

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(map(str, ids))


def rewards(prompts, completions, columns, conversations=None, training=True):
    """Prompts with `signal` score 0, 1, 0, 1 across their group; the others all 0.5."""
    scores = [float(j % 2) if sig else 0.5 for j, sig in enumerate(columns["signal"])]
    return RewardResult(scores, {"builtin:exact_answer": scores})


def components(overrides: dict, rollout=None, rows=None, rank: int = 0, world: int = 1):
    data = {"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic",
            "apply_chat_template": False},
            "reward": {"functions": ["builtin:exact_answer"]},
            "algorithm": {"name": "grpo", "group_size": G},
            "rollout": {"batch_size": 16, "max_new_tokens": 6}, "train": {"batch_size": 64, "micro_batch_size": 16}}
    for key, value in overrides.items():
        cur = data
        *head, last = key.split(".")
        for k in head:
            cur = cur.setdefault(k, {})
        cur[last] = value
    recipe = Recipe.model_validate(data)
    rows = rows or [{"prompt": str(i % 10), "signal": i % 2 == 0} for i in range(400)]
    return SimpleNamespace(
        recipe=recipe, tokenizer=Tok(), train_set=SimpleNamespace(rows=rows, prompt_key="prompt"),
        # the trainer's own sampler (in order): each rank takes its share of every generation call
        sampler=PromptSampler(len(rows), max(1, recipe.prompts_per_call // world), 0, shuffle=False,
                              drop_last=False, rank=rank, world_size=world),
        rollout=rollout or ScriptedRollout(6),
        rewards=rewards, dist=SimpleNamespace(is_main=True), env=None)


def group_signal(batch) -> list[bool]:
    return [bool(x) for x in batch.exp.scores.view(-1, G).std(-1) > 0]


def test_dynamic_sampling_generates_until_the_batch_is_full():
    # 4 calls of 4 prompts (half with signal) -> 8 of 16 groups; then 2 calls -> 4 more, then
    # 1 -> 2, then 1 -> 2: 16 groups with signal after 8 calls, each round asking for what is missing
    c = components({"algorithm.filter_groups": {"metric": "reward", "max_gen_calls": 8}})
    out = sample_step(c)
    assert c.rollout.calls == [16, 8, 4, 4]                # prompts per generate call (one per round)
    assert out.batch.exp.size == 64 and all(group_signal(out.batch))
    m = out.metrics
    assert m["rollout/gen_calls"] == 8
    assert (m["rollout/groups_generated"], m["rollout/groups_kept"], m["rollout/groups_dropped"],
            m["rollout/groups_topped_up"], m["rollout/groups_surplus"]) == (32, 16, 16, 0, 0)
    assert m["rollout/zero_std_frac"] == 0.5
    assert m["timing/extra_gen_s"] >= 0.0
    # the kept groups are the signal prompts in generation order: rows 0, 2, 4, ... of the set
    assert out.batch.prompts[::G] == [str(i % 10) for i in range(0, 64, 2)][:16]


def test_dynamic_sampling_tops_up_and_warns_when_calls_run_out(caplog):
    c = components({"algorithm.filter_groups": {"metric": "acc", "max_gen_calls": 5}})
    with caplog.at_level(logging.WARNING, logger="rltune"):
        out = sample_step(c)
    assert c.rollout.calls == [16, 4]                      # the second round capped at 1 call
    m = out.metrics
    assert out.batch.exp.size == 64
    assert sum(group_signal(out.batch)) == 10
    assert (m["rollout/groups_generated"], m["rollout/groups_kept"], m["rollout/groups_dropped"],
            m["rollout/groups_topped_up"], m["rollout/groups_surplus"]) == (20, 10, 4, 6, 0)
    assert m["rollout/groups_generated"] == sum(m[f"rollout/groups_{k}"] for k in
                                               ("kept", "dropped", "topped_up", "surplus"))
    assert any("topped up with 6 groups" in r.getMessage() and "max_gen_calls" in r.getMessage()
               for r in caplog.records)


def test_surplus_groups_are_counted_not_trained():
    # every prompt has signal: the first round already fills the batch
    rows = [{"prompt": str(i % 10), "signal": True} for i in range(400)]
    c = components({"algorithm.filter_groups": {"metric": "reward", "max_gen_calls": 8}}, rows=rows)
    out = sample_step(c)
    assert c.rollout.calls == [16]
    assert out.metrics["rollout/groups_kept"] == 16 and out.metrics["rollout/groups_surplus"] == 0
    assert out.metrics["rollout/zero_std_frac"] == 0.0


def test_without_filtering_one_round_and_zero_std_share_reported():
    c = components({})
    out = sample_step(c)
    assert c.rollout.calls == [16]
    assert out.batch.exp.size == 64
    assert out.metrics == {"rollout/zero_std_frac": 0.5}
    assert sum(group_signal(out.batch)) == 8              # nothing dropped


def test_overlong_penalty_and_truncation_mask_reach_the_batch():
    # prompt script 0: 3 tokens ending in EOS; 1: 6 tokens cut (no EOS); 2: 5 tokens ending in EOS
    rollout = ScriptedRollout(6, lengths=(3, 6, 5), cut=(False, True, False))
    rows = [{"prompt": str(i % 3), "signal": False} for i in range(400)]
    c = components({"reward.overlong": {"buffer": 2, "penalty": 1.0}, "rollout.mask_truncated": True},
                   rollout=rollout, rows=rows)
    out = sample_step(c)
    exp = out.batch.exp
    script = [int(p) for p in out.batch.prompts]
    # lengths as generated; penalty 0 up to 4 tokens, -0.5 at 5, -1 at 6
    assert out.lengths.tolist() == [float((3, 6, 5)[k]) for k in script]
    expect_pen = [{0: 0.0, 1: -1.0, 2: -0.5}[k] for k in script]
    assert out.batch.raw["overlong"] == pytest.approx(expect_pen)
    assert exp.scores.tolist() == pytest.approx([0.5 + p for p in expect_pen])
    # the cut responses (script 1) have no token left in the loss; the others are untouched
    kept = exp.response_mask.sum(-1).tolist()
    assert kept == [0.0 if k == 1 else float((3, 6, 5)[k]) for k in script]
    assert float((exp.rollout_logp != 0).sum()) == 0.0
    share = sum(k == 1 for k in script) / len(script)
    assert out.metrics["rollout/masked_truncated_frac"] == pytest.approx(share)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_a_masked_out_response_weighs_nothing_in_the_accumulated_loss(agg):
    # micro-batches [a, b] and [c, d] where c is masked whole (rollout.mask_truncated): the
    # accumulated loss equals the loss over a, b, d alone, in every aggregation mode
    from rltune.algo import aggregate
    from rltune.train.update import micro_weight

    x = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [5.0, 6.0, 7.0], [4.0, 8.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    mbs = [(x[:2], m[:2]), (x[2:], m[2:])]
    tokens, seqs = float(m.sum()), float((m.sum(-1) > 0).sum())
    acc = sum(micro_weight(mm, tokens, seqs, agg) * aggregate(xx, mm, agg, 3) for xx, mm in mbs)
    keep = torch.tensor([0, 1, 3])
    assert float(acc) == pytest.approx(float(aggregate(x[keep], m[keep], agg, 3)))


# ---- several ranks: each rank fills its own share, every rank generates as long as the worst one is short

def test_each_rank_fills_only_its_share_of_the_step():
    # 8 ranks, `preset: [8-gpu, dapo]`: a step is 4 calls x 64 sequences = 256 over all ranks, 32 per
    # rank; with every group informative one round of the step's 4 calls fills it (the old count,
    # need = all ranks' groups, made each rank generate 24 calls and train on 192 sequences)
    from rltune.recipe.loader import load_recipe_text

    recipe = load_recipe_text("preset: [8-gpu, dapo]\nmodel: {policy: builtin:tiny-llama}\n"
                              "data: {train: builtin:arithmetic, apply_chat_template: false}\n"
                              "reward: {functions: [builtin:exact_answer]}\n").recipe
    assert recipe.gen_calls_per_step == 4 and recipe.algorithm.filter_groups.max_gen_calls == 24
    G, world = recipe.algorithm.group_size, 8
    rows = [{"prompt": str(i % 10), "signal": True} for i in range(400)]
    c = components({}, rows=rows, rank=3, world=world)
    c.recipe = recipe
    c.sampler = PromptSampler(len(rows), recipe.prompts_per_call // world, 0, shuffle=False, drop_last=False,
                              rank=3, world_size=world)               # as setup builds it: 2 prompts per call
    c.rollout = ScriptedRollout(recipe.rollout.max_new_tokens)
    out = sample_step(c)
    assert c.rollout.calls == [4 * 64 // G // world]      # prompts of this rank's one round: 4 calls' share
    assert out.batch.exp.size == 256 // world
    assert out.metrics["rollout/gen_calls"] == 4


def _two_rank_worker(rank, world, port, out_dir, all_signal):
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        # the sampler splits every call's prompts: rank 0 draws rows 0-1, rank 1 rows 2-3, then 4-5 / 6-7, ...
        # with all_signal False, rank 0's prompts all carry signal, rank 1's half of them
        rows = [{"prompt": str(i % 10), "signal": all_signal or (i // 2) % 2 == 0 or i % 2 == 0}
                for i in range(400)]
        c = components({"algorithm.filter_groups": {"metric": "reward", "max_gen_calls": 8}}, rows=rows,
                       rank=rank, world=world)
        c.dist = SimpleNamespace(is_main=rank == 0)
        out = sample_step(c)
        (out_dir / f"rank{rank}.json").write_text(json.dumps(
            {"calls": c.rollout.calls, "size": out.batch.exp.size, "signal": group_signal(out.batch),
             "prompts": out.batch.prompts[::G], "metrics": out.metrics}))
    finally:
        dist.destroy_process_group()


def _two_ranks(tmp_path, all_signal: bool):
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_two_rank_worker, args=(2, port, tmp_path, all_signal), nprocs=2, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_dynamic_sampling_on_two_ranks_with_every_group_informative_is_one_round(tmp_path):
    # the step is 64 sequences over both ranks: 32 per rank, 4 calls of 2 prompts each, one round
    r0, r1 = _two_ranks(tmp_path, all_signal=True)
    assert r0["calls"] == r1["calls"] == [8]
    assert r0["size"] == r1["size"] == 32
    assert r0["metrics"]["rollout/gen_calls"] == 4
    assert r0["metrics"]["rollout/groups_kept"] == 16 and r0["metrics"]["rollout/groups_surplus"] == 0


def test_dynamic_sampling_on_two_ranks_runs_the_same_rounds_and_sums_the_counts(tmp_path):
    r0, r1 = _two_ranks(tmp_path, all_signal=False)
    # rank 1 (half its groups with signal) needs 8 groups: 4 calls (4 kept), 2 (2), 1 (1), 1 (1); rank 0,
    # full after its first round, generates alongside it (a rank that stopped would leave the other
    # waiting in the collectives)
    assert r0["calls"] == r1["calls"] == [8, 4, 2, 2]
    assert r0["size"] == r1["size"] == 32 and all(r0["signal"]) and all(r1["signal"])
    m, m1 = r0["metrics"], r1["metrics"]
    assert m.pop("timing/extra_gen_s") >= 0 and m1.pop("timing/extra_gen_s") >= 0   # each rank's own clock
    assert m == m1                                        # global counts, the same on every rank
    assert m["rollout/gen_calls"] == 8
    # generated 16 + 16 groups; dropped 0 + 8; kept 8 + 8; surplus 8 (rank 0's later rounds) + 0
    assert (m["rollout/groups_generated"], m["rollout/groups_kept"], m["rollout/groups_dropped"],
            m["rollout/groups_topped_up"], m["rollout/groups_surplus"]) == (32, 16, 8, 0, 8)
    assert m["rollout/zero_std_frac"] == 0.25


# ---- the reward sees exactly the trained tokens

def test_a_pad_sampled_mid_answer_is_shown_to_the_reward_and_never_scores_higher():
    # three responses to "5+7=": "12</s>", "1<pad>2</s>" and "<pad><pad>12</s>", then trailing padding. The
    # mask keeps a pad sampled mid-response (it is trained), so the reward must see it: a model that
    # pads inside its answer cannot score higher than one that does not (the old decode dropped every
    # pad id, so "1<pad>2" read as "12" and the pads were free)
    from rltune.models.loading import load_tokenizer
    from rltune.reward.builtins import exact_answer, format
    from rltune.rollout.base import response_mask_from_ids as response_mask
    from rltune.train.sampling import decode

    tok = load_tokenizer("builtin:tiny-llama")
    pad, eos = tok.pad_token_id, tok.eos_token_id
    one, two = tok.encode("1", add_special_tokens=False)[-1], tok.encode("2", add_special_tokens=False)[-1]
    rows = [[one, two, eos, pad, pad, pad], [one, pad, two, eos, pad, pad], [pad, pad, one, two, eos, pad]]
    ids = torch.tensor(rows)
    mask = response_mask(ids, {eos}, pad)
    assert mask.sum(-1).tolist() == [3.0, 4.0, 5.0]                     # the sampled pads are trained tokens
    exp = Experience(torch.ones((3, 1), dtype=torch.long), torch.ones((3, 1), dtype=torch.long), ids, mask)
    texts = decode(tok, exp, SimpleNamespace(eos_ids={eos}, pad_id=pad))
    assert texts[0] == "12" and tok.pad_token in texts[1] and texts[2].count(tok.pad_token) == 2
    answers = ["12"] * 3
    total = [a + f for a, f in zip(exact_answer(None, texts, answers), format(None, texts))]
    assert total[0] == 2.0
    assert total[1] < total[0] and total[2] < total[0]


def test_draw_keys_are_the_same_on_any_world_size_and_after_a_resume():
    """The draw keys seed server requests (rollout.base.request_seeds): a prompt drawn at the same
    place of the run's prompt stream gets the same key on 1 rank or 2, and after a resume."""
    from rltune.data.sampler import PromptSampler
    from rltune.rollout.base import request_seeds

    one = PromptSampler(6, 4, seed=3, drop_last=False)
    two = [PromptSampler(6, 2, seed=3, drop_last=False, rank=r, world_size=2) for r in range(2)]
    for _ in range(4):                                     # past two epoch ends
        rows = one.next_batch()
        keys = one.last_keys
        assert [i for s in two for i in s.next_batch()] == rows
        assert [k for s in two for k in s.last_keys] == keys
        assert len(set(keys)) == 4
    resumed = PromptSampler(6, 4, seed=3, drop_last=False)
    resumed.load_state_dict(one.state_dict())
    one.next_batch()
    resumed.next_batch()
    assert resumed.last_keys == one.last_keys == [16, 17, 18, 19]      # epoch 2, positions 4, 5, then epoch 3
    seeds = request_seeds(3, [0, 1, 2, 0])
    assert seeds[0] == seeds[3] and len(set(seeds[:3])) == 3 and max(seeds) < 2 ** 56
    assert request_seeds(4, [0]) != request_seeds(3, [0])


def test_episode_requests_are_seeded_by_draw_sample_and_turn_whatever_their_order():
    """Episodes through a server (issue 49, item 5): each request's seed comes from (the run's seed,
    the prompt's draw key, which of its group's episodes, which of the episode's requests), so a
    turn samples the same whichever episodes share its generate call and in what order; an
    episode's next request gets the next seed; eval episodes (no draw key) stay unseeded."""
    from rltune.rollout.base import Sampling, turn_seeds
    from rltune.train.episode_rows import Episode, seeded

    def episodes():
        return [Episode(None, {}, "p", [], [], "", draw=d, sample=j) for d in (7, 8) for j in range(2)]

    base = Sampling(n=1, max_new_tokens=4)
    a = episodes()
    first = seeded(base, a, 3).seeds
    assert len(set(first)) == 4 and max(first) < 2 ** 56
    assert seeded(base, a, 3).seeds != first                       # the next turn: new seeds
    assert [e.requests for e in a] == [2, 2, 2, 2]
    b = episodes()[::-1]                                           # another order, another batch
    assert seeded(base, b, 3).seeds == first[::-1]
    c = episodes()
    assert seeded(base, c[2:], 3).seeds == first[2:]               # a call holding some of them only
    assert seeded(base, episodes(), 4).seeds != first              # another run seed
    assert turn_seeds(3, [(7, 0, 0)])[0] == first[0]
    unkeyed = [Episode(None, {}, "p", [], [], "")]
    assert seeded(base, unkeyed, 3) is base and unkeyed[0].requests == 0
