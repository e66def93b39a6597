"""Synthetic metrics traces: healthy runs and runs that show one fault each."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path


def _trend(t: int, n: int, r0: float = 0.5, r1: float = 1.5) -> float:
    frac = t / n
    return r0 + (r1 - r0) * (1 - math.exp(-3 * frac)) / (1 - math.exp(-3))


def healthy_binary(n: int = 80, seed: int = 0, batch: int = 32) -> list[dict]:
    """GRPO on a 0/1 reward: success rate 0.05 -> 0.6, batch-mean sampling noise, no critic."""
    rng = random.Random(seed)
    out = healthy(n, seed=seed, ppo=False)
    for m in out:
        t = m["step"]
        p = 0.05 + 0.55 * (1 - math.exp(-4 * t / n))
        hits = sum(rng.random() < p for _ in range(batch))
        m["reward/mean"] = hits / batch
        m["reward/std"] = math.sqrt(max(p * (1 - p), 1e-6))
        if "eval/reward" in m:
            m["eval/reward"] = sum(rng.random() < p for _ in range(64)) / 64
    return out


def healthy(n: int = 60, seed: int = 0, noise: float = 0.03, ppo: bool = True,
            r0: float = 0.5, r1: float = 1.5, clipped: bool = False, kl_end: float = 0.09) -> list[dict]:
    """A run that learns: reward rising with noise, small slowly rising KL, stable grad norms.

    clipped=True: realistic pre-clip grad norms (grad_clip 1.0): the actor's around the clip (about
    half the steps clipped), the critic's above it on every step; plus the 2026 signals
    (importance weights of a bf16 rollout engine, zero-advantage groups, clip fraction)."""
    rng = random.Random(seed)
    out = []
    for t in range(1, n + 1):
        frac = t / n
        reward = _trend(t, n, r0, r1) * (1 + rng.gauss(0, noise))
        m = {
            "step": t,
            "reward/mean": reward,
            "reward/std": 0.4 + rng.gauss(0, 0.02),
            "kl": max(0.0, 0.01 + (kl_end - 0.01) * frac + rng.gauss(0, 0.005 + 0.05 * kl_end * frac)),
            "kl_coef": 0.05,
            "actor/loss": rng.gauss(0, 0.05),
            "actor/grad_norm": 0.3 * (1 + rng.gauss(0, 0.15)),
            "actor/clipfrac": 0.05 + rng.gauss(0, 0.01),
            "actor/entropy": 1.5 - 0.4 * frac + rng.gauss(0, 0.03),
            "actor/lr": 1e-6 * min(1.0, t / 10),
            "response/length_mean": 40 + rng.gauss(0, 3),
            "timing/rollout_s": 2.0 + rng.gauss(0, 0.1),
            "timing/train_s": 1.0 + rng.gauss(0, 0.05),
            "timing/sync_ms": 50 + rng.gauss(0, 8),
            "throughput/tokens_per_s": 900 + rng.gauss(0, 30),
            "health/skipped_steps": 0,
            "rollout/logprob_diff_mean": abs(rng.gauss(0.01, 0.003)),
            "rollout/logprob_diff_max": abs(rng.gauss(0.1, 0.02)),
        }
        if ppo:
            m.update({
                "critic/loss": 0.5 * math.exp(-2 * frac) + abs(rng.gauss(0, 0.02)),
                "critic/grad_norm": 0.5 * (1 + rng.gauss(0, 0.15)),
                "critic/explained_var": 0.2 + 0.6 * frac + rng.gauss(0, 0.03),
                "critic/lr": 3e-6 * min(1.0, t / 10),
            })
        if clipped:
            m["actor/grad_norm"] = max(0.05, rng.lognormvariate(0, 0.35))
            m.update({"rollout/is_weight_mean": 1.0 + rng.gauss(0, 0.002),
                      "rollout/is_weight_max": 1.0 + abs(rng.gauss(0, 0.8)),
                      "rollout/is_capped_frac": abs(rng.gauss(0, 0.002)),
                      "actor/approx_kl": abs(rng.gauss(0.002, 0.001)),
                      "actor/clipfrac": min(0.25, max(0.0, 0.05 + 0.05 * frac + rng.gauss(0, 0.02))),
                      "batch/zero_adv_frac": min(0.9, max(0.0, 0.5 - 0.2 * frac + rng.gauss(0, 0.08)))})
            if ppo:
                m["critic/grad_norm"] = 2.0 * math.exp(-frac) * max(0.3, 1 + rng.gauss(0, 0.25)) + 1.0
        if t % 10 == 0:
            m["eval/reward"] = reward * (1 + rng.gauss(0, 0.01))
        out.append(m)
    return out


def fault(kind: str, n: int = 60, seed: int = 1) -> tuple[list[dict], int]:
    """A healthy trace with one fault injected; returns (trace, step the detector must fire at)."""
    tr = healthy(n, seed=seed)
    rng = random.Random(seed + 100)
    if kind == "reward_swing":
        # lr too high: reward swings ±25% around its trend from step 10
        for m in tr[9:30]:
            t = m["step"]
            m["reward/mean"] = _trend(t, n) * (1.25 if t % 2 == 0 else 0.75)
            m["reward/std"] = 0.2
        return tr, 11   # step 10 is the first big (+) deviation, 11 the first (-) one
    if kind == "kl_high":
        # KL climbs 0.05 -> 0.75 over steps 10-20 (no single jump), then stays high, while the
        # reward stops improving from step 10: drift that buys nothing
        for m in tr[9:]:
            t = m["step"]
            m["kl"] = min(0.75, 0.05 + 0.07 * (t - 10)) + rng.gauss(0, 0.01)
            m["reward/mean"] = _trend(10, n) * (1 + rng.gauss(0, 0.02))
        return tr, 22   # above 0.6 from step 18, health.window = 5 steps
    if kind == "kl_spike":
        tr[29]["kl"] = 1.0
        for m in tr[30:33]:
            m["kl"] = 0.2
        return tr, 30
    if kind == "grad_spike":
        tr[24]["actor/grad_norm"] = 8.0
        return tr, 25
    if kind == "grad_clip":
        # actor pre-clip norms above actor.grad_clip (1.0) from step 20 while KL climbs: warning at 24
        for m in tr[19:]:
            t = m["step"]
            m["actor/grad_norm"] = 1.5 + rng.random()
            m["kl"] = min(0.5, 0.1 * 1.5 ** (t - 19))
        return tr, 24
    if kind == "grad_clip_info":
        # clipped on every step from step 20, nothing else moves: an info at 24 (effective lr lower)
        for m in tr[19:]:
            m["actor/grad_norm"] = 1.2 + 0.5 * rng.random()
        return tr, 24
    if kind == "grad_clip_critic":
        # critic pre-clip norms above critic.grad_clip while the critic loss climbs: warning at 24
        for m in tr[17:]:
            t = m["step"]
            m["critic/loss"] = 0.2 * 1.6 ** (t - 17)
        for m in tr[19:]:
            m["critic/grad_norm"] = 3.0 + rng.random()
            m["critic/loss"] = 0.2 * 1.6 ** (t - 17)
        return tr, 24
    if kind == "is_weight_extreme":
        for m in tr:
            m["rollout/is_weight_max"] = 1.0 + abs(rng.gauss(0, 0.3))
        for m in tr[19:]:
            m["rollout/is_weight_max"] = 40 + 10 * rng.random()
        return tr, 21
    if kind == "zero_advantage":
        for m in tr:
            m["batch/zero_adv_frac"] = 0.3 + rng.gauss(0, 0.05)
        for m in tr[19:]:
            m["batch/zero_adv_frac"] = 0.98
        return tr, 29
    if kind == "clipfrac_high":
        for m in tr[19:]:
            m["actor/clipfrac"] = 0.45 + rng.gauss(0, 0.02)
        return tr, 24
    if kind == "logprob_drift":
        # rollout/trainer mismatch creeping up 0.01 -> 0.048 from step 20 (below the 0.05 tolerance)
        for m in tr[19:]:
            t = m["step"]
            m["rollout/logprob_diff_mean"] = min(0.048, 0.01 + 0.002 * (t - 20))
        return tr, 37
    if kind == "critic_nan":
        tr[11]["critic/loss"] = float("nan")
        tr[11]["health/skipped_steps"] = 1
        for m in tr[12:]:
            m["health/skipped_steps"] = 1
        return tr, 12
    if kind == "actor_nan":
        tr[14]["actor/loss"] = float("inf")
        return tr, 15
    if kind == "reward_collapse":
        # rises fast to 2.5 by step 30, then collapses to 0.8 by step 40 (reward hacking)
        for m in tr:
            t = m["step"]
            if t <= 30:
                base = 0.5 + 2.0 * t / 30
            else:
                base = max(0.8, 2.5 - 1.7 * (t - 30) / 10)
            m["reward/mean"] = base * (1 + rng.gauss(0, 0.02))
        return tr, None   # computed by the test: first step where the smoothed drop is large
    if kind == "entropy_collapse":
        for m in tr[19:]:
            m["actor/entropy"] = 0.02
        return tr, 24
    if kind == "length_collapse":
        for m in tr[24:]:
            m["response/length_mean"] = 5.0 + rng.gauss(0, 0.5)
        return tr, 29
    if kind == "length_runaway":
        for m in tr[24:]:
            m["response/length_mean"] = 63.5
        return tr, 29
    if kind == "sync_slow":
        for m in tr[9:]:
            m["timing/sync_ms"] = 450 + rng.gauss(0, 20)
        return tr, 11
    if kind == "async_drift":   # generation ahead: the cap truncates 20% of the stale samples' weights
        for m in tr:
            m.update({"async/staleness_mean": 1.0, "rollout/is_capped_frac": 0.0, "rollout/is_weight_mean": 1.0})
        for m in tr[20:]:
            m["rollout/is_capped_frac"] = 0.2
        return tr, 22
    if kind == "stale_weights":
        for m in tr[14:]:
            m["rollout/logprob_diff_mean"] = 0.3
        return tr, 15  # the first step after a missed sync (tr[14] is step 15)
    raise KeyError(kind)


def write_run(run_dir: Path, trace: list[dict], recipe: dict | None = None, truncate_last: bool = False) -> Path:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(m) for m in trace]
    text = "\n".join(lines) + "\n"
    if truncate_last:
        text = "\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2]
    (run_dir / "metrics.jsonl").write_text(text)
    if recipe is not None:
        import yaml
        (run_dir / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return run_dir


RECIPE = {
    "model": {"policy": "builtin:tiny-llama"},
    "data": {"train": "builtin:arithmetic"},
    "reward": {"functions": ["builtin:exact_answer"]},
    "algorithm": {"name": "ppo", "kl": {"coef": 0.05}, "clip_range": 0.2},
    "actor": {"lr": 1e-6},
    "critic": {"lr": 3e-6},
}


# ---- issue 24: held-out traces the detectors missed ----------------------------------------

def long_clipping(n: int = 260, seed: int = 0) -> list[dict]:
    """A healthy run whose gradients are clipped on every step for longer than
    health.clip_long_steps (200): actor pre-clip norms 1.2-1.7 (grad_clip 1.0), the critic's above
    its clip too (healthy(clipped=True))."""
    rng = random.Random(seed + 7)
    tr = healthy(n, seed, clipped=True)
    for m in tr:
        m["actor/grad_norm"] = 1.2 + 0.5 * rng.random()
    return tr


def oscillating(n: int = 60, seed: int = 0, amp: float = 0.05, start: int = 10, steps: int = 16,
                std: float = 0.2) -> list[dict]:
    """A GRPO run whose reward alternates ±`amp` (relative) around its trend on steps
    start..start+steps-1: with reward/std `std` over 32 sequences each swing is within ~1.5
    standard errors (far below reward_swing's threshold), but up, down, up, down for many steps."""
    tr = healthy(n, seed, noise=0.01, ppo=False)
    for m in tr:
        m["reward/std"] = std
    for m in tr[start - 1:start - 1 + steps]:
        m["reward/mean"] *= 1 + (amp if m["step"] % 2 == 0 else -amp)
    return tr


def zero_std(n: int = 80, seed: int = 0, level: float = 0.1, jump_to: float | None = None, at: int = 30,
             groups: int = 8, ramp_to: float | None = None) -> list[dict]:
    """A GRPO run logging rollout/zero_std_frac as rltune does: the share of `groups` groups (8 in
    the GRPO test recipe: 4 generation calls x 2 prompts) whose samples all scored alike, with its
    binomial noise. From step `at` the share is `jump_to` (a jump), or it rises linearly to
    `ramp_to` by the last step (a learner solving its prompts)."""
    rng = random.Random(seed + 11)
    tr = healthy(n, seed, ppo=False)
    for m in tr:
        t = m["step"]
        p = level
        if ramp_to is not None:
            p = level + (ramp_to - level) * (t - 1) / (n - 1)
        elif jump_to is not None and t >= at:
            p = jump_to
        m["rollout/zero_std_frac"] = sum(rng.random() < p for _ in range(groups)) / groups
    return tr


def eval_falls_to_zero(n: int = 25, seed: int = 0, every: int = 5,
                       evals=(0.076, 0.05, 0.02, 0.0, 0.0)) -> list[dict]:
    """The held-out case: GRPO, the sampled train reward climbs ~0.5 -> 0.99 while the greedy eval
    reward (eval/reward every `every` steps, as the trainer logs it) falls 0.076 -> 0.000."""
    tr = healthy(n, seed, noise=0.02, ppo=False, r0=0.5, r1=0.99)
    for m in tr:
        m.pop("eval/reward", None)
    at = [s for s in range(1, n + 1) if s % every == 0 or s == n]
    for s, e in zip(at, evals):
        tr[s - 1]["eval/reward"] = e
    return tr


PROBLEM = ("warning", "error")


def observe_all(trace: list[dict], recipe) -> list:
    """Every event a fresh HealthMonitor fires over `trace` (step by step, no files written)."""
    from rltune.monitor.detectors import HealthMonitor

    mon = HealthMonitor(recipe, None)
    return [e for m in trace for e in mon.observe(m)]


def problems(evs) -> list[tuple]:
    """(step, kind, severity, message) of the warning and error events."""
    return [(e.step, e.kind, e.severity, e.message) for e in evs if e.severity in PROBLEM]


def zero_storm(n: int = 80, seed: int = 0, at: int = 30, ramp: int = 6, level: float = 0.1, storm: float = 0.9,
               groups: int = 8, reward: str = "flat") -> list[dict]:
    """A zero-advantage storm (issue 44): the share of `groups` groups that scored alike climbs
    linearly from `level` to `storm` over `ramp` steps from step `at` (at=1, ramp=1: a storm from
    the first step), logged as rollout/zero_std_frac with its binomial noise. reward="flat": the
    reward stays at 0.5 (the groups scoring alike teach nothing: a fault); "rising": it climbs
    0.2 -> 1.0 with the share (over 5 steps at least), then holds (the policy now solves its prompts)."""
    rng = random.Random(seed + 13)
    tr = healthy(n, seed, ppo=False, r0=0.5, r1=0.5)
    for m in tr:
        t = m["step"]
        p = level if t < at else level + (storm - level) * min(1.0, (t - at + 1) / ramp)
        m["rollout/zero_std_frac"] = sum(rng.random() < p for _ in range(groups)) / groups
        if reward == "rising":
            climb = min(1.0, max(0.0, (t - at + 1) / max(ramp, 5)))
            m["reward/mean"] = (0.2 + 0.8 * climb) * (1 + rng.gauss(0, 0.03))
    return tr
