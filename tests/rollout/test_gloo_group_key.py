"""The gloo weight-transfer group's keys carry a per-run secret (vllm_gloo_transfer.join_group): the
store listens on every interface, and one who reaches it without the key cannot take a rank in the
group; members with the key form it and broadcast. Real TCPStore and gloo groups on localhost."""

from __future__ import annotations

import threading

import pytest
import torch


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join_then_receive(port, key, out, timeout_s):
    pytest.importorskip("vllm")
    from rltune.rollout.vllm_gloo_transfer import broadcast, join_group

    try:
        _, group = join_group("127.0.0.1", port, 1, 2, timeout_s, is_master=False, key=key)
        buf = torch.zeros(4, dtype=torch.uint8)
        broadcast(group, buf).wait()
        out["got"] = buf.tolist()
    except Exception as err:  # noqa: BLE001 - the outcome under test
        out["error"] = type(err).__name__


def test_a_member_without_the_runs_key_cannot_join_and_one_with_it_receives():
    pytest.importorskip("vllm")
    from rltune.rollout.vllm_gloo_transfer import broadcast, join_group

    port = _free_port()
    key = "0123456789abcdef"
    intruder, member = {}, {}
    t_bad = threading.Thread(target=_join_then_receive, args=(port, "guessed", intruder, 3.0))
    t_good = threading.Thread(target=_join_then_receive, args=(port, key, member, 20.0))
    store_ready = threading.Event()

    def master(out):
        try:
            out["pair"] = join_group("127.0.0.1", port, 0, 2, 20.0, is_master=True, key=key)
        finally:
            store_ready.set()

    trainer: dict = {}
    t_master = threading.Thread(target=master, args=(trainer,))
    t_master.start()
    t_bad.start()            # the intruder comes first: it must not take rank 1
    t_bad.join()
    assert "error" in intruder and "got" not in intruder, intruder
    t_good.start()
    t_master.join()
    _, group = trainer["pair"]
    broadcast(group, torch.tensor([1, 2, 3, 4], dtype=torch.uint8)).wait()
    t_good.join()
    assert member == {"got": [1, 2, 3, 4]}, member
