"""The environments `rollout.env: builtin:NAME` names, and rows of data for them.

`builtin:calculator` is a tools environment (one `calc` tool, arithmetic evaluated safely
with `ast`, never `eval`); `builtin:guess` is a turns environment (guess a number with
"Higher."/"Lower." hints). Both are small enough to learn on a tiny model and show the two
shapes a user's environment can take.
"""

from __future__ import annotations

import ast
import math
import operator
import random
import re

MAX_EXPRESSION_CHARS = 500
MAX_EXPONENT = 100
MAX_RESULT_BITS = 4_000   # about 1200 decimal digits: bounds the work and the text of a result

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
ONLY_ARITHMETIC = "only arithmetic is allowed: numbers, + - * / // % **, and parentheses"


# ---------------------------------------------------------------- safe arithmetic

def safe_eval(expression: str) -> int | float:
    """The value of an arithmetic expression, evaluated by walking its syntax tree.

    Only numbers, + - * / // % ** (exponent at most 100), unary +/- and parentheses are
    allowed; names, calls, attributes and everything else raise ValueError, so no text a
    model writes can run code. Results are bounded in size so no expression can stall.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression ({err.msg})") from None
    except (ValueError, RecursionError, MemoryError):
        raise ValueError("not an arithmetic expression") from None
    try:
        return _value(tree.body)
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None
    except OverflowError:
        raise ValueError("the result is too large") from None
    except ZeroDivisionError:
        raise ValueError("division by zero") from None


def _value(node: ast.AST) -> int | float:
    """Evaluate one node of the expression tree (see safe_eval for what is allowed)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        return _bounded(_BINARY[type(node.op)](left, right))
    raise ValueError(ONLY_ARITHMETIC)


def _check_power(base: int | float, exponent: int | float) -> None:
    """Refuse a power that is too large to compute quickly (or is complex)."""
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponents are limited to {MAX_EXPONENT}")
    if isinstance(base, int) and isinstance(exponent, int) and base.bit_length() * exponent > MAX_RESULT_BITS:
        raise ValueError("the result is too large")
    if base < 0 and not float(exponent).is_integer():
        raise ValueError("a negative number to a fractional power is not a real number")


def _bounded(value: int | float) -> int | float:
    """The value, or ValueError when it is too large (or not finite) to be a useful answer."""
    if isinstance(value, int) and value.bit_length() > MAX_RESULT_BITS:
        raise ValueError("the result is too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is not a finite number")
    return value


