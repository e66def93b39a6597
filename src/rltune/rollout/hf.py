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

It draws its samples from a random generator of its own (`generator`, on the engine's device,
seeded from (seed, rank) and saved in every checkpoint), never from torch's global one:
`generate`'s own sampling calls `torch.multinomial` on the global RNG, which other code forks,
rewinds and restores (gradient checkpointing and the chunked output layer replay it around
every recompute). With generation ahead the producer thread samples while the trainer thread
recomputes, and a shared RNG handed the producer draws it had already used. So the engine asks
`generate` for argmax decoding and does the sampling itself as the last logits processor
(`OwnRngSampling`: the same warpers, softmax and `torch.multinomial`, with its generator).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from .experience import Experience
from .base import Sampling, response_mask_from_ids
from ..train.shared_prompt import saves_enough, shared_prompt_reason


class HFRollout:
    name = "hf"

    def __init__(self, model, tokenizer, device: str = "cpu", chunk_size: int = 64, share_prompts: bool = True,
                 adaptation=None):
        """`adaptation` (models/adaptation.py): how the actor is trained; with LoRA `model` has the
        actor's adapter layers (`adaptation.wrap(model, "rollout")`). Default: full weights."""
        from ..models.adaptation import FullWeights

        self.adaptation = adaptation or FullWeights()
        self.model = model.to(device).eval().requires_grad_(False)
        if getattr(self.model.config, "use_cache", None) is False:
            self.model.config.use_cache = True
        self.tokenizer = tokenizer
        self.device = device
        self.chunk_size = chunk_size  # sequences per generate call (bounds memory)
        # each prompt prefilled once for its n samples (see `_prompt_cache`) where the model's
        # cache is one we checked (the trainer's shared-prompt passes use the same test)
        self.share_prompts = share_prompts and shared_prompt_reason(self.model) is None
        self.share_weights = True     # see `sync_weights`
        self.version = 0              # weight syncs done
        # the sampling RNG (module docstring): seeded by the trainer (`seed`), in every checkpoint
        self.generator = torch.Generator(device=device).manual_seed(0)
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
        kw = {"tokenizer": self.tokenizer} if s.stop else {}
        if s.n > 1 and P > 1 and self.share_prompts and saves_enough(self.model, (s.n - 1) * float(mask.sum())):
            kw["past_key_values"] = self._prompt_cache(ids.to(self.device), mask.to(self.device), s.n)
        # n samples per prompt, prompt-major (greedy generate refuses num_return_sequences > 1)
        ids = ids.repeat_interleave(s.n, dim=0).to(self.device)
        mask = mask.repeat_interleave(s.n, dim=0).to(self.device)
        # log-probs of the sampled tokens under the engine's weights: the raw logits (before
        # top-k/top-p), at the log-prob temperature -- the trainer's definition of the policy --
        # captured step by step while sampling (one (B,) row kept per step, never (B, T, V))
        capture = SampledLogprobs(s.logprob_temperature, prompt_len=P)
        from transformers import LogitsProcessorList

        # sampling is done by the last processor with the engine's own RNG; `generate` then takes
        # the argmax of what it returns (a single finite score per row: the drawn token)
        processors = [capture] if s.greedy else [capture, OwnRngSampling(s, self.generator)]
        sequences = self.model.generate(
            input_ids=ids, attention_mask=mask,
            generation_config=generation_config(dataclasses.replace(s, greedy=True), sorted(self.eos_ids), self.pad_id),
            logits_processor=LogitsProcessorList(processors), **kw)
        response = sequences[:, P:]                                        # (B*n, T)
        if response.shape[1] == 0:  # nothing generated (max_new_tokens reached at once)
            response = torch.full((response.shape[0], 1), self.pad_id, dtype=torch.long, device=self.device)
            logp = torch.zeros(response.shape, dtype=torch.float32, device=self.device)
        else:
            logp = capture.finish(response)
        resp_mask = response_mask_from_ids(response, self.eos_ids, self.pad_id)
        # padding after EOS may carry any value: masked to exactly 0 (never 0 * -inf = nan)
        logp = torch.where(resp_mask.bool(), logp, torch.zeros_like(logp))
        return Experience(
            prompt_ids=ids.cpu(),
            prompt_mask=mask.cpu(),
            response_ids=response.cpu(),
            response_mask=resp_mask.cpu(),
            rollout_logp=logp.cpu(),
        )

    def _prompt_cache(self, ids: torch.Tensor, mask: torch.Tensor, n: int):
        """Keys/values of each prompt but its last token, computed once and repeated for the
        prompt's n samples: `generate` then prefills only the last prompt token of each row on
        top of it (the cached positions are skipped), instead of every prompt n times. Exact:
        a prompt token attends only to earlier prompt tokens, numbered from the mask as
        `generate` numbers them."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        position = (mask.cumsum(dim=1) - 1).masked_fill(mask == 0, 1)                   # (u, P)
        self.model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=position[:, :-1],
                   past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(n)                                                 # (u*n, ..., P-1, ...)
        return cache

    # -- the sampling RNG --
    def seed(self, seed: int) -> None:
        """Seed the sampling RNG (the trainer: from the run's seed and the rank)."""
        self.generator.manual_seed(int(seed))

    # -- memory: the module is small beside the trainer's engines; nothing to free --
    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def close(self) -> None:
        pass

    # -- weights --
    def sync_weights(self, actor) -> float:
        """Give the engine the actor's current weights. Where the actor holds them whole, on the
        engine's device and in its dtype (ZeRO 0-2), the engine's parameters are pointed at the
        actor's own tensors: no copy, no second set of weights in memory, and the optimizer's
        in-place updates are what the engine samples with (with LoRA: the frozen base weights and the
        adapter, which this engine's model runs unmerged, like the actor). Otherwise (ZeRO-3 shards, another
        device or dtype, or `own_copy()`) they are copied in place."""
        from ..engine.weights import iter_full_params, is_zero3

        t0 = time.perf_counter()
        own = dict(self.model.named_parameters())
        share = self.share_weights and not is_zero3(actor)
        for name, tensor in iter_full_params(actor):
            # a LoRA actor (a PEFT model) names its parameters with PEFT's prefix; this engine's model
            # has the same adapter layers without the wrapper (the adaptation maps the names)
            target = own.get(self.adaptation.rollout_name(name))
            if target is None:
                continue
            if share and tensor.device == target.device and tensor.dtype == target.dtype \
                    and tensor.shape == target.shape:
                target.data = tensor             # the actor's storage (a detached view)
            else:
                if target.data_ptr() == tensor.data_ptr():
                    target.data = target.data.clone()
                target.data.copy_(tensor.to(target.device, target.dtype))
        self.version += 1
        return (time.perf_counter() - t0) * 1000.0

    def own_copy(self) -> None:
        """Stop sharing the actor's tensors: the engine keeps a copy of the weights it has now and
        sees new ones only through `sync_weights` (a test of the stale-weight guard needs that)."""
        self.share_weights = False
        for p in self.model.parameters():
            p.data = p.data.clone()


class OwnRngSampling:
    """The last logits processor of a sampling call: the recipe's warpers (temperature, then top-k,
    then top-p: `generate`'s own order and classes), softmax, one `torch.multinomial` draw per row
    from the engine's generator. Returns scores that are -inf but at the drawn token (0), so the
    argmax decoding `generate` runs takes exactly that token. The same distribution and the same
    draw as `generate`'s sampling with the global RNG in the generator's state."""

    def __init__(self, s: Sampling, generator: torch.Generator):
        from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.warpers = []
        if s.temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(float(s.temperature)))
        if s.top_k:
            self.warpers.append(TopKLogitsWarper(top_k=int(s.top_k), min_tokens_to_keep=1))
        if s.top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p=float(s.top_p), min_tokens_to_keep=1))
        self.generator = generator

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        for warp in self.warpers:
            scores = warp(input_ids, scores)                                         # (B, V)
        probs = torch.softmax(scores.float(), dim=-1)                               # (B, V)
        token = torch.multinomial(probs, num_samples=1, generator=self.generator)   # (B, 1)
        return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)       # (B, V)


