"""The step's batch: one typed container, fields grouped by meaning, shapes commented.

B = sequences in the step, P = prompt width (left-padded), T = response width (right-padded).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Optional

import torch


@dataclass
class Experience:
    # -- tokens (from the rollout engine) --
    prompt_ids: torch.Tensor          # (B, P) long, left-padded
    prompt_mask: torch.Tensor         # (B, P) long, 1 = real token
    response_ids: torch.Tensor        # (B, T) long, right-padded
    response_mask: torch.Tensor       # (B, T) float, 1 = a real response token (attended): generated
                                      # up to and including EOS, and in an episode the environment's too
    loss_mask: Optional[torch.Tensor] = None     # (B, T) float, 1 = a token the model generated (trained);
                                                 # None = response_mask (single-turn: every real token is the model's)
    rollout_logp: Optional[torch.Tensor] = None  # (B, T) log-probs the rollout engine reports (pi_rollout)
    versions: Optional[torch.Tensor] = None      # (B, T) long: the weight version that sampled each token
                                                 # (rollout.asynchronous; None when synchronous)
    index: Optional[torch.Tensor] = None         # (B,) long: row number in the step (kept by `select`)
    filler: bool = False                         # a micro-batch that only keeps the ranks in step: trains
                                                 # nothing, and its outputs go nowhere (batching.filler)

    # -- episodes whose samples a prefix break split (docs/agents.md, "Tokens") --
    earlier: Optional["Experience"] = None       # (k rows) the samples before each row's last prefix break,
                                                 # in the order they were sampled; trained like any row
    owner: Optional[torch.Tensor] = None         # (k,) long, on `earlier`: the row (episode) each belongs to
    episode: Optional[torch.Tensor] = None       # (R,) long, on `rows()`'s result: each row's episode, rows of
                                                 # one episode adjacent and in the order they were sampled

    # -- outcome (from the reward functions / model) --
    scores: Optional[torch.Tensor] = None        # (B,) reward per sequence
    truncated: Optional[torch.Tensor] = None     # (B,) bool, episodes: cut at rollout.max_turns or
                                                 # max_episode_tokens (None: from the EOS, truncated_rows)
    turn_tokens: Optional[torch.Tensor] = None   # (B,) long, episodes: the model's longest turn, the length
                                                 # each turn's rollout.max_new_tokens bounds (None: single-turn,
                                                 # the row's trained tokens; see `turn_lengths`)

    # -- model outputs without autograd --
    ref_logp: Optional[torch.Tensor] = None      # (B, T) reference model log-probs
    behavior_logp: Optional[torch.Tensor] = None  # (B, T) actor log-probs under the weights that sampled
                                                  # (pi_behaviour: the ratio's denominator, the KL's policy)
    old_values: Optional[torch.Tensor] = None    # (B, T) critic values before the updates (PPO)

    # -- learning targets --
    token_rewards: Optional[torch.Tensor] = None  # (B, T) score at the last token, minus KL if in reward
    advantages: Optional[torch.Tensor] = None     # (B, T)
    returns: Optional[torch.Tensor] = None        # (B, T) value targets (PPO)

    @property
    def size(self) -> int:
        return self.response_ids.shape[0]

    @property
    def train_mask(self) -> torch.Tensor:
        """(B, T) the tokens in the loss, the KL, the entropy, the advantages and the token counts:
        the model's own. Environment and tool tokens of an episode are attended, never trained."""
        return self.response_mask if self.loss_mask is None else self.loss_mask

    @property
    def turn_lengths(self) -> torch.Tensor:
        """(B,) the length that rollout.max_new_tokens bounds: a single-turn row's model tokens, an
        episode's longest model turn (every turn has that budget; the episode as a whole has
        rollout.max_episode_tokens). reward.overlong and response/clip_ratio measure this."""
        return self.turn_tokens if self.turn_tokens is not None else self.train_mask.sum(-1)

    @property
    def prompt_width(self) -> int:
        return self.prompt_ids.shape[1]

    def model_inputs(self) -> dict[str, torch.Tensor]:
        """input_ids, attention_mask and position_ids for a forward over prompt + response."""
        input_ids = torch.cat([self.prompt_ids, self.response_ids], dim=1)            # (B, P+T)
        attention = torch.cat([self.prompt_mask, self.response_mask.long()], dim=1)   # (B, P+T)
        position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)                      # (B, P+T)
        return {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids}

    @property
    def response_width(self) -> int:
        return self.response_ids.shape[1]

    def trimmed(self) -> "Experience":
        """The same rows without the prompt columns that are padding in every row (left) and
        the response columns past every row's last token (right). Exact: those columns are
        masked everywhere, and positions are numbered from the masks. A (b, T) field keeps its
        first T' columns; `index` says where the rows go back."""
        real_p = self.prompt_mask.bool().any(dim=0)                                    # (P,)
        real_t = self.response_mask.bool().any(dim=0)                                  # (T,)
        p0 = int(real_p.float().argmax()) if bool(real_p.any()) else self.prompt_width - 1
        t1 = int(real_t.nonzero().max()) + 1 if bool(real_t.any()) else 1
        if p0 == 0 and t1 == self.response_width:
            return self
        T = self.response_width
        kw = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("prompt_ids", "prompt_mask"):
                value = value[:, p0:]
            elif isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[1] == T:
                value = value[:, :t1]
            kw[f.name] = value
        return Experience(**kw)

    def select(self, index: torch.Tensor) -> "Experience":
        """A sub-batch (rows `index`) sharing no storage requirements with the parent; the earlier
        samples of the rows kept go with them."""
        kw = {}
        for f in fields(self):
            value = getattr(self, f.name)
            kw[f.name] = value[index] if isinstance(value, torch.Tensor) else value
        if self.earlier is not None:
            index = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu()
            new = torch.full((self.size,), -1, dtype=torch.long)
            new[index] = torch.arange(index.numel())                                   # old row -> new row
            owner = new[self.earlier.owner.cpu()]                                       # (k,)
            keep = (owner >= 0).nonzero().reshape(-1)
            kw["earlier"] = None
            if keep.numel():
                e = self.earlier.select(keep.to(self.earlier.response_ids.device))
                e.owner = owner[keep].to(e.response_ids.device)
                kw["earlier"] = e
        return Experience(**kw)

    def to(self, device) -> "Experience":
        moved = replace(self, **{f.name: getattr(self, f.name).to(device) for f in fields(self)
                                 if isinstance(getattr(self, f.name), torch.Tensor)})
        if self.earlier is not None:
            moved.earlier = self.earlier.to(device)
        return moved

    def rows(self, pad_id: int = 0) -> "Experience":
        """The batch the learner trains on: one row per sample. Each episode's earlier samples (a
        prefix break's) come before its last one, and `episode` (R,) says whose each row is (row b's
        episode is b when nothing broke). The episode-level fields (`scores`, `truncated`,
        `turn_tokens`) are copied to every row of the episode."""
        B, device = self.size, self.response_ids.device
        if self.earlier is None:
            out = replace(self, earlier=None, owner=None)
            out.episode = torch.arange(B, device=device)
            return out
        e = self.earlier
        owner = e.owner.to(device)
        for name in ("scores", "truncated", "turn_tokens"):
            value = getattr(self, name)
            if value is not None and getattr(e, name) is None:
                setattr(e, name, value[owner])
        both = Experience.concat([self, e], pad_id)                # (B + k) rows
        # each episode's rows together, earlier samples first (in sampling order: stable sort)
        key = torch.cat([torch.arange(B, device=device) * 2 + 1, owner * 2])           # (B + k,)
        order = torch.sort(key.cpu(), stable=True).indices.to(device)
        out = both.select(order)
        out.episode = torch.cat([torch.arange(B, device=device), owner])[order]
        out.earlier = out.owner = out.index = None
        return out

    @staticmethod
    def concat(parts: list["Experience"], pad_id: int) -> "Experience":
        """Join generation calls: re-pad prompts on the left and responses on the right; the
        rows' earlier samples (`earlier`) go with them."""
        P = max(p.prompt_ids.shape[1] for p in parts)
        T = max(p.response_ids.shape[1] for p in parts)

        def left(x, width, value):
            return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

        def right(x, width, value):
            return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

        out = Experience(
            prompt_ids=torch.cat([left(p.prompt_ids, P, pad_id) for p in parts]),
            prompt_mask=torch.cat([left(p.prompt_mask, P, 0) for p in parts]),
            response_ids=torch.cat([right(p.response_ids, T, pad_id) for p in parts]),
            response_mask=torch.cat([right(p.response_mask, T, 0) for p in parts]),
        )
        if all(p.rollout_logp is not None for p in parts):
            out.rollout_logp = torch.cat([right(p.rollout_logp, T, 0.0) for p in parts])
        if all(p.versions is not None for p in parts):
            out.versions = torch.cat([right(p.versions, T, -1) for p in parts])
        if all(p.truncated is not None for p in parts):
            out.truncated = torch.cat([p.truncated for p in parts])
        if all(p.turn_tokens is not None for p in parts):
            out.turn_tokens = torch.cat([p.turn_tokens for p in parts])
        if any(p.loss_mask is not None for p in parts):
            out.loss_mask = torch.cat([right(p.train_mask, T, 0) for p in parts])
        if all(p.scores is not None for p in parts):
            out.scores = torch.cat([p.scores for p in parts])
        for name in ("ref_logp", "behavior_logp", "old_values"):      # the passes' outputs (rows())
            if all(getattr(p, name) is not None for p in parts):
                setattr(out, name, torch.cat([right(getattr(p, name), T, 0.0) for p in parts]))
        earlier, start = [], 0
        for p in parts:
            if p.earlier is not None:
                e = replace(p.earlier)
                e.owner = p.earlier.owner + start
                earlier.append(e)
            start += p.size
        if earlier:
            out.earlier = Experience.concat(earlier, pad_id)
            out.earlier.owner = torch.cat([e.owner for e in earlier])
        return out
