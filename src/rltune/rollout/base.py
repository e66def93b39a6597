"""The rollout interface every generation engine implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Sampling:
    n: int = 1                      # samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                  # 0 = off
    max_new_tokens: int = 64
    stop: tuple[str, ...] = field(default_factory=tuple)
    greedy: bool = False            # eval: argmax decoding
    min_new_tokens: int = 0         # `train --dry-run`: no response ends before this (EOS held back)
    seeds: tuple[int, ...] = ()     # one per prompt: a request's sampling seed (server engines); () = the engine's RNG

    @property
    def logprob_temperature(self) -> float:
        """The temperature of the reported log-probs: the sampling one; 1 for argmax decoding."""
        return 1.0 if self.greedy else self.temperature

    @classmethod
    def from_recipe(cls, rollout_cfg, n: int, greedy: bool = False) -> "Sampling":
        return cls(n=n, temperature=rollout_cfg.temperature, top_p=rollout_cfg.top_p,
                   top_k=rollout_cfg.top_k, max_new_tokens=rollout_cfg.max_new_tokens,
                   stop=tuple(rollout_cfg.stop), greedy=greedy or not rollout_cfg.do_sample)


def _seed_of(*parts: int) -> int:
    """A sampling seed hashed from integers: < 2**56, so a server's per-sample seeds (seed + sample
    index) stay in int64."""
    import hashlib

    text = ":".join(str(int(x)) for x in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "big")


def request_seeds(seed: int, keys: list[int]) -> tuple[int, ...]:
    """Each prompt's sampling seed from the run's seed and its draw key (PromptSampler.draw_key):
    what a request samples then depends on neither the order requests reach a server nor which
    server (or rank) serves them."""
    return tuple(_seed_of(seed, k) for k in keys)


def turn_seeds(seed: int, draws: list[tuple[int, int, int]]) -> tuple[int, ...]:
    """Each episode request's sampling seed from the run's seed and (the prompt's draw key, which
    of its group's episodes, which of the episode's requests): an episode's turns then sample the
    same on any server, rank and arrival order, as request_seeds does for one-turn prompts."""
    return tuple(_seed_of(seed, k, j, t) for k, j, t in draws)


class RolloutEngine(Protocol):
    name: str
    eos_ids: set[int]      # token ids that end a response
    pad_id: int            # id used to pad prompts (left) and responses (right)
    reason: str            # one line: why this engine was picked (set by make_rollout)

    def generate(self, prompt_ids: list[list[int]], sampling: Sampling):
        """Sample `sampling.n` responses per prompt (prompt-major order) -> Experience
        with prompt/response tokens, masks and `rollout_logp` (log-probs of the sampled
        tokens under the engine's weights at `sampling.logprob_temperature`)."""

    def sync_weights(self, actor) -> float:
        """Push the actor's current weights into the engine; returns milliseconds."""

    def sleep(self) -> None:
        """Free the engine's device memory while the trainer runs (a no-op where unsupported)."""

    def wake_up(self) -> None:
        """Undo `sleep` before the next generation or weight sync."""

    def close(self) -> None:
        """Release what the engine holds outside this process (a server process); idempotent."""


def response_mask_from_ids(response_ids, eos_ids: set[int], pad_id: int | None):
    """(B, T) float mask: 1 up to and including the first EOS; 0 after it and on the padding
    that ends a row (a row stopped by a stop string, or shorter than the longest). Padding is
    only ever a suffix: a pad token sampled mid-response is a token the later steps attended to,
    so it stays in (masking it would also shift the positions the trainer's forward numbers
    from the mask). A pad token sampled last cannot be told from padding: it is dropped, which
    changes no other token's log-prob."""
    import torch

    is_eos = torch.zeros_like(response_ids, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= response_ids == e
    # positions strictly after the first EOS
    after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    mask = ~after_eos
    if pad_id is not None and pad_id not in eos_ids:
        # positions with a non-pad token at or after them: all but the trailing run of padding
        mask &= (response_ids != pad_id).long().flip(1).cumsum(dim=1).flip(1) > 0
    return mask.float()
