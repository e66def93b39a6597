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
    longest = max(render.tok.get_vocab(), key=len)                      # a flood of the longest token
    flood = render.tok.convert_tokens_to_string([longest])
    for text in ("x" * 20_000_000, flood * (20_000_000 // len(flood))):
        sizes.clear()
        assert render.ids_within(text, 100) is None
        assert max(sizes) <= (101 + 64) * render.max_token_chars()


def test_prompt_ids_are_the_last_ids_and_their_count_and_a_flood_is_tokenised_from_its_tail(render, monkeypatch):
    for text in _texts(1):
        want = render.ids(text)
        for keep in (1, 8, 64):
            ids, n = render.prompt_ids(text, keep)
            if n is None:        # only past the tail's bound, and then the ids are those of its end
                assert len(want) > keep + 64 and len(ids) == keep
            else:
                assert (ids, n) == (want[-keep:], len(want))
    ids, n = render.prompt_ids("word " * 4_000_000 + "end", 16)
    assert n is None and len(ids) == 16 and render.tok.decode(ids).endswith(" word end")
