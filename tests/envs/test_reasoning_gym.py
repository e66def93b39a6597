"""reasoning-gym tasks as data (`data.train: reasoning_gym:NAME`, data.options) and reward
(`builtin:reasoning_gym`, the dataset's own score_answer); `validate` on names and options; and the
shipped recipe that learns (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytest.importorskip("reasoning_gym")

from rltune.data.datasets import DataError, load_prompts  # noqa: E402
from rltune.envs import reasoning_gym as rg  # noqa: E402
from rltune.recipe.schema import RewardCfg  # noqa: E402
from rltune.reward import RewardComputer  # noqa: E402
from rltune.reward.builtins import BUILTIN_REWARDS  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SUMS = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}
reward = BUILTIN_REWARDS["reasoning_gym"]


def score(rows, completions):
    return reward([r["prompt"] for r in rows], completions, reasoning_gym=[r["reasoning_gym"] for r in rows],
                  answer=[r["answer"] for r in rows])


def entry_of(row):
    import reasoning_gym

    meta = json.loads(row["reasoning_gym"])
    ds = reasoning_gym.create_dataset(meta["dataset"], **meta["options"], seed=meta["seed"], size=meta["size"])
    return ds, ds[meta["index"]]


# -- rows

def test_rows_are_the_generators_questions_and_answers():
    rows = rg.rows("chain_sum", SUMS, 20, 3, "train")
    assert len(rows) == 20 and set(rows[0]) == {"prompt", "answer", "reasoning_gym", "metadata"}
    for row in rows:
        _, entry = entry_of(row)
        assert row["prompt"] == entry["question"] and row["answer"] == entry["answer"]
        assert json.loads(row["metadata"])["expression"] == entry["metadata"]["expression"]
        assert eval(entry["metadata"]["expression"]) == int(row["answer"])   # noqa: S307 - digits and +


def test_rows_are_reproducible_for_a_seed_and_differ_for_another():
    a, b, c = (rg.rows("chain_sum", SUMS, 50, s, "train") for s in (7, 7, 8))
    assert a == b
    # reasoning-gym's entry i is Random(seed + i): the generator's seed is a hash, not seed + 1
    assert len({r["prompt"] for r in a} & {r["prompt"] for r in c}) < 10


def test_eval_questions_are_never_train_questions():
    """Eval is drawn with a seed derived from the run's and holds only the questions whose hash puts
    them there: disjoint from train by construction (also for a small space: 2-term one-digit sums)."""
    for options in (SUMS, {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}):
        train = {r["prompt"] for r in rg.rows("chain_sum", options, 2000, 42, "train")}
        evals = rg.rows("chain_sum", options, 32, 42, "eval")
        assert len(evals) == 32 and not train & {r["prompt"] for r in evals}
        assert json.loads(evals[0]["reasoning_gym"])["seed"] != json.loads(
            rg.rows("chain_sum", options, 1, 42, "train")[0]["reasoning_gym"])["seed"]


def test_options_reach_the_generator_and_lists_become_its_tuples():
    rows = rg.rows("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                                        "operators": ["+"], "allow_parentheses": False, "allow_negation": False},
                   30, 1, "train")
    for row in rows:
        expr = json.loads(row["metadata"])["expression"]
        assert "-" not in expr and "*" not in expr and "(" not in expr and len(expr.split("+")) == 2


def test_load_prompts_dispatches_with_options_and_size():
    ps = load_prompts("reasoning_gym:chain_sum", size=12, seed=5, split="train", options=SUMS)
    assert len(ps) == 12 and ps.prompt_key == "prompt" and ps.rows == rg.rows("chain_sum", SUMS, 12, 5, "train")


def test_a_space_too_small_for_the_size_says_so(monkeypatch):
    monkeypatch.setattr(rg, "DRAW_FACTOR", 0)   # 1000 draws of 2-term one-digit sums: far fewer than 500 eval questions
    with pytest.raises(DataError, match="too few distinct questions"):
        rg.rows("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, 500, 0, "eval")


# -- reward

def test_the_reward_is_the_datasets_score_answer():
    rows = rg.rows("chain_sum", SUMS, 4, 11, "train")
    right = [r["answer"] for r in rows]
    wrong = [str(int(a) + 1) for a in right]
    assert score(rows, right) == [1.0] * 4
    got = score(rows, wrong)
    assert all(v < 1.0 for v in got)
    assert got == [entry_of(r)[0].score_answer(w, entry_of(r)[1]) for r, w in zip(rows, wrong)]


def test_answer_tags_and_surrounding_text():
    """The last <answer>...</answer> is the answer (reasoning-gym's extract_answer); without tags the
    whole reply is, and the dataset's score_answer prices the extra words (chain_sum: partial credit)."""
    row = rg.rows("chain_sum", SUMS, 1, 2, "train")[0]
    a = row["answer"]
    ds, entry = entry_of(row)
    tagged = f"Let me add. <answer>0</answer> no wait: <answer> {a} </answer> done"
    verbose = f"The answer is {a}."
    assert score([row] * 3, [tagged, verbose, f"\n{a}\n"]) == [1.0, ds.score_answer(verbose, entry), 1.0]
    assert 0.0 < score([row], [verbose])[0] < 1.0


def test_a_dataset_that_scores_equivalent_answers():
    """countdown accepts any expression that reaches the target: the dataset's own check, not string equality."""
    row = rg.rows("countdown", {}, 1, 0, "train")[0]
    expr = row["answer"]
    terms = expr.split(" + ")
    other = " + ".join(reversed(terms)) if len(terms) > 1 and all("-" not in t and "*" not in t and "/" not in t
                                                                   for t in terms) else f"({expr})"
    assert score([row, row, row], [expr, f"<answer>{other}</answer>", "<answer>1 + 1</answer>"])[:2] == [1.0, 1.0]
    assert score([row], ["<answer>1 + 1</answer>"])[0] < 1.0


def test_through_the_reward_computer_and_without_its_column():
    rows = load_prompts("reasoning_gym:chain_sum", size=2, seed=0, split="eval", options=SUMS).rows
    cols = {k: [r[k] for r in rows] for k in rows[0] if k != "prompt"}
    rc = RewardComputer(RewardCfg(functions=["builtin:reasoning_gym"]))
    assert rc(["a", "b"], [rows[0]["answer"], "nope"], cols, training=False).scores == [1.0, 0.0]
    with pytest.raises(Exception, match=r"needs the rows of data.train reasoning_gym:NAME"):
        rc(["a"], ["1"], {"answer": ["1"]})


# -- validate

def _recipe(tmp_path, train, options=None):
    data = {"model": {"policy": "builtin:tiny-llama"}, "data": {"train": train},
            "reward": {"functions": ["builtin:reasoning_gym"]}}
    if options is not None:
        data["data"]["options"] = options
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_validate_accepts_a_good_recipe(cli_streams, tmp_path):
    code, out, err = cli_streams("validate", _recipe(tmp_path, "reasoning_gym:chain_sum", SUMS))
    assert code == 0, out + err


def test_validate_names_an_unknown_dataset_with_did_you_mean(cli_streams, tmp_path):
    code, out, err = cli_streams("validate", _recipe(tmp_path, "reasoning_gym:chain_summ"))
    text = out + err
    assert code != 0
    assert "unknown reasoning-gym dataset `chain_summ`" in text and "did you mean `reasoning_gym:chain_sum`" in text


def test_validate_names_a_bad_option_key_and_the_valid_ones(cli_streams, tmp_path):
    code, out, err = cli_streams("validate", _recipe(tmp_path, "reasoning_gym:chain_sum", {"max_digit": 2}))
    text = out + err
    assert code != 0
    assert "data.options.max_digit is not an option of reasoning_gym:chain_sum (ChainSumConfig)" in text
    assert "did you mean `max_digits`" in text and "min_terms" in text and "allow_negation" in text


def test_validate_reports_a_value_the_config_refuses(cli_streams, tmp_path):
    code, out, err = cli_streams("validate", _recipe(tmp_path, "reasoning_gym:chain_sum",
                                                     {"min_digits": 3, "max_digits": 1}))
    assert code != 0 and "its config refuses them" in out + err


def test_seed_and_size_are_rltunes():
    (problem, fix), = rg.data_problems("chain_sum", {"seed": 3})
    assert "data.options.seed" in problem and "trainer.seed" in fix


def test_reasoning_gym_is_imported_only_when_named():
    code = ("import sys; import rltune.envs.reasoning_gym, rltune.data.datasets, rltune.reward.builtins; "
            "print('reasoning_gym' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


# -- the shipped recipe learns

def test_shipped_copies_are_identical():
    for name in ("reasoning-gym-smollm2.yaml", "gsm8k-grpo-qwen.yaml"):
        assert (ROOT / "recipes" / name).read_text() == (ROOT / "src" / "rltune" / "recipes" / name).read_text()


def _trainlib():
    import importlib.util

    spec = importlib.util.spec_from_file_location("trainlib_rg", ROOT / "tests" / "train" / "trainlib.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_the_smollm2_recipe_learns(tmp_path):
    """recipes/reasoning-gym-smollm2.yaml through the CLI, 20 steps: the sampled reward of the last 3
    steps is above that of the first 3, and so is its reasoning_gym part (the dataset's own score).
    Measured here (2-core VM, 20 steps in 371 s): reward 0.021 -> 0.268, its reasoning_gym part
    0.012 -> 0.098 (an earlier run before the generator seed was hashed: 0.052 -> 0.634 and
    0.031 -> 0.167). The margins are about half the smaller rise."""
    lib = _trainlib()
    path = lib.tiny_recipe(tmp_path, "reasoning-gym-smollm2.yaml")
    start = time.monotonic()
    out = lib.run_cli("train", path, timeout=3000)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ms = [m for m in lib.read_metrics(tmp_path / "run") if "reward/mean" in m]
    total = [m["reward/mean"] for m in ms]
    part = [m["reward/builtin:reasoning_gym"] for m in ms]

    def first(v):
        return sum(v[:3]) / 3

    def last(v):
        return sum(v[-3:]) / 3

    print(f"{len(ms)} steps in {time.monotonic() - start:.0f} s: reward {first(total):.3f} -> {last(total):.3f}, "
          f"reasoning_gym part {first(part):.3f} -> {last(part):.3f}")
    assert len(ms) == 20
    assert last(total) > first(total) + 0.12, total      # measured +0.247
    assert last(part) > first(part) + 0.04, part         # measured +0.086
