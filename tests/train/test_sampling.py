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


class Sampler:
    def __init__(self, per_call: int):
        self.per_call, self.i = per_call, 0

    def next_batch(self):
        out = list(range(self.i, self.i + self.per_call))
        self.i += self.per_call
        return out


def components(overrides: dict, rollout=None, rows=None):
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
        sampler=Sampler(recipe.prompts_per_call), rollout=rollout or ScriptedRollout(6),
        rewards=rewards, dist=SimpleNamespace(is_main=True))


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


# ---- two ranks: every rank generates as long as the worst one is short

def _two_rank_worker(rank, world, port, out_dir):
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        # rank 0's prompts all carry signal (its batch is full after one round); rank 1's half
        rows = [{"prompt": str(i % 10), "signal": rank == 0 or i % 2 == 0} for i in range(400)]
        c = components({"algorithm.filter_groups": {"metric": "reward", "max_gen_calls": 8}}, rows=rows)
        c.dist = SimpleNamespace(is_main=rank == 0)
        out = sample_step(c)
        (out_dir / f"rank{rank}.json").write_text(json.dumps(
            {"calls": c.rollout.calls, "size": out.batch.exp.size, "signal": group_signal(out.batch),
             "metrics": out.metrics}))
    finally:
        dist.destroy_process_group()


def test_dynamic_sampling_on_two_ranks_runs_the_same_rounds_and_sums_the_counts(tmp_path):
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_two_rank_worker, args=(2, port, tmp_path), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    # rank 1 needs 8 calls (as in the one-rank test); rank 0, full after its first round, generates
    # alongside it (a rank that stopped would leave the other waiting in the collectives)
    assert r0["calls"] == r1["calls"] == [16, 8, 4, 4]
    assert r0["size"] == r1["size"] == 64 and all(r0["signal"]) and all(r1["signal"])
    m, m1 = r0["metrics"], r1["metrics"]
    assert m.pop("timing/extra_gen_s") >= 0 and m1.pop("timing/extra_gen_s") >= 0   # each rank's own clock
    assert m == m1                                        # global counts, the same on every rank
    assert m["rollout/gen_calls"] == 8
    # generated 32 + 32 groups; dropped 0 + 16; kept 16 + 16; surplus 16 (rank 0's later rounds) + 0
    assert (m["rollout/groups_generated"], m["rollout/groups_kept"], m["rollout/groups_dropped"],
            m["rollout/groups_topped_up"], m["rollout/groups_surplus"]) == (64, 32, 16, 0, 16)
    assert m["rollout/zero_std_frac"] == 0.25