class SampledLogprobs:
    """A pass-through logits processor recording log_softmax(raw logits / temperature) of the
    sampled token at every step, keeping one (B,) float row per step.

    `generate` runs the processors it is given right after its own (none with the neutral config
    of `generation_config`: no penalties, no suppression) and BEFORE the sampling warpers
    (temperature, top-k, top-p), which it appends after the user's list (transformers 5.x,
    `GenerationMixin._get_logits_processor`): the scores seen here are the step's raw fp32 logits.
    The token sampled from step t's row is read from `input_ids` at step t + 1; the last step's
    token from the returned sequences (`finish`). Scores pass through unchanged.
    """

    def __init__(self, temperature: float, prompt_len: int):
        self.temperature = float(temperature)
        self.prompt_len = int(prompt_len)
        self.steps: list[torch.Tensor] = []     # (B,) log-prob of the token sampled at step t
        self._row: torch.Tensor | None = None   # (B, V) log-probs of the step awaiting its token

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._row is not None:
            # input_ids[:, P + t] is the token sampled from step t's row (pad on finished rows)
            tok = input_ids[:, self.prompt_len + len(self.steps)]
            self.steps.append(self._row.gather(-1, tok.unsqueeze(-1)).squeeze(-1))
        self._row = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, response: torch.LongTensor) -> torch.Tensor:
        """(B, T) log-probs of `response` (the generated tokens) -- T steps recorded."""
        T = response.shape[1]
        steps = self.steps[:T]   # `generate` may run (and then undo) one step past the end
        if len(steps) < T:
            assert self._row is not None and len(steps) == T - 1, (len(steps), T)
            steps.append(self._row.gather(-1, response[:, T - 1:T]).squeeze(-1))
        self._row = None
        self.steps = []
        return torch.stack(steps, dim=1)


def generation_config(s: Sampling, eos_ids: list[int], pad_id: int):
    """A complete `GenerationConfig` for one call: the recipe's sampling, every other field that
    changes the distribution set to its neutral value (not left for `generate` to inherit)."""
    from transformers import GenerationConfig

    neutral = dict(repetition_penalty=1.0, no_repeat_ngram_size=0, encoder_no_repeat_ngram_size=0,
                   min_length=0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0,
                   min_p=None, bad_words_ids=None, suppress_tokens=None, begin_suppress_tokens=None,
                   forced_bos_token_id=None, forced_eos_token_id=None, sequence_bias=None,
                   exponential_decay_length_penalty=None, renormalize_logits=False,
                   remove_invalid_values=False, num_beams=1, num_return_sequences=1,
                   guidance_scale=None, watermarking_config=None, length_penalty=1.0)
    if s.greedy:
        sampling = dict(do_sample=False, temperature=1.0, top_p=1.0, top_k=0)
    else:
        sampling = dict(do_sample=True, temperature=float(s.temperature), top_p=float(s.top_p), top_k=int(s.top_k))
    return GenerationConfig(max_new_tokens=s.max_new_tokens, min_new_tokens=s.min_new_tokens or None, eos_token_id=eos_ids, pad_token_id=pad_id,
                            return_dict_in_generate=False, output_logits=False, output_scores=False, use_cache=True,
                            stop_strings=list(s.stop) or None, **neutral, **sampling)
