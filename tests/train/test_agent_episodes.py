"""`agent` environments (issue 28, item 4): run(client, row) written against the real OpenAI
client, served by rltune's recording endpoint. A scripted engine answers from the prompt it is
given, so every check is on exact ids: the episode holds the ids the engine sampled (trained) and
the environment's rendered turns between them (not trained), tool calls come back as OpenAI
`tool_calls`, history rewrites are prefix breaks, and the episode's bounds, crashes and hangs
end episodes, never the run (unless every agent crashes)."""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace

import pytest
import torch

from rltune.recipe.schema import Recipe

pytest.importorskip("openai")
TOKENIZER = "builtin:smollm2-135m-instruct"     # a chat tokenizer that can write `<tool_call>{...}`
CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
ADD = {"type": "function", "function": {"name": "add", "description": "Add two numbers.",
                                        "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                                                        "b": {"type": "integer"}},
                                                       "required": ["a", "b"]}}}


def _recipe(**rollout) -> Recipe:
    return Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
        "reward": {"functions": ["builtin:exact_answer"]}, "algorithm": {"name": "grpo", "group_size": 2},
        "rollout": {"engine": "hf", "batch_size": 2, "max_new_tokens": 64, "env": "agent.py:run", **rollout},
        "train": {"batch_size": 2, "micro_batch_size": 2}})


