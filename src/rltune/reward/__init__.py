"""Rewards: functions named by the recipe, a reward model, weighted, normalised, clipped.

The only user code rltune runs is the reward path a recipe names (`module:function` or
`path/to/file.py:function`); checkpoints and caches never execute pickled code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .functions import (ERROR_FIX, EXIT_FIX, RewardError, load_reward_function,  # noqa: F401 (the package's names)
                        reward_file_path)


# torch.finfo(torch.float32).max, without importing torch here: the trainer holds rewards in a
# float32 tensor, where a larger Python float (finite in float64, e.g. 1e39) becomes inf.
F32_MAX = 3.4028234663852886e38


def fits_float32(v: float) -> bool:
    """Whether the trainer's float32 reward tensor holds `v` as the number it is: finite, |v| <= F32_MAX."""
    return math.isfinite(v) and abs(v) <= F32_MAX


def _source(spec: str) -> str:
    """The reward source a message names: raw's key "model" / "env", or a function's spec."""
    return {"model": "the reward model", "env": "the environment's reward (rollout.env)"}.get(
        spec, f"reward function {spec}")


@dataclass
class RunningMoments:
    """Running mean/std of rewards (Chan et al. parallel update), checkpointable."""

    count: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, xs: list[float]) -> None:
        n = len(xs)
        if n == 0:
            return
        bmean = sum(xs) / n
        bm2 = sum((x - bmean) ** 2 for x in xs)
        delta = bmean - self.mean
        total = self.count + n
        self.mean += delta * n / total
        self.m2 += bm2 + delta**2 * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / max(self.count - 1, 1)) if self.count > 1 else 1.0


@dataclass
class RewardResult:
    scores: list[float]                       # (B,) final reward per completion
    raw: dict[str, list[float]] = field(default_factory=dict)  # per source, before weighting


