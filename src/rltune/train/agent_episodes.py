"""Step 1 with an `agent` environment: episodes driven by the user's OpenAI-client code
(`rollout.env: agent.py:run`, docs/agents.md "Agents").

Each episode is one call of `run(client, row)` in a thread of its own; its client talks to the
recording endpoint (agents/proxy.py), one URL per episode. The trainer's thread:

  1. starts every agent;
  2. waits until every running agent is waiting for the model (or the oldest request has
     waited BATCH_WAIT_S: an agent busy with its own work does not hold the others back
     longer), then samples the waiting requests in one `generate` call, in episode order (the
     same batches for the same seed), and hands each its turn;
  3. abandons an agent that runs on its own past rollout.tool_timeout_s (`episode/timeouts`);
  4. when every agent has returned: the episodes as rows, as train/episodes.py builds them (episode_rows.py).

Each request joins its episode token-in, token-out, as a class environment's turns do:
  - the first request's messages, rendered with the policy's chat template (and the request's
    tools), are the episode's prompt;
  - a later request must extend what the model has seen: the assistant messages the endpoint
    returned (matched by content and tool calls) are put back as the exact text sampled, and
    what the rest adds after it is the environment's turn (attended, never trained);
  - a request that does not extend it (the agent rewrote its history, or began another
    conversation) is a prefix break: the episode goes on as a new sample from that request,
    the sample before it a row of its own with the episode's advantage (rollout.prefix_break:
    rows) or context only (context) (episode_rows.restart);
  - rollout.max_turns, max_new_tokens and max_episode_tokens bound the episode as for a class
    environment: a turn that runs out of tokens is answered with finish_reason "length" and ends
    the episode; a request after the end gets an error ("episode_ended"), and an agent that
    raises on it scores 0 (the episode is truncated).

An agent that raises on its own scores 0 and counts in `episode/env_crashes` (a warning names
the first); when every episode of a call raises, the run stops with the error.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field

from ..agents.agent import AgentSession, Clients
from ..agents.env import EnvError
from ..agents.proxy import BadRequest, ChatProxy, completion, error, normalise_message, reply_message, \
    request_messages, same_message
from ..agents.rendering import Renderer
from ..rollout.base import Sampling
from .episode_rows import Episode, Played, append_turn, episode_metrics, experience, restart, sampled, seeded, \
    warn_long_prompts
from .prompts import prompt_text

LOG = logging.getLogger("rltune")
BATCH_WAIT_S = 1.0           # the longest a request waits for other agents to join its batch
CLIENT_TIMEOUT_S = 3600.0    # the agent's HTTP timeout: the endpoint always answers (engine errors too)


@dataclass
class AgentEpisode(Episode):
    key: str = ""                          # the episode's part of the endpoint's URL
    index: int = 0
    state: str = "agent"                   # agent (its code runs) | waiting (for the model) | finished
    since: float = 0.0                     # when it entered that state (time.monotonic)
    busy: bool = False                     # a request of it is being served
    ended: str = ""                        # why the episode ended before its agent returned
    replies: list = field(default_factory=list)   # (assistant message as returned, normalised; text sampled)
    thread: threading.Thread | None = None


class _Request:
    def __init__(self, e: AgentEpisode, ids: list[int]):
        self.e, self.ids, self.t = e, ids, time.monotonic()
        self.done = threading.Event()
        self.out: tuple[list[int], list[float]] | None = None
        self.failed = ""


def play_agents(c, rows: list[dict], prompt_key: str, n: int, greedy: bool = False,
                keys: list[int] | None = None) -> Played:
    """`n` episodes of every row, each one run of the agent; see the module docstring."""
    fn = c.env[0]
    run = _AgentRun(c, fn, greedy)
    run.seed = c.sampler.seed if keys is not None else 0   # the run's: with the draw keys, each request's seed
    episodes = [AgentEpisode(AgentSession(fn), row, prompt_text(row, prompt_key), [], [], "", key=secrets.token_hex(8),
                             index=i * n + j, limit=c.recipe.rollout.max_episode_tokens,
                             draw=None if keys is None else keys[i], sample=j)
                for i, row in enumerate(rows) for j in range(n)]
    run.play(episodes)
    c.rollout.sleep()
    warn_long_prompts(c.env[1], run.prompt_lengths, run.max_prompt)
    scores = [e.session.reward(ended=bool(e.ended)) for e in episodes]
    crashed = [e for e in episodes if e.session.crashed]
    if crashed and len(crashed) == len(episodes):
        raise EnvError(f"every agent episode raised; the first: {crashed[0].session.crash_text()}",
                       "fix run(); an agent that cannot go on should return its reward, not raise")
    if crashed:
        LOG.warning("%d of %d agent episodes raised (reward 0, episode/env_crashes); the first: %s",
                    len(crashed), len(episodes), crashed[0].session.crash_text())
    filler = [c.tokenizer.bos_token_id if c.tokenizer.bos_token_id is not None else c.rollout.pad_id]
    for e in episodes:
        if not e.prompt_ids:       # the agent returned without calling the model: an empty response
            e.prompt_ids = list(filler)
    return Played(experience(episodes, c.rollout.pad_id), [e.prompt for e in episodes],
                  [e.last_text if e.answered else "" for e in episodes], [e.row for e in episodes],
                  [e.messages for e in episodes], scores, episode_metrics(episodes))


class _AgentRun:
    """The endpoint's side of one `play_agents` call: requests in, turns out."""

    def __init__(self, c, fn, greedy: bool):
        self.c, self.fn = c, fn
        self.ro = c.recipe.rollout
        self.max_prompt = c.recipe.data.max_prompt_length
        self.sampling = Sampling.from_recipe(self.ro, 1, greedy=greedy)
        self.seed = 0                                # the run's seed where episodes are seeded (play_agents)
        self.eos = set(c.rollout.eos_ids)
        self.cond = threading.Condition()
        self.pending: list[_Request] = []
        self.by_key: dict[str, AgentEpisode] = {}
        self.renderers: dict[str, Renderer] = {}
        self.prompt_lengths: list[int | None] = []   # of each episode's first request, untruncated (warn_long_prompts)

    # ---------------------------------------------------------------- the trainer's thread

    def play(self, episodes: list[AgentEpisode]) -> None:
        self.by_key = {e.key: e for e in episodes}
        proxy = ChatProxy(self.chat)
        clients = Clients(CLIENT_TIMEOUT_S)
        try:
            for e in episodes:
                client = clients.make(self.fn, proxy.url(e.key))
                e.thread = threading.Thread(target=self._agent, args=(e, client), daemon=True,
                                            name=f"rltune-agent-{e.index}")
            now = time.monotonic()
            for e in episodes:
                e.since = now
                e.thread.start()
            self._drive(episodes)
        finally:
            with self.cond:
                for e in episodes:
                    if e.state != "finished":
                        self._end(e, "the run stopped")
                        e.state = "finished"
                for r in self.pending:
                    r.failed = "the run stopped"
                    r.done.set()
                self.pending = []
            proxy.close()
            clients.close()

    def _agent(self, e: AgentEpisode, client) -> None:
        e.session.run(client, e.row)
        with self.cond:
            e.state = "finished"
            e.done = True
            self.cond.notify_all()

    def _drive(self, episodes: list[AgentEpisode]) -> None:
        """Steps 2-3 of the module docstring, until every agent has returned (or was abandoned)."""
        while True:
            with self.cond:
                self.cond.wait(0.05)
                now = time.monotonic()
                for e in episodes:
                    if e.state == "agent" and now - e.since > self.ro.tool_timeout_s:
                        e.session.timeouts += 1
                        self._end(e, f"its agent ran past rollout.tool_timeout_s ({self.ro.tool_timeout_s:g} s)")
                        e.state = "finished"
                running = any(e.state == "agent" for e in episodes)
                if not running and not self.pending:
                    return
                batch: list[_Request] = []
                if self.pending and (not running or now - self.pending[0].t > BATCH_WAIT_S):
                    batch, self.pending = sorted(self.pending, key=lambda r: r.e.index), []
            if batch:
                self._generate(batch)

    def _generate(self, batch: list[_Request]) -> None:
        try:
            out = self.c.rollout.generate([r.ids for r in batch],
                                          seeded(self.sampling, [r.e for r in batch], self.seed))
        except BaseException:
            with self.cond:
                for r in batch:
                    r.failed = "the rollout engine failed (the trainer's log says why)"
                    r.done.set()
            raise
        now = time.monotonic()
        with self.cond:
            for i, r in enumerate(batch):
                r.out = sampled(out, i)
                r.e.state, r.e.since = "agent", now
                r.e.session.waited_s += now - r.t
                r.done.set()

    # ---------------------------------------------------------------- a request's thread

    def chat(self, key: str, body: dict) -> tuple[int, dict]:
        e = self.by_key.get(key)
        if e is None:
            return 404, error(f"no episode {key!r} on this endpoint", "not_found")
        with self.cond:
            if e.ended or e.state == "finished":
                return 400, error(f"this episode has ended: {e.ended or 'its agent returned'}", "episode_ended")
            if e.busy:
                return 400, error("one request at a time per episode: an episode is one conversation")
            e.busy = True
        try:
            with self.cond:
                try:
                    messages, tools = request_messages(body)
                    ids = self._prepare(e, messages, tools)
                except BadRequest as err:
                    return 400, error(str(err), "episode_ended" if e.ended else "invalid_request_error")
                request = _Request(e, ids)
                e.state = "waiting"
                self.pending.append(request)
                self.cond.notify_all()
            request.done.wait()
            with self.cond:
                if request.failed:
                    return 500, error(request.failed, "server_error")
                return 200, self._record(e, *request.out, offer_tools=bool(tools))
        finally:
            with self.cond:
                e.busy = False

    def _renderer(self, tools: list[dict] | None) -> Renderer:
        key = json.dumps(tools, sort_keys=True)
        if key not in self.renderers:
            self.renderers[key] = Renderer(self.c.tokenizer, tools)
        return self.renderers[key]

    def _restore(self, e: AgentEpisode, messages: list[dict]) -> list[dict]:
        """The request's messages with the assistant turns this endpoint returned put back as the
        exact text sampled, and tool results named after the call they answer."""
        names = {call["id"]: call["function"]["name"] for reply, _ in e.replies for call in reply.get("tool_calls") or []}
        out, j = [], 0
        for m in messages:
            if m["role"] == "assistant":
                hit = next((k for k in range(j, len(e.replies)) if same_message(m, e.replies[k][0])), None)
                if hit is not None:
                    m, j = {"role": "assistant", "content": e.replies[hit][1]}, hit + 1
            elif m["role"] == "tool" and "name" not in m and m.get("tool_call_id") in names:
                m = {**m, "name": names[m["tool_call_id"]]}
            out.append(m)
        return out

    def _end(self, e: AgentEpisode, why: str) -> None:
        e.ended = e.ended or why
        e.done = e.truncated = True

    def _prepare(self, e: AgentEpisode, messages: list[dict], tools) -> list[int]:
        """The ids the next turn of `e` is sampled from (what the request adds appended, as the
        environment's turn); BadRequest when the episode has reached one of its bounds."""
        render = self._renderer(tools)
        messages = render.start(self._restore(e, messages))
        if len(e.replies) >= self.ro.max_turns:
            self._end(e, f"rollout.max_turns ({self.ro.max_turns}) reached")
            raise BadRequest(f"this episode has ended: {e.ended}")
        if not e.prompt_ids:                      # the episode's first request: its prompt
            e.seen = render.text(messages)
            e.prompt_ids, length = render.prompt_ids(e.seen, self.max_prompt)   # a flood: only its end is tokenised
            self.prompt_lengths.append(length)
            e.messages = messages
            return list(e.prompt_ids)
        delta = render.env_delta(e.seen, messages, room=e.limit - len(e.tokens) - 1)   # only what can fit is tokenised
        e.messages = messages
        if delta is None:                         # a prefix break: a new sample from this request
            restart(e, render, self.ro, self.max_prompt)
            if e.done:
                self._end(e, f"rollout.max_episode_tokens ({self.ro.max_episode_tokens}) reached")
                raise BadRequest(f"this episode has ended: {e.ended}")
            return list(e.prompt_ids)
        env_ids, env_text = delta
        if env_ids is None or len(e.tokens) + len(env_ids) >= e.limit:
            self._end(e, f"rollout.max_episode_tokens ({self.ro.max_episode_tokens}) reached")
            raise BadRequest(f"this episode has ended: {e.ended}")
        e.tokens += env_ids
        e.trained += [0.0] * len(env_ids)
        e.logp += [0.0] * len(env_ids)
        e.seen += env_text
        return e.prompt_ids + e.tokens

    def _record(self, e: AgentEpisode, ids: list[int], logp: list[float], offer_tools: bool) -> dict:
        """The sampled turn on the end of `e`, and the chat completion that answers the request."""
        prompt_tokens = len(e.prompt_ids) + len(e.tokens)
        append_turn(e, ids, logp, self.eos, self.c.tokenizer)
        e.session.turns += e.answered      # turns the agent got to answer (as session.Session counts them)
        turn = len(e.replies) + 1
        message, calls, unreadable = reply_message(e.last_text, offer_tools, f"call-{e.index}-{turn}")
        e.session.tool_calls += calls
        e.session.parse_errors += unreadable
        e.replies.append((normalise_message(message), e.last_text))
        finish = "tool_calls" if calls else "stop"
        if not e.answered:
            self._end(e, "its last turn ran out of tokens (rollout.max_new_tokens or max_episode_tokens)")
            finish = "length"
        return completion(message, finish, prompt_tokens, len(ids), f"chatcmpl-{e.key}-{turn}")


__all__ = ["play_agents"]
