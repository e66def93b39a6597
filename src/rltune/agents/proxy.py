"""The OpenAI-compatible endpoint an `agent` environment talks to (docs/agents.md, "Agents").

An agent is ordinary code written against the OpenAI client: `run(client, row) -> reward`. In
training rltune gives it a client whose base URL is this small HTTP server on 127.0.0.1, one URL
per episode (`/e/<key>/v1`). The server turns each chat-completions request into token ids, asks
the rollout engine for the next turn and answers as an OpenAI endpoint would; the trainer keeps
the exact ids and log-probs (train/agent_episodes.py). The same agent runs unchanged against a
real endpoint outside training.

This module is the wire: HTTP, the request's messages normalised, the reply built (tool calls
parsed from the sampled text into `message.tool_calls` when the request offered tools).
Standard library only. What it serves:

    POST /e/<key>/v1/chat/completions   non-streaming, n = 1; sampling settings are the recipe's
    GET  /e/<key>/v1/models             one model, "policy"

Errors have OpenAI's shape ({"error": {"message", "type", "code"}}), so the client raises them.
Whatever arrives is answered, never dropped with a traceback: a bad Content-Length, a chunked body,
a body that is not JSON or nests deeper than MAX_DEPTH, a request line http.server refuses (4xx);
a failure of the trainer's side (500). Lone UTF-16 surrogates in the request's strings become
U+FFFD before anything reads them (docs/agents.md says why).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from .rendering import SURROGATE, clean_text
from .tools import CLOSE, OPEN, parse_tool_calls

LOG = logging.getLogger("rltune")
MAX_BODY = 64 << 20          # a request larger than this is refused (413)
READ_TIMEOUT_S = 300.0   # a stalled client's read (headers or body) ends after this many seconds
MAX_DEPTH = 64               # JSON nested deeper than this is refused (400): a chat request nests ~10 levels
MODEL_ID = "policy"


class BadRequest(Exception):
    """A request the proxy will not serve: the message goes back to the agent as a 400."""


# ---------------------------------------------------------------- requests

def read_body(raw: bytes):
    """The JSON value of a request body, with every lone UTF-16 surrogate in its strings (keys
    too) replaced by U+FFFD (see `clean_text`); BadRequest for a body that is not JSON or nests
    deeper than MAX_DEPTH levels (a 100,000-deep array exhausts no stack here: the parser's
    RecursionError is caught, and what parses is walked without recursion)."""
    try:
        value = json.loads(raw or b"{}")
    except RecursionError:
        raise BadRequest(f"the request body's JSON is nested too deeply (more than {MAX_DEPTH} levels)") from None
    except ValueError as err:   # UnicodeDecodeError, an integer past 4,300 digits included
        raise BadRequest(f"the request body is not JSON (UTF-8): {str(err)[:160]}") from None
    root = [value]
    stack = [(root, 0, 0)]           # (container, key or index, depth of the value there)
    while stack:
        holder, k, depth = stack.pop()
        v = holder[k]
        if isinstance(v, str):
            holder[k] = clean_text(v)
        elif isinstance(v, (list, dict)):
            if depth >= MAX_DEPTH:
                raise BadRequest(f"the request body's JSON is nested too deeply (more than {MAX_DEPTH} levels)")
            if isinstance(v, dict) and any(SURROGATE.search(key) for key in v):
                v = holder[k] = {clean_text(key): item for key, item in v.items()}
            stack.extend((v, j, depth + 1) for j in (v if isinstance(v, dict) else range(len(v))))
    return root[0]


def request_messages(body: dict) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) of a chat-completions request, normalised: each message a dict with a
    str role and a str content (text parts joined), assistant tool calls as
    [{"id", "type": "function", "function": {"name", "arguments": dict}}] (what chat templates
    read). BadRequest for what the proxy does not serve (streaming, n > 1, images)."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    if body.get("stream"):
        raise BadRequest("streaming is not supported by rltune's training endpoint: call without stream=True")
    if body.get("n", 1) not in (1, None):
        raise BadRequest("n must be 1: rltune samples one completion per request (group_size sets how many "
                         "episodes each row gets)")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("`messages` must be a non-empty list")
    messages = [normalise_message(m, i) for i, m in enumerate(raw)]
    tools = body.get("tools") or None
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise BadRequest("`tools` must be a list of {\"type\": \"function\", \"function\": {...}} objects")
    return messages, tools


def normalise_message(m, i: int = 0) -> dict:
    """One message of a request (the i-th), normalised as `request_messages` says."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise BadRequest(f"messages[{i}] is not an object with a str `role`")
    out = {"role": m["role"], "content": _text(m.get("content"), i)}
    for key in ("name", "tool_call_id"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    calls = m.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            raise BadRequest(f"messages[{i}].tool_calls must be a list")
        out["tool_calls"] = [_call(c, i) for c in calls]
    return out


def _text(content, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise BadRequest(f"messages[{i}] has a content part that is not text: only text is supported")
            parts.append(p["text"])
        return "".join(parts)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts")


def _call(c, i: int) -> dict:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest(f"messages[{i}] has a tool call without function.name")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            pass          # kept as the text it was: it only matters for rendering
    return {"id": str(c.get("id", "")), "type": "function", "function": {"name": fn["name"], "arguments": args}}


def same_message(a: dict, b: dict) -> bool:
    """Whether two normalised assistant messages say the same (content and tool calls; ids aside)."""
    def key(m):
        return (m.get("content") or "").strip(), [(c["function"]["name"], c["function"]["arguments"])
                                                  for c in m.get("tool_calls") or []]
    return key(a) == key(b)


# ---------------------------------------------------------------- replies

def reply_message(text: str, offer_tools: bool, call_prefix: str) -> tuple[dict, int, bool]:
    """(assistant message, tool calls made, unparseable call) for the sampled text. With tools
    offered, `<tool_call>` blocks become `tool_calls` (ids `call_prefix`-N) and the rest is the
    content; a call that cannot be read stays in the content, as text."""
    message = {"role": "assistant", "content": text}
    if not offer_tools:
        return message, 0, False
    calls, why = parse_tool_calls(text)
    if why is not None or not calls:
        return message, 0, why is not None
    rest = ""                     # the text around the <tool_call> blocks (a bare JSON call has none)
    if OPEN in text:
        tail = text.rpartition(CLOSE)[2] if CLOSE in text else ""
        rest = f"{text.partition(OPEN)[0].strip()} {tail.strip()}".strip()
    message["content"] = rest or None
    message["tool_calls"] = [{"id": f"{call_prefix}-{j}", "type": "function",
                              "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                             for j, c in enumerate(calls)]
    return message, len(calls), False


def completion(message: dict, finish: str, prompt_tokens: int, completion_tokens: int, rid: str) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": MODEL_ID,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def error(message: str, code: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": code, "code": code, "param": None}}


# ---------------------------------------------------------------- the server

class ChatProxy:
    """The HTTP server; `chat(key, body) -> (status, json)` answers each request (called in the
    request's own thread). Bound to 127.0.0.1 on a free port; `close()` stops it."""

    def __init__(self, chat: Callable[[str, dict], tuple[int, dict]]):
        handler = type("Handler", (_Handler,), {"chat": staticmethod(chat)})
        self.server = _Server(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name="rltune-agent-proxy", daemon=True)
        self.thread.start()

    def url(self, key: str) -> str:
        return f"http://127.0.0.1:{self.port}/e/{key}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024      # every episode's agent connects at once (the default backlog is 5)

    def handle_error(self, request, client_address) -> None:
        """Last resort (the handler answers everything it can): one log line, never a traceback
        on the trainer's console; a client that hung up is not worth a line."""
        import sys

        err = sys.exc_info()[1]
        if not isinstance(err, (ConnectionError, TimeoutError)):
            LOG.warning("the agent endpoint dropped a request: %s: %s", type(err).__name__, str(err)[:200])


class _Handler(BaseHTTPRequestHandler):
    timeout = READ_TIMEOUT_S           # a client that stalls mid-request (or idles on a kept-alive connection) is cut
    protocol_version = "HTTP/1.1"
    default_request_version = "HTTP/1.1"   # a request line it cannot read is answered with a status line and headers too
    disable_nagle_algorithm = True     # headers and body are two writes: no 40 ms delayed-ACK wait between them
    chat: Callable

    def log_message(self, *args) -> None:   # no access log on the trainer's console
        pass

    def _route(self) -> tuple[str | None, str]:
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if len(parts) >= 3 and parts[0] == "e" and parts[2] == "v1":
            return parts[1], "/".join(parts[3:])
        return None, ""

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()      # ASCII: a surrogate left in a payload is escaped, never raised on
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a bad request line, headers too long, an unknown method) in
        OpenAI's JSON shape, not HTML; the connection is closed after them."""
        self.close_connection = True
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "error"
        if code == HTTPStatus.NOT_IMPLEMENTED and getattr(self, "command", None) not in (None, "GET", "POST"):
            code, message = 405, f"rltune's endpoint serves GET and POST only, not {self.command}"
        self._send(code, error(f"{message or phrase} (HTTP {code})", "not_found" if code == 404 else "invalid_request_error"))

    def _refuse(self, status: int, message: str) -> None:
        """An answer after which the connection is closed (its body was not read: the stream's
        state is unknown)."""
        self.close_connection = True
        self._send(status, error(message))

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        key, rest = self._route()
        if key is not None and rest == "models":
            self._send(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "rltune"}]})
        else:
            self._send(404, error(f"no route GET {self.path}", "not_found"))

    def do_POST(self) -> None:  # noqa: N802
        key, rest = self._route()
        if self.headers.get("Transfer-Encoding"):
            self._refuse(411, "send the body with a Content-Length header (Transfer-Encoding is not supported)")
            return
        text = self.headers.get("Content-Length") or "0"
        if not (text.isascii() and text.strip().isdigit()):
            self._refuse(400, f"the Content-Length header {text[:40]!r} is not a number of bytes")
            return
        length = int(text)
        if length > MAX_BODY:
            self._refuse(413, f"request body over {MAX_BODY >> 20} MiB")
            return
        raw = self.rfile.read(length)
        if len(raw) < length:                # the client hung up mid-body: nobody to answer
            self.close_connection = True
            return
        if key is None or rest != "chat/completions":
            self._send(404, error(f"no route POST {self.path}: rltune serves /e/<episode>/v1/chat/completions",
                                  "not_found"))
            return
        try:
            body = read_body(raw)
        except BadRequest as err:
            self._send(400, error(str(err)))
            return
        try:
            status, payload = self.chat(key, body)
        except Exception as err:  # noqa: BLE001 - a bug on the trainer's side: the agent gets an answer, the log a line
            LOG.warning("the agent endpoint failed on a request of episode %s: %s: %s", key, type(err).__name__,
                        str(err)[:200])
            status, payload = 500, error(f"rltune's endpoint failed: {type(err).__name__}: {str(err)[:200]}",
                                         "server_error")
        self._send(status, payload)


__all__ = ["BadRequest", "ChatProxy", "completion", "error", "normalise_message", "read_body",
           "reply_message", "request_messages", "same_message"]
