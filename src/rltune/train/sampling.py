"""Steps 1-2 of the loop: generate the step's sequences and score them.

Three recipe options shape what reaches the learner (docs/algorithms.md):
  - `algorithm.filter_groups` (DAPO dynamic sampling, arXiv:2503.14476 sec. 3.2): groups whose
    samples all score alike carry no group-baseline signal; they are dropped and more prompts are
    generated until the step holds its sequences or `max_gen_calls` generation calls were made
    (then the batch is topped up with dropped groups, and a warning says how many);
  - `reward.overlong` (DAPO sec. 3.4): a soft length penalty in the last `buffer` tokens before
    `rollout.max_new_tokens`, added to the training reward (reported as `reward/overlong`). In an
    episode (rollout.env) every assistant turn has that budget, so the penalty is the longest
    turn's: a long episode of short turns is not punished (`Experience.turn_lengths`);
  - `rollout.mask_truncated`: responses cut at `max_new_tokens` get a zero response mask, so no
    loss term sees them (they still count in their group's baseline, which is computed first).

Every rank runs the same number of generation rounds with the same number of calls (decided on
the largest shortfall over ranks), so collective reward normalisation stays in step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import torch

from ..algo import groups_with_signal, overlong_penalty, truncated_rows
from ..rollout.base import Sampling, request_seeds
from ..rollout.experience import Experience
from .collective import global_max, global_sum
from .console import LOG
from .prompts import encode_prompt, prompt_messages, prompt_text, reward_columns


@dataclass
class Scored:
    """Sequences with their scores (B = sequences, in groups of group_size, prompt-major)."""
    exp: Experience                                   # scores filled; CPU tensors
    prompts: list[str]                                # (B,) prompt texts
    completions: list[str]                            # (B,) decoded responses
    rows: list[dict]                                  # (B,) dataset rows (reward columns)
    conversations: list[list[dict]]                   # (B,) chat messages of the prompt
    raw: dict[str, list[float]] = field(default_factory=dict)   # per reward source, (B,) each
    env_scores: list[float] | None = None             # (B,) rollout.env: the environment's reward
    episode: dict = field(default_factory=dict)       # rollout.env: this rank's episode sums

    def select(self, index: list[int]) -> "Scored":
        pick = lambda xs: [xs[i] for i in index]  # noqa: E731
        return Scored(self.exp.select(torch.tensor(index, dtype=torch.long)), pick(self.prompts),
                      pick(self.completions), pick(self.rows), pick(self.conversations),
                      {k: pick(v) for k, v in self.raw.items()},
                      None if self.env_scores is None else pick(self.env_scores), self.episode)

    @staticmethod
    def concat(parts: list["Scored"], pad_id: int) -> "Scored":
        if len(parts) == 1:
            return parts[0]
        exp = Experience.concat([p.exp for p in parts], pad_id)
        exp.scores = torch.cat([p.exp.scores for p in parts])
        env = None if parts[0].env_scores is None else sum((p.env_scores for p in parts), [])
        return Scored(exp, *[sum((getattr(p, k) for p in parts), []) for k in
                             ("prompts", "completions", "rows", "conversations")],
                      {k: sum((p.raw[k] for p in parts), []) for k in parts[0].raw}, env, parts[0].episode)


@dataclass
class StepBatch:
    """What steps 1-2 hand on: the batch to learn from and the metrics of how it was drawn."""
    batch: Scored
    lengths: torch.Tensor                             # (B,) response lengths before any masking
    metrics: dict
    rollout_s: float = 0.0                            # generation (every round)
    reward_s: float = 0.0                             # scoring (every round)


def decode(tokenizer, exp: Experience, rollout) -> list[str]:
    """Response texts as the reward sees them: exactly the trained tokens (the response mask),
    less the EOS that ends a response. Every other token is shown as its text, special ones
    too: a model must not hide text from the reward in tokens that a `skip_special_tokens`
    decode would drop. That includes a pad token the model sampled mid-response (the mask keeps
    it: docs/training.md, "Which tokens count"): it is trained, so the reward sees it as the
    tokenizer writes it (e.g. "<pad>"), never as nothing. A pad that was free to the reward and
    trained anyway was a reward hole (sampled reward 0.99 while the greedy answer became empty).
    Only the trailing padding, which is no token of the response, is outside the mask."""
    drop = set(rollout.eos_ids)
    out = []
    for ids, mask in zip(exp.response_ids, exp.response_mask):
        kept = [i for i in ids[mask.bool()].tolist() if i not in drop]
        out.append(tokenizer.decode(kept, skip_special_tokens=False))
    return out


def rollout_phase(c, calls: int) -> Scored:
    """Step 1 for `calls` generation calls' worth of prompts (rollout.batch_size sequences each,
    this rank's share), sampled in one `generate` call: the weights do not change in between, and
    each engine bounds its own memory (hf: chunks of rollout.batch_size sequences; vLLM: its
    scheduler within the KV cache). Scores are not filled yet."""
    drawn, keys = [], []
    for _ in range(calls):
        drawn += [c.train_set.rows[i] for i in c.sampler.next_batch()]
        keys += getattr(c.sampler, "last_keys", None) or []
    return generate_rows(c, drawn, keys if len(keys) == len(drawn) else None)


def generate_rows(c, drawn: list[dict], keys: list[int] | None = None) -> Scored:
    """Step 1 for the given dataset rows: group_size samples of each, prompt-major. `keys` (the
    rows' draw keys) seed each prompt's request on a server engine (rollout.base.request_seeds)."""
    r, tok = c.recipe, c.tokenizer
    n = r.algorithm.group_size
    if c.env is not None:   # rollout.env: episodes, turn by turn (episodes.py)
        from .episodes import play

        ep = play(c, drawn, c.train_set.prompt_key, n, keys=keys)
        return Scored(ep.exp, ep.prompts, ep.completions, ep.rows, ep.conversations, {}, ep.env_scores, ep.metrics)
    ids, prompts, rows, conversations = [], [], [], []
    for row in drawn:
        ids.append(encode_prompt(row, tok, r.data, c.train_set.prompt_key))
        prompts += [prompt_text(row, c.train_set.prompt_key)] * n
        conversations += [prompt_messages(row, c.train_set.prompt_key, r.data)] * n
        rows += [row] * n
    sampling = Sampling.from_recipe(r.rollout, n)
    if keys is not None:
        sampling = replace(sampling, seeds=request_seeds(c.sampler.seed, keys))
    exp = c.rollout.generate(ids, sampling)
    c.rollout.sleep()  # free rollout memory while training (GPU vLLM; a no-op elsewhere)
    return Scored(exp, prompts, decode(tok, exp, c.rollout), rows, conversations)


def rescore(c, rows: list[dict], update_normaliser: bool = True) -> tuple[Scored, torch.Tensor]:
    """Steps 1-2 for the given prompts (one dataset row per group): scored, truncated responses
    masked as asked; with their (B,) lengths. The async pipeline generates groups again that
    outlived the staleness bound (`update_normaliser`: see RewardComputer)."""
    s = score(c, generate_rows(c, rows), update_normaliser)
    lengths, _ = mask_truncated(c, s.exp)
    return s, lengths


def score(c, s: Scored, update_normaliser: bool = True) -> Scored:
    """Step 2: reward functions / model, plus the overlong penalty; fills s.exp.scores (B,)."""
    r = c.recipe
    extra = {} if s.env_scores is None else {"env_scores": s.env_scores}   # rollout.env's own reward
    if not update_normaliser:
        extra["update_normaliser"] = False
    result = c.rewards(s.prompts, s.completions, reward_columns(s.rows, c.train_set.prompt_key),
                       conversations=s.conversations, **extra)
    scores = torch.tensor(result.scores, dtype=torch.float32)                        # (B,)
    s.raw = dict(result.raw)
    if r.reward.overlong is not None:
        pen = overlong_penalty(s.exp.turn_lengths, r.rollout.max_new_tokens,
                               r.reward.overlong.buffer, r.reward.overlong.penalty)   # (B,)
        scores = scores + pen
        s.raw["overlong"] = pen.tolist()
    if not torch.isfinite(scores).all():
        bad = int((~torch.isfinite(scores)).nonzero()[0])
        from ..reward import RewardError

        parts = ", ".join(f"{k} {v[bad]:g}" for k, v in s.raw.items()) or "no source"
        raise RewardError(f"reward for sample {bad} (prompt {s.prompts[bad][:60]!r}) is {float(scores[bad])} "
                          f"as a float32 ({parts}; reward.normalize {r.reward.normalize}, reward.clip {r.reward.clip})\n"
                          "  fix: keep each reward source's scores within float32's range (|r| < 3.4e38)")
    s.exp.scores = scores
    return s


def filter_metric(c, s: Scored) -> torch.Tensor:
    """(B,) what must vary within a group: the first reward source (acc) or the reward."""
    fg = c.recipe.algorithm.filter_groups
    first = next((k for k in s.raw if k != "overlong"), None)
    if fg is not None and fg.metric == "acc" and first is not None:
        return torch.tensor(s.raw[first], dtype=torch.float64)
    return s.exp.scores.double()


def sample_step(c) -> StepBatch:
    """Steps 1-2: the step's gen_calls_per_step x rollout.batch_size sequences (this rank's share),
    scored; with filter_groups, only groups with signal, generating more as needed."""
    r = c.recipe
    G, fg = r.algorithm.group_size, r.algorithm.filter_groups
    # counted on this rank: the sampler hands each rank its share (prompts_per_call / world size)
    per_call = c.sampler.batch_size                                            # groups per call
    need = r.gen_calls_per_step * per_call                                     # groups on this rank
    rounds: list[tuple[Scored, torch.Tensor]] = []                             # (scored, signal (N,))
    calls, calls_now, with_signal, extra_s = 0, r.gen_calls_per_step, 0, 0.0
    rollout_s = reward_s = 0.0
    while True:
        t0 = time.perf_counter()
        s = rollout_phase(c, calls_now)
        t1 = time.perf_counter()
        s = score(c, s)
        rollout_s, reward_s = rollout_s + t1 - t0, reward_s + time.perf_counter() - t1
        signal = groups_with_signal(filter_metric(c, s), G)                    # (N,) bool
        rounds.append((s, signal))
        calls += calls_now
        with_signal += int(signal.sum())
        if len(rounds) > 1:
            extra_s += time.perf_counter() - t0
        if fg is None:
            break
        short = int(global_max([float(max(0, need - with_signal))])[0])        # groups, worst rank
        if short == 0 or calls >= fg.max_gen_calls:
            break
        calls_now = min(math.ceil(short / per_call), fg.max_gen_calls - calls)

    # the batch: groups with signal in generation order, topped up with others when short
    picked, topped = [], []
    for k, (s, signal) in enumerate(rounds):
        for g, ok in enumerate(signal.tolist()):
            (picked if (ok or fg is None) else topped).append((k, g))
    surplus = max(0, len(picked) - need)
    picked = picked[:need]
    top_up = topped[:need - len(picked)]
    chosen = sorted(picked + top_up)
    parts = []
    for k, (s, _) in enumerate(rounds):
        rows = [g * G + j for (kk, g) in chosen if kk == k for j in range(G)]
        if rows:
            parts.append(s if len(rows) == s.exp.size else s.select(rows))
    batch = Scored.concat(parts, c.rollout.pad_id)

    # rollout/zero_std_frac: generated groups whose samples all scored alike (a health signal)
    generated = sum(int(sig.numel()) for _, sig in rounds)
    no_signal = generated - sum(int(sig.sum()) for _, sig in rounds)
    tot = global_sum([float(generated), float(no_signal), float(len(picked) if fg else 0),
                      float(len(top_up)), float(surplus)])
    m = {"rollout/zero_std_frac": tot[1] / max(tot[0], 1.0)}
    if c.env is not None:   # every generated episode counts, kept or dropped by filter_groups
        from .episodes import finish_metrics

        sums: dict = {}
        for s, _ in rounds:
            for k, v in s.episode.items():
                sums[k] = sums.get(k, 0.0) + v
        m.update(finish_metrics(sums, global_sum))
    if fg is not None:
        m.update({"rollout/gen_calls": float(calls), "rollout/groups_generated": tot[0],
                  "rollout/groups_kept": tot[2], "rollout/groups_dropped": tot[1] - tot[3],
                  "rollout/groups_topped_up": tot[3], "rollout/groups_surplus": tot[4],
                  "timing/extra_gen_s": extra_s})
        if tot[3] > 0 and c.dist.is_main:
            LOG.warning("[Sampling] only %d of %d groups had varying %s after %d generation calls "
                        "(algorithm.filter_groups.max_gen_calls %d); topped up with %d groups that teach "
                        "nothing. Fix: raise max_gen_calls or algorithm.group_size, or make the task easier.",
                        int(tot[2]), int(tot[2] + tot[3]), fg.metric, calls, fg.max_gen_calls, int(tot[3]))

    lengths, trunc_m = mask_truncated(c, batch.exp)
    m.update(trunc_m)
    return StepBatch(batch, lengths, m, rollout_s, reward_s)


def mask_truncated(c, exp: Experience) -> tuple[torch.Tensor, dict]:
    """Responses cut at max_new_tokens: counted, and masked out of the loss when asked (in
    place). Returns ((B,) response lengths before masking, metrics). The lengths that
    rollout.max_new_tokens bounds are kept on `exp.turn_tokens` (set here, before the masking, where
    the rollout did not: response/clip_ratio reads them)."""
    r, m = c.recipe, {}
    lengths = exp.train_mask.sum(-1)                                           # (B,) the model's tokens
    if exp.earlier is not None:   # an episode's samples before a prefix break count too
        lengths = lengths.index_add(0, exp.earlier.owner, exp.earlier.train_mask.sum(-1).to(lengths.dtype))
    if exp.turn_tokens is None:
        exp.turn_tokens = lengths.long()
    trunc = exp.truncated if exp.truncated is not None else truncated_rows(
        exp.response_ids, exp.response_mask, set(c.rollout.eos_ids), r.rollout.max_new_tokens)  # (B,) bool
    if r.rollout.mask_truncated:
        keep = (~trunc).to(exp.response_mask.dtype)[:, None]                   # (B, 1)
        if exp.loss_mask is None:
            exp.response_mask = exp.response_mask * keep
        else:  # an episode's tokens stay attended; none of them is trained
            exp.loss_mask = exp.loss_mask * keep
        if exp.rollout_logp is not None:
            exp.rollout_logp = exp.rollout_logp * exp.train_mask
        if exp.earlier is not None:   # the episode's earlier samples are not trained either
            e = exp.earlier
            e.loss_mask = e.train_mask * keep[e.owner]
            if e.rollout_logp is not None:
                e.rollout_logp = e.rollout_logp * e.loss_mask
        n_trunc, n_all = global_sum([float(trunc.sum()), float(trunc.numel())])
        m["rollout/masked_truncated_frac"] = n_trunc / max(n_all, 1.0)
    return lengths, m