def format_number(value: int | float) -> str:
    """A result as the model should read it: an integer when integral, else up to 12 digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


# ---------------------------------------------------------------- environments

class Calculator:
    """A tools environment with one tool, `calc`: the row's prompt is the question.

    It gives no reward of its own: score the final answer with a reward function such as
    builtin:exact_answer against the row's `answer`. `calls` counts the tool's uses.
    """

    def __init__(self) -> None:
        self.calls = 0

    def reset(self, row: dict) -> None:
        """Start an episode: the conversation is the row's prompt as it is."""
        self.calls = 0
        return None

    def calc(self, expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses.

        Args:
            expression: the expression to evaluate, e.g. "(12 + 7) * 3"; also // % and **
        """
        self.calls += 1
        return format_number(safe_eval(expression))


class Guess:
    """A turns environment: guess a whole number from 1 to N, told "Higher." or "Lower.".

    The row's `target` (or `answer`) is the number, its `high` is N (default 16). The reward
    is 1.0 for a first-turn hit, 0.1 less per extra turn (at least 0.1), 0.0 if never found.
    """

    def __init__(self) -> None:
        self.high = 16
        self.target = 0
        self.turns = 0
        self.found_on: int | None = None

    def reset(self, row: dict) -> list[dict]:
        """Read the target from the row and ask the first question."""
        self.high = int(row.get("high", 16))
        raw = row["target"] if "target" in row else row.get("answer")
        if raw is None:
            raise ValueError("a guess row needs a `target` (or `answer`): the number to find")
        self.target = int(raw)
        if not 1 <= self.target <= self.high:
            raise ValueError(f"the target {self.target} is not between 1 and {self.high}")
        self.turns = 0
        self.found_on = None
        return [{"role": "user", "content": f"I am thinking of a whole number from 1 to {self.high}. "
                                            "Guess it: answer with the number only."}]

    def step(self, assistant_text: str) -> dict:
        """Answer one guess: a hint, or done when the guess is right."""
        self.turns += 1
        guess = _first_integer(assistant_text)
        if guess is None:
            return {"messages": [{"role": "user", "content": "Answer with a number only."}], "done": False}
        if guess == self.target:
            self.found_on = self.turns
            return {"messages": [], "done": True, "info": {"found": True, "turns": self.turns}}
        hint = "Higher." if guess < self.target else "Lower."
        return {"messages": [{"role": "user", "content": hint}], "done": False, "info": {"found": False}}

    def reward(self, episode: dict) -> float:
        """1.0 for a hit on turn 1, minus 0.1 per further turn (floor 0.1); 0.0 if not found."""
        if self.found_on is None:
            return 0.0
        return max(0.1, round(1.0 - 0.1 * (self.found_on - 1), 10))


def _first_integer(text: str) -> int | None:
    """The first integer in the text (a number too long to be a guess counts as huge)."""
    match = re.search(r"-?\d+", text[:10_000])
    if match is None:
        return None
    digits = match.group()
    if len(digits.lstrip("-")) > 18:
        return -(10**18) if digits.startswith("-") else 10**18
    return int(digits)


BUILTIN_ENVS = {"calculator": Calculator, "guess": Guess}


# ---------------------------------------------------------------- data

_TEMPLATES = ("{a}*{b}+{c}", "{a}*{b}-{c}", "({a}+{c})*{b}", "{a}+{b}*{c}")


# one solved question before the real one: a small model (SmolLM2-135M) writes no tool call from
# the schema alone (0 of 32 episodes), and about 7 in 10 after seeing one (docs/BENCHMARKS.md)
DEMONSTRATION = [
    {"role": "user", "content": "What is 512*37+64? Use the calc tool, then answer with just the number."},
    {"role": "assistant", "content": '<tool_call>\n{"name": "calc", "arguments": {"expression": "512*37+64"}}\n</tool_call>'},
    {"role": "tool", "content": "19008"},
    {"role": "assistant", "content": "19008"},
]


def calculator_rows(n: int, seed: int, digits: int = 3) -> list[dict]:
    """n arithmetic questions for builtin:calculator (the same n rows for the same seed).

    Each mixes a `digits`-digit number with two 2-digit numbers, hard enough that the calc tool
    helps; `answer` is the exact integer result as text (for builtin:exact_answer). The prompt is
    a conversation: one solved question (DEMONSTRATION: the call, the tool's answer, the final
    answer), then the row's own question.
    """
    if digits < 1:
        raise ValueError("digits must be at least 1")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a = rng.randint(10 ** (digits - 1), 10**digits - 1)
        b, c = rng.randint(11, 99), rng.randint(11, 99)
        expression = rng.choice(_TEMPLATES).format(a=a, b=b, c=c)
        question = f"What is {expression}? Use the calc tool, then answer with just the number."
        rows.append({"prompt": [dict(m) for m in DEMONSTRATION] + [{"role": "user", "content": question}],
                     "answer": format_number(safe_eval(expression))})
    return rows


def guess_rows(n: int, seed: int, high: int = 16) -> list[dict]:
    """n rows for builtin:guess: a target from 1 to `high` each (deterministic by seed)."""
    if high < 1:
        raise ValueError("high must be at least 1")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        target = rng.randint(1, high)
        rows.append({"prompt": "guess", "answer": str(target), "target": target, "high": high})
    return rows
