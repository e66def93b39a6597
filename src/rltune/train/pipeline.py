"""Generation one step ahead: `rollout.asynchronous.max_staleness: K >= 1` (docs/async.md).

A producer thread runs steps 1-2 of the loop (`sampling.sample_step`: generate and score) for the
next K steps while the trainer learns from the current one. The schedule is a lockstep, so it is
deterministic and every lag is known in advance:

  - the batch of step j may start once the trainer has taken the batch of step j - K;
  - without partial rollouts, the weight sync after step s waits until the batch of step s + K is
    generated: every batch is sampled with one weight version, and the batch of step j with the
    weights of step j - K - 1 (its lag is K; the first K + 1 batches of a run or a resume are
    sampled with the starting weights, lags 0..K);
  - with partial rollouts (`partial`, vllm-server), the sync does not wait: the server pauses the
    requests in flight (`/pause?mode=keep`), swaps the weights and resumes them, each token
    reporting the version that sampled it. Lags are then at most K and timing-dependent.

Versions are policy versions: the number of training steps in the weights (the weights that train
step s are version s - 1). The engines label what they sample with their own sync count; the
pipeline maps each sync to the step it carried. The bound is checked per token at the step that
trains it, from those labels (never from timing): a group with a token older than K versions is
generated again with the current weights or dropped (`on_stale`): a guard, since the schedule never
produces one and a rollback or a resume discards or regenerates the batches generated ahead first.

Several ranks (trainer.nproc / nnodes > 1): one producer per rank, each generating its rank's share
of every batch, like the synchronous loop. The sampler's position is global (every rank's sampler
takes the same steps; each keeps its slice), so no prompt is lost or repeated across ranks, and the
lockstep schedule is the same on every rank: without partial rollouts every rank's batch j is
sampled with the same weights. The producers' own collectives (reward normalisation, step metrics,
dynamic sampling's agreement on the number of calls) go to a gloo group of their own
(`collective.on_group`), so they never interleave with the trainer thread's; every producer makes
exactly the batches the schedule allows (`allowed` is set by the same `take` on every rank), so
every producer call has its partners. Before a sync every rank's producer has finished (a shared
fleet must not change weights under another rank's batch). A stale group is generated again by its
rank alone (`collective.local`: the reward normaliser is then read, not updated); `on_stale: drop`
would leave ranks with unequal shares and is refused with several ranks.

Off-policy correction (decoupled PPO; Hilton et al. 2021, used by AReaL, Fu et al. 2025, arXiv
2505.24298): the clipped ratio's denominator is the proximal policy, the trainer's weights at the
start of the step (the behaviour pass of the loop, step 4, or the first update's own forward),
so the trust region is around the current weights however old the sample; the sampling policy
enters only through the per-token importance weight pi_prox / pi_sample (rollout_logp, reported by
the engine for the version that sampled each token), truncated (tis) or masked (mis). Recomputing
log-probs under each sample's own old version would need the old weights kept: the proximal form
needs nothing more than the synchronous loop computes.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import torch

from . import collective
from .console import LOG
from .sampling import Scored, StepBatch, rescore, sample_step


class _NoSleep:
    """The rollout engine as the producer sees it: it generates while the trainer trains, so it
    never sleeps between calls."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def sleep(self) -> None:
        pass


def _stamp(exp, version: int) -> None:
    """Label the tokens with the engine's sync count `version` where the engine reported none (hf,
    and episodes, whose batch is built from many calls): without partial rollouts no sync happens
    while a batch is made, so that one version sampled all of it."""
    if exp.versions is None:
        exp.versions = torch.full(exp.response_ids.shape, int(version), dtype=torch.long)
    if exp.earlier is not None:   # an episode's samples before a prefix break
        _stamp(exp.earlier, version)


