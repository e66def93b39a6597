"""An attached server's answers are checked before they are trained on (issue 45 item 9):
hand-built answers, no server. Each refusal is one line naming the server, then the fix; and
the lint rule for who may reach a started server (server-remote-access)."""

from __future__ import annotations

import math

import pytest

from rltune.rollout.server import ServerError
from rltune.rollout.server_checks import check_answer, parse_version
from rltune.rollout.vllm_api import token_versions

URL = "http://10.0.0.7:8000"


def _choice(ids=(5, 6, 7), logps=None, index=0, spans=None):
    logps = [-0.5] * len(ids) if logps is None else logps
    c = {"index": index, "token_ids": list(ids), "logprobs": {"content": [{"logprob": x} for x in logps]}}
    if spans is not None:
        c["weight_versions"] = spans
    return c


def _refused(answer, n=1, max_tokens=6, vocab=100) -> str:
    with pytest.raises(ServerError) as e:
        check_answer(answer, n, max_tokens, vocab, URL)
    msg = str(e.value)
    head, fix = msg.split("\n")
    assert head.startswith(f"the rollout server at {URL} ") and fix.strip().startswith("fix: ")
    assert "probably a bug" not in msg
    return head


def test_a_good_answer_passes_in_index_order():
    answer = {"choices": [_choice((8,), index=1), _choice((5, 6), index=0, spans=[{"version": "2", "start": 0, "end": 2}])]}
    got = check_answer(answer, 2, 6, 100, URL)
    assert [c["token_ids"] for c in got] == [[5, 6], [8]]


@pytest.mark.parametrize("answer,words", [
    ({"choices": [_choice((5, 100))]}, "token id 100, outside the policy's vocabulary (0 to 99)"),
    ({"choices": [_choice((5, -1))]}, "token id -1, outside"),
    ({"choices": [_choice((5, 6.5))]}, "not a list of integers"),
    ({"choices": [_choice((5, True))]}, "not a list of integers"),
    ({"choices": [_choice((5, 6), logps=[-1.0, math.nan])]}, "log-prob nan for token 1"),
    ({"choices": [_choice((5, 6), logps=[0.7, -1.0])]}, "log-prob 0.7 for token 0"),
    ({"choices": [_choice((5, 6), logps=[-math.inf, -1.0])]}, "log-prob -inf"),
    ({"choices": [_choice((5, 6), logps=[-1.0, "x"])]}, "log-prob 'x'"),
    ({"choices": [_choice((5, 6), logps=[-1.0])]}, "1 log-probs for 2 tokens"),
    ({"choices": [_choice(tuple(range(50)) * 100)]}, "5000 tokens for a sample limited to max_tokens 6"),
    ({"choices": []}, "returned 0 samples for a prompt, asked for 1"),
    ({"nothing": 1}, "without a list of choices"),
    ([1, 2], "without a list of choices"),
    ({"choices": [_choice(spans=[{"version": "9" * 40, "start": 0, "end": 3}])]}, "beyond what a version can be"),
    ({"choices": [_choice(spans=[{"version": "1", "start": "0", "end": 3}])]}, "start or end is not an integer"),
])
def test_a_bad_answer_is_one_line_naming_the_server_and_the_fix(answer, words):
    assert words in _refused(answer)


def test_fewer_samples_than_asked_are_refused():
    assert "returned 1 samples for a prompt, asked for 4" in _refused({"choices": [_choice()]}, n=4)


def test_weight_versions_are_bounded():
    assert parse_version("7") == 7 and parse_version("default") == 0 and parse_version(None) == 0
    assert parse_version("-3") == 0 and parse_version("\uff17") == 0   # not an ASCII number: vLLM's "default"-like
    with pytest.raises(ServerError, match="beyond what a version can be"):
        parse_version(str(2 ** 63), URL)
    with pytest.raises(ServerError):
        token_versions([{"version": str(2 ** 64), "start": 0, "end": 2}], 2, 0)


# ------------------------------------------------------------------ lint: server-remote-access