class Answering:
    """A rollout engine that answers from the prompt: a tool call until the tool's answer is in
    it, then the answer "3" (or `reply(prompt text)` where given). Records every batch."""

    name = "answering"

    def __init__(self, tok, reply=None):
        self.tok, self.reply = tok, reply
        self.eos_ids, self.pad_id = {tok.eos_token_id}, tok.pad_token_id
        self.batches: list[list[list[int]]] = []
        self.sampled: dict[tuple, list[list[int]]] = {}     # prompt ids -> the ids sampled for it, each time

    def _text(self, prompt: list[int]) -> str:
        if self.reply is not None:
            return self.reply(self.tok.decode(prompt))
        return "3" if "<|im_start|>tool" in self.tok.decode(prompt) else CALL

    def generate(self, prompt_ids, sampling):
        from rltune.rollout.experience import Experience

        self.batches.append([list(p) for p in prompt_ids])
        rows = []
        for p in prompt_ids:
            text = self._text(list(p))
            cut = text.endswith("…")
            ids = self.tok(text.rstrip("…"), add_special_tokens=False)["input_ids"] + ([] if cut else [self.tok.eos_token_id])
            self.sampled.setdefault(tuple(p), []).append(ids)
            rows.append(ids)
        B, T = len(rows), max(len(r) for r in rows)
        response = torch.full((B, T), self.pad_id, dtype=torch.long)
        mask = torch.zeros(B, T)
        for i, r in enumerate(rows):
            response[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1.0
        return Experience(prompt_ids=torch.zeros(B, 1, dtype=torch.long), prompt_mask=torch.ones(B, 1, dtype=torch.long),
                          response_ids=response, response_mask=mask,
                          rollout_logp=-mask * torch.arange(1, T + 1, dtype=torch.float32) / 10)

    def sleep(self):
        pass


def _play(agent, rows, n=1, reply=None, **rollout):
    from rltune.agents.rendering import Renderer
    from rltune.models.loading import load_tokenizer
    from rltune.train.episodes import play

    tok = load_tokenizer(TOKENIZER)
    c = SimpleNamespace(recipe=_recipe(**rollout), tokenizer=tok, rollout=Answering(tok, reply), env=(agent, Renderer(tok)))
    return c, play(c, rows, "prompt", n)


def assert_sampled_ids_exactly(c, ep):
    """Every trained run of every episode is what the engine sampled for exactly the ids before it
    (`c.rollout.sampled`: prompt ids -> every sample drawn for them)."""
    exp = ep.exp.rows(c.rollout.pad_id)        # the samples before a prefix break too
    for b in range(exp.size):
        prompt = exp.prompt_ids[b][exp.prompt_mask[b].bool()].tolist()
        n = int(exp.response_mask[b].sum())
        ids, trained = exp.response_ids[b, :n].tolist(), exp.loss_mask[b, :n].tolist()
        p = 0
        while p < n:
            if trained[p] == 0:
                p += 1
                continue
            # one of the samples drawn for exactly these ids (episodes may share a prompt)
            options = [w for w in c.rollout.sampled[tuple(prompt + ids[:p])] if ids[p:p + len(w)] == w[:n - p]]
            assert options, (b, p)
            want = options[0]
            assert trained[p:p + len(want)] == [1.0] * min(len(want), n - p)
            p += len(want)


def tool_agent(client, row):
    messages = [{"role": "user", "content": row["prompt"]}]
    first = client.chat.completions.create(model="any", messages=messages, tools=[ADD])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    messages += [choice.message, {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}]
    final = client.chat.completions.create(model="any", messages=messages, tools=[ADD])
    return 1.0 if final.choices[0].message.content == "3" else 0.0


def test_an_openai_client_agent_with_tools_is_recorded_token_in_token_out():
    c, ep = _play(tool_agent, [{"prompt": "What is 1+2?"}, {"prompt": "And 1+2?"}], n=2)
    assert ep.env_scores == [1.0] * 4 and ep.completions == ["3"] * 4
    assert_sampled_ids_exactly(c, ep)
    exp, tok = ep.exp, c.tokenizer
    env = exp.response_mask - exp.loss_mask
    assert float(env.sum()) > 0
    text = tok.decode(exp.response_ids[0][env[0].bool()])
    assert text.startswith("\n<|im_start|>tool\n3<|im_end|>") and text.endswith("<|im_start|>assistant\n")
    # the tools are offered as the template can (SmolLM2's renders no `tools=`: a system message)
    assert "add" in tok.decode(exp.prompt_ids[0]) and "<tool_call>" in tok.decode(exp.prompt_ids[0])
    assert float(exp.rollout_logp[env.bool()].abs().sum()) == 0 and bool((exp.rollout_logp[exp.loss_mask.bool()] < 0).all())
    m = ep.metrics
    assert m["episode/tool_calls"] == 4 and m["episode/turns"] == 8 and m["episode/prefix_breaks"] == 0
    assert m["episode/truncated"] == 0 and m["episode/env_crashes"] == 0
    # lockstep: the 4 episodes' first turns were sampled in one call, then their second turns
    assert [len(b) for b in c.rollout.batches] == [4, 4]


@pytest.mark.parametrize("prefix_break", ["rows", "context"])
def test_a_rewritten_history_is_a_prefix_break_and_the_earlier_turn_is_a_row_of_its_own(prefix_break):
    def forgetful(client, row):
        first = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "one"}])
        text = first.choices[0].message.content
        # the agent keeps a summary of its turn, not the turn: the model never saw this history
        messages = [{"role": "user", "content": "one"}, {"role": "assistant", "content": text.upper()},
                    {"role": "user", "content": "two"}]
        client.chat.completions.create(model="m", messages=messages)
        return 0.5

    c, ep = _play(forgetful, [{"prompt": "p"}], reply=lambda prompt: "ok", prefix_break=prefix_break)
    assert ep.metrics["episode/prefix_breaks"] == 1 and ep.env_scores == [0.5]
    if prefix_break == "context":
        assert ep.metrics["episode/untrained_tokens"] == 2 and ep.exp.earlier is None   # "ok" + EOS: context
    else:   # "ok" + EOS train in a row of their own, sampled from the first request
        e = ep.exp.earlier
        assert ep.metrics["episode/untrained_tokens"] == 0 and e.owner.tolist() == [0]
        assert e.loss_mask[0].sum() == 2 and c.tokenizer.decode(e.prompt_ids[0][e.prompt_mask[0].bool()]).endswith(
            "one<|im_end|>\n<|im_start|>assistant\n")
    exp, tok = ep.exp, c.tokenizer
    assert "OK" in tok.decode(exp.prompt_ids[0]) and tok.decode(exp.prompt_ids[0]).endswith("two<|im_end|>\n<|im_start|>assistant\n")
    assert exp.loss_mask[0].sum() == 2
    assert_sampled_ids_exactly(c, ep)


def test_the_episodes_bounds_end_it_and_the_agent_is_told():
    import openai

    seen = {}

    def endless(client, row):
        messages = [{"role": "user", "content": "go"}]
        try:
            while True:
                reply = client.chat.completions.create(model="m", messages=messages)
                messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                             {"role": "user", "content": "again"}]
        except openai.BadRequestError as err:
            seen["error"], seen["code"] = str(err), err.code
            return 0.25 if row["prompt"] == "catch" else None

    c, ep = _play(endless, [{"prompt": "catch"}, {"prompt": "none"}], reply=lambda prompt: "more", max_turns=3)
    assert "rollout.max_turns (3) reached" in seen["error"] and seen["code"] == "episode_ended"
    assert [len(b) for b in c.rollout.batches] == [2, 2, 2]
    assert ep.env_scores == [0.25, 0.0] and bool(ep.exp.truncated.all())
    assert ep.metrics["episode/env_crashes"] == 0        # an ended episode's agent is not a crash
    assert_sampled_ids_exactly(c, ep)

    # a turn that runs out of tokens: finish_reason "length", then the episode is over
    reasons = []

    def cut(client, row):
        reasons.append(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
                       .choices[0].finish_reason)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])

    c, ep = _play(cut, [{"prompt": "p"}], reply=lambda prompt: "never ends…")
    assert reasons == ["length"] and ep.env_scores == [0.0] and bool(ep.exp.truncated[0]) and ep.completions == [""]


