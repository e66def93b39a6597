"""builtin:math_verify: the completion's final answer against the row's `answer` by math-verify,
each completion bounded in time, on and off the main thread; a row's answer math-verify cannot
parse goes the reward's error path (reward.on_error), not a crash."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("math_verify")

from rltune.recipe.schema import RewardCfg  # noqa: E402
from rltune.reward import RewardComputer, RewardError  # noqa: E402
from rltune.reward import ecosystem  # noqa: E402
from rltune.reward.builtins import BUILTIN_REWARDS  # noqa: E402

mv = BUILTIN_REWARDS["math_verify"]


def score(completion, answer):
    return mv(["q"], [completion], answer=[answer])[0]


@pytest.mark.parametrize("completion,answer", [
    (r"$\frac{1}{2}$", "0.5"),
    ("0.5", r"\frac{1}{2}"),
    (r"The answer is $\frac{2}{4}$.", "1/2"),
    ("x = 12", "12"),
    (r"so the set is $\{2, 1\}$", r"\{1,2\}"),
])
def test_equal_answers_score_1(completion, answer):
    assert score(completion, answer) == 1.0


@pytest.mark.parametrize("completion,answer", [("2", "3"), (r"$\frac{1}{3}$", "0.5"), ("no number here", "4")])
def test_different_answers_score_0(completion, answer):
    assert score(completion, answer) == 0.0


def test_the_boxed_answer_in_a_long_completion_is_found():
    reasoning = " ".join(f"Step {i}: we have {i * 7} apples and 3 pears." for i in range(40))
    completion = reasoning + r" Therefore the answer is $\boxed{\frac{3}{4}}$. (Check: 12 and 99.)"
    assert mv(["q"] * 2, [completion, completion], answer=["0.75", "99"]) == [1.0, 0.0]


def test_a_pathological_completion_finishes_within_the_bound(monkeypatch):
    monkeypatch.setattr(ecosystem, "MATH_VERIFY_TIMEOUT_S", 1.0)
    tower = r"$\boxed{" + "9^{" * 30 + "9" + "}" * 30 + "}$"      # sympy would evaluate it for ever
    mv(["q"], ["1"], answer=["1"])     # the worker started: its start is not the bound's
    start = time.monotonic()
    assert mv(["q", "q"], [tower, "1"], answer=["1", "1"]) == [0.0, 1.0]
    assert time.monotonic() - start < 1.0 + ecosystem.ITEM_SLACK_S + 5.0   # a fresh worker for the second


def test_a_completion_stuck_in_native_code_is_cut(monkeypatch):
    """A signal cannot interrupt C code (a huge integer power): the worker is killed, the completion
    scores 0, and the next completion gets a fresh worker."""
    monkeypatch.setattr(ecosystem, "MATH_VERIFY_TIMEOUT_S", 1.0)
    mv(["q"], ["1"], answer=["1"])
    start = time.monotonic()
    assert mv(["q", "q"], ["$9^{9^{9^{9}}}+1$", "$7$"], answer=["1", "7"]) == [0.0, 1.0]
    assert time.monotonic() - start < 1.0 + ecosystem.ITEM_SLACK_S + 10.0


def test_the_same_scores_off_the_main_thread():
    """Signals work only in the main thread: there the batch goes to a worker process."""
    got = {}
    t = threading.Thread(target=lambda: got.update(v=mv(["q"] * 3, [r"$\frac{1}{2}$", "2", r"\boxed{7}"],
                                                        answer=["0.5", "3", "7"])))
    t.start()
    t.join(120)
    assert got["v"] == [1.0, 0.0, 1.0]


def test_an_unparseable_answer_goes_the_error_path(caplog):
    cols = {"answer": ["1/2", "%%%"]}
    with pytest.raises(RewardError, match=r"reward function builtin:math_verify raised ValueError: math-verify "
                                          r"cannot parse the row's answer '%%%' on sample 1"):
        RewardComputer(RewardCfg(functions=["builtin:math_verify"]))(["a", "b"], ["0.5", "0.5"], cols)
    with caplog.at_level(logging.WARNING):
        rc = RewardComputer(RewardCfg(functions=["builtin:math_verify"], on_error="zero"), log=logging.getLogger("t"))
        assert rc(["a", "b"], ["0.5", "0.5"], cols).scores == [0.0, 0.0]
    assert "scored 0 (reward.on_error: zero)" in caplog.text


def test_no_answer_column_is_an_error():
    with pytest.raises(ValueError, match="needs an 'answer' column"):
        mv(["q"], ["1"])


def test_math_verify_is_imported_only_when_the_reward_is_called():
    code = ("import sys; from rltune.reward.builtins import BUILTIN_REWARDS; import rltune.reward.ecosystem; "
            "print(sorted(m for m in ('math_verify', 'reasoning_gym', 'sympy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
