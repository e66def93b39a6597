"""A sequence-classification reward model scoring prompt + response."""

from __future__ import annotations


class RewardModelScorer:
    """Scores texts with a frozen reward model (its single logit is the reward)."""

    def __init__(self, spec: str, max_length: int, precision: str = "fp32", device: str = "cpu",
                 batch_size: int = 8):
        from ..models.loading import load_reward_model, load_tokenizer

        self.model = load_reward_model(spec, precision).to(device)
        self.tokenizer = load_tokenizer(spec)
        self.tokenizer.padding_side = "right"
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.max_length, self.device, self.batch_size = max_length, device, batch_size
        self.truncated = 0  # sequences cut at max_length (lint rule reward-length guards this)

    def __call__(self, prompts: list[str], completions: list[str]) -> list[float]:
        import torch

        out: list[float] = []
        texts = [p + c for p, c in zip(prompts, completions)]
        for i in range(0, len(texts), self.batch_size):
            chunk = texts[i:i + self.batch_size]
            full = self.tokenizer(chunk, padding=False, truncation=False)
            self.truncated += sum(len(ids) > self.max_length for ids in full["input_ids"])
            enc = self.tokenizer(chunk, padding=True, truncation=True, max_length=self.max_length,
                                 return_tensors="pt").to(self.device)
            with torch.no_grad():
                logits = self.model(**enc).logits  # (b, 1)
            out.extend(logits[:, 0].float().tolist())
        return out
