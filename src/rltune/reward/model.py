"""A sequence-classification reward model scoring the conversation (prompt + response).

The reward model reads text the way it was trained to: the conversation (system prompt if
any, the user prompt, the assistant response) rendered with the reward model's OWN chat
template, which may differ from the policy's. A reward model whose tokenizer has no chat
template reads the plain `prompt + completion` text, with its tokenizer's special tokens.
"""

from __future__ import annotations

from . import RewardError


class RewardModelScorer:
    """Scores texts with a frozen reward model (its single logit is the reward)."""

    def __init__(self, spec: str, max_length: int, precision: str = "fp32", device: str = "cpu",
                 batch_size: int = 8):
        from ..models.loading import load_reward_model, load_tokenizer

        self.spec = spec
        self.model = load_reward_model(spec, precision).to(device)
        self.tokenizer = load_tokenizer(spec)
        self.tokenizer.padding_side = "right"
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.max_length, self.device, self.batch_size = max_length, device, batch_size
        self.truncated = 0  # sequences cut at max_length (lint rule reward-length guards this)

    @property
    def uses_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def texts(self, prompts: list[str], completions: list[str],
              conversations: list[list[dict]] | None = None) -> list[str]:
        """The text the reward model reads for each sample.

        `conversations` are the prompt messages per sample ({"role", "content"} dicts, no
        assistant turn); None means one user message holding the prompt text."""
        if not self.uses_chat_template:
            return [p + c for p, c in zip(prompts, completions)]
        if conversations is None:
            conversations = [[{"role": "user", "content": p}] for p in prompts]
        if len(conversations) != len(completions):
            raise ValueError(f"{len(conversations)} conversations for {len(completions)} completions")
        out = []
        for messages, completion in zip(conversations, completions):
            messages = list(messages) + [{"role": "assistant", "content": completion}]
            try:
                out.append(self.tokenizer.apply_chat_template(messages, tokenize=False))
            except Exception as err:  # noqa: BLE001 - a template that rejects the conversation
                raise RewardError(
                    f"the chat template of reward.model {self.spec} cannot render the conversation "
                    f"(roles {[m.get('role') for m in messages]}): {type(err).__name__}: {err}\n"
                    "  fix: use a reward model whose chat template accepts these roles (e.g. unset "
                    "data.system_prompt when it has no system role)") from err
        return out

    def __call__(self, prompts: list[str], completions: list[str],
                 conversations: list[list[dict]] | None = None) -> list[float]:
        import torch

        texts = self.texts(prompts, completions, conversations)
        # a rendered template already holds its special tokens (BOS, turn markers): adding the
        # tokenizer's own would double them (this is what apply_chat_template(tokenize=True) does)
        special = not self.uses_chat_template
        out: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            chunk = texts[i:i + self.batch_size]
            full = self.tokenizer(chunk, padding=False, truncation=False, add_special_tokens=special)
            self.truncated += sum(len(ids) > self.max_length for ids in full["input_ids"])
            enc = self.tokenizer(chunk, padding=True, truncation=True, max_length=self.max_length,
                                 add_special_tokens=special, return_tensors="pt").to(self.device)
            with torch.no_grad():
                logits = self.model(**enc).logits  # (b, 1)
            out.extend(logits[:, 0].float().tolist())
        return out
