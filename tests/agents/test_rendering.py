"""Renderer.ids_within (issue 45 item 7): the ids of an environment's turn, exactly, when they fit
the episode's room; None when they do not, found without tokenising more than a bounded head."""

from __future__ import annotations

import random

import pytest

from rltune.agents.rendering import Renderer


@pytest.fixture(scope="module")
def render():
    from rltune.models.loading import load_tokenizer

    return Renderer(load_tokenizer("builtin:smollm2-135m-instruct"))


def _texts(seed: int) -> list[str]:
    rnd = random.Random(seed)
    words = ["the", "log", " ", "\n", "#" * 80, " " * 90, "é", "日本", "<|im_end|>", "12345", "\ufffd", "😀"]
    return ["".join(rnd.choice(words) for _ in range(rnd.randint(0, 400))) for _ in range(60)]


def test_ids_within_is_the_exact_ids_when_they_fit_and_none_when_they_do_not(render):
    for text in _texts(0):
        want = render.ids(text)
        for room in (0, 1, len(want) - 1, len(want), len(want) + 1, 5, 50):
            got = render.ids_within(text, room)
            assert got == (want if len(want) <= room else None), (text[:80], room)


def test_ids_within_tokenises_a_bounded_head_of_a_flood(render, monkeypatch):
    sizes = []
    real = render.tok

    class Counting:
        def __call__(self, text, **kw):
            sizes.append(len(text))
            return real(text, **kw)

        def __len__(self):
            return len(real)

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(render, "tok", Counting())
    assert render.ids_within("x" * 20_000_000, 100) is None
    assert max(sizes) <= 101 * render.max_token_chars()
