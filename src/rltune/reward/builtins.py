"""Builtin reward functions (`builtin:NAME` in `reward.functions`).

Every reward function has the documented signature

    fn(prompts: list[str], completions: list[str], **columns) -> list[float]

where `columns` are the data rows' extra fields as lists aligned with the completions
(e.g. `answer=[...]`). Functions should accept and ignore columns they do not use.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text.replace(",", ""))
    return found[-1] if found else None


def _same_number(a: str | None, b) -> bool:
    if a is None or b is None:
        return False
    try:
        return abs(float(a) - float(str(b).replace(",", "").strip())) < 1e-6
    except ValueError:
        return False


def exact_answer(prompts, completions, answer=None, **_):
    """1.0 when the completion's final number equals the row's `answer`, else 0.0."""
    if answer is None:
        raise ValueError("builtin:exact_answer needs an 'answer' column in the data")
    return [1.0 if _same_number(last_number(c), a) else 0.0 for c, a in zip(completions, answer)]


def format(prompts, completions, **_):  # noqa: A001 - the recipe name is builtin:format
    """1.0 for a bare number; partial credit for the share of the text that is the number.

    Gives a verbose starting model a signal to move towards short, direct answers.
    """
    out = []
    for c in completions:
        text = c.strip()
        if re.fullmatch(r"-?\d+(?:\.\d+)?", text):
            out.append(1.0)
            continue
        num = last_number(text)
        out.append(0.0 if num is None else 0.5 * len(num) / max(len(text), 1))
    return out


def length(prompts, completions, max_chars: int = 200, **_):
    """1.0 for an empty answer falling linearly to 0.0 at `max_chars` characters."""
    return [max(0.0, 1.0 - len(c) / max_chars) for c in completions]


def reasoning_gym(prompts, completions, **columns):
    """The reasoning-gym dataset's own score_answer (rows of data.train reasoning_gym:NAME; reward/ecosystem.py)."""
    from .ecosystem import reasoning_gym as score

    return score(prompts, completions, **columns)


def math_verify(prompts, completions, **columns):
    """1.0 when math-verify finds the completion's final answer equal to the row's `answer` (reward/ecosystem.py)."""
    from .ecosystem import math_verify as score

    return score(prompts, completions, **columns)


BUILTIN_REWARDS = {"exact_answer": exact_answer, "format": format, "length": length,
                   "reasoning_gym": reasoning_gym, "math_verify": math_verify}
