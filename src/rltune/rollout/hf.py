"""The `hf` rollout engine: batched `generate` with KV cache on a copy of the policy.

The engine owns its own module (never gradient-checkpointed, always eval mode) and
receives the actor's weights through `sync_weights`, exactly like an external engine
(vLLM) would, so both engines share the trainer code path and the sync is timed.
"""

from __future__ import annotations

import time

import torch

from ..train.experience import Experience
from .base import Sampling, response_mask_from_ids


class HFRollout:
    name = "hf"

    def __init__(self, model, tokenizer, device: str = "cpu", chunk_size: int = 64):
        self.model = model.to(device).eval().requires_grad_(False)
        if getattr(self.model.config, "use_cache", None) is False:
            self.model.config.use_cache = True
        self.tokenizer = tokenizer
        self.device = device
        self.chunk_size = chunk_size  # sequences per generate call (bounds memory)
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))

    # -- generation --
    def generate(self, prompt_ids: list[list[int]], sampling: Sampling) -> Experience:
        per_call = max(1, self.chunk_size // sampling.n)
        parts = [self._generate(prompt_ids[i:i + per_call], sampling)
                 for i in range(0, len(prompt_ids), per_call)]
        return parts[0] if len(parts) == 1 else Experience.concat(parts, self.pad_id)

    @torch.no_grad()
    def _generate(self, prompt_ids: list[list[int]], s: Sampling) -> Experience:
        P = max(len(p) for p in prompt_ids)
        ids = torch.full((len(prompt_ids), P), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompt_ids), P), dtype=torch.long)
        for i, p in enumerate(prompt_ids):  # left padding
            ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, P - len(p):] = 1
        # n samples per prompt, prompt-major (greedy generate refuses num_return_sequences > 1)
        ids = ids.repeat_interleave(s.n, dim=0).to(self.device)
        mask = mask.repeat_interleave(s.n, dim=0).to(self.device)
        kw = dict(max_new_tokens=s.max_new_tokens, pad_token_id=self.pad_id,
                  eos_token_id=list(self.eos_ids), return_dict_in_generate=True, output_logits=True,
                  use_cache=True)
        if s.greedy:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kw.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None)
        if s.stop:
            kw.update(stop_strings=list(s.stop), tokenizer=self.tokenizer)
        out = self.model.generate(input_ids=ids, attention_mask=mask, **kw)
        response = out.sequences[:, P:]                                    # (B*n, T)
        if response.shape[1] == 0:  # nothing generated (max_new_tokens reached at once)
            response = torch.full((response.shape[0], 1), self.pad_id, dtype=torch.long, device=self.device)
        resp_mask = response_mask_from_ids(response, self.eos_ids, self.pad_id)
        # log-probs of the sampled tokens under the engine's weights at the sampling temperature
        logits = torch.stack(out.logits, dim=1)[:, :response.shape[1]].float()  # (B*n, T, V)
        temp = 1.0 if s.greedy else s.temperature
        logp = torch.log_softmax(logits / temp, dim=-1).gather(-1, response.unsqueeze(-1)).squeeze(-1)
        return Experience(
            prompt_ids=ids.cpu(),
            prompt_mask=mask.cpu(),
            response_ids=response.cpu(),
            response_mask=resp_mask.cpu(),
            rollout_logp=(logp * resp_mask).cpu(),
        )

    # -- weights --
    def sync_weights(self, actor) -> float:
        """Copy the actor's parameters in place (gathered from ZeRO-3 shards when needed)."""
        from ..engine.weights import iter_full_params

        t0 = time.perf_counter()
        own = dict(self.model.named_parameters())
        for name, tensor in iter_full_params(actor):
            target = own.get(name)
            if target is not None:
                target.data.copy_(tensor.to(target.device, target.dtype))
        return (time.perf_counter() - t0) * 1000.0
