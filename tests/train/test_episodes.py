"""Episodes (issue 27, items 2-3, 5): token-in token-out bookkeeping, checked on hand-built
episodes (a scripted "model" whose turns are given), and on real sampled ones (rollout log-probs
equal the actor's recomputed log-probs on every generated position of a multi-turn episode)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rltune.recipe.schema import Recipe


def _recipe(env: str, **rollout) -> Recipe:
    return Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
        "reward": {"functions": ["builtin:exact_answer"]},
        "algorithm": {"name": "grpo", "group_size": 2},
        "rollout": {"engine": "hf", "batch_size": 2, "max_new_tokens": 64, "env": env, **rollout},
        "train": {"batch_size": 2, "micro_batch_size": 2}})


class Scripted:
    """A rollout engine whose turns are scripted: turn k of every episode is `turns[k]`, encoded
    as the tokenizer encodes it, then EOS (or no EOS where a turn ends in "…": cut)."""

    name = "scripted"

    def __init__(self, tok, turns: list[str]):
        self.tok, self.turns = tok, turns
        self.eos_ids, self.pad_id = {tok.eos_token_id}, tok.pad_token_id
        self.calls = 0
        self.seen: list[list[list[int]]] = []

    def generate(self, prompt_ids, sampling):
        from rltune.rollout.experience import Experience

        self.seen.append([list(p) for p in prompt_ids])
        text = self.turns[self.calls]
        self.calls += 1
        cut = text.endswith("…")
        ids = self.tok(text.rstrip("…"), add_special_tokens=False)["input_ids"] + ([] if cut else [self.tok.eos_token_id])
        B = len(prompt_ids)
        response = torch.tensor([ids] * B)
        return Experience(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                          response_ids=response, response_mask=torch.ones(B, len(ids)),
                          rollout_logp=-torch.arange(1, len(ids) + 1, dtype=torch.float32).repeat(B, 1) / 10)

    def sleep(self):
        pass


def _components(recipe: Recipe, turns: list[str], tmp_path: Path | None = None):
    from rltune.models.loading import load_tokenizer
    from rltune.train.episodes import load_environment

    tok = load_tokenizer(TOKENIZER)
    return SimpleNamespace(recipe=recipe, tokenizer=tok, rollout=Scripted(tok, turns),
                           env=load_environment(recipe, tok, tmp_path or Path(".")))


ROW = {"prompt": "What is 12*3+4?", "answer": "40"}
# a real chat tokenizer (SmolLM2's, ChatML): the tiny test model's character vocabulary has no `<`,
# `{` or `"`, so it cannot write a tool call; the scripted engine needs no model
TOKENIZER = "builtin:smollm2-135m-instruct"


def test_tool_episode_is_model_tokens_plus_env_tokens_exactly():
    from rltune.train.episodes import play

    call = '<tool_call>{"name": "calc", "arguments": {"expression": "12*3+4"}}</tool_call>'
    c = _components(_recipe("builtin:calculator"), [call, "40"])
    ep = play(c, [ROW], "prompt", 2)
    tok, exp = c.tokenizer, ep.exp
    eos = tok.eos_token_id
    model1 = tok(call, add_special_tokens=False)["input_ids"] + [eos]
    model2 = tok("40", add_special_tokens=False)["input_ids"] + [eos]
    for b in range(2):
        n = int(exp.response_mask[b].sum())
        ids, trained = exp.response_ids[b, :n].tolist(), exp.loss_mask[b, :n].tolist()
        k = len(model1)
        env_len = n - k - len(model2)
        assert ids[:k] == model1 and ids[k + env_len:] == model2             # sampled ids, as sampled
        assert trained == [1.0] * k + [0.0] * env_len + [1.0] * len(model2)
        env_text = tok.decode(ids[k:k + env_len])
        assert "<|im_start|>tool\n40<|im_end|>" in env_text                  # the tool's answer,
        assert env_text.endswith("<|im_start|>assistant\n")                   # then the model's turn
        # the second turn was generated from exactly prompt + model turn + env turn
        assert c.rollout.seen[1][b] == exp.prompt_ids[b][exp.prompt_mask[b].bool()].tolist() + ids[:k + env_len]
        # rollout log-probs where the model sampled, 0 on the environment's tokens
        lp = exp.rollout_logp[b, :n]
        assert float(lp[k:k + env_len].abs().sum()) == 0.0 and bool((lp[:k] < 0).all())
    assert ep.completions == ["40", "40"]
    assert ep.conversations[0][-1] == {"role": "assistant", "content": "40"}
    assert ep.conversations[0][3] == {"role": "tool", "name": "calc", "content": "40"}
    assert ep.metrics["episode/tool_calls"] == 2 and ep.metrics["episode/turns"] == 4
    assert ep.metrics["episode/truncated"] == 0 and not bool(exp.truncated.any())
    # the tools are offered in a system message (the plain template renders no `tools=`)
    assert "calc" in tok.decode(exp.prompt_ids[0]) and "<tool_call>" in tok.decode(exp.prompt_ids[0])


def test_episode_ends_truncated_at_max_turns_and_at_a_turn_without_eos():
    from rltune.train.episodes import play

    call = '<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}}</tool_call>'
    c = _components(_recipe("builtin:calculator", max_turns=2), [call, call])
    ep = play(c, [ROW], "prompt", 1)
    assert bool(ep.exp.truncated[0]) and c.rollout.calls == 2
    # the environment's answer to the last turn is not appended: nothing after it would be trained
    n = int(ep.exp.response_mask[0].sum())
    assert ep.exp.loss_mask[0, n - 1] == 1.0
    c = _components(_recipe("builtin:calculator"), ["40 and more…"])
    ep = play(c, [ROW], "prompt", 1)
    assert bool(ep.exp.truncated[0]) and ep.metrics["episode/turns"] == 0      # the env never saw it


def test_a_tool_that_raises_or_an_unparseable_call_is_a_turn_not_a_crash():
    from rltune.train.episodes import play

    bad_expr = '<tool_call>{"name": "calc", "arguments": {"expression": "__import__(1)"}}</tool_call>'
    c = _components(_recipe("builtin:calculator"), [bad_expr, "<tool_call>{oops</tool_call>", "40"])
    ep = play(c, [ROW], "prompt", 1)
    conv = ep.conversations[0][1:]                                   # after the system message (the tools)
    assert conv[2]["role"] == "tool" and conv[2]["content"].startswith("error")
    assert conv[4]["role"] == "tool" and "could not parse" in conv[4]["content"]
    assert ep.metrics["episode/tool_errors"] == 2 and ep.completions == ["40"]


@pytest.mark.parametrize("prefix_break", ["rows", "context"])
def test_a_template_that_rewrites_history_restarts_the_sample_from_the_re_rendered_prompt(tmp_path, prefix_break):
    """A template that drops past assistant turns' reasoning (as Qwen3 drops <think>): rendering
    the longer conversation no longer starts with what the model saw, so no splice is made. The
    episode goes on as a new sample whose prompt is the conversation as the template renders it
    now: the next turn is sampled from exactly those ids. The sample before the break is a row of
    its own, exactly as it was sampled (rollout.prefix_break: rows), or context only (context)."""
    from rltune.agents.rendering import Renderer
    from rltune.train.episodes import play

    c = _components(_recipe("builtin:guess", max_turns=3, prefix_break=prefix_break),
                    ["<think>hm</think>3", "<think>ok</think>9"])
    c.tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {% if m['role'] == 'assistant' and not loop.last %}"
        "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
    c.env = (c.env[0], Renderer(c.tokenizer, None))
    ep = play(c, [{"prompt": "guess", "target": 9, "high": 16}], "prompt", 1)
    tok, exp = c.tokenizer, ep.exp
    assert c.rollout.calls == 2 and ep.env_scores == [pytest.approx(0.9)]      # found on turn 2: went on
    turn1 = tok("<think>hm</think>3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    turn2 = tok("<think>ok</think>9", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert ep.metrics["episode/prefix_breaks"] == 1
    first = tok.decode(c.rollout.seen[0][0])                                     # what turn 1 was sampled from
    if prefix_break == "rows":   # turn 1 trains in a row of its own: its prompt, its ids, its log-probs
        assert ep.metrics["episode/untrained_tokens"] == 0 and ep.metrics["episode/samples"] == 2
        e = exp.earlier
        assert e.size == 1 and e.owner.tolist() == [0]
        assert e.prompt_ids[0][e.prompt_mask[0].bool()].tolist() == c.rollout.seen[0][0]
        assert e.response_ids[0, :len(turn1)].tolist() == turn1 and int(e.response_mask[0].sum()) == len(turn1)
        assert e.loss_mask[0, :len(turn1)].tolist() == [1.0] * len(turn1)
        assert e.rollout_logp[0, :len(turn1)].tolist() == pytest.approx([-(k + 1) / 10 for k in range(len(turn1))])
        rows = exp.rows(c.rollout.pad_id)                                         # the learner's batch
        assert rows.size == 2 and rows.episode.tolist() == [0, 0]
        assert rows.response_ids[0, :len(turn1)].tolist() == turn1               # sampling order: turn 1 first
        assert tok.decode(rows.prompt_ids[0][rows.prompt_mask[0].bool()]) == first
    else:
        assert ep.metrics["episode/untrained_tokens"] == len(turn1) and exp.earlier is None
    # the row's prompt: the re-rendered conversation (turn 1 without its reasoning, the hint)
    prompt = exp.prompt_ids[0][exp.prompt_mask[0].bool()].tolist()
    text = tok.decode(prompt)
    assert "assistant: 3" in text and "<think>hm" not in text and text.endswith("user: Higher.<|im_end|>\nassistant: ")
    assert c.rollout.seen[1] == [prompt]                                         # what turn 2 was sampled from
    n = int(exp.response_mask[0].sum())
    assert exp.response_ids[0, :n].tolist() == turn2                             # the response: turn 2 only
    assert exp.loss_mask[0, :n].tolist() == [1.0] * n
    assert exp.rollout_logp[0, :n].tolist() == pytest.approx([-(k + 1) / 10 for k in range(n)])


def test_a_prefix_break_keeps_the_episode_token_budget(tmp_path):
    """rollout.max_episode_tokens bounds the whole episode, over the samples a break makes."""
    from rltune.agents.rendering import Renderer
    from rltune.train.episodes import play

    think = "<think>" + "a" * 40 + "</think>3"
    n1 = len(_components(_recipe("builtin:guess"), []).tokenizer(think, add_special_tokens=False)["input_ids"]) + 1
    c = _components(_recipe("builtin:guess", max_turns=4, max_episode_tokens=n1 + 1), [think, think, think])
    c.tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {% if m['role'] == 'assistant' and not loop.last %}"
        "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
    c.env = (c.env[0], Renderer(c.tokenizer, None))
    ep = play(c, [{"prompt": "guess", "target": 9, "high": 16}], "prompt", 1)
    # turn 2 has one token of room left: it is cut there, the episode truncated
    assert c.rollout.calls == 2 and ep.metrics["episode/truncated"] == 1
    assert int(ep.exp.response_mask[0].sum()) == 1


def test_env_reward_and_turns_environment(tmp_path):
    from rltune.train.episodes import play

    c = _components(_recipe("builtin:guess"), ["8", "12", "9"])
    ep = play(c, [{"prompt": "guess", "target": 9, "high": 16}], "prompt", 1)
    assert ep.env_scores == [pytest.approx(0.8)]                                 # found on turn 3
    assert [m["content"] for m in ep.conversations[0] if m["role"] == "user"][1:] == ["Higher.", "Lower."]


def test_a_user_environment_file_and_reset_errors_name_the_row(tmp_path):
    from rltune.agents.env import EnvError
    from rltune.train.episodes import play

    (tmp_path / "myenv.py").write_text(textwrap.dedent('''
        class Echo:
            def reset(self, row):
                if row.get("bad"):
                    raise KeyError("no such thing")
                return "Say it twice."
            def echo(self, text: str) -> str:
                """Repeat the text.

                Args:
                    text: what to repeat
                """
                return text * 2
    '''))
    c = _components(_recipe("myenv.py:Echo"), ["done"], tmp_path)
    ep = play(c, [ROW], "prompt", 1)
    assert ep.conversations[0][1]["content"].endswith("What is 12*3+4?\n\nSay it twice.")
    with pytest.raises(EnvError, match="row .*bad"):
        play(c, [{"prompt": "x", "bad": True}], "prompt", 1)


@pytest.fixture(scope="module")
def dist():
    from rltune.engine.distributed import init_distributed

    return init_distributed("cpu")


def test_rollout_logprobs_equal_the_actors_on_every_generated_position(dist):
    """Real sampling (hf engine, fp32, tiny model), multi-turn: the log-probs the engine reported
    for the model's tokens are the actor's, recomputed over the whole spliced episode."""
    from rltune.train.setup import build
    from rltune.train.update import forward_logp
    from rltune.train.episodes import play

    r = Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:guess"},
        "algorithm": {"name": "grpo", "group_size": 4},
        "rollout": {"engine": "hf", "batch_size": 8, "max_new_tokens": 32, "env": "builtin:guess", "max_turns": 4},
        "train": {"batch_size": 8, "micro_batch_size": 8}, "trainer": {"seed": 3}})
    c = build(r, dist, Path("."))
    torch.manual_seed(0)
    ep = play(c, c.train_set.rows[:4], "prompt", 4)
    exp = ep.exp
    assert ep.metrics["episode/turns"] >= 2                      # multi-turn episodes were played
    env_tokens = exp.response_mask - exp.loss_mask
    assert float(env_tokens.sum()) > 0
    lp = forward_logp(c.actor.module, exp, 1.0, 8)
    diff = ((lp - exp.rollout_logp).abs() * exp.loss_mask).max()
    assert float(diff) < 1e-4, float(diff)


def test_the_overlong_penalty_and_clip_ratio_read_each_turn_not_the_episode():
    """Issue 44.2: every assistant turn has its own rollout.max_new_tokens budget. Three complete
    2-token turns under a 4-token budget (penalty buffer 2: it starts past 2 tokens) are neither
    punished nor counted as clipped; the episode's 6 model tokens used to give reward/overlong -1
    and response/clip_ratio 1. A turn that reaches the budget is punished, whatever turn it is."""
    from rltune.reward import RewardResult
    from rltune.train.episodes import play
    from rltune.train.sampling import Scored, mask_truncated, score

    def episode(turns):
        r = Recipe.model_validate({**_recipe("builtin:guess", max_new_tokens=4).model_dump(exclude_unset=True),
                                   "reward": {"functions": ["builtin:exact_answer"],
                                              "overlong": {"buffer": 2, "penalty": 1.0}}})
        c = _components(r, turns)
        c.rewards = lambda prompts, completions, columns, **kw: RewardResult([0.0] * len(prompts), {})
        c.train_set = SimpleNamespace(prompt_key="prompt")
        ep = play(c, [{"prompt": "guess", "target": 9, "high": 16}], "prompt", 1)
        s = score(c, Scored(ep.exp, ep.prompts, ep.completions, ep.rows, ep.conversations, {}, ep.env_scores))
        mask_truncated(c, s.exp)
        return s, int(s.exp.train_mask.sum()), r.rollout.max_new_tokens

    s, model_tokens, budget = episode(["8", "3", "9"])          # "Higher." twice, then found
    assert model_tokens == 6 > budget and s.exp.turn_lengths.tolist() == [2]
    assert s.raw["overlong"] == [0.0]
    assert not bool((s.exp.turn_lengths >= budget).any())       # response/clip_ratio counts no clipped row
    s, _, _ = episode(["8", "3…", "9"])                         # turn 2: 1 token, no EOS (cut short of the budget)
    assert s.raw["overlong"] == [0.0]
    s, _, _ = episode(["8", "123…"])                            # turn 2 fills the budget without an EOS
    long_turn = s.exp.turn_lengths.tolist()[0]
    assert long_turn >= 3 and s.raw["overlong"][0] == pytest.approx(-min(1.0, (long_turn - 2) / 2))


def test_lone_surrogates_in_an_environments_text_become_u_fffd_not_a_crash(tmp_path):
    """Issue 45 item 10: a non-UTF-8 file name (os.fsdecode gives a lone surrogate) in what reset,
    a tool or step returns is no crash of tokenisation or rendering: the model sees U+FFFD, and
    the conversation the reward functions get holds U+FFFD too."""
    import json

    from rltune.train.episodes import play

    (tmp_path / "files.py").write_text(textwrap.dedent('''
        import os

        NAME = os.fsdecode(b"caf\\xe9.txt")          # "caf\\udce9.txt"

        class Files:
            def reset(self, row):
                return "The folder holds " + NAME
            def ls(self, folder: str) -> str:
                """List a folder.

                Args:
                    folder: its path
                """
                return NAME + " and \\ud800"

        class Turns:
            def reset(self, row):
                return [{"role": "user", "content": "Open " + NAME}]
            def step(self, text):
                return {"messages": [{"role": "user", "content": "No: " + NAME}], "done": False}
    '''))
    call = '<tool_call>{"name": "ls", "arguments": {"folder": "."}}</tool_call>'
    for env, turns in (("files.py:Files", [call, "done"]), ("files.py:Turns", ["a", "b"])):
        c = _components(_recipe(env, max_turns=2), turns, tmp_path)
        ep = play(c, [ROW], "prompt", 1)
        text = c.tokenizer.decode(ep.exp.prompt_ids[0]) + c.tokenizer.decode(ep.exp.response_ids[0])
        assert "caf\ufffd.txt" in text and "\ud800" not in text, env
        messages = json.dumps(ep.conversations[0], ensure_ascii=False)
        messages.encode("utf-8")                                       # no surrogate left anywhere
        assert messages.count("caf\ufffd.txt") >= 2, env


def _short_prompts(recipe: Recipe, n: int) -> Recipe:
    return recipe.model_copy(update={"data": recipe.data.model_copy(update={"max_prompt_length": n})})


def test_an_episode_prompt_longer_than_max_prompt_length_is_reported_once_not_cut_silently(tmp_path, caplog):
    """Issue 45 item 10: a system prompt (reset's messages, the tools) longer than
    data.max_prompt_length is left-truncated as a single-turn prompt is, and said as one is: one
    warning, with the count, the longest and the fix (once per run, not every step)."""
    import logging

    from rltune.train.episodes import play

    (tmp_path / "talky.py").write_text(textwrap.dedent('''
        class Talky:
            def reset(self, row):
                return [{"role": "system", "content": "You are a careful assistant. " * 20},
                        {"role": "user", "content": row["prompt"]}]
            def step(self, text):
                return {"done": True}
    '''))
    c = _components(_short_prompts(_recipe("talky.py:Talky"), 24), ["a", "b"], tmp_path)
    with caplog.at_level(logging.WARNING, logger="rltune"):
        ep = play(c, [ROW, {"prompt": "hi"}], "prompt", 1)
    assert int(ep.exp.prompt_mask[0].sum()) == 24                   # left-truncated, as single-turn prompts are
    warnings = [r.getMessage() for r in caplog.records if "max_prompt_length" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert "2 of 2 episode prompts of this step" in warnings[0] and "longer than data.max_prompt_length (24 tokens" in warnings[0]
    assert "left-truncated" in warnings[0] and "fix: raise data.max_prompt_length to" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rltune"):
        play(c, [ROW], "prompt", 1)
    assert "max_prompt_length" not in caplog.text                    # said once per run


# an environment whose every answer is 20 MB of text (issue 45 item 7)
FLOOD_ANSWER = textwrap.dedent('''
    class Flood:
        def reset(self, row):
            return [{"role": "user", "content": "Read the log."}]
        def step(self, text):
            return {"messages": [{"role": "user", "content": "line of the log\\n" * 1_250_000}], "done": False}
''')

def test_a_20_mb_environment_answer_is_not_tokenised_whole_and_ends_the_episode_truncated(tmp_path, monkeypatch):
    """Issue 45 item 7: only what can still fit in the episode (its max_episode_tokens room) is
    tokenised; an answer past it ends the episode truncated, as at max_episode_tokens (the answer
    is not appended). Measured in characters handed to the tokenizer, not in seconds."""
    from rltune.agents.rendering import Renderer
    from rltune.train.episodes import play

    (tmp_path / "flood.py").write_text(FLOOD_ANSWER)
    tokenised = []
    real = Renderer.ids
    monkeypatch.setattr(Renderer, "ids", lambda self, text: tokenised.append(len(text)) or real(self, text))
    c = _components(_recipe("flood.py:Flood", max_turns=3, max_episode_tokens=1024), ["a", "b"], tmp_path)
    ep = play(c, [ROW], "prompt", 1)
    assert sum(tokenised) < 1_000_000, tokenised                     # 20 MB answered, < 1 MB tokenised
    assert bool(ep.exp.truncated[0]) and c.rollout.calls == 1
    n = int(ep.exp.response_mask[0].sum())
    assert ep.exp.loss_mask[0, :n].tolist() == [1.0] * n              # the answer was not appended


def test_a_20_mb_answer_at_a_prefix_break_is_not_tokenised_whole_and_the_row_keeps_its_bound(tmp_path, monkeypatch):
    """Issue 45 item 7, at a prefix break: the re-rendered conversation holding a 20 MB answer
    is tokenised only as far as the row can hold (data.max_prompt_length + max_episode_tokens);
    past that the episode ends truncated as it was, its row within the bound."""
    from rltune.agents.rendering import Renderer
    from rltune.train.episodes import play

    (tmp_path / "flood.py").write_text(FLOOD_ANSWER)
    c = _components(_recipe("flood.py:Flood", max_turns=3, max_episode_tokens=256), ["<think>hm</think>3", "4"],
                    tmp_path)
    c.tokenizer.chat_template = (              # drops past reasoning (as Qwen3 does): every answer is a break
        "{% for m in messages %}{{ m['role'] }}: {% if m['role'] == 'assistant' and not loop.last %}"
        "{{ m['content'].split('</think>')[-1] }}{% else %}{{ m['content'] }}{% endif %}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}")
    c.env = (c.env[0], Renderer(c.tokenizer, None))
    tokenised = []
    real = Renderer.ids
    monkeypatch.setattr(Renderer, "ids", lambda self, text: tokenised.append(len(text)) or real(self, text))
    ep = play(c, [ROW], "prompt", 1)
    assert sum(tokenised) < 1_000_000, tokenised
    assert bool(ep.exp.truncated[0]) and c.rollout.calls == 1 and ep.metrics["episode/prefix_breaks"] == 0
    assert ep.exp.prompt_ids.shape[1] + ep.exp.response_ids.shape[1] <= c.recipe.data.max_prompt_length + 256


def test_a_20_mb_first_message_is_not_tokenised_whole_its_end_is_the_prompt(tmp_path, monkeypatch, caplog):
    """Issue 45 item 7, for reset: a first message of 20 MB is left-truncated to
    data.max_prompt_length from a bounded tail of it, never tokenised whole, and said once."""
    import logging

    from rltune.agents.rendering import Renderer
    from rltune.train.episodes import play

    (tmp_path / "flood.py").write_text(textwrap.dedent('''
        class Flood:
            def reset(self, row):
                return [{"role": "user", "content": "line of the log\\n" * 1_250_000 + "Which line?"}]
            def step(self, text):
                return {"done": True}
    '''))
    tokenised = []
    real = Renderer.ids
    monkeypatch.setattr(Renderer, "ids", lambda self, text: tokenised.append(len(text)) or real(self, text))
    c = _components(_recipe("flood.py:Flood"), ["a"], tmp_path)
    with caplog.at_level(logging.WARNING, logger="rltune"):
        ep = play(c, [ROW], "prompt", 1)
    assert sum(tokenised) < 1_000_000, tokenised
    prompt = c.tokenizer.decode(ep.exp.prompt_ids[0][ep.exp.prompt_mask[0].bool()])
    assert int(ep.exp.prompt_mask[0].sum()) == c.recipe.data.max_prompt_length
    assert prompt.endswith("Which line?<|im_end|>\n<|im_start|>assistant\n")
    assert "1 of 1 episode prompts" in caplog.text and "too long to count" in caplog.text


def test_turns_mean_counts_the_turns_that_ended_with_eos():
    """Issue 46 item 9: `episode/turns_mean` is what docs/agents.md says: the assistant turns per
    episode that ended with EOS (and reached the environment), the last one included; a turn cut
    off mid-way is not counted."""
    from rltune.train.episodes import finish_metrics, play

    call = '<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}}</tool_call>'

    def turns_mean(turns, **rollout):
        c = _components(_recipe("builtin:calculator", **rollout), turns)
        ep = play(c, [ROW], "prompt", 2)
        return finish_metrics(ep.metrics, lambda xs: xs)["episode/turns_mean"]

    assert turns_mean([call, "2"]) == 2.0                    # the call, and the answer that ended it
    assert turns_mean([call, call], max_turns=2) == 2.0      # max_turns stopped it after its 2nd turn
    assert turns_mean([call, "2 and more…"]) == 1.0          # the 2nd turn was cut off: not counted
    assert turns_mean(["2 and more…"]) == 0.0
    # ... and docs/agents.md says so (it said "assistant turns the environment answered")
    docs = " ".join((Path(__file__).resolve().parents[2] / "docs" / "agents.md").read_text().split())
    said = docs[docs.index("`episode/turns_mean` ("):docs.index("`episode/tool_calls_mean`")]
    assert "ended with EOS" in said and "the last one counts too" in said and "cut off mid-way" in said, said
