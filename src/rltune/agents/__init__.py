"""Environments for multi-turn and tool-calling episodes (`rollout.env`, docs/agents.md).

A user's class is either a tools environment (reset + documented, type-hinted public methods
the model calls as tools) or a turns environment (reset + step); `load_env_class` loads one
from a spec, `Session` drives one episode of either, `check_env_file` lets `validate` check an
environment file without running it. Standard library only: no torch, no transformers.
"""

from __future__ import annotations

from .builtin import BUILTIN_ENVS, Calculator, Guess, calculator_rows, guess_rows
from .env import EnvError, check_env_file, env_defines_reward, gives_reward, kind_of, load_env_class
from .session import Session
from .tools import ToolCall, call_tool, parse_tool_calls, tool_methods, tool_schema, tool_schemas

__all__ = ["BUILTIN_ENVS", "Calculator", "Guess", "calculator_rows", "guess_rows",
           "EnvError", "Session", "check_env_file", "env_defines_reward", "gives_reward", "kind_of", "load_env_class",
           "ToolCall", "call_tool", "parse_tool_calls", "tool_methods", "tool_schema", "tool_schemas"]
