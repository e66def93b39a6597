"""Prompt data: .jsonl, .json, .csv and .parquet files (checked row by row), builtin tasks, and a seeded sampler."""

from .datasets import DataError, PromptSet, load_prompts  # noqa: F401
from .sampler import PromptSampler  # noqa: F401
