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
template shows it to the model (counted in `episode/prefix_breaks`). The sample before it becomes
a row of its own, trained with the episode's advantage (`Experience.earlier`; rollout.prefix_break:
rows), or context only, not trained (context: `episode/untrained_tokens`).

The result is the same `Scored` a single-turn step gives: the response region holds every turn
after the prompt; the reward functions see the last assistant message as the completion (empty
when that turn was cut off before its EOS: a half-written answer is no answer) and the whole
conversation; an environment that defines `reward` adds its score (source `env`).
"""

from __future__ import annotations

from pathlib import Path

from ..rollout.base import Sampling
from ..rollout.experience import Experience
from .episode_rows import Episode, Played, append_turn, episode_metrics, experience, restart, sampled, seeded, \
    warn_long_prompts
from .prompts import prompt_messages, prompt_text


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
    cls = load_env_class(recipe.rollout.env, Path(recipe_dir), recipe.rollout.env_args)
    return cls, Renderer(tokenizer, tool_schemas(cls) if kind_of(cls) == "tools" else None)


def close_environment(env) -> None:
    """End what the loaded environment started for the run (`load_environment`'s result, or None):
    a library environment's child server (rltune/envs: the class's `rltune_stop`)."""
    stop = getattr(env[0], "rltune_stop", None) if env else None
    if stop is not None:
        stop()


def play(c, rows: list[dict], prompt_key: str, n: int, greedy: bool = False, keys: list[int] | None = None) -> Played:
    """`n` episodes of every row, to their end; see the module docstring for the turns. `keys`:
    the rows' draw keys, which seed every request on a server engine (episode_rows.seeded)."""
    from ..agents.env import gives_reward
    from ..agents.session import Session
    from ..agents.rendering import clean_messages
    from ..agents.isolate import EnvPool

    from ..agents.env import is_agent

    r, tok = c.recipe, c.tokenizer
    ro = r.rollout
    cls, render = c.env
    if is_agent(cls):   # rollout.env names an agent function: its own code drives the episodes
        from .agent_episodes import play_agents

        return play_agents(c, rows, prompt_key, n, greedy, keys)
    eos = set(c.rollout.eos_ids)
    episodes: list[Episode] = []
    lengths: list[int | None] = []       # of the prompts, untruncated (None: too long to count): warn_long_prompts
    for i, row in enumerate(rows):
        for j in range(n):
            session = cls.session() if isinstance(cls, EnvPool) else Session(cls, ro.tool_timeout_s)
            messages = render.start(clean_messages(session.start(row, prompt_messages(row, prompt_key, r.data))))
            text = render.text(messages)
            ids, length = render.prompt_ids(text, r.data.max_prompt_length)   # a flood: only its end is tokenised
            lengths.append(length)
            episodes.append(Episode(session, row, prompt_text(row, prompt_key), messages, ids, text,
                                    limit=ro.max_episode_tokens, draw=None if keys is None else keys[i], sample=j))
    warn_long_prompts(render, lengths, r.data.max_prompt_length)
    sampling = Sampling.from_recipe(ro, 1, greedy=greedy)
    seed = c.sampler.seed if keys is not None else 0      # the run's: with the draw keys, each request's seed
    for _turn in range(ro.max_turns):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        out = c.rollout.generate([e.prompt_ids + e.tokens for e in active], seeded(sampling, active, seed))
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
    from ..agents.rendering import clean_messages

    e.messages = e.messages + clean_messages(list(new))     # lone surrogates as U+FFFD (rendering.clean_text)
    if last_turn:                      # rollout.max_turns: the environment wanted another turn
        e.done = e.truncated = True
        return
    # the answer fits when its ids leave room for a model token; only that much of it is tokenised
    delta = render.env_delta(e.seen, e.messages, room=e.limit - len(e.tokens) - 1)
    if delta is None:                  # the template rewrote earlier turns: no exact splice
        restart(e, render, ro, max_prompt)
        return
    env_ids, env_text = delta
    if env_ids is None or len(e.tokens) + len(env_ids) >= e.limit:   # past rollout.max_episode_tokens
        e.done = e.truncated = True
        return
    e.tokens += env_ids
    e.trained += [0.0] * len(env_ids)
    e.logp += [0.0] * len(env_ids)
    e.seen += env_text


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
            # rows of the batch per episode: 1 + the samples a prefix break ended (rollout.prefix_break: rows)
            "episode/samples_mean": totals.get("episode/samples", n) / n,
            "episode/env_crashes": totals["episode/env_crashes"],
            "episode/env_token_frac": totals["episode/env_tokens"] / max(
                totals["episode/env_tokens"] + totals["episode/model_tokens"], 1.0),
            # an agent's per-criterion reward parts (a verifiers rubric's) and metrics, means per episode
            **{k: v / n for k, v in totals.items() if k.startswith(("reward/env/", "env/metric/"))}}


__all__ = ["play", "Played", "finish_metrics", "load_environment"]
