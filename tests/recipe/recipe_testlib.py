"""Shared text for the recipe tests (unique module name: tests/ has no packages)."""

MINIMAL = """\
model:
  policy: builtin:tiny-llama
data:
  train: builtin:arithmetic
reward:
  functions: [builtin:exact_answer]
"""

PPO = MINIMAL + """\
algorithm:
  name: ppo
"""
