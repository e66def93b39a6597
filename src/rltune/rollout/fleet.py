"""A fleet of rollout servers behind a router in the trainer (`rollout.server.replicas: N` starts N
servers, `rollout.server.urls: [...]` attaches to N running ones; docs/rollout-server.md, "A
fleet of servers"). Each server is a `VLLMServerRollout` (vllm_server.py: its start, secret,
checks and weight transfer); the fleet is the rollout engine the trainer sees.

- **Routing**: each request (one prompt's n samples: a group stays on one server, where its
  prompt's prefix is cached) goes to the live server with the fewest requests in flight (ties:
  the first). Requests carry their own seeds (rollout.base.request_seeds), so what they sample
  does not depend on which server takes them.
- **Failover**: a server that fails a request or a weight sync (it died, stopped answering within
  `request_timeout_s`, answered what the checks refuse) is taken out with a warning and closed;
  its request goes to another. The run stops (with the resume command) only when none is left.
- **Weights**: once per sync, gathered once (ZeRO-3: parameter by parameter), each bucket sent to
  every live server, all of them finished with the same version; a server that fails during a
  sync is taken out (it may hold half of the new weights).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .base import Sampling
from .server import ServerError
from .server_io import experience_of, weight_buckets
from .vllm_server import RESUME_FIX


class ServerFleet:
    name = "vllm-server"

    def __init__(self, replicas: list, warn=None):
        self.replicas, self.live = list(replicas), list(replicas)
        self.warn = warn or (lambda line: None)
        first = self.replicas[0]
        self.eos_ids, self.pad_id = first.eos_ids, first.pad_id
        self.version = max(int(r.version) for r in self.replicas)   # syncs number on together
        for r in self.replicas:
            r.version = self.version
        self.in_flight = {id(r): 0 for r in self.replicas}
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
                replica = min(self.live, key=lambda r: self.in_flight[id(r)])
                self.in_flight[id(replica)] += 1
            try:
                return replica.request(prompt, params, sampling)
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
        """The actor's weights, gathered once, to every live server; the same version on each."""
        t0 = time.perf_counter()
        version = self.version + 1
        self._each(lambda r: r.begin_sync())
        try:
            for bucket in weight_buckets(self.replicas[0], actor):
                self._each(lambda r: r._send_bucket(bucket))
            self._each(lambda r: r.finish_sync(version))
        finally:
            if self.live:
                self._each(lambda r: r._post("/resume"))
        if self.pause_mode != "keep":
            self._each(lambda r: r._post("/reset_prefix_cache"))
        self.version = version
        self.last_sync_ms = (time.perf_counter() - t0) * 1000.0
        return self.last_sync_ms

    def sleep(self) -> None:
        self._each(lambda r: r.sleep())

    def wake_up(self) -> None:
        self._each(lambda r: r.wake_up())

    def close(self) -> None:
        for r in self.replicas:
            try:
                r.close()
            except Exception:  # noqa: BLE001 - close every one
                pass
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.each_pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["ServerFleet"]
