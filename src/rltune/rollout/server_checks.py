"""What a rollout server answers is checked before it is trained on (docs/rollout-server.md,
"What the trainer checks in its answers").

An attached server (rollout.server.url) is another program, perhaps another version or another
model: its answers are data. A token id outside the vocabulary fails deep in the forward
(IndexError); a NaN or positive log-prob is trained on and the health monitor blames stale
weights; 5,000 tokens for max_tokens 6 are trained on; a weight version beyond int64 overflows
the version tensor. Each is refused here with one line naming the server and the fix. Pure
functions on the decoded JSON (no server needed to test them); standard library only.

At attach, what the server serves (`served_model`: GET /v1/models and dev mode's
GET /server_info) is compared with what the trainer trains (`same_model`, `check_served`): another
model, another dtype (a bf16 server beside an fp32 trainer samples from another distribution than
the one the trainer's ratios use) or a context shorter than prompt + response is refused, with the
`vllm serve` flag that fixes it.
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


# what makes two models the same for the trainer: the weights come from the trainer at every sync,
# so the architecture, the shapes and the vocabulary are what must agree
IDENTITY_KEYS = ("model_type", "architectures", "vocab_size", "hidden_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "intermediate_size", "tie_word_embeddings")


def _short(x, n: int = 200) -> str | None:
    return x[:n] if isinstance(x, str) and x else None


def served_model(models_answer, info_answer=None) -> dict:
    """What an attached server says it serves, from GET /v1/models (`data[0]`: `id`, `root` the
    path or hub id it loaded, `max_model_len`) and dev mode's GET /server_info?config_format=json
    (`vllm_config.model_config`: `model`, `dtype` as "torch.bfloat16", `max_model_len`):
    {"model": str | None, "name": str | None, "dtype": "bfloat16" | None, "max_model_len": int | None}.
    What an answer does not say (or says in another shape) is None: not compared."""
    card = {}
    data = models_answer.get("data") if isinstance(models_answer, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        card = data[0]
    mc = {}
    vc = info_answer.get("vllm_config") if isinstance(info_answer, dict) else None
    if isinstance(vc, dict) and isinstance(vc.get("model_config"), dict):
        mc = vc["model_config"]
    dtype = _short(mc.get("dtype"), 40)
    n = card.get("max_model_len", mc.get("max_model_len"))
    return {"model": _short(card.get("root")) or _short(mc.get("model")), "name": _short(card.get("id")),
            "dtype": dtype.removeprefix("torch.") if dtype else None,
            "max_model_len": n if _is_int(n) and n > 0 else None}


def model_identity(config: dict) -> dict:
    """The IDENTITY_KEYS of a config.json (its text model's, for a config that nests one)."""
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    out = {k: cfg.get(k, config.get(k)) for k in IDENTITY_KEYS}
    if isinstance(out["architectures"], (list, tuple)):
        out["architectures"] = sorted(str(a) for a in out["architectures"])
    return out


def same_model(served: str | None, policy: str, served_config: dict | None, policy_config: dict | None) -> bool | None:
    """Whether the server's model is the policy's: True for the same path or hub id (the caller
    resolves links) or a config.json that agrees on IDENTITY_KEYS (a copy, a snapshot of the same
    model); False for one that does not, or for two different hub ids; None when it cannot be told
    here (the server's path is on another machine, or a hub id against a local directory): not
    refused, and the first weight sync refuses weights whose names or shapes do not fit."""
    if not served:
        return None
    if served == policy:
        return True
    if served_config is not None and policy_config is not None:
        return model_identity(served_config) == model_identity(policy_config)

    def hub_id(s: str) -> bool:
        return not s.startswith(("/", ".", "~")) and s.count("/") == 1

    if hub_id(served) and hub_id(policy):
        return False
    return None


def check_served(url: str, served: dict, policy: str, same: bool | None, dtype: str, precision: str,
                 need_len: int, model_len: int) -> None:
    """Refuse an attached server whose model is not the policy (`same` False), whose dtype is not
    trainer.precision's (`dtype`: "float32", ...), or whose max_model_len is below `need_len`
    (prompt + response): one line naming the server, what it serves and what the trainer trains,
    then the flags to restart it with (`model_len`: the --max-model-len rltune would give it)."""
    fixes = []
    if same is False:
        fixes.append(f"--model {policy}")
    if served.get("dtype") and served["dtype"] != dtype:
        fixes.append(f"--dtype {dtype}")
    if served.get("max_model_len") is not None and served["max_model_len"] < need_len:
        fixes.append(f"--max-model-len {max(model_len, need_len)}")
    if not fixes:
        return
    raise ServerError(f"rollout.server.url {url} serves {served.get('model') or '(a model it does not name)'} in "
                      f"{served.get('dtype') or '(a dtype it does not say)'} with max_model_len "
                      f"{served.get('max_model_len') or '(not said)'}; the trainer trains {policy} in {dtype} "
                      f"(trainer.precision: {precision}) with prompt + response up to {need_len} tokens\n  fix: "
                      f"restart the server with {' '.join(fixes)} (docs/rollout-server.md, attaching)")


__all__ = ["IDENTITY_KEYS", "MAX_VERSION", "check_answer", "check_choice", "check_served", "model_identity",
           "parse_version", "same_model", "served_model"]
