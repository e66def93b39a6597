"""Step 1 with `rollout.env`: episodes instead of single completions (docs/agents.md).

Every episode (group_size per prompt, one environment instance each) runs turn by turn:

  1. the environment's `reset(row)` gives the first messages; rendered with the chat template
     (and the tools), tokenised once: the episode's prompt;
  2. the rollout engine samples one assistant turn for every unfinished episode at once; its ids
     and log-probs are appended as they were sampled (trained: `loss_mask` 1);
  3. the environment answers (tool calls parsed and run, or `step(text)`); its messages, rendered
     after what the model has seen, are tokenised on their own and appended (attended, never
     trained: `loss_mask` 0; agents/rendering.py says how and when that cannot be done);
  4. until the environment says done, `rollout.max_turns` turns were taken, a turn ran out of
     tokens (no EOS) or `rollout.max_episode_tokens` is reached (the last two: truncated).

Where the chat template rewrites earlier turns (step 3 finds no exact splice: a prefix break),
the episode goes on as a new sample: its prompt is the whole conversation re-rendered, as the
template shows it to the model, and the turns before it become context (not trained; counted
in `episode/prefix_breaks` and `episode/untrained_tokens`). One row per episode, always.

The result is the same `Scored` a single-turn step gives: the response region holds every turn
after the prompt; the reward functions see the last assistant message as the completion (empty
when that turn was cut off before its EOS: a half-written answer is no answer) and the whole
conversation; an environment that defines `reward` adds its score (source `env`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..rollout.base import Sampling
from ..rollout.experience import Experience
from .prompts import prompt_messages, prompt_text


@dataclass
class Episode:
    session: object                      # agents.env.Session
    row: dict
    prompt: str                          # the row's prompt text (what reward functions get as prompt)
    messages: list[dict]                 # the conversation so far
    prompt_ids: list[int]
    seen: str                            # the text of prompt_ids + tokens, as rendered
    tokens: list[int] = field(default_factory=list)      # response side: every turn after the prompt
    trained: list[float] = field(default_factory=list)   # 1 = sampled by the model
    logp: list[float] = field(default_factory=list)      # rollout log-prob of sampled tokens, 0 elsewhere
    limit: int = 0                       # most tokens this sample's response side may hold
    spent: int = 0                       # response-side tokens of the samples before a prefix break
    last_text: str = ""                  # the last assistant message
    answered: bool = False               # the last assistant turn ended (EOS): an answer, not a cut-off
    done: bool = False
    truncated: bool = False
    breaks: int = 0                      # prefix breaks: the sample restarted from a re-rendered prompt
    untrained: int = 0                   # model tokens that became context at a break


@dataclass
class Played:
    """Finished episodes as the step needs them (B = episodes, prompt-major in groups)."""
    exp: Experience
    prompts: list[str]
    completions: list[str]               # the last assistant message of each episode ("" when it was cut
                                         # off before its EOS: no answer)
    rows: list[dict]
    conversations: list[list[dict]]      # the whole conversation of each episode
    env_scores: list[float] | None       # the environment's reward, where it defines one
    metrics: dict


def load_environment(recipe, tokenizer, recipe_dir: Path):
    """(class, Renderer) of `rollout.env`, built once at set-up (a class that does not load stops
    the run before any model is built), or None for single-turn runs."""
    if not recipe.rollout.env:
        return None
    from ..agents.env import EnvError, kind_of, load_env_class
    from ..agents.rendering import Renderer
    from ..agents.tools import tool_schemas

    if recipe.rollout.env_isolate:   # the environment's module is imported in the worker only
        from ..agents.isolate import EnvPool

        pool = EnvPool(recipe.rollout.env, Path(recipe_dir), recipe.rollout.tool_timeout_s)
        if pool.kind == "agent":
            pool.close()
            raise EnvError(f"rollout.env_isolate is for environment classes; {recipe.rollout.env} is an agent "
                           "function, which runs in threads of the trainer",
                           "remove rollout.env_isolate (an agent's own code may start processes of its own)")
        return pool, Renderer(tokenizer, pool.tools if pool.kind == "tools" else None)
    cls = load_env_class(recipe.rollout.env, Path(recipe_dir))
    return cls, Renderer(tokenizer, tool_schemas(cls) if kind_of(cls) == "tools" else None)


def play(c, rows: list[dict], prompt_key: str, n: int, greedy: bool = False) -> Played:
    """`n` episodes of every row, to their end; see the module docstring for the turns."""
    from ..agents.env import Session, gives_reward
    from ..agents.isolate import EnvPool

    from ..agents.agent import is_agent

    r, tok = c.recipe, c.tokenizer
    ro = r.rollout
    cls, render = c.env
    if is_agent(cls):   # rollout.env names an agent function: its own code drives the episodes
        from .agent_episodes import play_agents

        return play_agents(c, rows, prompt_key, n, greedy)
    eos = set(c.rollout.eos_ids)
    episodes: list[Episode] = []
    for row in rows:
        for _ in range(n):
            session = cls.session() if isinstance(cls, EnvPool) else Session(cls, ro.tool_timeout_s)
            messages = render.start(session.start(row, prompt_messages(row, prompt_key, r.data)))
            text = render.text(messages)
            ids = render.ids(text)[-r.data.max_prompt_length:]
            episodes.append(Episode(session, row, prompt_text(row, prompt_key), messages, ids, text,
                                    limit=ro.max_episode_tokens))
    sampling = Sampling.from_recipe(ro, 1, greedy=greedy)
    for _turn in range(ro.max_turns):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        out = c.rollout.generate([e.prompt_ids + e.tokens for e in active], sampling)
        for i, e in enumerate(active):
            _take_turn(e, out, i, eos, tok, render, ro, r.data.max_prompt_length,
                       last_turn=_turn == ro.max_turns - 1)
    c.rollout.sleep()
    pool = cls if isinstance(cls, EnvPool) else None
    scores = [e.session.reward(e.messages) for e in episodes] if (
        pool.gives_reward if pool is not None else gives_reward(cls)) else None
    for e in episodes:
        if hasattr(e.session, "close"):
            e.session.close()
    return Played(experience(episodes, c.rollout.pad_id), [e.prompt for e in episodes],
                  [e.last_text if e.answered else "" for e in episodes], [e.row for e in episodes],
                  [e.messages for e in episodes],
                  None if scores is None else [float(s) for s in scores], episode_metrics(episodes))


def _take_turn(e: Episode, out: Experience, i: int, eos: set, tok, render, ro, max_prompt: int,
               last_turn: bool) -> None:
    """Append the model's turn `i` of `out` to episode `e`, then the environment's answer."""
    append_turn(e, *sampled(out, i), eos, tok)
    if not e.answered:                 # out of tokens mid-turn: the environment never sees it
        e.done = e.truncated = True
        return
    new, done = e.session.respond(e.last_text)
    if done:
        e.done = True
        return
    e.messages = e.messages + list(new)
    if last_turn:                      # rollout.max_turns: the environment wanted another turn
        e.done = e.truncated = True
        return
    delta = render.env_delta(e.seen, e.messages)
    if delta is None:                  # the template rewrote earlier turns: no exact splice
        restart(e, render, ro, max_prompt)
        return
    env_ids, env_text = delta
    if len(e.tokens) + len(env_ids) >= e.limit:
        e.done = e.truncated = True
        return
    e.tokens += env_ids
    e.trained += [0.0] * len(env_ids)
    e.logp += [0.0] * len(env_ids)
    e.seen += env_text


def sampled(out: Experience, i: int) -> tuple[list[int], list[float]]:
    """(ids, log-probs) of row `i` of a `generate` result, without its padding."""
    length = int(out.response_mask[i].sum())
    ids = out.response_ids[i, :length].tolist()
    logp = out.rollout_logp[i, :length].tolist() if out.rollout_logp is not None else [0.0] * length
    return ids, logp


def append_turn(e: Episode, ids: list[int], logp: list[float], eos: set, tok) -> None:
    """The model's turn, exactly as sampled (cut to the episode's room), on the end of `e`:
    trained ids and their log-probs, the text seen, the assistant message (its text without
    EOS), and whether it is an answer (it ended with EOS, uncut)."""
    room = e.limit - len(e.tokens)
    cut = len(ids) > room
    ids, logp = ids[:room], logp[:room]
    e.tokens += ids
    e.trained += [1.0] * len(ids)
    e.logp += logp
    ended = bool(ids) and ids[-1] in eos
    e.last_text = tok.decode([t for t in ids if t not in eos], skip_special_tokens=False)
    e.seen += tok.decode(ids, skip_special_tokens=False)
    e.messages = e.messages + [{"role": "assistant", "content": e.last_text}]
    e.answered = ended and not cut


def restart(e: Episode, render, ro, max_prompt: int) -> None:
    """A prefix break: the episode goes on as a new sample whose prompt is the conversation
    re-rendered (what the template shows the model now). The turns so far become context, not
    trained. The episode keeps its token budget (rollout.max_episode_tokens over all its
    samples) and the row its length bound (data.max_prompt_length + max_episode_tokens)."""
    text = render.text(e.messages)
    ids = render.ids(text)
    e.spent += len(e.tokens)
    e.breaks += 1
    e.untrained += int(sum(e.trained))
    e.prompt_ids, e.seen, e.tokens, e.trained, e.logp = ids, text, [], [], []
    e.limit = min(ro.max_episode_tokens - e.spent, max_prompt + ro.max_episode_tokens - len(ids))
    if e.limit <= 0:                   # no room left for another turn
        e.done = e.truncated = True


def experience(episodes: list[Episode], pad_id: int) -> Experience:
    """The batch: prompts left-padded, every episode's turns right-padded; `loss_mask` marks the
    model's tokens, `response_mask` every real one."""
    B = len(episodes)
    P = max(len(e.prompt_ids) for e in episodes)
    T = max(1, max(len(e.tokens) for e in episodes))
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    response_ids = torch.full((B, T), pad_id, dtype=torch.long)
    response_mask = torch.zeros((B, T))
    loss_mask = torch.zeros((B, T))
    logp = torch.zeros((B, T))
    for b, e in enumerate(episodes):
        p, t = len(e.prompt_ids), len(e.tokens)
        prompt_ids[b, P - p:] = torch.tensor(e.prompt_ids, dtype=torch.long)
        prompt_mask[b, P - p:] = 1
        if t:
            response_ids[b, :t] = torch.tensor(e.tokens, dtype=torch.long)
            response_mask[b, :t] = 1.0
            loss_mask[b, :t] = torch.tensor(e.trained)
            logp[b, :t] = torch.tensor(e.logp)
    return Experience(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                      response_mask=response_mask, loss_mask=loss_mask, rollout_logp=logp,
                      truncated=torch.tensor([e.truncated for e in episodes], dtype=torch.bool))