class RewardComputer:
    """Calls the recipe's reward functions (and model) and combines them."""

    def __init__(self, cfg, base_dir: Path | None = None, reward_model=None, log=None,
                 gather: Callable[[list[float]], list[float]] | None = None, env_reward: bool = False):
        """`env_reward`: an episode environment scores the samples (rollout.env; its scores come in
        `__call__`'s `env_scores`), so no function or model is needed. `gather(values)` returns the values of every rank (the global batch; identity with one
        rank): the running normaliser sees the global batch, so its state is the same on every rank."""
        self.cfg = cfg
        self.gather = gather or (lambda values: values)
        isolate = getattr(cfg, "isolate", False)
        timeout = getattr(cfg, "timeout", 60.0)
        self.functions = []
        for spec in cfg.functions:
            if isolate and not spec.startswith("builtin:"):
                from .isolate import IsolatedReward
                fn = IsolatedReward(spec, base_dir, timeout)   # user code in a worker process
            else:
                fn = load_reward_function(spec, base_dir)
            self.functions.append((spec, fn))
        self.weights = list(cfg.weights) if cfg.weights is not None else [1.0] * len(self.functions)
        # callable(prompts, completions, conversations=...) -> list[float], e.g. RewardModelScorer
        self.reward_model = reward_model
        self.moments = RunningMoments()
        self.log = log
        self.env_reward = env_reward
        if not self.functions and reward_model is None and not env_reward:
            raise RewardError("no reward: set reward.functions (e.g. [builtin:exact_answer]) or reward.model, or "
                              "give rollout.env a reward (an environment class's reward(), or an agent function: "
                              "run(client, row) returns it)")

    def _call_one(self, spec, fn, prompts, completions, columns) -> list[float]:
        try:
            values = fn(prompts, completions, **columns)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - find the sample, then report; Ctrl-C passes
            bad = self._first_failing_sample(fn, prompts, completions, columns)
            where = f"sample {bad} (prompt {prompts[bad][:60]!r})" if bad is not None else f"a batch of {len(prompts)}"
            what, fix = _describe_failure(err)
            return self._on_error(f"reward function {spec} {what} {where}", len(prompts), fix)
        shape = _not_a_list(values)
        if shape:
            return self._on_error(f"reward function {spec} must return a list of floats (one per completion), "
                                  f"got {shape}", len(prompts),
                                  "return [score, ...] in the order of the completions, e.g. "
                                  "[float(s) for s in scores]")
        try:
            values = [float(v) for v in values]
        except (TypeError, ValueError, OverflowError) as err:
            return self._on_error(f"reward function {spec} must return a list of floats, got {type(values).__name__}: {err}", len(prompts))
        if len(values) != len(prompts):
            return self._on_error(f"reward function {spec} returned {len(values)} values for {len(prompts)} completions", len(prompts))
        return self._held(f"reward function {spec}", values, prompts,
                          "make the function return finite floats in a sane range (e.g. |r| <= 1e6)")

    def _held(self, source: str, values: list[float], prompts: list[str], fix: str) -> list[float]:
        """`values` with each score float32 cannot hold (NaN, inf, or |v| > F32_MAX) raised as a
        RewardError naming `source`, the value and the sample, or scored 0 (reward.on_error: zero).
        The scores are Python floats here, where 1e39 is finite; the trainer holds them in float32,
        where it is inf and used to stop the run with a message that named no source."""
        for i, v in enumerate(values):
            if fits_float32(v):
                continue
            msg = f"{source} returned {v} for sample {i} (prompt {prompts[i][:60]!r})"
            if math.isfinite(v):
                msg += f", beyond float32's range (|r| <= {F32_MAX:.3g}) that the trainer holds rewards in"
            if self.cfg.on_error == "raise":
                raise RewardError(f"{msg}\n  fix: {fix}, or set reward.on_error: zero")
            if self.log:
                self.log.warning(msg + "; scored 0 (reward.on_error: zero)")
            values[i] = 0.0
        return values

    def _first_failing_sample(self, fn, prompts, completions, columns):
        if len(prompts) < 2:
            return 0 if prompts else None
        for i in range(len(prompts)):
            try:
                fn(prompts[i:i + 1], completions[i:i + 1], **{k: v[i:i + 1] for k, v in columns.items()})
            except (Exception, SystemExit):  # noqa: BLE001
                return i
        return None

    def _on_error(self, msg: str, n: int, fix: str = ERROR_FIX) -> list[float]:
        if self.cfg.on_error == "raise":
            raise RewardError(f"{msg}\n  fix: {fix}")
        if self.log:
            self.log.warning(msg + "; scored 0 (reward.on_error: zero)")
        return [0.0] * n

    def _finite_sums(self, total: list[float], raw: dict[str, list[float]], prompts: list[str]) -> list[float]:
        """Each sample's weighted sum must stay within float32, the trainer's reward type: scores
        float32 holds can still overflow it (3e38 + 3e38; a weight of 1e300 on 1e10 is inf even in float64).
        The source with the largest weighted score is named; reward.on_error applies as to a NaN."""
        weights = dict(zip((spec for spec, _ in self.functions), self.weights), model=1.0, env=1.0)
        for i, t in enumerate(total):
            if fits_float32(t):
                continue
            spec = max(raw, key=lambda k: abs(weights.get(k, 1.0) * raw[k][i]))
            over = (f"overflows to {t}" if not math.isfinite(t) else
                    f"overflows float32 at {t:g} (the trainer holds rewards in float32, |r| <= {F32_MAX:.3g})")
            msg = (f"the reward of sample {i} (prompt {prompts[i][:60]!r}) {over}: {_source(spec)} returned "
                   f"{raw[spec][i]:g} (weight {weights.get(spec, 1.0):g})")
            if self.cfg.on_error == "raise":
                raise RewardError(msg + "\n  fix: keep rewards in a sane range (e.g. |r| <= 1e6), or set "
                                  "reward.on_error: zero")
            if self.log:
                self.log.warning(msg + "; scored 0 (reward.on_error: zero)")
            total[i] = 0.0
        return total

    def close(self) -> None:
        """Stop the reward workers (reward.isolate); they also stop when the process exits."""
        for _, fn in self.functions:
            if hasattr(fn, "close"):
                fn.close()

    def __call__(self, prompts: list[str], completions: list[str], columns: dict[str, list],
                 conversations: list[list[dict]] | None = None, training: bool = True,
                 env_scores: list[float] | None = None, update_normaliser: bool = True) -> RewardResult:
        """`conversations`: the prompt messages of each sample ({"role", "content"} dicts, no
        assistant turn; see train.prompts.prompt_messages), for the reward model's chat template.
        None: the reward model sees each prompt as one user message. `training=False` (eval):
        the weighted sum as is, neither normalised nor clipped, and the normaliser is untouched.
        `update_normaliser=False`: normalised with the moments as they are, which stay as they are
        (one rank's regenerated groups: the ranks' normalisers must stay alike)."""
        n = len(completions)
        total = [0.0] * n
        raw: dict[str, list[float]] = {}
        for (spec, fn), w in zip(self.functions, self.weights):
            values = self._call_one(spec, fn, prompts, completions, columns)
            raw[spec] = values
            total = [t + w * v for t, v in zip(total, values)]
        if self.reward_model is not None:
            values = [float(v) for v in self.reward_model(prompts, completions, conversations=conversations)]
            raw["model"] = self._held(_source("model"), values, prompts,
                                      "check the reward model (reward.model) and its inputs")
            total = [t + v for t, v in zip(total, raw["model"])]
        if env_scores is not None:      # an episode environment's own reward (rollout.env), weight 1
            raw["env"] = self._held(_source("env"), [float(v) for v in env_scores], prompts,
                                    "make the environment's reward() return a finite float in a sane range")
            total = [t + v for t, v in zip(total, raw["env"])]
        total = self._finite_sums(total, raw, prompts)  # before the normaliser: its moments see no overflow
        if not training:
            return RewardResult(total, raw)
        if self.cfg.normalize:
            if update_normaliser:
                self.moments.update(self.gather(total))
            total = [(t - self.moments.mean) / (self.moments.std + 1e-8) for t in total]
        if self.cfg.clip is not None:
            c = self.cfg.clip
            total = [min(max(t, -c), c) for t in total]
        return RewardResult(total, raw)

    def state_dict(self) -> dict:
        m = self.moments
        return {"count": m.count, "mean": m.mean, "m2": m.m2}

    def load_state_dict(self, state: dict) -> None:
        self.moments = RunningMoments(state["count"], state["mean"], state["m2"])


