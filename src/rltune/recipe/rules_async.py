"""Lint rules for generation one step ahead (`rollout.asynchronous`, docs/async.md): what the
pipeline cannot do yet, and settings that do not make sense with samples from older weights.
Registered in RULES by rules.py, like rules_algo."""

from __future__ import annotations

import math
from typing import Iterator

from rltune.recipe.rules_base import RULES, Ctx, Hit, num, rule
from rltune.recipe.schema import AsyncCfg, Recipe

STALENESS_WARN = 4   # above this many versions: beyond what decoupled-PPO results cover


@rule("async-unsupported", "error",
      "rollout.asynchronous.max_staleness >= 1 with rollout.engine vllm (in-process); rollout.asynchronous.partial "
      "with an engine other than vllm-server or with rollout.env; on_stale drop with several ranks",
      "the in-process vLLM engine cannot generate while the trainer trains; only the server can pause a request "
      "and resume it with new weights, and an episode's tokens come from many requests whose versions are not "
      "tracked yet; every rank trains an equal share, which a rank dropping its stale groups would break")
def async_unsupported(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    a, ro, t = r.rollout.asynchronous, r.rollout, r.trainer
    if a.max_staleness == 0:
        return
    if ro.engine == "vllm":
        yield Hit("rollout.engine", "rollout.engine vllm with rollout.asynchronous.max_staleness "
                  f"{a.max_staleness}: the in-process engine cannot generate while the trainer trains",
                  "set rollout.engine: vllm-server (or hf)")
    if a.on_stale == "drop" and t.nproc * t.nnodes > 1:
        yield Hit("rollout.asynchronous.on_stale", f"rollout.asynchronous.on_stale drop with "
                  f"{t.nproc * t.nnodes} processes: a rank that drops its stale groups would train fewer rows "
                  "than the others", "set rollout.asynchronous.on_stale: regenerate")
    if a.partial and ro.engine != "vllm-server":
        yield Hit("rollout.asynchronous.partial", f"rollout.asynchronous.partial with rollout.engine {ro.engine}: "
                  "only the vllm-server engine pauses a request and resumes it with new weights",
                  "set rollout.engine: vllm-server, or rollout.asynchronous.partial: false")
    if a.partial and ro.env:
        yield Hit("rollout.asynchronous.partial", f"rollout.asynchronous.partial with rollout.env {ro.env}: an "
                  "episode's turns are separate requests whose versions are not tracked yet",
                  "set rollout.asynchronous.partial: false (each batch is then sampled with one version)")


@rule("async-without-correction", "warning",
      "rollout.asynchronous.max_staleness >= 1 with algorithm.rollout_correction.mode none",
      "the samples come from weights up to max_staleness versions old: without the importance weight "
      "pi_prox / pi_sample per token the gradient is that of another policy (decoupled PPO needs it)")
def async_without_correction(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    K = r.rollout.asynchronous.max_staleness
    if K >= 1 and r.algorithm.rollout_correction.mode == "none":
        yield Hit("algorithm.rollout_correction.mode", f"algorithm.rollout_correction.mode none with "
                  f"rollout.asynchronous.max_staleness {K}: {RULES['async-without-correction'].why}",
                  "set algorithm.rollout_correction.mode: tis (auto picks it)")


@rule("staleness-vs-cap", "warning",
      "(1 + clip) ^ (max_staleness x optimizer updates per step) above algorithm.rollout_correction.cap, "
      f"or max_staleness above {STALENESS_WARN}",
      "each update may move a token's probability by a factor up to 1 + clip (the trust region), so a token "
      "sampled K steps ago can have an importance weight up to (1 + clip)^(K x updates): above the cap it is "
      "truncated (tis) or dropped (mis), and the correction stops correcting; decoupled-PPO results (AReaL, "
      "arXiv:2505.24298) are for a staleness of a few versions")
def staleness_vs_cap(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    K, algo = r.rollout.asynchronous.max_staleness, r.algorithm
    if K == 0 or algo.rollout_correction.mode == "none" or algo.ratio_level != "token":
        return
    eps = algo.clip_range_high if algo.clip_range_high is not None else algo.clip_range
    u = r.optimizer_updates_per_step
    reach = (1.0 + eps) ** (K * u)
    cap = algo.rollout_correction.cap
    if reach > cap:
        k_ok = max(1, int(math.log(cap) / (u * math.log1p(eps))))
        yield Hit("rollout.asynchronous.max_staleness",
                  f"max_staleness {K} x {u} update(s) per step with clip {num(eps)}: a stale token's weight can "
                  f"reach {reach:.2f}, above algorithm.rollout_correction.cap {num(cap)}: "
                  f"{RULES['staleness-vs-cap'].why}",
                  f"set rollout.asynchronous.max_staleness: {k_ok}, or algorithm.rollout_correction.cap: "
                  f"{math.ceil(reach * 10) / 10}")
    elif K > STALENESS_WARN:
        yield Hit("rollout.asynchronous.max_staleness", f"max_staleness {K}: {RULES['staleness-vs-cap'].why}",
                  f"set rollout.asynchronous.max_staleness: {STALENESS_WARN} or lower")


@rule("staleness-gspo", "warning",
      "rollout.asynchronous.max_staleness >= 2 with algorithm.ratio_level sequence or sequence-token (GSPO)",
      "GSPO's premise is one importance weight per sequence, clipped in a range of about 3e-4 "
      "(arXiv:2507.18071); with stale samples rltune's off-policy correction is per token (pi_prox / pi_sample), "
      "and those weights spread along a sequence as the lag grows, which the sequence-level ratio does not see")
def staleness_gspo(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    K, algo = r.rollout.asynchronous.max_staleness, r.algorithm
    if K >= 2 and algo.ratio_level != "token":
        yield Hit("rollout.asynchronous.max_staleness", f"max_staleness {K} with algorithm.ratio_level "
                  f"{algo.ratio_level} (clip {num(algo.clip_range)}): {RULES['staleness-gspo'].why}",
                  "set rollout.asynchronous.max_staleness: 1, or algorithm.ratio_level: token")


def async_settings_without_effect(r: Recipe, why: str) -> Iterator[Hit]:
    """For setting-without-effect (rules_settings.py): async settings with max_staleness 0."""
    a, default = r.rollout.asynchronous, AsyncCfg()
    if a.max_staleness == 0:
        for key in ("partial", "on_stale"):
            if getattr(a, key) != getattr(default, key):
                yield Hit(f"rollout.asynchronous.{key}", f"rollout.asynchronous.{key} {getattr(a, key)} with "
                          f"max_staleness 0: {why}", "set rollout.asynchronous.max_staleness: 1, or remove "
                          f"rollout.asynchronous.{key}")
