"""Prompt data: files through HF `datasets` loaders, builtin tasks, and a seeded sampler."""

from .datasets import DataError, PromptSet, load_prompts  # noqa: F401
from .sampler import PromptSampler  # noqa: F401
