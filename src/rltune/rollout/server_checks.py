"""What a rollout server answers is checked before it is trained on (docs/rollout-server.md,
"What the trainer checks in its answers").

An attached server (rollout.server.url) is another program, perhaps another version or another
model: its answers are data. A token id outside the vocabulary fails deep in the forward
(IndexError); a NaN or positive log-prob is trained on and the health monitor blames stale
weights; 5,000 tokens for max_tokens 6 are trained on; a weight version beyond int64 overflows
the version tensor. Each is refused here with one line naming the server and the fix. Pure
functions on the decoded JSON (no server needed to test them); standard library only.
"""

from __future__ import annotations

import math

from .server import ServerError

MAX_VERSION = 2 ** 62      # weight versions are int64 tensors; rltune's own count never gets near
LOGP_SLACK = 1e-4          # a log-prob above 0 by more than float rounding is no log-prob
FIX = "fix: attach a server started as docs/rollout-server.md says (the same model, rltune's launcher)"


def _refuse(url: str | None, what: str) -> ServerError:
    return ServerError(f"the rollout server at {url or '(unknown)'} {what}\n  {FIX}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_version(label, url: str | None = None) -> int:
    """A weight version label (rltune's sync numbers; anything else, e.g. vLLM's "default" for the
    weights it loaded, is version 0). A number beyond int64's range is refused."""
    text = str(label)[:64] if label is not None else ""
    if not (text.isascii() and text.isdigit()):
        return 0
    v = int(text)
    if v > MAX_VERSION or len(str(label)) > 64:
        raise _refuse(url, f"reported weight version {text[:24]}..., beyond what a version can be (at most 2^62)")
    return v


def check_answer(answer, n: int, max_tokens: int, vocab_size: int | None, url: str | None) -> list[dict]:
    """The `n` choices of one `/inference/v1/generate` answer, in index order, each checked by
    `check_choice`; ServerError when the answer is not what was asked."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        raise _refuse(url, "answered a generate request without a list of choices")
    if len(choices) != n:
        raise _refuse(url, f"returned {len(choices)} samples for a prompt, asked for {n}")
    if any(not _is_int(c.get("index", 0)) for c in choices):
        raise _refuse(url, "returned a sample whose index is not an integer")
    choices = sorted(choices, key=lambda c: c.get("index", 0))
    for c in choices:
        check_choice(c, max_tokens, vocab_size, url)
    return choices


def check_choice(choice: dict, max_tokens: int, vocab_size: int | None, url: str | None) -> None:
    """One sample: token ids in [0, vocab_size), at most `max_tokens` of them, one finite log-prob
    <= 0 per token, weight-version spans of integers with versions in range."""
    ids = choice.get("token_ids") or []
    if not isinstance(ids, list) or not all(_is_int(t) for t in ids):
        raise _refuse(url, "returned token ids that are not a list of integers")
    if len(ids) > max_tokens:
        raise _refuse(url, f"returned {len(ids)} tokens for a sample limited to max_tokens {max_tokens}")
    bad = next((t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size)), None)
    if bad is not None:
        raise _refuse(url, f"returned token id {bad}, outside the policy's vocabulary (0 to {(vocab_size or 0) - 1}): "
                           "is it serving rollout's model?")
    content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    if not isinstance(content, list) or len(content) != len(ids):
        got = len(content) if isinstance(content, list) else "no"
        raise _refuse(url, f"returned {got} log-probs for {len(ids)} tokens (it must run with --logprobs-mode "
                           "processed_logprobs)")
    for i, entry in enumerate(content):
        lp = entry.get("logprob") if isinstance(entry, dict) else None
        if not isinstance(lp, (int, float)) or isinstance(lp, bool) or not math.isfinite(lp) or lp > LOGP_SLACK:
            raise _refuse(url, f"returned log-prob {lp!r} for token {i} of a sample; a log-prob is a finite number "
                               "<= 0")
    spans = choice.get("weight_versions") or []
    if not isinstance(spans, list) or not all(isinstance(s, dict) for s in spans):
        raise _refuse(url, "returned weight_versions that are not a list of spans")
    for s in spans:
        if not all(_is_int(s.get(k, 0)) for k in ("start", "end")):
            raise _refuse(url, "returned a weight-version span whose start or end is not an integer")
        parse_version(s.get("version"), url)


__all__ = ["MAX_VERSION", "check_answer", "check_choice", "parse_version"]