def _lint(**server):
    from rltune.recipe.rules import run_rules
    from rltune.recipe.schema import Recipe

    r = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                               "reward": {"functions": ["builtin:exact_answer"]},
                               "rollout": {"engine": "vllm-server", "server": server}})
    return [h for rl, h in run_rules(r) if rl.id == "server-remote-access" and setattr(h, "severity", h.severity
                                                                                      or rl.severity) is None]


def _sev(hits):
    return [(h.severity, h.path) for h in hits]


def test_a_wildcard_host_needs_allow_remote():
    assert _lint() == [] and _lint(host="10.0.0.5") == [] and _lint(extra_args=["--host", "127.0.0.1"]) == []
    assert _sev(_lint(host="0.0.0.0")) == [("error", "rollout.server.host")]
    assert _sev(_lint(host="::")) == [("error", "rollout.server.host")]
    assert _sev(_lint(extra_args=["--max-num-seqs", "8", "--host", "0.0.0.0"])) == [("error", "rollout.server.extra_args")]
    assert _sev(_lint(extra_args=["--host=192.168.1.4"])) == [("error", "rollout.server.extra_args")]
    assert _sev(_lint(host="0.0.0.0", allow_remote=True)) == [("warning", "rollout.server.host")]
    f = _lint(host="0.0.0.0")[0]
    assert "allow_remote" in f.fix and "127.0.0.1" in f.fix


def test_an_attached_server_without_a_secret_is_a_warning():
    assert _sev(_lint(url="http://10.0.0.7:8000")) == [("warning", "rollout.server.secret_env")]
    assert _lint(url="http://10.0.0.7:8000", secret_env="MY_SERVER_SECRET") == []


def test_the_engine_refuses_a_wildcard_host_without_allow_remote(tmp_path):
    from rltune.models import resolve_model_dir
    from rltune.models.loading import load_tokenizer
    from rltune.recipe.schema import Recipe
    from rltune.rollout.vllm_server import VLLMServerRollout

    d = resolve_model_dir("builtin:tiny-llama")
    r = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                               "reward": {"functions": ["builtin:exact_answer"]},
                               "rollout": {"engine": "vllm-server", "server": {"host": "0.0.0.0"}}})
    with pytest.raises(ServerError, match="allow_remote: true"):
        VLLMServerRollout(d, load_tokenizer(d), r.rollout, max_len=128, log_dir=tmp_path)
    assert not (tmp_path / "rollout-server.log").exists()


def test_credentials_in_an_attached_url_are_refused_at_start():
    from rltune.models import resolve_model_dir
    from rltune.models.loading import load_tokenizer
    from rltune.recipe.schema import Recipe
    from rltune.rollout.vllm_server import VLLMServerRollout

    d = resolve_model_dir("builtin:tiny-llama")
    r = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                               "reward": {"functions": ["builtin:exact_answer"]},
                               "rollout": {"engine": "vllm-server", "server": {"url": "http://u:hunter2@127.0.0.1:9"}}})
    with pytest.raises(ServerError) as e:
        VLLMServerRollout(d, load_tokenizer(d), r.rollout, max_len=128)
    assert "holds credentials" in str(e.value) and "hunter2" not in str(e.value) and "secret_env" in str(e.value)


def test_a_server_that_fails_mid_run_says_how_to_resume():
    """Issue 45 item 9: a server that dies or closes the connection during the run stops it with
    what happened and the resume command (before: a collective timeout blaming another rank)."""
    from rltune.rollout.server import free_port
    from rltune.rollout.vllm_server import VLLMServerRollout

    engine = VLLMServerRollout.__new__(VLLMServerRollout)   # an attached engine whose server is gone
    engine.base_url, engine.log, engine.process, engine.secret = f"http://127.0.0.1:{free_port()}", None, None, None
    engine.timeout_s, engine.pause_mode, engine.version, engine.tied_embeddings = 2.0, "wait", 0, False
    engine.adaptation = _NoWeights()
    with pytest.raises(ServerError) as e:
        engine.sync_weights(object())
    msg = str(e.value)
    assert "connection refused: nothing listens there" in msg and "--resume auto" in msg
    assert "restart it" in msg and engine.base_url in msg and "another rank" not in msg


class _NoWeights:
    def full_weights(self, actor):
        return []
