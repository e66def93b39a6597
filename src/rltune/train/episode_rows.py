"""An episode as a row of the batch (train/episodes.py drives class environments, agent_episodes.py
agent functions; both build their episodes with these): the dataclasses, the model's turn appended
exactly as sampled, the restart at a prefix break, the batch and the per-rank metric sums."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from ..rollout.experience import Experience


@dataclass
class Episode:
    session: object                      # agents.session.Session
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
    longest_turn: int = 0                # tokens of the model's longest turn as sampled (each turn has its
                                         # own rollout.max_new_tokens: reward.overlong and clip_ratio read it)
    breaks: int = 0                      # prefix breaks: the sample restarted from a re-rendered prompt
    untrained: int = 0                   # model tokens that became context at a break, untrained
                                         # (rollout.prefix_break: context)
    before: list = field(default_factory=list)   # the samples before each break (rollout.prefix_break: rows):
                                                 # (prompt_ids, tokens, trained, logp) each, in sampling order
    draw: int | None = None              # the prompt's draw key (None: not seeded) and which of its group's
    sample: int = 0                      # episodes this is: with `requests` they seed each request on a
    requests: int = 0                    # server engine (rollout.base.turn_seeds)


def seeded(sampling, episodes: list[Episode], seed: int):
    """`sampling` with one seed per episode's next request (each episode's `requests` counted up);
    unchanged where an episode has no draw key (eval, a regenerated group)."""
    from dataclasses import replace

    from ..rollout.base import turn_seeds

    if not episodes or any(e.draw is None for e in episodes):
        return sampling
    draws = [(e.draw, e.sample, e.requests) for e in episodes]
    for e in episodes:
        e.requests += 1
    return replace(sampling, seeds=turn_seeds(seed, draws))


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
    e.longest_turn = max(e.longest_turn, len(ids))
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
    re-rendered (what the template shows the model now). The sample so far is kept as a row of
    its own (`before`; rollout.prefix_break: rows) or becomes context only (context). The episode keeps its token budget (rollout.max_episode_tokens over all its
    samples) and the row its length bound (data.max_prompt_length + max_episode_tokens): a
    conversation the row cannot hold (a flood of an answer) is tokenised only that far, and the
    episode ends truncated as it was, the answer not appended."""
    text = render.text(e.messages)
    ids = render.ids_within(text, max_prompt + ro.max_episode_tokens - 1)   # a bounded head of a flood, at most
    if ids is None:                    # the row could not hold it (limit <= 0): the episode ends as it was
        e.done = e.truncated = True
        return
    e.spent += len(e.tokens)
    e.breaks += 1
    if getattr(ro, "prefix_break", "rows") == "rows" and sum(e.trained) > 0:
        e.before.append((e.prompt_ids, e.tokens, e.trained, e.logp))
    else:
        e.untrained += int(sum(e.trained))
    e.prompt_ids, e.seen, e.tokens, e.trained, e.logp = ids, text, [], [], []
    e.limit = min(ro.max_episode_tokens - e.spent, max_prompt + ro.max_episode_tokens - len(ids))
    if e.limit <= 0:                   # no room left for another turn
        e.done = e.truncated = True


def warn_long_prompts(render, lengths: list[int | None], max_prompt: int) -> None:
    """One warning for the episode prompts (an environment's first messages, an agent's first
    request, rendered with the tools) longer than data.max_prompt_length: they are
    left-truncated, as single-turn prompts are (prompts.truncation_warning), and said once per
    run (`render`, the run's Renderer, remembers it), with the count and the longest (None: one
    too long to count, Renderer.prompt_ids tokenised its end only)."""
    over = [n for n in lengths if n is None or n > max_prompt]
    if not over or getattr(render, "warned_long_prompts", False):
        return
    render.warned_long_prompts = True
    counted = [n for n in over if n is not None]
    if len(counted) < len(over):
        longest, fix = "is too long to count: only its end was tokenised", "data.max_prompt_length"
    else:
        longest, fix = f"has {max(counted)}", f"data.max_prompt_length to {max(counted)}"
    logging.getLogger("rltune").warning(
        "rollout.env: %d of %d episode prompts of this step are longer than data.max_prompt_length (%d tokens; the "
        "longest %s) and are left-truncated: the policy does not see their beginning (the system prompt, the "
        "tools; said once per run)\n  fix: raise %s (rollout.max_model_len and reward.max_length "
        "must then hold it plus rollout.max_episode_tokens and one turn), or shorten the environment's first "
        "messages (an agent's system prompt) or the tools' descriptions", len(over), len(lengths), max_prompt,
        longest, fix)