def test_an_agent_that_raises_scores_zero_and_when_all_do_the_run_stops(caplog):
    from rltune.agents.env import EnvError

    def flaky(client, row):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": row["prompt"]}])
        if row["prompt"] == "bad":
            raise ValueError("cannot parse the model's answer")
        return 1.0

    with caplog.at_level(logging.WARNING, logger="rltune"):
        c, ep = _play(flaky, [{"prompt": "good"}, {"prompt": "bad"}], reply=lambda prompt: "x")
    assert ep.env_scores == [1.0, 0.0] and ep.metrics["episode/env_crashes"] == 1
    assert "1 of 2 agent episodes raised" in caplog.text and "ValueError: cannot parse" in caplog.text
    with pytest.raises(EnvError, match="every agent episode raised; the first: ValueError"):
        _play(flaky, [{"prompt": "bad"}], reply=lambda prompt: "x")

    def wrong(client, row):
        return "1.0"

    with pytest.raises(EnvError, match="returned '1.0'"):
        _play(wrong, [{"prompt": "p"}])


def test_streaming_and_several_choices_are_refused_with_the_reason():
    import openai

    errors = []

    def streaming(client, row):
        for kwargs in ({"stream": True}, {"n": 2}):
            try:
                client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], **kwargs)
            except openai.BadRequestError as err:
                errors.append(str(err))
        return 0.0

    _play(streaming, [{"prompt": "p"}])
    assert "streaming is not supported" in errors[0] and "n must be 1" in errors[1]


def test_an_async_agent_gets_an_async_client():
    async def agent(client, row):
        reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        return 1.0 if reply.choices[0].message.content == "yes" else 0.0

    c, ep = _play(agent, [{"prompt": "p"}], n=2, reply=lambda prompt: "yes")
    assert ep.env_scores == [1.0, 1.0]
    assert_sampled_ids_exactly(c, ep)


def test_an_agent_busy_past_the_tool_timeout_is_abandoned_and_the_others_go_on():
    def agent(client, row):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        if row["prompt"] == "slow":
            time.sleep(3)
        return 1.0

    t0 = time.monotonic()
    c, ep = _play(agent, [{"prompt": "slow"}, {"prompt": "fast"}], reply=lambda prompt: "y", tool_timeout_s=0.5)
    assert time.monotonic() - t0 < 2.5
    assert ep.env_scores == [0.0, 1.0] and ep.metrics["episode/timeouts"] == 1
    assert ep.exp.truncated.tolist() == [True, False]


def test_an_agent_that_never_calls_the_model_is_an_empty_row():
    c, ep = _play(lambda client, row: 0.5, [{"prompt": "p"}])
    assert ep.env_scores == [0.5] and ep.exp.response_mask.sum() == 0 and ep.exp.prompt_mask.sum() == 1


def test_an_agent_is_loaded_from_its_spec_and_is_not_isolated(tmp_path):
    from rltune.agents.env import EnvError, kind_of, load_env_class
    from rltune.models.loading import load_tokenizer
    from rltune.train.episodes import load_environment

    (tmp_path / "agent.py").write_text("def run(client, row):\n    return 1.0\n\ndef bad(client):\n    return 1.0\n")
    fn = load_env_class("agent.py:run", tmp_path)
    assert kind_of(fn) == "agent"
    with pytest.raises(EnvError, match=r"cannot be called as run\(client, row\)"):
        load_env_class("agent.py:bad", tmp_path)
    with pytest.raises(EnvError, match="rollout.env_isolate is for environment classes"):
        load_environment(_recipe(env_isolate=True), load_tokenizer(TOKENIZER), tmp_path)


