"""An attached server serves the policy, in trainer.precision's dtype, with a context that holds
prompt + response (issue 46 item 4): before, a bf16 server beside an fp32 trainer (the documented
attach command had no --dtype) was attached without a word, and sampled from another distribution
than the one the trainer's ratios use. Hand-built answers of the shapes vLLM 0.32 gives
(GET /v1/models, dev mode's GET /server_info?config_format=json), then a stand-in server
answering them: attach refuses a mismatch with one line and the flag that fixes it."""

from __future__ import annotations

import http.server
import json
import os
import threading
from urllib.parse import parse_qs, urlsplit

import pytest

from rltune.rollout.server import ServerError
from rltune.rollout.server_auth import IDENTITY_ROUTE, identity_proof, new_secret
from rltune.rollout.server_checks import check_served, model_identity, same_model, served_model

URL = "http://10.0.0.7:8000"
POLICY = "/home/me/.cache/rltune/builtin/tiny-llama-v2"
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 77, "hidden_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 128,
         "tie_word_embeddings": False, "dtype": "float32"}


def _models(root=POLICY, max_model_len=512, name="policy"):
    return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "vllm", "root": root,
                                         "parent": None, "max_model_len": max_model_len}]}


def _info(dtype="torch.float32", model=POLICY, max_model_len=512):
    return {"vllm_config": {"model_config": {"model": model, "dtype": dtype, "max_model_len": max_model_len,
                                             "served_model_name": "policy"}},
            "vllm_env": {}, "system_env": {}}


def test_what_the_server_serves_is_read_from_its_answers():
    assert served_model(_models(), _info("torch.bfloat16")) == {
        "model": POLICY, "name": "policy", "dtype": "bfloat16", "max_model_len": 512}
    # what an answer does not say is not compared
    assert served_model(_models(), None)["dtype"] is None
    assert served_model({"data": []}, _info()) == {"model": POLICY, "name": None, "dtype": "float32",
                                                   "max_model_len": 512}
    assert served_model("nonsense", ["x"]) == {"model": None, "name": None, "dtype": None, "max_model_len": None}
    assert served_model(_models(max_model_len="2048"), None)["max_model_len"] is None


def test_the_same_model_by_path_hub_id_or_config():
    assert same_model(POLICY, POLICY, None, None) is True
    assert same_model("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M", None, None) is True
    assert same_model("HuggingFaceTB/SmolLM2-360M", "HuggingFaceTB/SmolLM2-135M", None, None) is False
    copy = dict(LLAMA, dtype="bfloat16", transformers_version="4.0")   # a copy of the same model: the same
    assert same_model("/models/copy", POLICY, copy, LLAMA) is True
    assert same_model("/models/big", POLICY, dict(LLAMA, hidden_size=128), LLAMA) is False
    assert same_model("/models/qwen", POLICY, dict(LLAMA, architectures=["Qwen2ForCausalLM"]), LLAMA) is False
    # another machine's path, or a hub id against a local directory: cannot be told here
    assert same_model("/srv/models/policy", POLICY, None, LLAMA) is None
    assert same_model("HuggingFaceTB/SmolLM2-135M", POLICY, None, None) is None
    assert same_model(None, POLICY, None, None) is None
    nested = {"architectures": ["X"], "text_config": {k: v for k, v in LLAMA.items() if k != "architectures"}}
    assert model_identity(nested)["hidden_size"] == 64 and model_identity(nested)["architectures"] == ["X"]


def _refused(served, same=True, precision="fp32", need=128, model_len=128) -> tuple[str, str]:
    dtype = {"fp32": "float32", "bf16": "bfloat16"}[precision]
    with pytest.raises(ServerError) as e:
        check_served(URL, served, POLICY, same, dtype, precision, need, model_len)
    head, fix = str(e.value).split("\n")
    assert head.startswith(f"rollout.server.url {URL} serves ") and f"the trainer trains {POLICY} in {dtype}" in head
    assert fix.startswith("  fix: restart the server with --")
    return head, fix


def test_a_server_in_another_dtype_is_refused_with_the_dtype_flag():
    head, fix = _refused(served_model(_models(), _info("torch.bfloat16")))
    assert "in bfloat16" in head and "(trainer.precision: fp32)" in head and fix.endswith(
        "with --dtype float32 (docs/rollout-server.md, attaching)")
    head, fix = _refused(served_model(_models(), _info("torch.float32")), precision="bf16")
    assert "--dtype bfloat16" in fix