def _not_a_list(values) -> str | None:
    """Why `values` is not a list of scores, or None. A str, bytes, dict or set iterates (into
    characters, keys, an arbitrary order) and used to be taken as scores."""
    from collections.abc import Mapping, Set

    if isinstance(values, (str, bytes, bytearray)):
        return f"a {type(values).__name__} ({str(values)[:40]!r})"
    if isinstance(values, (Mapping, Set)):
        return f"a {type(values).__name__} (its keys or members are no scores in the completions' order)"
    if getattr(values, "ndim", 1) != 1:
        return f"an array of shape {tuple(getattr(values, 'shape', ()))}"
    if hasattr(values, "__next__"):     # a generator: ordered, one score per completion
        return None
    if not hasattr(values, "__len__") or not hasattr(values, "__getitem__"):
        return f"a {type(values).__name__}"
    return None


def _describe_failure(err: BaseException) -> tuple[str, str]:
    """("raised ValueError: ... on" | "called sys.exit(3) while scoring" | "exited with code 1 while
    scoring", fix) for a reward function that failed; the caller appends the sample."""
    from .isolate import RemoteRewardError, RewardWorkerError

    if isinstance(err, SystemExit):
        return f"called sys.exit({err.code!r}) while scoring", EXIT_FIX + ", or set reward.on_error: zero to score such samples 0"
    if isinstance(err, RewardWorkerError):
        return f"{err.what} while scoring", err.fix
    if isinstance(err, RemoteRewardError):
        return f"raised {err.remote_type}: {err} on", ERROR_FIX
    return f"raised {type(err).__name__}: {err} on", ERROR_FIX
