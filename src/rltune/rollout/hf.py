"""The `hf` rollout engine: batched `generate` with KV cache on a copy of the policy.

The engine owns its own module (never gradient-checkpointed, always eval mode) and
receives the actor's weights through `sync_weights`, exactly like an external engine
(vLLM) would, so both engines share the trainer code path and the sync is timed.

It samples from exactly the recipe's distribution: softmax(logits / temperature), then
top-k and top-p when set, nothing else. `generate` would otherwise fill every field the
call leaves unset from the checkpoint's `generation_config` (repetition_penalty,
suppress_tokens, no_repeat_ngram_size, min_new_tokens, ... — Qwen2.5 ships top_k 20,
top_p 0.8, repetition_penalty 1.05) and from transformers' own defaults (top_k 50), so the
samples would follow another distribution than the one whose log-probs the trainer uses.
The engine therefore replaces its module's generation config with a fresh one and passes
a complete config, built from the recipe, on every call.
"""

from __future__ import annotations

import time

import torch

from .experience import Experience
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
        from transformers import GenerationConfig

        # nothing inherited from the checkpoint: every call passes its full config (see above)
        self.model.generation_config = GenerationConfig(eos_token_id=sorted(self.eos_ids), pad_token_id=self.pad_id)

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
        kw = {"tokenizer": self.tokenizer} if s.stop else {}
        out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=generation_config(
            s, sorted(self.eos_ids), self.pad_id), **kw)
        response = out.sequences[:, P:]                                    # (B*n, T)
        if response.shape[1] == 0:  # nothing generated (max_new_tokens reached at once)
            response = torch.full((response.shape[0], 1), self.pad_id, dtype=torch.long, device=self.device)
        resp_mask = response_mask_from_ids(response, self.eos_ids, self.pad_id)
        # log-probs of the sampled tokens under the engine's weights: the raw logits (before
        # top-k/top-p), at the log-prob temperature -- the trainer's definition of the policy
        logits = torch.stack(out.logits, dim=1)[:, :response.shape[1]].float()  # (B*n, T, V)
        logp = torch.log_softmax(logits / s.logprob_temperature, dim=-1).gather(-1, response.unsqueeze(-1)).squeeze(-1)
        return Experience(
            prompt_ids=ids.cpu(),
            prompt_mask=mask.cpu(),
            response_ids=response.cpu(),
            response_mask=resp_mask.cpu(),
            rollout_logp=(logp * resp_mask).cpu(),
        )

    # -- memory: the module is small beside the trainer's engines; nothing to free --
    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

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


def generation_config(s: Sampling, eos_ids: list[int], pad_id: int):
    """A complete `GenerationConfig` for one call: the recipe's sampling, every other field that
    changes the distribution set to its neutral value (not left for `generate` to inherit)."""
    from transformers import GenerationConfig

    neutral = dict(repetition_penalty=1.0, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0,
                   min_length=0, min_new_tokens=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0,
                   min_p=None, bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None,
                   forced_bos_token_id=None, forced_eos_token_id=None, sequence_bias=None,
                   exponential_decay_length_penalty=None, renormalize_logits=False,
                   remove_invalid_values=False, num_beams=1, num_return_sequences=1,
                   guidance_scale=None, watermarking_config=None, length_penalty=1.0)
    if s.greedy:
        sampling = dict(do_sample=False, temperature=1.0, top_p=1.0, top_k=0)
    else:
        sampling = dict(do_sample=True, temperature=float(s.temperature), top_p=float(s.top_p), top_k=int(s.top_k))
    return GenerationConfig(max_new_tokens=s.max_new_tokens, eos_token_id=eos_ids, pad_token_id=pad_id,
                            return_dict_in_generate=True, output_logits=True, use_cache=True,
                            stop_strings=list(s.stop) or None, **neutral, **sampling)