def episode_metrics(episodes: list[Episode]) -> dict:
    """Sums over this rank's episodes (the step adds the ranks and divides)."""
    s = [e.session for e in episodes]
    return {"episode/count": float(len(episodes)),
            "episode/turns": float(sum(x.turns for x in s)),
            "episode/tool_calls": float(sum(x.tool_calls for x in s)),
            "episode/tool_errors": float(sum(x.tool_errors + x.parse_errors for x in s)),
            "episode/parse_errors": float(sum(x.parse_errors for x in s)),
            "episode/timeouts": float(sum(x.timeouts for x in s)),
            "episode/env_time_s": float(sum(x.env_time_s for x in s)),
            "episode/truncated": float(sum(e.truncated for e in episodes)),
            "episode/prefix_breaks": float(sum(e.breaks for e in episodes)),
            "episode/untrained_tokens": float(sum(e.untrained for e in episodes)),
            "episode/env_crashes": float(sum(getattr(x, "crashed", False) for x in s)),
            "episode/model_tokens": float(sum(sum(e.trained) for e in episodes)),
            "episode/env_tokens": float(sum(len(e.trained) - sum(e.trained) for e in episodes))}


def finish_metrics(sums: dict, global_sum) -> dict:
    """The step's episode metrics over every rank: means per episode, shares, totals."""
    keys = sorted(sums)
    totals = dict(zip(keys, global_sum([sums[k] for k in keys])))
    n = max(totals["episode/count"], 1.0)
    return {"episode/turns_mean": totals["episode/turns"] / n,
            "episode/tool_calls_mean": totals["episode/tool_calls"] / n,
            "episode/tool_errors": totals["episode/tool_errors"],
            # failed calls among the calls made (an unparseable call counts as one made)
            "episode/tool_error_frac": totals["episode/tool_errors"] / max(
                totals["episode/tool_calls"] + totals["episode/parse_errors"], 1.0),
            "episode/timeouts": totals["episode/timeouts"],
            "episode/env_time_s": totals["episode/env_time_s"],
            "episode/truncated": totals["episode/truncated"] / n,
            "episode/prefix_breaks": totals["episode/prefix_breaks"],
            # model tokens that became context at a prefix break (not trained), per episode
            "episode/untrained_tokens": totals["episode/untrained_tokens"] / n,
            "episode/env_crashes": totals["episode/env_crashes"],
            "episode/env_token_frac": totals["episode/env_tokens"] / max(
                totals["episode/env_tokens"] + totals["episode/model_tokens"], 1.0)}


__all__ = ["play", "Played", "finish_metrics", "load_environment"]
