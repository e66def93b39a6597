"""agents.builtin: the calculator (safe arithmetic) and guess environments, and their rows."""

from __future__ import annotations

import time

import pytest

from rltune.agents.builtin import BUILTIN_ENVS, Calculator, Guess, calculator_rows, guess_rows, safe_eval
from rltune.agents.session import Session
from rltune.agents.tools import ToolCall, call_tool


@pytest.mark.parametrize("expression, value", [
    ("347*29+81", "10144"),
    ("(3 + 4) * 12", "84"),
    ("7 / 2", "3.5"),
    ("6 / 3", "2"),
    ("7 // 2", "3"),
    ("-7 % 3", "2"),
    ("2 ** 10", "1024"),
    ("-(2 - 5)", "3"),
    ("0.1 + 0.2", "0.3"),
    ("2 ** -1", "0.5"),
    ("  1+1 ", "2"),
])
def test_calc_evaluates_arithmetic(expression, value):
    assert Calculator().calc(expression) == value


@pytest.mark.parametrize("expression, match", [
    ("__import__('os').system('echo hi')", "only arithmetic"),
    ("x + 1", "only arithmetic"),
    ("(1).real", "only arithmetic"),
    ("'a' * 3", "only arithmetic"),
    ("[1, 2]", "only arithmetic"),
    ("True + 1", "only arithmetic"),
    ("1 if 1 else 2", "only arithmetic"),
    ("1 < 2", "only arithmetic"),
    ("lambda: 1", "only arithmetic"),
    ("2 ** 101", "exponents are limited to 100"),
    ("9 ** 9 ** 9", "exponents are limited"),
    ("(10 ** 100) ** 100", "too large"),
    ("99999 ** 99 * 99999 ** 99 * 99999 ** 99", "too large"),
    ("1e308 * 10", "not a finite number"),
    ("(-8) ** 0.5", "not a real number"),
    ("1 / 0", "division by zero"),
    ("1 +", "not an arithmetic expression"),
    ("1" * 600, "longer than"),
])
def test_calc_refuses_anything_else(expression, match):
    with pytest.raises(ValueError, match=match):
        safe_eval(expression)


def test_calc_errors_reach_the_model_as_tool_errors():
    calc = Calculator()
    calc.reset({})
    t0 = time.perf_counter()
    text, err = call_tool(calc, ToolCall("calc", {"expression": "9**9**9**9"}), 5)
    assert time.perf_counter() - t0 < 2
    assert err == "raised" and text.startswith("error: ValueError: ")
    assert call_tool(calc, ToolCall("calc", {"expression": "2*21"}), 5) == ("42", None)
    assert calc.calls == 2


def test_calculator_episode_through_a_session():
    s = Session(BUILTIN_ENVS["calculator"])
    assert [t["function"]["name"] for t in s.tools] == ["calc"]
    assert s.tools[0]["function"]["description"].startswith("Evaluate an arithmetic expression")
    prompt = [{"role": "user", "content": "What is 347*29+81?"}]
    assert s.start({"prompt": "What is 347*29+81?", "answer": "10144"}, prompt) == prompt
    msgs, done = s.respond('<tool_call>{"name": "calc", "arguments": {"expression": "347*29+81"}}</tool_call>')
    assert msgs == [{"role": "tool", "name": "calc", "content": "10144"}] and not done
    assert s.respond("10144") == ([], True)
    assert s.env.calls == 1 and s.reward([]) is None


def _play_guess(row: dict, guesses: list[str]):
    s = Session(Guess)
    conversation = s.start(row, [])
    answers = []
    for g in guesses:
        msgs, done = s.respond(g)
        answers.append((msgs, done))
        conversation += [{"role": "assistant", "content": g}] + msgs
        if done:
            break
    return s, conversation, answers


def test_guess_episode_higher_lower_then_right():
    s, conversation, answers = _play_guess({"target": 11, "high": 16}, ["8", "I say 13", "well...", "11"])
    assert conversation[0] == {"role": "user", "content": "I am thinking of a whole number from 1 to 16. "
                                                          "Guess it: answer with the number only."}
    assert answers == [([{"role": "user", "content": "Higher."}], False),
                       ([{"role": "user", "content": "Lower."}], False),
                       ([{"role": "user", "content": "Answer with a number only."}], False),
                       ([], True)]
    assert s.reward(conversation) == pytest.approx(0.7)


@pytest.mark.parametrize("guesses, reward", [
    (["5"], 1.0),
    (["1", "5"], 0.9),
    (["1"] * 9 + ["5"], 0.1),
    (["1"] * 14 + ["5"], 0.1),
    (["1", "2", "3"], 0.0),
])
def test_guess_reward_by_turn(guesses, reward):
    s, conversation, _ = _play_guess({"answer": "5", "prompt": "guess"}, guesses)
    assert s.reward(conversation) == pytest.approx(reward)


def test_guess_reads_the_first_integer_and_huge_numbers():
    g = Guess()
    g.reset({"target": 3})
    assert g.step("maybe 3 or 4")["done"] is True
    g.reset({"target": 3})
    assert g.step("9" * 5000)["messages"] == [{"role": "user", "content": "Lower."}]
    assert g.step("-2")["messages"] == [{"role": "user", "content": "Higher."}]


@pytest.mark.parametrize("row", [{"target": 0}, {"target": 17}, {"prompt": "no target"}, {"answer": "x"}])
def test_guess_rejects_bad_rows(row):
    with pytest.raises(ValueError):
        Guess().reset(row)


def test_calculator_rows_are_deterministic_and_correct():
    rows = calculator_rows(20, seed=3)
    assert rows == calculator_rows(20, seed=3)
    assert rows != calculator_rows(20, seed=4)
    for row in rows:
        demo, question = row["prompt"][:-1], row["prompt"][-1]["content"]
        assert [m["role"] for m in demo] == ["user", "assistant", "tool", "assistant"]
        assert demo[2]["content"] == demo[3]["content"] == Calculator().calc("512*37+64")  # a true example
        assert question.startswith("What is ")
        assert question.endswith("? Use the calc tool, then answer with just the number.")
        expression = question[len("What is "):question.index("?")]
        assert row["answer"] == str(int(safe_eval(expression)))
        assert any(len(tok) == 3 for tok in expression.replace("(", " ").replace(")", " ").replace("*", " ")
                   .replace("+", " ").replace("-", " ").split())
    wide = calculator_rows(5, seed=1, digits=5)
    assert all(any(len(t) == 5 for t in r["prompt"][-1]["content"].replace("*", " ").replace("+", " ").replace("-", " ")
                   .replace("(", " ").replace(")", " ").split()) for r in wide)
    with pytest.raises(ValueError):
        calculator_rows(1, seed=0, digits=0)


def test_guess_rows_are_deterministic_and_in_range():
    rows = guess_rows(50, seed=7, high=8)
    assert rows == guess_rows(50, seed=7, high=8)
    assert rows != guess_rows(50, seed=8, high=8)
    for row in rows:
        assert row["prompt"] == "guess" and row["high"] == 8
        assert 1 <= row["target"] <= 8 and row["answer"] == str(row["target"])
    assert len({r["target"] for r in rows}) > 1
