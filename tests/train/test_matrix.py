"""The training-core matrix: every algorithm, KL mode and estimator, loss aggregation, rollout
correction, precision, ZeRO stage, rank count, ppo_epochs and updates_per_step, pairwise-covered
(every pair of values appears in some case), sampling on. Each case runs the trainer's own steps
3-8 on real DeepSpeed engines (tests/train/matrix_case.py) and asserts invariants, not "it ran".

The case list is generated deterministically (`pairwise_cases`) and written down in
docs/training.md (`python tests/train/test_matrix.py` prints the table; a test keeps the two equal).
`make test` runs DEFAULT_CASES (marked below); `make test-matrix` runs all.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from matrix_case import DEFAULTS as DEFAULT_FACTORS, NEW_TOKENS
from trainlib import ROOT, cli_env, free_port

FACTORS = {
    "algo": ["ppo", "grpo", "rloo", "reinforce_pp"],
    "kl_mode": ["reward", "loss"],
    "estimator": ["k1", "k2", "k3", "abs"],
    "agg": ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"],
    "correction": ["none", "tis", "mis"],
    "precision": ["fp32", "bf16"],
    "zero": [0, 1, 2, 3],
    "ranks": [1, 2],
    "epochs": [1, 2],
    "updates": [1, 2],
    # the features that entered beside the matrix: steps 1-2 (dynamic sampling, the truncation mask, the
    # overlong penalty, top-p/top-k sampling) and the update's variants (LoRA with and without adapter
    # dropout, GSPO's sequence ratio, CISPO)
    "filter": [False, True],
    "lora": ["none", "d0", "d05"],
    "ratio_level": ["token", "sequence", "sequence-token"],
    "policy_loss": ["ppo", "cispo"],
    "mask_truncated": [False, True],
    "overlong": [False, True],
    "top_p": [1.0, 0.9],
    # micro-batches by tokens (train.max_tokens_per_micro_batch): 40 holds 2-3 of the cases' ~14-token
    # sequences, so groups are split and micro-batches uneven
    "mb_tokens": [None, 40],
    # actor/critic.gradient_checkpointing (docs/memory.md): selective keeps the shared-prompt passes
    "checkpointing": [False, "full", "selective"],
    # train.padding_free (train/packed.py): the rows of a micro-batch end to end under a block mask
    "padding_free": [False, True],
}


def pairwise_cases(seed: int = 0, candidates: int = 60) -> list[dict]:
    """A greedy all-pairs covering: each new case is the candidate (random, seeded, with the
    first uncovered pair forced in) that covers the most still-uncovered value pairs."""
    names = list(FACTORS)
    uncovered = {((a, va), (b, vb)) for a, b in itertools.combinations(names, 2)
                 for va in FACTORS[a] for vb in FACTORS[b]}
    rng, cases = random.Random(seed), []
    while uncovered:
        (fa, va), (fb, vb) = min(uncovered, key=str)
        best, best_gain = None, -1
        for _ in range(candidates):
            case = {n: rng.choice(FACTORS[n]) for n in names}
            case[fa], case[fb] = va, vb
            gain = sum(((a, case[a]), (b, case[b])) in uncovered for a, b in itertools.combinations(names, 2))
            if gain > best_gain:
                best, best_gain = case, gain
        cases.append(best)
        uncovered -= {((a, best[a]), (b, best[b])) for a, b in itertools.combinations(names, 2)}
    return cases


CASES = pairwise_cases(seed=2)   # seed 2: a default subset of six covers the claims below
# the default subset: every algorithm, both rank counts, ZeRO 0-3, fp32 and bf16, every correction mode,
# several epochs and several updates per step, micro-batches by rows and by tokens (by tokens on 2 ranks),
# gradient checkpointing false, full and selective (selective on 2 ranks at ZeRO-3), padded and padding-free
# passes (padding-free with a token budget on 2 ranks at ZeRO-3) (test_the_default_cases_cover_their_claim).
# When train.padding_free entered (a factor of its own) the cases were drawn again (seed 2). Under the
# earlier draw, GSPO's sequence-ratio cases failed the objective check until it evaluated the unclipped
# surrogate there (matrix_case.py says why), and PPO + LoRA + ZeRO-3 + bf16 cases failed when the critic
# engine was built (ZeRO-3 flattened a bf16 value head with fp32 adapters). `make test-matrix` runs every case.
DEFAULT_CASES = {0, 4, 5, 6, 7, 8}


# episodes (rollout.env, docs/agents.md) enter the matrix as cases of their own: the same assertions on
# experience whose responses alternate the model's turns with the environment's (attended, never
# trained); every algorithm, both rank counts, ZeRO 0-3, fp32 and bf16, LoRA, several updates, padded and
# padding-free passes
EPISODE_CASES = [
    {"algo": "grpo", "kl_mode": "loss", "estimator": "k3", "agg": "token-mean", "correction": "tis",
     "precision": "fp32", "zero": 1, "ranks": 2, "epochs": 1, "updates": 2, "episodes": True, "padding_free": True},
    {"algo": "ppo", "kl_mode": "reward", "estimator": "k1", "agg": "seq-mean-token-mean", "correction": "mis",
     "precision": "fp32", "zero": 0, "ranks": 1, "epochs": 2, "updates": 1, "lora": "d0", "episodes": True,
     "overlong": True},
    {"algo": "rloo", "kl_mode": "reward", "estimator": "k2", "agg": "seq-mean-token-sum-norm", "correction": "none",
     "precision": "bf16", "zero": 3, "ranks": 2, "epochs": 1, "updates": 1, "episodes": True},
    {"algo": "reinforce_pp", "kl_mode": "loss", "estimator": "abs", "agg": "token-sum", "correction": "tis",
     "precision": "bf16", "zero": 2, "ranks": 1, "epochs": 2, "updates": 2, "overlong": True, "episodes": True},
]
# the same game as an agent (run(client, row) with the OpenAI client, through the recording endpoint)
EPISODE_CASES += [
    {"algo": "grpo", "kl_mode": "loss", "estimator": "k3", "agg": "seq-mean-token-mean", "correction": "tis",
     "precision": "fp32", "zero": 2, "ranks": 2, "epochs": 2, "updates": 2, "episodes": "agent"},
    {"algo": "ppo", "kl_mode": "reward", "estimator": "k1", "agg": "token-mean", "correction": "mis",
     "precision": "bf16", "zero": 1, "ranks": 1, "epochs": 1, "updates": 2, "lora": "d0", "episodes": "agent",
     "padding_free": True},
]
DEFAULT_EPISODE_CASES = {0, 1, 4}
# generation ahead (rollout.asynchronous, docs/async.md) enters as cases of its own too: the experience
# sampled by an older policy than the one that learns (the hf engine's weights moved off the actor's), so
# the ratio's denominator must be the learner's own start-of-step policy (decoupled PPO), the sampler's
# log-probs entering only through the correction weights; every algorithm, 1 and 2 ranks, ZeRO 0-3, fp32
# and bf16, every correction mode, several updates and epochs, LoRA, padded and padding-free passes
STALE_CASES = [
    {"algo": "grpo", "kl_mode": "loss", "estimator": "k3", "agg": "token-mean", "correction": "tis",
     "precision": "fp32", "zero": 0, "ranks": 1, "epochs": 1, "updates": 2, "stale": True, "padding_free": True,
     "checkpointing": "full"},
    {"algo": "ppo", "kl_mode": "reward", "estimator": "k1", "agg": "seq-mean-token-mean", "correction": "mis",
     "precision": "fp32", "zero": 2, "ranks": 2, "epochs": 2, "updates": 1, "stale": True},
    {"algo": "rloo", "kl_mode": "reward", "estimator": "k2", "agg": "token-sum", "correction": "none",
     "precision": "bf16", "zero": 3, "ranks": 1, "epochs": 1, "updates": 1, "lora": "d0", "stale": True},
    {"algo": "reinforce_pp", "kl_mode": "loss", "estimator": "abs", "agg": "seq-mean-token-sum-norm",
     "correction": "tis", "precision": "bf16", "zero": 1, "ranks": 2, "epochs": 2, "updates": 2, "stale": True},
]
DEFAULT_STALE_CASES = {0, 1}


# prefix breaks (docs/agents.md, "Tokens"): a chat template that rewrites history splits some episodes into
# several rows (the samples before a break trained with their episode's advantage), so the ranks hold
# different numbers of rows and run as many micro-batches each (fillers where short); every algorithm (GAE
# and REINFORCE++ across the break), 1 and 2 ranks, ZeRO 0-3, fp32 and bf16, rows and token budgets,
# padded and padding-free passes, a class environment and an agent
BREAK_CASES = [
    {"algo": "ppo", "kl_mode": "reward", "estimator": "k1", "agg": "token-mean", "correction": "tis",
     "precision": "fp32", "zero": 2, "ranks": 2, "epochs": 1, "updates": 2, "episodes": True, "breaks": True},
    {"algo": "grpo", "kl_mode": "reward", "estimator": "k3", "agg": "seq-mean-token-mean", "correction": "mis",
     "precision": "fp32", "zero": 3, "ranks": 2, "epochs": 2, "updates": 1, "episodes": True, "breaks": True,
     "mb_tokens": 40, "padding_free": True},
    {"algo": "rloo", "kl_mode": "loss", "estimator": "k2", "agg": "token-sum", "correction": "none",
     "precision": "bf16", "zero": 1, "ranks": 1, "epochs": 1, "updates": 2, "episodes": "agent", "breaks": True},
    {"algo": "reinforce_pp", "kl_mode": "reward", "estimator": "abs", "agg": "seq-mean-token-sum-norm",
     "correction": "tis", "precision": "fp32", "zero": 0, "ranks": 2, "epochs": 2, "updates": 2, "episodes": True,
     "breaks": True, "padding_free": True},
]
DEFAULT_BREAK_CASES = {0, 1}


def case_id(c: dict) -> str:
    extra = "".join([("-filter" if c["filter"] else ""), ("" if c["lora"] == "none" else f"-lora{c['lora']}"),
                     ("" if c["ratio_level"] == "token" else f"-{c['ratio_level']}"),
                     ("-cispo" if c["policy_loss"] == "cispo" else ""), ("-masktrunc" if c["mask_truncated"] else ""),
                     ("-overlong" if c["overlong"] else ""), ("" if c["top_p"] == 1.0 else f"-topp{c['top_p']}"),
                     ({True: "-episodes", "agent": "-agent-episodes"}.get(c.get("episodes"), "")),
                     ("-stale" if c.get("stale") else ""), ("-breaks" if c.get("breaks") else ""),
                     ("" if c.get("mb_tokens") is None else f"-mbtok{c['mb_tokens']}"),
                     (f"-gc{c['checkpointing']}" if c.get("checkpointing") else ""),
                     ("-packed" if c.get("padding_free") else "")])
    return (f"{c['algo']}-{c['kl_mode']}-{c['estimator']}-{c['agg']}-{c['correction']}-{c['precision']}"
            f"-z{c['zero']}-r{c['ranks']}-e{c['epochs']}-u{c['updates']}{extra}")


def _run(case: dict, ranks: int, out: Path) -> dict:
    script = str(ROOT / "tests" / "train" / "matrix_case.py")
    payload = json.dumps({k: v for k, v in case.items() if k != "ranks"})
    cmd = [sys.executable, script, payload, str(out)]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
               "--master_port", str(free_port()), script, payload, str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=cli_env(OMP_NUM_THREADS="1"), cwd=ROOT)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads((out / "result.json").read_text())




def _params(out: Path) -> dict:
    return torch.load(out / "params.pt", weights_only=True)


def docs_rows() -> list[list[str]]:
    """The cells of docs/training.md's case table, without the measured seconds (its last column)."""
    lora = {"none": "", "d0": "dropout 0", "d05": "dropout 0.05"}

    def yes(x):
        return "yes" if x else ""

    return [[str(i), c["algo"], c["kl_mode"], c["estimator"], c["agg"], c["correction"], c["precision"],
             str(c["zero"]), str(c["ranks"]), str(c["epochs"]), str(c["updates"]), yes(c["filter"]), lora[c["lora"]],
             c["ratio_level"], c["policy_loss"], yes(c["mask_truncated"]), yes(c["overlong"]), str(c["top_p"]),
             "" if c["mb_tokens"] is None else str(c["mb_tokens"]), c["checkpointing"] or "",
             yes(c["padding_free"]), yes(i in DEFAULT_CASES)]
            for i, c in enumerate(CASES)]