def test_a_server_too_short_or_of_another_model_is_refused_with_its_flag():
    _, fix = _refused(served_model(_models(max_model_len=64), _info(max_model_len=64)), need=100, model_len=128)
    assert "--max-model-len 128" in fix and "--dtype" not in fix
    _, fix = _refused(served_model(_models(root="/models/other"), _info()), same=False)
    assert f"--model {POLICY}" in fix
    _, fix = _refused(served_model(_models(root="/models/other", max_model_len=64), _info("torch.bfloat16")),
                      same=False)
    assert fix.split(" (docs")[0].endswith(f"--model {POLICY} --dtype float32 --max-model-len 128")


def test_a_matching_server_or_one_that_says_nothing_passes():
    check_served(URL, served_model(_models(), _info()), POLICY, True, "float32", "fp32", 128, 128)
    check_served(URL, served_model(_models(max_model_len=2048), None), POLICY, None, "float32", "fp32", 512, 512)
    check_served(URL, served_model({}, None), POLICY, None, "float32", "fp32", 512, 512)


# ------------------------------------------------------------------ attach, against a stand-in server


class _Served(http.server.BaseHTTPRequestHandler):
    secret = ""
    models: dict = {}
    info: dict = {}
    seen: list = []
    api = "rl"      # "dev": vLLM 0.26's routes (no /weight_info; /get_world_size)

    def _send(self, obj, status=200):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        u = urlsplit(self.path)
        type(self).seen.append(u.path)
        if u.path == IDENTITY_ROUTE:
            return self._send({"proof": identity_proof(self.secret, parse_qs(u.query)["nonce"][0])})
        if self.headers.get("Authorization") != f"Bearer {self.secret}":
            return self._send({"error": "unauthorized"}, 401)
        answers = {"/health": {}, "/weight_info": {"weight_version": "default"}, "/v1/models": type(self).models,
                   "/server_info": type(self).info}
        if type(self).api == "dev":
            answers = {k: v for k, v in answers.items() if k != "/weight_info"} | {"/get_world_size": {"world_size": 1}}
        self._send(answers[u.path]) if u.path in answers else self._send({"detail": "Not Found"}, 404)

    def do_POST(self):
        type(self).seen.append(urlsplit(self.path).path)
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._send({"success": True})

    def log_message(self, *args):
        pass


@pytest.fixture
def stand_in(monkeypatch):
    _Served.secret, _Served.seen, _Served.api = new_secret(), [], "rl"
    monkeypatch.setenv("RLTUNE_TEST_ATTACH_SECRET", _Served.secret)
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Served)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _attach(url, precision="fp32", max_len=128):
    from rltune.models import resolve_model_dir
    from rltune.models.loading import load_tokenizer
    from rltune.recipe.schema import Recipe
    from rltune.rollout.vllm_server import VLLMServerRollout

    d = resolve_model_dir("builtin:tiny-llama")
    r = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                               "reward": {"functions": ["builtin:exact_answer"]},
                               "rollout": {"engine": "vllm-server", "server": {
                                   "url": url, "secret_env": "RLTUNE_TEST_ATTACH_SECRET", "request_timeout_s": 5.0}}})
    return d, VLLMServerRollout(d, load_tokenizer(d), r.rollout, precision=precision, max_len=max_len)


def test_attach_refuses_a_bf16_server_beside_an_fp32_trainer(stand_in):
    from rltune.models import resolve_model_dir

    d = resolve_model_dir("builtin:tiny-llama")
    _Served.models, _Served.info = _models(root=d), _info("torch.bfloat16", model=d)
    with pytest.raises(ServerError) as e:
        _attach(stand_in)
    head, fix = str(e.value).split("\n")
    assert head.startswith(f"rollout.server.url {stand_in} serves {d} in bfloat16 with max_model_len 512; the "
                           f"trainer trains {d} in float32 (trainer.precision: fp32)")
    assert fix == "  fix: restart the server with --dtype float32 (docs/rollout-server.md, attaching)"
    assert "/init_weight_transfer_engine" not in _Served.seen   # refused before anything was sent


def test_attach_refuses_another_model_and_a_short_context(stand_in, tmp_path):
    from rltune.models import resolve_model_dir

    other = tmp_path / "other"   # another model on this machine: its config.json says so
    other.mkdir()
    with open(os.path.join(resolve_model_dir("builtin:tiny-llama"), "config.json")) as f:
        cfg = json.load(f)
    (other / "config.json").write_text(json.dumps(dict(cfg, hidden_size=128, num_hidden_layers=4)))
    _Served.models, _Served.info = _models(root=str(other), max_model_len=64), _info(model=str(other), max_model_len=64)
    with pytest.raises(ServerError) as e:
        _attach(stand_in, max_len=128)
    d = resolve_model_dir("builtin:tiny-llama")
    assert str(e.value).split("\n")[1].startswith(f"  fix: restart the server with --model {d} --max-model-len 128")
    # a copy of the policy (the same config.json) is the policy
    (other / "config.json").write_text(json.dumps(cfg))
    _Served.models, _Served.info = _models(root=str(other)), _info(model=str(other))
    _, engine = _attach(stand_in)
    engine.close()


