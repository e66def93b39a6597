"""Episodes of several rows: the samples of an episode that a prefix break split (docs/agents.md).

An episode is normally one row of the batch. Where the chat template rewrote earlier turns, the
episode went on as a new sample from the re-rendered conversation, and each sample is a row of
its own (R rows for E episodes, R >= E). `episode` (R,) names each row's episode (0..E-1); the
rows of one episode are adjacent and in the order they were sampled, the last one holding the
end of the episode (where its score lands).

The advantages are the episode's, not the row's:
  - outcome advantages (GRPO, RLOO): one number per episode, from its score (and, with the KL in
    the reward, the KL summed over all its rows), spread over every row's model tokens;
  - per-token returns (GAE, REINFORCE++): the episode's model tokens in sampling order, as if
    they were one row: `chain` lays an episode's rows end to end, so a masked scan over it runs
    across the break (what lies between the samples, the re-rendered prompt, is not a step).
"""

from __future__ import annotations

import torch

__all__ = ["chain", "episode_sums", "last_rows", "unchain"]


def last_rows(episode: torch.Tensor) -> torch.Tensor:
    """(R,) bool: the last row of each episode (rows of one episode adjacent). (R,) -> (R,)"""
    following = torch.cat([episode[1:], episode.new_full((1,), -1)])                 # (R,)
    return episode != following


def episode_sums(x: torch.Tensor, episode: torch.Tensor, count: int) -> torch.Tensor:
    """Per-episode sums of the rows' values: (R,) -> (E,) with E = `count`."""
    return x.new_zeros(count).index_add(0, episode, x)


def _slots(episode: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Each row's position within its episode (R,) and the most rows an episode has."""
    R = episode.numel()
    first = torch.ones(R, dtype=torch.bool, device=episode.device)
    first[1:] = episode[1:] != episode[:-1]                                           # (R,) episode starts
    start = torch.cummax(torch.where(first, torch.arange(R, device=episode.device), 0), 0).values
    slot = torch.arange(R, device=episode.device) - start                            # (R,)
    return slot, int(slot.max()) + 1 if R else 1


def chain(x: torch.Tensor, episode: torch.Tensor, count: int) -> torch.Tensor:
    """Each episode's rows end to end: (R, T) -> (E, K*T), K = the most rows of an episode; the
    slots an episode does not fill are 0 (with a 0 mask: masked, skipped by a masked scan)."""
    slot, K = _slots(episode)
    R, T = x.shape
    out = x.new_zeros(count, K, T)                                                    # (E, K, T)
    out[episode, slot] = x
    return out.reshape(count, K * T)


def unchain(y: torch.Tensor, episode: torch.Tensor) -> torch.Tensor:
    """`chain`'s inverse: (E, K*T) -> (R, T)."""
    slot, K = _slots(episode)
    E = y.shape[0]
    return y.reshape(E, K, -1)[episode, slot]
