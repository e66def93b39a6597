"""A fleet of rollout servers behind a router in the trainer (`rollout.server.replicas: N` starts N
servers, `rollout.server.urls: [...]` attaches to N running ones; docs/rollout-server.md, "A
fleet of servers"). Each server is a `VLLMServerRollout` (vllm_server.py: its start, secret,
checks and weight transfer); the fleet is the rollout engine the trainer sees.

- **Routing**: each request (one prompt's n samples: a group stays on one server, where its
  prompt's prefix is cached) goes to the live server with the fewest requests in flight (ties:
  the first). A request that continues an earlier one (an episode's next turn: its prompt starts
  with the earlier prompt and response) or repeats its prompt (an episode group's next episode)
  goes where that one went, while that server is live (`Affinity`). Requests carry their own
  seeds (rollout.base.request_seeds), so what they sample does not depend on which server takes
  them.
- **Failover**: a server that fails a request or a weight sync (it died, stopped answering within
  `request_timeout_s`, answered what the checks refuse) is taken out with a warning and closed;
  its request goes to another. The run stops (with the resume command) only when none is left.
- **Weights**: once per sync, gathered once (ZeRO-3: parameter by parameter), each bucket sent to
  every live server, all of them finished with the same version; a server that fails during a
  sync is taken out (it may hold half of the new weights).
- **Several training processes share one fleet** (`trainer.nproc` > 1): rank 0 starts (or
  attaches to) the servers and sends every weight sync; the other ranks route their own share of
  the prompts to the same servers (`peers`: generation only, with the servers' secrets from rank
  0) and join the sync's gathers; after each sync rank 0 tells them the version and which servers
  are still in the fleet. A fleet shared by ranks does not sleep (a rank may be generating while
  another trains).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..train.collective import broadcast_object
from .base import Sampling
from .server import ServerError
from .server_io import experience_of, weight_buckets
from .vllm_server import RESUME_FIX


class Affinity:
    """Which server took which token sequences lately (a request's prompt, and each of its samples'
    prompt + response): a later prompt that starts with one of them goes to the same server, where
    its prefix is cached. Looked up in time linear in the prompt (prefix hashes, one per position);
    at most `size` sequences are kept, the oldest forgotten first."""

    MOD, BASE = (1 << 61) - 1, 1_000_003

    def __init__(self, size: int = 8192):
        from collections import OrderedDict

        self.size, self.seen = size, OrderedDict()     # (length, hash) -> server
        self.lengths: dict[int, int] = {}              # length -> sequences kept of it

    def _prefix_hashes(self, ids) -> list[int]:
        h, out = 0, [0]
        for t in ids:
            h = (h * self.BASE + int(t) + 1) % self.MOD
            out.append(h)
        return out

    def remember(self, ids, server) -> None:
        key = (len(ids), self._prefix_hashes(ids)[-1])
        if key not in self.seen:
            self.lengths[key[0]] = self.lengths.get(key[0], 0) + 1
        self.seen[key] = server
        self.seen.move_to_end(key)
        while len(self.seen) > self.size:
            (n, _), _ = self.seen.popitem(last=False)
            self.lengths[n] -= 1
            if not self.lengths[n]:
                del self.lengths[n]

    def lookup(self, prompt, live) -> object | None:
        """The server of the longest remembered sequence the prompt starts with, if live."""
        hashes = self._prefix_hashes(prompt)
        for n in sorted((n for n in self.lengths if n <= len(prompt)), reverse=True):
            server = self.seen.get((n, hashes[n]))
            if server is not None and server in live:
                return server
        return None


class ServerFleet:
    name = "vllm-server"

    def __init__(self, replicas: list, warn=None, rank: int = 0, world_size: int = 1):
        self.replicas, self.live = list(replicas), list(replicas)
        self.warn = warn or (lambda line: None)
        self.rank, self.world = int(rank), int(world_size)
        first = self.replicas[0]
        self.eos_ids, self.pad_id = first.eos_ids, first.pad_id
        self.version = max(int(r.version) for r in self.replicas)   # syncs number on together
        for r in self.replicas:
            r.version = self.version
        self.in_flight = {id(r): 0 for r in self.replicas}
        self.affinity = Affinity()
        self.lock = threading.Lock()
        width = sum(r.pool._max_workers for r in self.replicas)
        self.pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="rltune-fleet")
        self.each_pool = ThreadPoolExecutor(max_workers=len(self.replicas), thread_name_prefix="rltune-fleet-sync")
        self.taken_out: list[str] = []
        self.last_sync_ms: float | None = None

    # -- what the trainer reads --
    @property
    def base_url(self) -> str:
        return ", ".join(r.base_url for r in self.replicas)

    @property
    def process(self):
        """None when every server is attached (the engine line says so)."""
        return next((r.process for r in self.replicas if r.process is not None), None)

    @property
    def log(self):
        return ", ".join(str(r.log) for r in self.replicas if r.log is not None) or None

    @property
    def init_s(self) -> float:
        return max(r.init_s for r in self.replicas)

    @property
    def kv_cache_line(self) -> str:
        return self.replicas[0].kv_cache_line

    @property
    def stale_samples(self) -> int:
        return sum(r.stale_samples for r in self.replicas)

    @stale_samples.setter
    def stale_samples(self, value: int) -> None:
        for r in self.replicas:
            r.stale_samples = 0
        self.replicas[0].stale_samples = int(value)

    @property
    def pause_mode(self) -> str:
        return self.replicas[0].pause_mode

    def keep_requests_across_syncs(self) -> None:
        for r in self.replicas:
            r.keep_requests_across_syncs()

    # -- the fleet's own --
    def _take_out(self, replica, err: BaseException) -> None:
        with self.lock:
            if replica not in self.live:
                return
            self.live.remove(replica)
            left = len(self.live)
        why = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        self.taken_out.append(replica.base_url)
        self.warn(f"rollout server {replica.base_url} taken out of the fleet: {why}; "
                  f"{left} of {len(self.replicas)} left" + (f" (its log: {replica.log})" if replica.log else ""))
        try:
            replica.close()
        except Exception:  # noqa: BLE001 - it is gone either way
            pass

    def _none_left(self) -> ServerError:
        what = ("see why the rollout servers stopped (their logs: " + (self.log or "none") + ")"
                if self.process is not None else "see why the servers at rollout.server.urls stopped, restart them")
        return ServerError(f"every rollout server of the fleet is out ({', '.join(self.taken_out)})\n"
                           + RESUME_FIX.format(what=what))

    def _routed(self, prompt: list[int], params: dict, sampling: Sampling) -> list[tuple]:
        """One request on the least-loaded live server; on another when that one fails."""
        while True:
            with self.lock:
                if not self.live:
                    raise self._none_left()
                replica = (self.affinity.lookup(prompt, self.live)
                           or min(self.live, key=lambda r: self.in_flight[id(r)]))
                self.in_flight[id(replica)] += 1
                self.affinity.remember(prompt, replica)
            try:
                samples = replica.request(prompt, params, sampling)
                with self.lock:
                    for ids, _, _ in samples:
                        self.affinity.remember(list(prompt) + list(ids), replica)
                return samples
            except ServerError as err:
                self._take_out(replica, err)
            finally:
                with self.lock:
                    self.in_flight[id(replica)] -= 1

    def _each(self, fn) -> None:
        """fn(server) on every live server at once; one that fails is taken out."""
        live = list(self.live)
        futures = [(r, self.each_pool.submit(fn, r)) for r in live]
        for r, f in futures:
            err = f.exception()
            if isinstance(err, ServerError):
                self._take_out(r, err)
            elif err is not None:
                raise err
        if not self.live:
            raise self._none_left()

    # -- the engine --
    def generate(self, prompt_ids: list[list[int]], sampling: Sampling):
        if not self.live:
            raise self._none_left()
        params = self.live[0].check_call(prompt_ids, sampling)
        self._each(lambda r: r.wake_up())
        answers = list(self.pool.map(lambda i: self._routed(prompt_ids[i], params[i], sampling), range(len(prompt_ids))))
        return experience_of(prompt_ids, answers, sampling, self.pad_id, self.eos_ids)

    def sync_weights(self, actor) -> float:
        """The actor's weights, gathered once, to every live server; the same version on each.
        Several ranks: rank 0 sends, the others join its gathers and then learn the outcome."""
        t0 = time.perf_counter()
        version = self.version + 1
        if self.rank > 0:
            for _ in self.replicas[0].adaptation.full_weights(actor):   # the gathers every rank joins (ZeRO-3)
                pass
            self._follow(broadcast_object(None))
            self.last_sync_ms = (time.perf_counter() - t0) * 1000.0
            return self.last_sync_ms
        try:
            self._sync(actor, version)
        finally:
            if self.world > 1:   # the version and the servers still in the fleet, to the other ranks
                broadcast_object({"version": self.version, "live": [r.base_url for r in self.live]})
        self.last_sync_ms = (time.perf_counter() - t0) * 1000.0
        return self.last_sync_ms

    def _follow(self, outcome: dict) -> None:
        """A rank > 0 after rank 0's sync: its version, and the servers rank 0 took out."""
        self.version = int(outcome["version"])
        for r in self.replicas:
            r.version, r.expected_version = self.version, str(self.version)
        gone = [r for r in self.live if r.base_url not in set(outcome["live"])]
        for r in gone:
            self._take_out(r, ServerError("rank 0 took it out of the fleet"))
        if not self.live:
            raise self._none_left()

    def _sync(self, actor, version: int) -> None:
        self._each(lambda r: r.begin_sync())
        try:
            buckets = weight_buckets(self.replicas[0], actor)
            try:
                for bucket in buckets:
                    self._each(lambda r: r._send_bucket(bucket))
            except ServerError:
                for _ in buckets:   # none left: the other ranks still gather with this one
                    pass
                raise
            self._each(lambda r: r.finish_sync(version))
        finally:
            if self.live:
                self._each(lambda r: r._post("/resume"))
        if self.pause_mode != "keep":
            self._each(lambda r: r._post("/reset_prefix_cache"))
        self.version = version

    def sleep(self) -> None:
        if self.world == 1:   # shared by ranks: another rank may be generating now
            self._each(lambda r: r.sleep())

    def wake_up(self) -> None:
        self._each(lambda r: r.wake_up())

    def peers(self) -> list[tuple]:
        """What the other ranks need to use this rank's servers: (url, secret, api, version label)."""
        return [(r.base_url, r.secret, r.api, r.expected_version) for r in self.replicas]

    def close(self) -> None:
        for r in self.replicas:
            try:
                r.close()
            except Exception:  # noqa: BLE001 - close every one
                pass
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.each_pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["ServerFleet"]