def test_attach_accepts_the_server_the_docs_start(stand_in):
    from rltune.models import resolve_model_dir

    d = resolve_model_dir("builtin:tiny-llama")
    _Served.models, _Served.info = _models(root=d), _info(model=d)
    _, engine = _attach(stand_in)
    try:
        assert {"/v1/models", "/server_info", "/init_weight_transfer_engine"} <= set(_Served.seen)
    finally:
        engine.close()


def test_attach_to_a_vllm_026_server_numbers_the_syncs_itself_and_refuses_partial_rollouts(stand_in):
    """vLLM 0.26 (the GPU image's) has the RL routes in dev mode but no GET /weight_info and no
    per-token weight versions (rollout/vllm_api.py): the engine attaches, numbers its syncs itself,
    and refuses rollout.asynchronous.partial with the fix; against 0.32's API both hold."""
    from rltune.models import resolve_model_dir
    from rltune.rollout.vllm_api import DEV, RL

    d = resolve_model_dir("builtin:tiny-llama")
    _Served.models, _Served.info, _Served.api = _models(root=d), _info(model=d), "dev"
    _, engine = _attach(stand_in)
    try:
        assert (engine.api, engine.version, engine.weight_version()) == (DEV, 0, "default")
        with pytest.raises(ServerError) as e:
            engine.keep_requests_across_syncs()
        assert "vLLM 0.26's dev-mode API" in str(e.value) and "fix: rollout.asynchronous.partial: false" in str(e.value)
        assert engine.pause_mode == "wait"
    finally:
        engine.close()
    _Served.api = "rl"
    _, engine = _attach(stand_in)
    try:
        assert engine.api == RL
        engine.keep_requests_across_syncs()
        assert engine.pause_mode == "keep"
    finally:
        engine.close()


def test_the_installed_vllm_api_decides_the_token_in_flag(monkeypatch, tmp_path):
    """The started server gets --enable-scale-out only where the installed vLLM has 0.32's RL API
    (vLLM 0.26 registers the token-in route without the flag, and refuses an unknown one)."""
    import importlib.machinery
    import importlib.util

    from rltune.rollout import vllm_api

    def fake_vllm(*dirs):
        root = tmp_path / "-".join(dirs).replace("/", "_") / "vllm"
        for sub in dirs:
            (root / "entrypoints" / sub).mkdir(parents=True)
        spec = importlib.machinery.ModuleSpec("vllm", None, is_package=True)
        spec.submodule_search_locations = [str(root)]
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "vllm" else None)

    fake_vllm("serve/dev/rlhf")
    assert vllm_api.installed_api() == vllm_api.DEV and vllm_api.token_in_args(vllm_api.DEV) == []
    fake_vllm("rl", "serve/dev/rlhf")
    assert vllm_api.installed_api() == vllm_api.RL
    assert vllm_api.token_in_args(vllm_api.RL) == ["--enable-scale-out"]
    fake_vllm("openai")
    assert vllm_api.installed_api() is None


def test_a_sleeping_server_is_woken_before_it_generates_or_takes_weights(stand_in):
    """A started server beside the trainer on CUDA sleeps between generations (vLLM's /sleep?level=1,
    once) and is woken (/wake_up, once) before anything else is asked of it; started with
    --enable-sleep-mode. (An attached server never sleeps: it is not the trainer's to put to sleep.)"""
    from rltune.models import resolve_model_dir

    d = resolve_model_dir("builtin:tiny-llama")
    _Served.models, _Served.info = _models(root=d), _info(model=d)
    _, engine = _attach(stand_in)
    try:
        assert engine.sleep_enabled is False                  # attached
        engine.sleep()
        assert "/sleep" not in _Served.seen
        engine.sleep_enabled = True                           # as a started server on CUDA
        engine.sleep()
        engine.sleep()
        assert _Served.seen.count("/sleep") == 1 and engine.asleep
        engine.wake_up()
        engine.wake_up()
        assert _Served.seen.count("/wake_up") == 1 and not engine.asleep
        engine.device = "cuda"
        cmd = engine._command(d, engine.cfg.server, 8000, "bf16", 0, False)
        assert "--enable-sleep-mode" in cmd and "--enforce-eager" not in cmd
        engine.sleep_enabled = False
        assert "--enable-sleep-mode" not in engine._command(d, engine.cfg.server, 8000, "bf16", 0, False)
    finally:
        engine.close()
