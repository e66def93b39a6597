"""Where generation runs, and what a step costs there: `rltune plan RECIPE --times RUN_DIR`.

A phase model, not a measurement: it takes a run's measured phase times (RUN_DIR/metrics.jsonl,
the medians of its steps after the first, which pays for warm-up) and adds them up per placement
of the rollout engine (docs/async.md, "Placement"). The phases:

  G  generation            timing/rollout_s                     on the rollout's devices
  R  reward                timing/reward_s                      host (CPU) work
  E  experience passes     timing/reference_s + timing/old_s    on the trainer's devices
  U  update                timing/train_s                       on the trainer's devices
  S  weight sync           timing/sync_ms                       both sides wait

with D devices (GPUs, or CPU cores), measured with every phase on all D:

  synchronous                    G + R + E + U + S
  colocated, max_staleness >= 1  max(G + E + U, G + R) + S
      the device is shared, so generation and the trainer's passes still take turns on it; only
      what does not use it (the reward, tokenisation, an environment) overlaps
  separate, server on d of D     max(G x D/d + R, (E + U) x D/(D - d)) + S
      each side on its own devices, each phase scaled ideally with its share (data parallel);
      the best d is reported

The scaling is ideal (linear in devices) and a measured run with `max_staleness >= 1` times its
phases while they overlap (slower than alone): feed it a synchronous run's times. No torch.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

KEYS = {"generate": ("timing/rollout_s",), "reward": ("timing/reward_s",),
        "experience": ("timing/reference_s", "timing/old_s"), "update": ("timing/train_s",)}


class TimesError(ValueError):
    """A run directory whose metrics cannot give the phase times (message is user-facing)."""


@dataclass
class PhaseTimes:
    generate: float      # G, seconds per step
    reward: float        # R
    experience: float    # E
    update: float        # U
    sync: float          # S
    steps: int           # steps the medians are over
    asynchronous: bool   # measured with generation ahead (its phases overlapped)

    @classmethod
    def from_run(cls, run_dir) -> "PhaseTimes":
        """Medians of a run's steps after the first (metrics.jsonl read as untrusted input)."""
        from ..monitor.runlog import RunLogError, read_metrics

        try:
            log = read_metrics(run_dir)
        except (RunLogError, OSError) as err:
            raise TimesError(str(err)) from None

        def med(key: str) -> float | None:
            vals = [v for v in log.values(key)[1:] if math.isfinite(v)]
            return statistics.median(vals) if vals else None

        out = {}
        for name, keys in KEYS.items():
            got = [med(k) for k in keys]
            if got[0] is None:
                raise TimesError(f"{log.path}: no {keys[0]} after the first step: a run's metrics.jsonl "
                                 "(rltune train, two steps or more) gives the phase times")
            out[name] = sum(x for x in got if x is not None)
        sync = med("timing/sync_ms")
        return cls(**out, sync=(sync or 0.0) / 1000.0, steps=max(0, len(log) - 1),
                   asynchronous=bool(med("async/staleness_mean")))


def step_times(t: PhaseTimes, devices: int) -> dict:
    """Expected seconds per step of each placement on `devices` devices (the model above)."""
    G, R, E, U, S = t.generate, t.reward, t.experience, t.update, t.sync
    out = {"synchronous": G + R + E + U + S, "colocated": max(G + E + U, G + R) + S}
    best = None
    for d in range(1, devices):
        sec = max(G * devices / d + R, (E + U) * devices / (devices - d)) + S
        if best is None or sec < best[1]:
            best = (d, sec)
    if best is not None:
        out["separate"] = best[1]
        out["server_devices"] = best[0]
    return out


def render(t: PhaseTimes, devices: int, unit: str, source: str) -> list[str]:
    """Text lines for `rltune plan --times`."""
    st = step_times(t, devices)
    lines = [f"step time by placement (a phase model on {devices} {unit}(s): docs/async.md, placement)",
             f"  phase times from {source}, medians of {t.steps} step(s) after the first: generate {t.generate:.2f} s, "
             f"reward {t.reward:.2f} s, reference + behaviour/values {t.experience:.2f} s, update {t.update:.2f} s, "
             f"sync {t.sync:.2f} s",
             f"  {'synchronous (max_staleness 0)':<40} {st['synchronous']:7.2f} s/step",
             f"  {'colocated, max_staleness >= 1':<40} {st['colocated']:7.2f} s/step   only the reward overlaps: "
             "generation and training share the devices"]
    if "separate" in st:
        d = st["server_devices"]
        label = f"separate: server on {d} of {devices} {unit}(s)"
        lines.append(f"  {label:<40} {st['separate']:7.2f} s/step   rollout.server.devices: {d} {unit}(s), the "
                     f"trainer on the other {devices - d}")
    fastest = min((k for k in ("synchronous", "colocated", "separate") if k in st), key=lambda k: st[k])
    lines.append(f"  faster for this recipe: {fastest} ({st[fastest]:.2f} s/step, "
                 f"{st['synchronous'] / st[fastest]:.2f}x the synchronous step)")
    if t.asynchronous:
        lines.append("  note: these times were measured with generation ahead, while phases overlapped (each is "
                     "slower than alone): a synchronous run's times give the model its inputs")
    return lines
