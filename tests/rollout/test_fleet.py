"""The fleet's router (rollout/fleet.py) on its own, with replicas that answer from Python: least
loaded first, a failing replica taken out with its request served elsewhere, weights gathered once
and finished with one version on every replica, and the stop with the resume command when none is
left. The fleet with real vLLM servers: tests/vllm/test_vllm_fleet.py."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rltune.rollout.base import Sampling
from rltune.rollout.fleet import ServerFleet
from rltune.rollout.server import ServerError


class Replica:
    def __init__(self, url, version=0, fail=False, delay=0.0):
        self.base_url, self.version, self.fail, self.delay = url, version, fail, delay
        self.eos_ids, self.pad_id = {0}, 0
        self.pool = ThreadPoolExecutor(max_workers=4)
        self.process = self.log = None
        self.init_s, self.kv_cache_line, self.stale_samples, self.pause_mode = 1.0, "", 0, "wait"
        self.served, self.calls, self.closed, self.buckets = [], [], False, []
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        # what weight_buckets reads from the first replica
        self.adaptation = self
        self.tied_embeddings, self.transfer, self.sync_bucket_bytes = False, "file", 1

    def full_weights(self, actor):
        actor["gathered"] += 1
        yield from actor["weights"].items()

    def check_call(self, prompt_ids, sampling):
        return [{"n": sampling.n}] * len(prompt_ids)

    def request(self, prompt, params, sampling):
        if self.fail:
            raise ServerError(f"{self.base_url}: connection refused: nothing listens there")
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        time.sleep(self.delay)
        with self.lock:
            self.in_flight -= 1
        self.served.append(tuple(prompt))
        return [([prompt[-1] + 1, 0], [-0.5, -0.1], [self.version, self.version])] * sampling.n

    def wake_up(self):
        pass

    def sleep(self):
        pass

    def begin_sync(self):
        self.calls.append("begin")

    def _send_bucket(self, bucket):
        if self.fail:
            raise ServerError(f"{self.base_url}: the server closed the connection")
        self.buckets.append(sorted(bucket))

    def finish_sync(self, version):
        self.calls.append(f"finish {version}")
        self.version = version

    def _post(self, route, body=None):
        self.calls.append(route)

    def close(self):
        self.closed = True


def test_requests_go_to_the_least_loaded_and_a_group_stays_on_one():
    a, b = Replica("http://a", delay=0.05), Replica("http://b", delay=0.05)
    fleet = ServerFleet([a, b])
    prompts = [[1, i] for i in range(8)]
    exp = fleet.generate(prompts, Sampling(n=3, max_new_tokens=2))
    assert exp.response_ids.shape == (24, 2)
    assert exp.response_ids[:, 0].tolist() == [i + 1 for i in range(8) for _ in range(3)]   # prompt-major
    assert len(a.served) == len(b.served) == 4            # balanced: each took the next while the other was busy
    assert sorted(a.served + b.served) == sorted(map(tuple, prompts))   # each group one request, on one server


def test_a_failing_replica_is_taken_out_and_its_requests_served_elsewhere():
    warned = []
    a, b = Replica("http://a", fail=True), Replica("http://b")
    fleet = ServerFleet([a, b], warn=warned.append)
    exp = fleet.generate([[1, 2], [1, 3]], Sampling(n=2, max_new_tokens=2))
    assert exp.response_ids[:, 0].tolist() == [3, 3, 4, 4] and len(b.served) == 2
    assert fleet.live == [b] and a.closed
    (line,) = warned
    assert "http://a taken out of the fleet: http://a: connection refused" in line and "1 of 2 left" in line


def test_weights_are_gathered_once_and_every_replica_gets_the_same_version():
    a, b, c = Replica("http://a", version=3), Replica("http://b", version=5), Replica("http://c")
    fleet = ServerFleet([a, b, c])
    assert fleet.version == 5
    actor = {"gathered": 0, "weights": {"w1": torch.ones(2), "w2": torch.zeros(3)}}
    fleet.sync_weights(actor)
    assert actor["gathered"] == 1
    for r in (a, b, c):
        assert r.calls == ["begin", "finish 6", "/resume", "/reset_prefix_cache"] and r.buckets == [["w1"], ["w2"]]
    assert fleet.version == 6 and a.version == b.version == c.version == 6


def test_a_replica_failing_mid_sync_is_taken_out_and_the_rest_finish():
    a, b = Replica("http://a"), Replica("http://b")
    fleet = ServerFleet([a, b], warn=lambda line: None)
    a.fail = True
    fleet.sync_weights({"gathered": 0, "weights": {"w": torch.ones(1)}})
    assert fleet.live == [b] and b.version == 1 and "finish 1" not in a.calls


def test_none_left_stops_with_the_resume_command():
    fleet = ServerFleet([Replica("http://a", fail=True), Replica("http://b", fail=True)], warn=lambda line: None)
    with pytest.raises(ServerError) as err:
        fleet.generate([[1, 2]], Sampling(n=1, max_new_tokens=2))
    text = str(err.value)
    assert "every rollout server of the fleet is out (http://" in text and "--resume auto" in text


def test_an_episodes_next_turn_and_its_groups_next_episode_go_where_it_went():
    a, b = Replica("http://a"), Replica("http://b")
    fleet = ServerFleet([a, b])
    fleet.generate([[1, 2, 3]], Sampling(n=1, max_new_tokens=2))      # turn 1 of an episode: to a (ties: the first)
    assert a.served == [(1, 2, 3)]
    fleet.in_flight[id(a)] = 5                                       # a is busier now
    # its next turn: the prompt, the reply a sampled ([4, 0]), the environment's tokens
    fleet.generate([[1, 2, 3, 4, 0, 9, 9]], Sampling(n=1, max_new_tokens=2))
    fleet.generate([[1, 2, 3]], Sampling(n=1, max_new_tokens=2))      # the group's next episode: same prompt
    assert a.served == [(1, 2, 3), (1, 2, 3, 4, 0, 9, 9), (1, 2, 3)] and b.served == []
    fleet.generate([[7, 7]], Sampling(n=1, max_new_tokens=2))         # a new prompt: the least loaded
    assert b.served == [(7, 7)]
    fleet._take_out(a, ServerError("gone"))                            # affinity never outlives its server
    fleet.generate([[1, 2, 3, 4, 0, 9, 9, 5]], Sampling(n=1, max_new_tokens=2))
    assert b.served[-1] == (1, 2, 3, 4, 0, 9, 9, 5)


def test_affinity_forgets_the_oldest_and_looks_up_the_longest():
    from rltune.rollout.fleet import Affinity

    aff = Affinity(size=2)
    aff.remember([1, 2], "x")
    aff.remember([1, 2, 3, 4], "y")
    assert aff.lookup([1, 2, 3, 4, 5], {"x", "y"}) == "y" and aff.lookup([1, 2, 9], {"x", "y"}) == "x"
    assert aff.lookup([1, 2, 3, 4, 5], {"x"}) == "x"                   # y not live: the next longest
    aff.remember([5], "z")                                             # over size: [1, 2] forgotten
    assert aff.lookup([1, 2, 9], {"x", "y", "z"}) is None and aff.lengths == {4: 1, 1: 1}