DOCS_HEADER = ["#", "algorithm", "kl.mode", "estimator", "loss_agg", "correction", "precision", "ZeRO", "ranks",
               "epochs", "updates", "filter", "LoRA", "ratio_level", "policy_loss", "mask_truncated", "overlong",
               "top_p", "max_tokens_per_micro_batch", "gradient_checkpointing", "padding_free", "default", "s"]


def test_the_docs_list_the_cases():
    lines = (ROOT / "docs" / "training.md").read_text(encoding="utf-8").splitlines()
    start = lines.index("| " + " | ".join(DOCS_HEADER) + " |")
    rows = []
    for ln in lines[start + 2:]:          # after the header and its --- line, up to the table's end
        if not ln.startswith("|"):
            break
        rows.append([x.strip() for x in ln.strip().strip("|").split("|")])
    assert [row[:-1] for row in rows] == docs_rows()


def test_the_default_cases_cover_their_claim():
    picked = [CASES[i] for i in DEFAULT_CASES]
    for name in ("algo", "ranks", "zero", "precision", "correction", "mb_tokens", "checkpointing", "padding_free"):
        assert {c[name] for c in picked} == set(FACTORS[name]), name
    assert any(c["epochs"] > 1 for c in picked) and any(c["updates"] > 1 for c in picked)
    assert any(c["ranks"] > 1 and c["mb_tokens"] for c in picked)
    assert any(c["ranks"] > 1 and c["checkpointing"] == "selective" and c["zero"] == 3 for c in picked)
    assert any(c["ranks"] > 1 and c["zero"] == 3 and c["mb_tokens"] and c["padding_free"] for c in picked)