class Pipeline:
    """The producer thread and the hand-over of batches, weights and checkpoint state."""

    def __init__(self, c, first_step: int, last_step: int, inflight: dict | None = None,
                 before: dict | None = None):
        """`inflight` (a resume): step -> its batch generated ahead, restored from the checkpoint;
        `before`: step -> (sampler, rewards) state from before that batch was drawn, for each of
        them (where each batch began: the next checkpoint or a rollback needs it)."""
        cfg = c.recipe.rollout.asynchronous
        self.c, self.K, self.partial, self.on_stale = c, cfg.max_staleness, cfg.partial, cfg.on_stale
        self.engine = c.rollout
        self.group = c.recipe.algorithm.group_size
        if hasattr(self.engine, "own_copy"):   # hf: the trainer's in-place updates must not reach a batch
            self.engine.own_copy()             # being sampled; the engine keeps its own weights
        if self.partial:
            self.engine.keep_requests_across_syncs()
        self.cv = threading.Condition()
        self.ready: dict[int, StepBatch] = dict(inflight or {})      # step -> its batch, generated
        self.next = max(self.ready, default=first_step - 1) + 1       # the step the producer makes next
        self.allowed = first_step - 1                                 # it may make batches up to this step
        self.last = last_step
        self.policy = first_step - 1                                  # steps in the synced weights
        self.policy_of = {int(self.engine.version): self.policy}      # engine sync count -> policy version
        self.before: dict[int, tuple[dict, dict]] = dict(before or {})  # step -> (sampler, rewards) before its batch
        self.busy, self.closed, self.error = False, False, None
        self.idle_rollout = 0.0
        self.world = collective.world_size()
        self.mapped: set[int] = set(self.ready)     # steps whose batch holds policy versions (restored ones do)
        self._producer_c = dataclasses.replace(c, rollout=_NoSleep(self.engine))
        self.producers = None   # the producers' process group, apart from the trainer threads' (every rank makes it)
        if self.world > 1:
            import torch.distributed as dist

            from datetime import timedelta

            wait = timedelta(seconds=float(c.recipe.trainer.collective_timeout_s))   # a stalled peer, as the trainer's
            self.producers = dist.new_group(backend="gloo", timeout=wait)
        self.thread = threading.Thread(target=self._produce, name="rltune-rollout-producer", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ producer thread
    def _produce(self) -> None:
        started = False
        collective.on_group(self.producers)
        try:
            while True:
                with self.cv:
                    t0 = time.perf_counter()
                    while not self.closed and self.next > self.allowed:
                        self.cv.wait()
                    if self.closed:
                        return
                    if started:
                        self.idle_rollout += time.perf_counter() - t0
                    started, j, self.busy = True, self.next, True
                    self.before[j] = (self.c.sampler.state_dict(), self.c.rewards.state_dict())
                    version = int(self.engine.version)
                batch = sample_step(self._producer_c)
                with self.cv:
                    _stamp(batch.batch.exp, version)   # engine labels: mapped to policy versions when taken
                    self.ready[j], self.next, self.busy = batch, j + 1, False
                    self.cv.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the trainer thread, raised there
            with self.cv:
                self.error, self.busy = err, False
                self.cv.notify_all()

    def _wait(self, until) -> None:
        """Wait (trainer thread) until `until()` holds; the producer's error is raised here."""
        while self.error is None and not until():
            self.cv.wait(timeout=1.0)
        if self.error is not None:
            raise self.error

    # ------------------------------------------------------------------ trainer thread
    def take(self, step: int) -> tuple[StepBatch, dict]:
        """Steps 1-2 of `step`: its batch (waiting for it), checked against the bound; and the
        step's async/* metrics so far."""
        t0 = time.perf_counter()
        with self.cv:
            self.allowed = min(step + self.K, self.last)
            self.cv.notify_all()
            self._wait(lambda: step in self.ready)
            self._map_ready()
            drawn = self.ready.pop(step)
            self.mapped.discard(step)
            self.before.pop(step, None)
            idle_rollout, self.idle_rollout = self.idle_rollout, 0.0
        idle_trainer = time.perf_counter() - t0
        drawn, bound = self._enforce_bound(drawn)
        m = {"async/idle_trainer_s": idle_trainer, "async/idle_rollout_s": idle_rollout, **bound}
        return drawn, m

    def sync(self, actor, step: int) -> tuple[float, float]:
        """Step 9: the weights of `step` -> the engine (without partial rollouts, once the batch of
        step + K is generated). Returns (sync ms, seconds waited for the producer)."""
        t0 = time.perf_counter()
        if not self.partial:
            target = min(step + self.K, self.last)
            with self.cv:
                self._wait(lambda: self.next > target)
            if self.world > 1:   # every rank's batch of step + K is made before any weights change
                collective.barrier()
        waited = time.perf_counter() - t0
        with self.cv:   # before the sync: with partial rollouts tokens carry its label as soon as it ends
            self.policy_of[int(self.engine.version) + 1] = step
        ms = self.engine.sync_weights(actor)
        with self.cv:
            self.policy = step
            self.cv.notify_all()
        return ms, waited

    def _map_ready(self) -> None:
        """The batches made since the last call: engine labels -> policy versions (the trainer
        thread, the producer holding none of them). Mapped here, not in the producer: with partial rollouts on a fleet
        that several ranks share, a token may carry the label of a sync that rank 0 began before
        this rank's trainer thread registered it; by the time this rank takes a batch it has."""
        for j, b in self.ready.items():
            if j not in self.mapped:
                self._to_policy(b.batch.exp)
                self.mapped.add(j)

    def _to_policy(self, exp) -> None:
        """The engine's labels (its sync count per token) -> policy versions, in place; -1 stays
        on padding. A label from before this pipeline's first sync is its oldest known version."""
        labels, out = exp.versions, torch.full_like(exp.versions, -1)
        for v in labels.unique().tolist():
            if v >= 0:
                out[labels == v] = self.policy_of.get(int(v), min(self.policy_of.values()))
        exp.versions = out
        if exp.earlier is not None:
            self._to_policy(exp.earlier)

    def _enforce_bound(self, drawn: StepBatch) -> tuple[StepBatch, dict]:
        """Per-token lags of the batch; groups beyond K regenerated or dropped (`on_stale`)."""
        exp, G = drawn.batch.exp, self.group
        mask, lag = self._lags(exp)                                                    # (N, T) each
        oldest = self._oldest(exp, lag)                                                # (B,) per episode
        stale_groups = [g for g in range(exp.size // G) if bool((oldest[g * G:(g + 1) * G] > self.K).any())]
        m = {"async/dropped": 0.0, "async/regenerated": 0.0}
        if stale_groups:
            keep = [g for g in range(exp.size // G) if g not in stale_groups]
            if self.on_stale == "drop" and keep:   # one rank only: _start_pipeline refuses drop on several
                drawn = _select_groups(drawn, keep, G)
                m["async/dropped"] = float(len(stale_groups))
                LOG.warning("[Async] %d group(s) had tokens older than rollout.asynchronous.max_staleness %d "
                            "versions: dropped (on_stale: drop)", len(stale_groups), self.K)
            else:
                # on_stale: drop with every group stale would leave the step no batch: they are
                # generated again instead, and the warning says so
                drawn = self._regenerate(drawn, stale_groups, keep,
                                         "every group was stale and on_stale: drop would leave the step no batch"
                                         if self.on_stale == "drop" else "on_stale: regenerate")
                m["async/regenerated"] = float(len(stale_groups))
            exp = drawn.batch.exp
            mask, lag = self._lags(exp)
        # over the global batch (every rank takes the same step at once: the trainer threads' group)
        lag_sum, n, m["async/dropped"], m["async/regenerated"] = collective.global_sum(
            [float(lag.sum()), float(mask.sum()), m["async/dropped"], m["async/regenerated"]])
        m["async/staleness_mean"] = lag_sum / max(n, 1.0)
        m["async/staleness_max"] = collective.global_max([float(lag.max()) if lag.numel() else 0.0])[0]
        return drawn, m

    def _lags(self, exp) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, T) trained-token mask and lag (versions behind the policy) of every sample: the
        batch's rows, then the samples before a prefix break (`exp.earlier`), on one width."""
        parts = [exp] if exp.earlier is None else [exp, exp.earlier]
        T = max(p.response_width for p in parts)
        pad = lambda x, v: torch.nn.functional.pad(x, (0, T - x.shape[1]), value=v)  # noqa: E731
        mask = torch.cat([pad(p.train_mask, 0.0) for p in parts]).bool()             # (N, T)
        versions = torch.cat([pad(p.versions, -1) for p in parts])                     # (N, T)
        return mask, (self.policy - versions).masked_fill(~mask, 0)

    @staticmethod
    def _oldest(exp, lag: torch.Tensor) -> torch.Tensor:
        """(B,) each episode's largest lag, over its row and its samples before a prefix break."""
        per = lag.amax(-1) if lag.numel() else lag.new_zeros(lag.shape[0])            # (N,)
        oldest = per[:exp.size].clone()
        if exp.earlier is not None:
            oldest = oldest.scatter_reduce(0, exp.earlier.owner, per[exp.size:], "amax")
        return oldest

    def _regenerate(self, drawn: StepBatch, stale: list[int], keep: list[int],
                    why: str = "on_stale: regenerate") -> StepBatch:
        """The stale groups' prompts generated again now (the producer waits: one engine)."""
        G = self.group
        with self.cv:
            self._wait(lambda: not self.busy)
            allowed, self.allowed = self.allowed, self.next - 1   # hold the producer: one engine, one sampler
        try:
            rows = [drawn.batch.rows[g * G] for g in stale]
            version = int(self.engine.version)
            with collective.local():   # this rank's groups alone: the other ranks may have none to redo
                fresh, fresh_lengths = rescore(self._producer_c, rows, update_normaliser=self.world == 1)
            _stamp(fresh.exp, version)
            self._to_policy(fresh.exp)
        finally:
            with self.cv:
                self.allowed = allowed
                self.cv.notify_all()
        LOG.warning("[Async] %d group(s) had tokens older than rollout.asynchronous.max_staleness %d versions: "
                    "generated again with the current weights (%s)", len(stale), self.K, why)
        kept = _select_groups(drawn, keep, G) if keep else None
        batch = Scored.concat(([kept.batch] if kept else []) + [fresh], self.engine.pad_id)
        lengths = torch.cat(([kept.lengths] if kept else []) + [fresh_lengths.to(drawn.lengths.dtype)])
        return StepBatch(batch, lengths, drawn.metrics, drawn.rollout_s, drawn.reward_s)

    # ------------------------------------------------------------------ checkpoints, rollback, end
    def quiesce(self) -> None:
        """Wait until the producer has made every batch it may make (a checkpoint then sees a
        state no thread is changing)."""
        with self.cv:
            self._wait(lambda: not self.busy and self.next > self.allowed)

    def state(self, step: int) -> tuple[dict, dict]:
        """After `step` (quiesced): (state.json's "async" entry, the in-flight batches as tensors
        and plain data for `inflight-rank{R}.pt`). The entry says where every in-flight batch began
        (`before`: its sampler and reward-normaliser state), so that a resume that restores them
        can save that again, and one that cannot generates them again from the first one's."""
        self._map_ready()   # saved as policy versions (unpack's promise)
        first = step + 1
        sampler, rewards = self.before.get(first, (self.c.sampler.state_dict(), self.c.rewards.state_dict()))
        entry = {"max_staleness": self.K, "next_step": first, "sampler_before": sampler, "rewards_before": rewards,
                 "inflight_steps": sorted(self.ready),
                 "before": {str(j): {"sampler": self.before[j][0], "rewards": self.before[j][1]}
                            for j in sorted(self.ready) if j in self.before}}
        batches = {}
        for j, b in self.ready.items():
            packed = pack(b)
            if packed is None:   # rows that are not plain data: a resume regenerates them
                return {**entry, "inflight_steps": [], "before": {}}, {}
            batches[str(j)] = packed
        return entry, batches

    def flush(self) -> None:
        """A rollback: the batches generated and not trained are discarded; the sampler goes back
        to before the first of them (no prompt is lost) and the producer waits for the next take."""
        with self.cv:
            if self.world == 1:
                self.allowed = self.next - 1
                self._wait(lambda: not self.busy)
            else:   # every rank's producer makes the batches it was allowed (each has partners in the
                self._wait(lambda: not self.busy and self.next > self.allowed)   # producers' group)
            if self.ready:
                first = min(self.ready)
                sampler, _ = self.before.get(first, (None, None))
                if sampler is not None:
                    self.c.sampler.load_state_dict(sampler)
            self.ready.clear()
            self.mapped.clear()
            self.before.clear()

    def restart(self, step: int) -> None:
        """After a rollback to `step` (its weights synced by the rollback): the next batch is for
        step + 1, sampled with them."""
        with self.cv:
            self.next, self.allowed, self.policy = step + 1, step, step
            self.policy_of[int(self.engine.version)] = step
            self.cv.notify_all()

    def close(self) -> None:
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        self.thread.join(timeout=10.0)   # a generation call in flight may take a while: do not hang an exit


def _select_groups(drawn: StepBatch, groups: list[int], G: int) -> StepBatch:
    rows = [g * G + k for g in groups for k in range(G)]
    return StepBatch(drawn.batch.select(rows), drawn.lengths[rows], drawn.metrics, drawn.rollout_s, drawn.reward_s)


# ---------------------------------------------------------------------- in-flight batches on disk
_PLAIN = ("prompts", "completions", "rows", "conversations", "raw", "env_scores", "episode")


def pack(b: StepBatch) -> dict | None:
    """A generated batch as tensors and JSON-plain data (torch.load(weights_only=True) reads it
    back); None when its rows hold values that are not plain data."""
    s = b.batch
    plain = {k: getattr(s, k) for k in _PLAIN}
    plain.update(metrics=b.metrics, rollout_s=b.rollout_s, reward_s=b.reward_s)
    try:
        text = json.dumps(plain, allow_nan=True)
    except (TypeError, ValueError):
        return None
    out = {"exp": _tensors(s.exp), "lengths": b.lengths, "plain": text}
    if s.exp.earlier is not None:   # an episode's samples before a prefix break
        out["earlier"] = _tensors(s.exp.earlier)
    return out


def _tensors(exp) -> dict:
    return {f.name: getattr(exp, f.name) for f in dataclasses.fields(exp) if isinstance(getattr(exp, f.name), torch.Tensor)}


def unpack(d: dict) -> StepBatch:
    """`pack`'s inverse (its tokens' versions are policy versions)."""
    from ..rollout.experience import Experience

    plain = json.loads(d["plain"])
    fields = {f.name for f in dataclasses.fields(Experience)} - {"earlier", "filler", "episode", "index"}   # tensors
    exp = Experience(**{k: v for k, v in d["exp"].items() if k in fields - {"owner"}})
    if isinstance(d.get("earlier"), dict):
        exp.earlier = Experience(**{k: v for k, v in d["earlier"].items() if k in fields})
    s = Scored(exp, *[plain[k] for k in _PLAIN])
    return StepBatch(s, d["lengths"], plain["metrics"], plain["rollout_s"], plain["reward_s"])


def check_batch(b: StepBatch, vocab: int) -> None:
    """A batch read back from a checkpoint's in-flight file is data like any received file: its
    shapes agree, its token ids are in [0, vocab), its log-probs and scores are finite, else
    ValueError naming what is wrong (the resume then generates the batch again)."""
    exp, s = b.batch.exp, b.batch
    _check_rows(exp, vocab)
    if exp.earlier is not None:
        _check_rows(exp.earlier, vocab, owners=exp.size)
    B = exp.size if exp.response_ids.dim() == 2 else -1
    if tuple(b.lengths.shape) != (B,) or any(len(getattr(s, k)) != B for k in ("prompts", "completions", "rows",
                                                                                "conversations")):
        raise ValueError(f"its texts and lengths do not have the batch's {B} rows")


def _check_rows(exp, vocab: int, owners: int | None = None) -> None:
    """`check_batch` for one set of rows (`owners`: the rows of the batch, for its samples before a
    prefix break, whose `owner` must name one)."""
    B, T = exp.response_ids.shape if exp.response_ids.dim() == 2 else (-1, -1)
    want = {"prompt_ids": (B, exp.prompt_ids.shape[-1]), "prompt_mask": (B, exp.prompt_ids.shape[-1]),
            "response_ids": (B, T), "response_mask": (B, T), "loss_mask": (B, T), "rollout_logp": (B, T),
            "versions": (B, T), "scores": (B,), "truncated": (B,), "turn_tokens": (B,)}
    for name, shape in want.items():
        value = getattr(exp, name)
        if value is not None and (B < 0 or tuple(value.shape) != shape):
            raise ValueError(f"{name} has shape {tuple(value.shape)}, the batch's rows need {shape}")
    for name in ("prompt_ids", "response_ids"):
        ids = getattr(exp, name)
        if ids.dtype != torch.long:
            raise ValueError(f"{name} holds {ids.dtype}, not token ids")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(f"{name} holds token ids outside the vocabulary [0, {vocab})")
    for name in ("rollout_logp", "scores"):
        value = getattr(exp, name)
        if value is not None and not bool(torch.isfinite(value).all()):
            raise ValueError(f"{name} holds values that are not finite")
    if owners is not None:
        owner = exp.owner
        if owner is None or owner.dtype != torch.long or tuple(owner.shape) != (B,) or (
                owner.numel() and (int(owner.min()) < 0 or int(owner.max()) >= owners)):
            raise ValueError(f"the samples before a prefix break name no row of the batch's {owners} (owner)")
