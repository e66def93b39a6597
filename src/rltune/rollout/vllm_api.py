"""Which of vLLM's server APIs a `vllm-server` engine speaks: vLLM 0.32's or vLLM 0.26's (the
release pinned to the GPU image's torch 2.11). Read in their sources; no vLLM import here.

| | 0.32 (`rl`) | 0.26 (`dev`) |
| --- | --- | --- |
| server module | `vllm.entrypoints.launchers.api_server` | `vllm.entrypoints.openai.api_server` |
| token-in route `/inference/v1/generate` | with `--enable-scale-out` | always (no such flag) |
| `/pause` `/resume` `/start_weight_update` `/update_weights` `/finish_weight_update` | yes | yes (dev mode) |
| `GET /weight_info`, `weight_version` at `/finish_weight_update` | yes | no |
| per-token `weight_versions` in answers | yes | no |

Without per-token versions a synchronous or `partial: false` run is exact as it is (a sync waits for
the requests in flight, so every token of a sample comes from the weights of the sync before it was
sent: the trainer numbers those itself). Partial rollouts need the per-token labels: refused.
"""

from __future__ import annotations

import importlib.util
import os

from .server_checks import parse_version

RL = "rl"     # vLLM 0.32
DEV = "dev"   # vLLM 0.26


def installed_api() -> str | None:
    """The API of the vLLM installed here (from its files, without importing it), or None."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = os.path.join(list(spec.submodule_search_locations)[0], "entrypoints")
    if os.path.isdir(os.path.join(root, "rl")):
        return RL
    if os.path.isdir(os.path.join(root, "serve", "dev", "rlhf")):
        return DEV
    return None


def token_in_args(api: str) -> list[str]:
    """The flag that turns the token-in route on (0.26 registers it without one)."""
    return ["--enable-scale-out"] if api == RL else []


def partial_problem(api: str) -> str | None:
    """Why `rollout.asynchronous.partial` cannot run against this API, or None."""
    if api == RL:
        return None
    return ("rollout.asynchronous.partial needs a server that labels every token with the weight version it was "
            "sampled with (vLLM 0.32's RL API: GET /weight_info, weight_versions in its answers); this one is "
            "vLLM 0.26's dev-mode API, which has none\n  fix: rollout.asynchronous.partial: false (generation ahead "
            "still runs: a sync waits for the requests in flight), or vllm 0.32+")


def server_sleeps(rollout_cfg, device: str) -> bool:
    """Whether the started server sleeps between generations: on CUDA with rollout.sleep_mode, beside
    the trainer (not attached, not on devices of its own) and never under generation ahead (it
    generates while the trainer trains)."""
    srv = rollout_cfg.server
    return (device == "cuda" and bool(rollout_cfg.sleep_mode) and not srv.url and not srv.devices
            and int(rollout_cfg.asynchronous.max_staleness) == 0)


def token_versions(spans, n_tokens: int, default: int) -> list[int]:
    """The weight version of each of a sample's `n_tokens` tokens, from the server's spans
    (`weight_versions`: [{"version": "3", "start": 0, "end": 12}, ...], labels = rltune's sync
    numbers; the weights loaded at start carry none: version 0). No spans: `default` (the
    version when the request was sent; with pause mode "wait" nothing changes during it)."""
    out = [int(default)] * n_tokens
    for span in spans or []:
        v = parse_version(span.get("version"))
        start, end = max(0, int(span.get("start", 0))), min(n_tokens, int(span.get("end", n_tokens)))
        out[start:end] = [v] * max(0, end - start)
    return out


def torch_versions(rows: list[list[int]], width: int):
    """(B, T) long: each row's token versions, -1 past its last token."""
    import torch

    out = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            out[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    return out