def test_the_case_list_covers_every_pair():
    names = list(FACTORS)
    for a, b in itertools.combinations(names, 2):
        seen = {(c[a], c[b]) for c in CASES}
        assert seen == set(itertools.product(FACTORS[a], FACTORS[b])), (a, b)
    assert len(CASES) <= 30


@pytest.mark.parametrize("case", [pytest.param(c, id=f"{i:02d}-{case_id(c)}",
                                               marks=() if i in DEFAULT_CASES else pytest.mark.slow)
                                  for i, c in enumerate(CASES)] +
                         [pytest.param(c, id=f"episodes-{i}-{case_id({**DEFAULT_FACTORS, **c})}",
                                       marks=() if i in DEFAULT_EPISODE_CASES else pytest.mark.slow)
                          for i, c in enumerate(EPISODE_CASES)] +
                         [pytest.param(c, id=f"stale-{i}-{case_id({**DEFAULT_FACTORS, **c})}",
                                       marks=() if i in DEFAULT_STALE_CASES else pytest.mark.slow)
                          for i, c in enumerate(STALE_CASES)] +
                         [pytest.param(c, id=f"breaks-{i}-{case_id({**DEFAULT_FACTORS, **c})}",
                                       marks=() if i in DEFAULT_BREAK_CASES else pytest.mark.slow)
                          for i, c in enumerate(BREAK_CASES)])
