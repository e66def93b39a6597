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
  separate: k replicas of r      max(G x D/(k r) + R, (E + U) x D/(D - k r)) + S'
      a fleet (rollout.server.replicas: k) of servers on r = rollout.tensor_parallel_size devices
      each, on d = k r of the D devices (k r < D), the trainer on the other D - k r; each side on
      its own devices, each phase scaled ideally with its share (data parallel: replicas share the
      prompts); the best k is reported. With r = 1 and k = d this is "a server on d of D".
      S' is the sync with k replicas. The trainer gathers the weights once and sends each bucket
      to every server at once (one thread per server, rollout/fleet.py); each server loads it
      while the others do. So the gather is paid once and the receives overlap: S' = S when the
      trainer's host side keeps up (the headline figure). But the host side is per replica (with
      weight_transfer file each replica's bucket is written to its own /dev/shm file; the threads
      share the host's memory bandwidth, the GIL and its network link): S' = k x S when that is
      all of S, the worst case. Both are reported; the truth lies between, closer to S while the
      gather and the servers' loads dominate, closer to k x S while the host's writes do.
      (S is a one-server run's; feed it one, as a run through a fleet has S' in timing/sync_ms.)

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


def fleet_split(t: PhaseTimes, devices: int, tp: int = 1, sync: str = "parallel") -> dict | None:
    """The best split of `devices` into k rollout replicas of `tp` devices each (k x tp < devices)
    and a trainer on the rest, with S' = S (sync "parallel") or S' = k x S (sync "shared"); None
    where no split leaves the trainer a device. Ties go to the fewer replicas."""
    if sync not in ("parallel", "shared"):
        raise ValueError(f"sync {sync!r}: parallel or shared")
    G, R, E, U = t.generate, t.reward, t.experience, t.update
    tp = max(1, int(tp))
    best = None
    k = 1
    while k * tp < devices:
        d = k * tp
        sync_s = t.sync * (k if sync == "shared" else 1)
        sec = max(G * devices / d + R, (E + U) * devices / (devices - d)) + sync_s
        if best is None or sec < best["step_s"]:
            best = {"replicas": k, "tensor_parallel_size": tp, "server_devices": d,
                    "trainer_devices": devices - d, "sync_s": sync_s, "step_s": sec}
        k += 1
    return best


def step_times(t: PhaseTimes, devices: int, tp: int = 1) -> dict:
    """Expected seconds per step of each placement on `devices` devices (the model above);
    "separate" is the best replica split with S' = S, "fleet" holds both sync assumptions."""
    G, R, E, U, S = t.generate, t.reward, t.experience, t.update, t.sync
    out = {"synchronous": G + R + E + U + S, "colocated": max(G + E + U, G + R) + S}
    par, shared = fleet_split(t, devices, tp, "parallel"), fleet_split(t, devices, tp, "shared")
    if par is not None:
        out["separate"] = par["step_s"]
        out["server_devices"] = par["server_devices"]
        out["replicas"] = par["replicas"]
        out["fleet"] = {"sync_parallel": par, "sync_shared": shared}
    return out


def _ids(lo: int, hi: int) -> str:
    return ",".join(str(i) for i in range(lo, hi))


def split_keys(split: dict, devices: int, unit: str, nodes: int = 1) -> str:
    """How to run a split: the recipe keys of the fleet, and where the trainer goes. On one machine
    (rollout.server.replicas starts its servers there); across `nodes` machines, attached servers."""
    k, d, r = split["replicas"], split["server_devices"], split["tensor_parallel_size"]
    rest = _ids(d, devices)
    if unit.startswith("GPU") and nodes > 1:
        return (f"rollout.server.urls: [{k} URL(s)] of servers you start on {d} of the {devices} GPUs, {r} each "
                f"(rollout.server.replicas starts servers on the trainer's machine only); the trainer on the other "
                f"{devices - d} (trainer.nproc x trainer.nnodes = {devices - d})")
    keys = f"rollout.server.replicas: {k}, rollout.server.devices: [{', '.join(str(i) for i in range(d))}]"
    if unit.startswith("GPU"):
        return (f"{keys}; the trainer on GPU(s) {rest}: CUDA_VISIBLE_DEVICES={rest} rltune train ... "
                f"(trainer.nproc: {devices - d})")
    return f"{keys}; the trainer on core(s) {rest}: taskset -c {rest} rltune train ..."


def render(t: PhaseTimes, devices: int, unit: str, source: str, tp: int = 1, nodes: int = 1) -> list[str]:
    """Text lines for `rltune plan --times`."""
    st = step_times(t, devices, tp)
    lines = [f"step time by placement (a phase model on {devices} {unit}(s): docs/async.md, placement)",
             f"  phase times from {source}, medians of {t.steps} step(s) after the first: generate {t.generate:.2f} s, "
             f"reward {t.reward:.2f} s, reference + behaviour/values {t.experience:.2f} s, update {t.update:.2f} s, "
             f"sync {t.sync:.2f} s",
             f"  {'synchronous (max_staleness 0)':<40} {st['synchronous']:7.2f} s/step",
             f"  {'colocated, max_staleness >= 1':<40} {st['colocated']:7.2f} s/step   only the reward overlaps: "
             "generation and training share the devices"]
    if "separate" in st:
        par, shared = st["fleet"]["sync_parallel"], st["fleet"]["sync_shared"]

        def line(label: str, sp: dict, how: str) -> str:
            return (f"  {label:<40} {sp['step_s']:7.2f} s/step   {sp['replicas']} replica(s) x {sp['tensor_parallel_size']} "
                    f"{unit}(s) (tensor_parallel_size {sp['tensor_parallel_size']}), the trainer on the other "
                    f"{sp['trainer_devices']}; {how}")

        lines.append(line(f"separate: rollout on {par['server_devices']} of {devices} {unit}(s)", par,
                          f"sync {par['sync_s']:.2f} s (S' = S: the replicas receive at once)"))
        if max(par["replicas"], shared["replicas"]) > 1:   # with one replica S' = S either way
            lines.append(line("  or, sync per replica (S' = k x S)", shared, f"sync {shared['sync_s']:.2f} s (the worst case)"))
        lines.append(f"  best split (S' = S): {split_keys(par, devices, unit, nodes)}")
        if shared["replicas"] != par["replicas"]:
            lines.append(f"  best split (S' = k x S): {split_keys(shared, devices, unit, nodes)}")
        lines.append("  note: the split overlaps generation with training: it needs "
                     "rollout.asynchronous.max_staleness >= 1 (docs/async.md)")
    fastest = min((k for k in ("synchronous", "colocated", "separate") if k in st), key=lambda k: st[k])
    lines.append(f"  faster for this recipe: {fastest} ({st[fastest]:.2f} s/step, "
                 f"{st['synchronous'] / st[fastest]:.2f}x the synchronous step)")
    if t.asynchronous:
        lines.append("  note: these times were measured with generation ahead, while phases overlapped (each is "
                     "slower than alone): a synchronous run's times give the model its inputs")
    return lines