def test_the_endpoint_answers_malformed_requests_and_a_lone_surrogate_reaches_the_model_as_u_fffd(capfd):
    """Issue 45 item 10, on the real endpoint of a real episode: raw requests that are not
    chat requests get a 4xx with a JSON error (never a dropped connection or a traceback); a lone
    surrogate (what `requests`, or json.dumps, sends for a non-UTF-8 file name) reaches the
    model as U+FFFD, and the episode goes on."""
    import socket
    import urllib.request
    from urllib.parse import urlsplit

    answers = []

    def raw(url, data: bytes) -> tuple[int, dict]:
        parts = urlsplit(url)
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
            s.sendall(data.replace(b"PATH", (parts.path.rstrip("/") + "/chat/completions").encode()))
            buf = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)

    def agent(client, row):
        url = str(client.base_url)
        deep = b"[" * 100_000 + b"]" * 100_000
        for data in (b"POST PATH HTTP/1.1\r\nContent-Length: abc\r\nConnection: close\r\n\r\n",
                     b"POST PATH HTTP/1.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(deep) + deep):
            answers.append(raw(url, data))
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "file caf\udce9.txt"}]}).encode()
        request = urllib.request.Request(url.rstrip("/") + "/chat/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request) as reply:
            answers.append((reply.status, json.loads(reply.read())))
        return 1.0

    c, ep = _play(agent, [{"prompt": "p"}], reply=lambda prompt: "seen")
    (s1, b1), (s2, b2), (s3, b3) = answers
    assert s1 == 400 and "Content-Length" in b1["error"]["message"]
    assert s2 == 400 and "nested too deeply" in b2["error"]["message"]
    assert s3 == 200 and b3["choices"][0]["message"]["content"] == "seen"
    assert "file caf\ufffd.txt" in c.tokenizer.decode(ep.exp.prompt_ids[0]) and ep.env_scores == [1.0]
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_an_agent_prompt_longer_than_max_prompt_length_is_reported_once_not_cut_silently(caplog):
    """Issue 45 item 10: an agent's first request (its system prompt, its tools) longer than
    data.max_prompt_length is left-truncated and said once, as a single-turn prompt is."""
    from rltune.agents.rendering import Renderer
    from rltune.models.loading import load_tokenizer
    from rltune.train.episodes import play

    def agent(client, row):
        client.chat.completions.create(model="m", messages=[
            {"role": "system", "content": "You are a careful assistant. " * 20}, {"role": "user", "content": "x"}])
        return 1.0

    tok = load_tokenizer(TOKENIZER)
    recipe = _recipe()
    recipe = recipe.model_copy(update={"data": recipe.data.model_copy(update={"max_prompt_length": 24})})
    c = SimpleNamespace(recipe=recipe, tokenizer=tok, rollout=Answering(tok, lambda prompt: "y"), env=(agent, Renderer(tok)))
    with caplog.at_level(logging.WARNING, logger="rltune"):
        ep = play(c, [{"prompt": "p"}], "prompt", 2)
    assert int(ep.exp.prompt_mask[0].sum()) == 24
    warnings = [r.getMessage() for r in caplog.records if "max_prompt_length" in r.getMessage()]
    assert len(warnings) == 1 and "2 of 2 episode prompts" in warnings[0] and "left-truncated" in warnings[0], caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rltune"):
        play(c, [{"prompt": "p"}], "prompt", 1)
    assert "max_prompt_length" not in caplog.text


def test_a_20_mb_tool_result_from_an_agent_is_not_tokenised_whole_and_ends_the_episode(monkeypatch):
    """Issue 45 item 7, for agents: a request whose new messages (a 20 MB tool result) cannot fit
    in the episode's max_episode_tokens is refused with `episode_ended` after tokenising at most
    a bounded part of it; the episode is truncated."""
    import openai

    from rltune.agents.rendering import Renderer

    tokenised, seen = [], {}
    real = Renderer.ids
    monkeypatch.setattr(Renderer, "ids", lambda self, text: tokenised.append(len(text)) or real(self, text))

    def agent(client, row):
        messages = [{"role": "user", "content": "read the log"}]
        reply = client.chat.completions.create(model="m", messages=messages)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "line of the log\n" * 1_250_000}]
        try:
            client.chat.completions.create(model="m", messages=messages)
        except openai.BadRequestError as err:
            seen["code"], seen["error"] = err.code, str(err)
        return 0.5

    c, ep = _play(agent, [{"prompt": "p"}], reply=lambda prompt: "ok", max_episode_tokens=1024)
    assert seen["code"] == "episode_ended" and "max_episode_tokens (1024)" in seen["error"]
    assert sum(tokenised) < 1_000_000, tokenised
    assert bool(ep.exp.truncated[0]) and ep.env_scores == [0.5]
