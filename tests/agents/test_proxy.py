"""The recording endpoint (agents/proxy.py) answers whatever it receives (issue 45 item 10): raw
requests on a socket to a running server get an HTTP answer with an OpenAI-shaped JSON error,
never a dropped connection or a traceback on the trainer's console, and the server goes on
serving good requests."""

from __future__ import annotations

import json
import socket

import pytest

from rltune.agents.proxy import ChatProxy


def _answer(port: int, data: bytes) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of the answer to the raw bytes `data`; fails on a dropped connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, f"the connection was dropped without an answer (got {buf[:200]!r})"
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        while len(body) < length:
            chunk = s.recv(65536)
            assert chunk, "the connection was dropped mid-answer"
            body += chunk
    return status, headers, json.loads(body)


def _post(body: bytes, length: str | None = None, path: str = "/e/k/v1/chat/completions") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body) if length is None else length}\r\n\r\n").encode() + body


GOOD = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()


@pytest.fixture
def proxy():
    seen = []

    def chat(key, body):
        seen.append(body)
        return 200, {"ok": True}

    p = ChatProxy(chat)
    p.seen = seen
    yield p
    p.close()


def _deep(n: int) -> bytes:
    return b'{"messages": ' + b"[" * n + b"]" * n + b"}"


@pytest.mark.parametrize("request_bytes, words", [
    (_post(b"{}", length="abc"), "Content-Length"),
    (_post(b"{}", length="-5"), "Content-Length"),
    (_post(_deep(100_000)), "nested"),
    (_post(_deep(600)), "nested"),                    # under the interpreter's recursion limit, over the endpoint's
    (_post(b"\xff\xfe not json"), "not JSON"),
    (_post(b'{"n": ' + b"9" * 5000 + b"}"), "not JSON"),  # past int()'s digit limit
    (b"POST /e/k/v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
     "Content-Length"),
    (b"PUT /e/k/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", "PUT"),
    (b"GARBAGE\r\n\r\n", "request"),
], ids=["length-abc", "length-negative", "deep-100000", "deep-600", "not-utf8", "long-int", "chunked", "put", "garbage-line"])
def test_a_malformed_request_gets_a_json_error_and_the_server_goes_on(proxy, capfd, request_bytes, words):
    status, headers, body = _answer(proxy.port, request_bytes)
    assert 400 <= status < 500 and headers["content-type"] == "application/json"
    assert set(body["error"]) >= {"message", "type", "code"} and words in body["error"]["message"], body
    assert proxy.thread.is_alive()
    status, _, body = _answer(proxy.port, _post(GOOD))
    assert (status, body) == (200, {"ok": True})
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "Exception" not in out + err


def test_a_chat_function_that_raises_is_a_500_with_json_not_a_dropped_connection(capfd):
    def chat(key, body):
        raise RuntimeError("a bug in the endpoint's own code")

    p = ChatProxy(chat)
    try:
        status, _, body = _answer(p.port, _post(GOOD))
        assert status == 500 and "RuntimeError" in body["error"]["message"]
        assert p.thread.is_alive()
    finally:
        p.close()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_a_lone_surrogate_is_replaced_by_u_fffd_before_anything_reads_it(proxy, capfd):
    body = (b'{"messages": [{"role": "user", "content": "a\\ud800b", "name": "\\udcff"}], '
            b'"tools": [{"type": "function", "function": {"name": "f\\ud83d", "description": "\\ud83d\\ude00 ok"}}]}')
    status, _, answer = _answer(proxy.port, _post(body))
    assert (status, answer) == (200, {"ok": True})
    got = proxy.seen[-1]
    assert got["messages"][0]["content"] == "a\ufffdb" and got["messages"][0]["name"] == "\ufffd"
    assert got["tools"][0]["function"]["name"] == "f\ufffd"
    assert got["tools"][0]["function"]["description"] == "\U0001F600 ok"      # a valid pair is one character
    json.dumps(got).encode("utf-8")                                           # encodable: no surrogate left
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_a_client_that_stalls_mid_request_is_cut_and_the_server_goes_on(monkeypatch, capfd):
    """A client that sends half a request and waits (headers or body) holds a thread of the endpoint:
    it is cut after READ_TIMEOUT_S, without a line on the console, and good requests are answered."""
    import time

    from rltune.agents import proxy as proxy_mod

    monkeypatch.setattr(proxy_mod._Handler, "timeout", 0.5)
    p = ChatProxy(lambda key, body: (200, {"ok": True}))
    try:
        stalled = []
        for partial in (b"POST /e/k/v1/chat/completions HTTP/1.1\r\nHost: x\r\n",          # headers never end
                        _post(GOOD)[:-5]):                                                  # body never ends
            s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
            s.sendall(partial)
            stalled.append(s)
        t0 = time.monotonic()
        for s in stalled:
            s.settimeout(10)                              # the endpoint closes it (whatever it sends first)
            while s.recv(65536):
                pass
            s.close()
        assert time.monotonic() - t0 < 5                  # cut at the endpoint's timeout, not the client's 10 s
        assert _answer(p.port, _post(GOOD))[0] == 200
    finally:
        p.close()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "dropped a request" not in out + err