def test_matrix_case(case, tmp_path):
    fp32 = case["precision"] == "fp32"
    res = _run(case, case["ranks"], tmp_path / "run")
    assert res["finite"] and res["skipped"] == 0
    assert res["updates"] == case["epochs"] * case["updates"]

    # behaviour log-probs are the actor's own (the rollout's carry the injected mismatch)
    assert res["behavior_err"] <= (1e-5 if fp32 else 2e-2) < res["rollout_err"], res
    # ratio 1: the first update's forwards reproduce the behaviour log-probs
    assert res["first_dev"] <= (1e-5 if fp32 else 2e-2), res
    # ... and once the weights moved, later updates of the step see a ratio != 1 and clip
    if res["updates"] > 1:
        assert res["later_dev"] > 1e-2, res
        assert res["later_clipfrac"] > 0, res

    # one update on a fixed experience lowers the objective it optimises
    assert res["loss_after"] < res["loss_before"], res
    # 1 x 8 accumulation == 8 x 1 (with a token budget: its packing): same loss, same weights (float-rounding apart)
    if case.get("mb_tokens"):
        assert res["many_micro"] > 1, res
    # token-sum sums the per-token terms instead of averaging them: float rounding grows with the tokens
    # (case 25: 1.9e-6 on a loss of 0.0045 that is a sum of ~50 terms of either sign)
    tokens = res["trained_rows"] * NEW_TOKENS if case["agg"] == "token-sum" else 1
    assert res["loss_many"] == pytest.approx(res["loss_one"], rel=1e-4 if fp32 else 2e-2, abs=1e-6 * tokens)
    assert res["moved"] > 1e-3
    assert res["accum_diff"] <= (1e-5 if fp32 else 5e-3) * max(1.0, res["moved"] / 1e-3), res
    # recomputation (gradient checkpointing full / selective) makes the update of an actor that keeps its activations
    assert res["recompute_diff"] <= (1e-5 if fp32 else 5e-3) * max(1.0, res["moved"] / 1e-3), res
    # padding-free passes make the update of padded ones
    assert res["packing_diff"] <= (1e-5 if fp32 else 5e-3) * max(1.0, res["moved"] / 1e-3), res

    if case.get("breaks"):   # prefix breaks made rows of their own
        assert res["rank_rows"][1] > case["updates"] * 8 // case["ranks"], res      # more rows than episodes
    if case.get("breaks") and case["ranks"] > 1:   # ... and the ranks held different numbers of rows: fillers ran
        assert res["rank_rows"][0] < res["rank_rows"][1] and res["fillers"] > 0, res
    # 2 ranks == 1 rank on the same experience (the same sequences, split across the ranks)
    if case["ranks"] > 1:
        one = _run(case, 1, tmp_path / "one")
        p1, p2 = _params(tmp_path / "one"), _params(tmp_path / "run")
        diff = max(float((p1[n] - p2[n]).abs().max()) for n in p1)
        assert diff <= (1e-5 if fp32 else 5e-3), f"2 ranks differ from 1 rank by {diff}"
        assert res["loss_one"] == pytest.approx(one["loss_one"], rel=1e-4 if fp32 else 2e-2, abs=1e-6)


if __name__ == "__main__":   # the table of docs/training.md, its measured seconds left empty
    print("| " + " | ".join(DOCS_HEADER) + " |")
    print("|" + " --- |" * len(DOCS_HEADER))
    for row in docs_rows():
        print("| " + " | ".join(row + [""]) + " |")