def experience(episodes: list[Episode], pad_id: int) -> Experience:
    """The batch: one row per episode (its last sample), prompts left-padded, every episode's
    turns right-padded; `loss_mask` marks the model's tokens, `response_mask` every real one. The
    samples before a prefix break are the rows of `earlier`, each with its episode as `owner`."""
    samples = [(e.prompt_ids, e.tokens, e.trained, e.logp) for e in episodes]
    exp = _rows(samples, pad_id)
    exp.truncated = torch.tensor([e.truncated for e in episodes], dtype=torch.bool)
    exp.turn_tokens = torch.tensor([e.longest_turn for e in episodes], dtype=torch.long)
    before = [(b, s) for b, e in enumerate(episodes) for s in e.before]
    if before:
        exp.earlier = _rows([s for _, s in before], pad_id)
        exp.earlier.owner = torch.tensor([b for b, _ in before], dtype=torch.long)
    return exp


def _rows(samples: list[tuple], pad_id: int) -> Experience:
    """Rows of (prompt_ids, tokens, trained, logp) samples, padded."""
    B = len(samples)
    P = max(len(p) for p, *_ in samples)
    T = max(1, max(len(t) for _, t, *_ in samples))
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    response_ids = torch.full((B, T), pad_id, dtype=torch.long)
    response_mask = torch.zeros((B, T))
    loss_mask = torch.zeros((B, T))
    logp = torch.zeros((B, T))
    for b, (prompt, tokens, trained, lp) in enumerate(samples):
        p, t = len(prompt), len(tokens)
        prompt_ids[b, P - p:] = torch.tensor(prompt, dtype=torch.long)
        prompt_mask[b, P - p:] = 1
        if t:
            response_ids[b, :t] = torch.tensor(tokens, dtype=torch.long)
            response_mask[b, :t] = 1.0
            loss_mask[b, :t] = torch.tensor(trained)
            logp[b, :t] = torch.tensor(lp)
    return Experience(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                      response_mask=response_mask, loss_mask=loss_mask, rollout_logp=logp)


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
            "episode/samples": float(sum(1 + len(e.before) for e in episodes)),
            "episode/env_crashes": float(sum(getattr(x, "crashed", False) for x in s)),
            "episode/model_tokens": float(sum(sum(e.trained) + sum(sum(s[2]) for s in e.before) for e in episodes)),
            "episode/env_tokens": float(sum(len(e.trained) - sum(e.trained)
                                            + sum(len(s[2]) - sum(s[2]) for s in e.before) for e in episodes)),
            **_part_sums(s)}


def _part_sums(sessions) -> dict:
    """An agent's per-criterion reward parts (AgentSession.parts) and metrics (.metrics), summed:
    `reward/env/NAME` and `env/metric/NAME` sums (finish_metrics makes them means); an episode
    without one counts 0 for it."""
    out = {}
    for attr, prefix in (("parts", "reward/env/"), ("metrics", "env/metric/")):
        names = sorted({k for x in sessions for k in getattr(x, attr, None) or {}})
        out.update({f"{prefix}{k}": float(sum((getattr(x, attr, None) or {}).get(k, 0.0) for x in sessions))
                    for k in names})
    return out


__all__ = ["Episode", "Played", "append_turn", "episode_metrics", "experience", "restart", "sampled", "seeded",
           "warn_long_prompts"]
