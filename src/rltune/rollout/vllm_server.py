"""The `vllm-server` rollout engine: vLLM's own OpenAI-compatible server, in a child process on
the trainer's devices (or a running one at `rollout.server.url`), spoken to over HTTP
(docs/rollout-server.md).

- **Start and stop**: the installed vLLM's API server (the code behind `vllm serve`) through
  `python -m rltune.rollout.server_launch`: `VLLM_SERVER_DEV_MODE=1` (its RL routes), every
  route behind a per-run secret (server_auth.py; the trainer checks the server proves it holds
  it before sending anything), `--enable-scale-out` (token-in/token-out generation) and the
  `rltune_file` weight-transfer backend (vllm_plugin.py), behind `server.ServerProcess`: it
  never outlives the trainer.
- **Untrusted answers**: every answer is checked before it is trained on (server_checks.py).
- **Token-in, token-out**: one `POST /inference/v1/generate` per prompt (its `n` samples),
  `rollout.server.max_in_flight` at once: token ids in, sampled token ids and their log-probs
  out; nothing is re-tokenised. Log-probs are `processed_logprobs`: log_softmax(logits / T),
  the trainer's own, where no top-k / top-p truncation is set (refused otherwise: the
  in-process `vllm` engine can hook vLLM's sampler to report them before truncation, a
  server cannot).
- **Weights**: the actor's parameters in Hugging Face naming go to a safetensors file (in
  /dev/shm where there is one) and through vLLM's RL API: `/pause`, `/start_weight_update`,
  `/update_weights`, `/finish_weight_update` (with the weight version: the sync count),
  `/resume`, then `/reset_prefix_cache`. Every sample carries the weight version it was
  sampled with; `stale_samples` counts those that were not the latest.

Every request has a timeout (`rollout.server.request_timeout_s`) and fails with the server's
last log lines. Standard library HTTP (no client import); vLLM itself is imported by the
server process only.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .base import Sampling
from .server import NotOurServer, ServerError, ServerProcess, call, free_port, healthy, prove_identity, route_address
from .server_auth import SECRET_ENV, new_secret, secret_problem
from .server_checks import check_answer, check_served, parse_version, same_model, served_model
from .server_io import experience_of, weight_buckets
from .vllm_ipc import ipc_problem, update_info as ipc_update_info
from .weight_files import sweep_weight_files, weight_file_prefix, weights_dir  # noqa: F401 - the trainer's files
from .vllm_api import DEV, RL, installed_api, partial_problem, server_sleeps, token_in_args, token_versions

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
SYNC_BUCKET_BYTES = 512 << 20   # weights per /update_weights call (one safetensors file)
LAUNCH = "rltune.rollout.server_launch"   # vLLM's API server (what `vllm serve` runs) behind the run's secret
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "", "*")


def remote_host(srv) -> str | None:
    """The wildcard address the started server would listen on (rollout.server.host, or a --host
    in rollout.server.extra_args), or None when it listens on the one address host names."""
    args = [str(a) for a in srv.extra_args]
    for i, a in enumerate(args):
        if a == "--host" or a.startswith("--host="):
            host = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
            return None if host.strip() in ("127.0.0.1", "localhost", "::1") or host.startswith("127.") else host
    return srv.host if str(srv.host).strip() in WILDCARD_HOSTS else None


def backend_name(transfer: str) -> str:
    """The --weight-transfer-config backend for rollout.server.weight_transfer: rltune's file and gloo
    backends (vllm_plugin.py), vLLM's own ipc."""
    from .vllm_plugin import BACKENDS

    return "ipc" if transfer == "ipc" else BACKENDS[transfer][0]


def visible_device(device: str) -> str:
    """The CUDA_VISIBLE_DEVICES entry of the torch device `cuda:K` (K counts the visible ones)."""
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[index] if index < len(visible) else str(index)


RESUME_FIX = "  fix: {what}, then resume the run: the same `rltune train` command with --resume auto"


def _mid_run(method):
    """A server that fails during the run (it died, closed the connection, stopped answering,
    answered nonsense) stops it with what to do, resume included."""
    import functools

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except ServerError as err:
            if "then resume the run" in str(err):
                raise
            what = (f"see why the server at {self.base_url} stopped or misbehaved, restart it"
                    if self.process is None else f"see why the rollout server stopped (its log: {self.log})")
            raise ServerError(f"{err}\n{RESUME_FIX.format(what=what)}") from None
    return wrapper


def check_devices(devices, device: str) -> None:
    """rollout.server.devices names devices that exist here (CPU cores this process may run on;
    GPU ids below the device count when CUDA_VISIBLE_DEVICES does not renumber them): checked
    before the server starts, not found in vLLM's frames a minute later."""
    wanted = [int(d) for d in devices]
    if device == "cpu":
        have = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
        unit, fix = "CPU core", f"CPU cores this process may use: {_ranges(have)}"
    else:
        if os.environ.get("CUDA_VISIBLE_DEVICES", "").strip():
            return   # the ids are CUDA_VISIBLE_DEVICES entries of the machine, which this process cannot count
        import torch

        have = list(range(torch.cuda.device_count()))
        unit, fix = "GPU", f"GPUs here: {_ranges(have) or 'none'}"
    missing = [d for d in wanted if d not in have]
    if missing:
        raise ServerError(f"rollout.server.devices names {unit} {', '.join(map(str, missing))}, which "
                          f"{'does' if len(missing) == 1 else 'do'} not exist here ({fix})\n  fix: set "
                          "rollout.server.devices to ids from that list, or remove it (the trainer's devices)")


def _ranges(ids: list[int]) -> str:
    out, i = [], 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


class VLLMServerRollout:
    name = "vllm-server"

    def __init__(self, model_dir: str, tokenizer, rollout_cfg, precision: str = "fp32", seed: int | None = 0,
                 max_len: int = 512, device: str = "cpu", log_dir: Path | None = None, adaptation=None,
                 trust_remote_code: bool = False, seqs_per_call: int | None = None, rank: int = 0,
                 own_device: bool = False, log_name: str | None = None, peer: tuple | None = None):
        from transformers import AutoConfig

        from ..models.adaptation import FullWeights
        from .vllm import _truncates, cpu_kv_cache, default_max_model_len, eos_and_pad

        self.cfg, srv = rollout_cfg, rollout_cfg.server
        self.device = "cuda" if str(device).startswith("cuda") else "cpu"
        if rollout_cfg.do_sample and _truncates(rollout_cfg.top_p, rollout_cfg.top_k):
            raise ServerError("rollout.engine vllm-server reports log-probs after top-p / top-k truncation, not the "
                              "full distribution the trainer's ratios use\n  fix: set rollout.top_p: 1.0 and "
                              "rollout.top_k: 0, or use rollout.engine: vllm")
        self.adaptation = adaptation or FullWeights()
        if self.adaptation.vllm_lora_rank is not None:
            raise ServerError("rollout.engine vllm-server pushes full weights\n  fix: rollout.lora_sync: merged")
        hf_cfg = AutoConfig.from_pretrained(model_dir, trust_remote_code=bool(trust_remote_code))
        text_cfg = getattr(hf_cfg, "get_text_config", lambda: hf_cfg)()
        self.tied_embeddings = bool(getattr(text_cfg, "tie_word_embeddings", False))
        self.eos_ids, self.pad_id = eos_and_pad(model_dir, hf_cfg, tokenizer)
        self.max_model_len = int(rollout_cfg.max_model_len or default_max_model_len(
            max_len, getattr(hf_cfg, "max_position_embeddings", None)))
        self.timeout_s = float(srv.request_timeout_s)
        self.vocab_size = int(getattr(text_cfg, "vocab_size", 0) or 0) or None
        # what an attached server must serve (_check_served): the policy, in trainer.precision, long enough
        self.model_dir, self.precision, self.max_len = str(model_dir), precision, int(max_len)
        self.policy_config = hf_cfg.to_dict()
        self.secret: str | None = None
        self.pool = ThreadPoolExecutor(max_workers=int(srv.max_in_flight), thread_name_prefix="rltune-rollout")
        self.version = 0                  # weight syncs done: the version the server's weights carry
        # "wait": a sync lets the requests in flight finish first; "keep" (rollout.asynchronous.partial):
        # they are paused, continue with the new weights and report the version of each token
        self.pause_mode = "wait"
        self.sync_bucket_bytes = SYNC_BUCKET_BYTES
        self.stale_samples = 0            # samples whose weight version was not the latest
        self.last_sync_ms: float | None = None
        self.process: ServerProcess | None = None
        self.kv_cache_line = ""
        self.api = installed_api() or RL   # an attached server's: found at attach (vllm_api.py)
        # a started server on the trainer's GPU gives its memory back while the trainer updates
        # (vLLM's sleep mode, level 1: weights to host memory, KV cache freed), as the in-process engine does
        self.sleep_enabled = server_sleeps(rollout_cfg, self.device)
        self.asleep = False
        if srv.weight_transfer == "ipc" and ipc_problem(self.device, srv):
            raise ServerError(ipc_problem(self.device, srv) + "\n  fix: rollout.server.weight_transfer: file")
        problem = partial_problem(self.api) if rollout_cfg.asynchronous.partial and not srv.url else None
        if problem:
            raise ServerError(problem)   # before a server starts for nothing
        t0 = time.perf_counter()
        if srv.url:
            from urllib.parse import urlsplit

            if urlsplit(srv.url).username is not None or urlsplit(srv.url).password is not None:
                raise ServerError("rollout.server.url holds credentials (user:password@), which rltune does not send\n  "
                                  "fix: remove them; start the server with rltune's launcher and a secret, and set "
                                  "rollout.server.secret_env to the variable holding it (docs/rollout-server.md)")
            self.base_url, self.log = srv.url.rstrip("/"), None
            if peer is not None:   # a fleet server rank 0 started or attached: this rank only generates there
                self.secret, self.api, self.transfer, self.group = peer[0], peer[1], None, None
                self.expected_version, self.init_s = "default", 0.0
                return
            self.secret = self._attached_secret(srv)
            self._check_attached()
        else:
            wildcard = remote_host(srv)
            if wildcard is not None and not srv.allow_remote:
                raise ServerError(f"rollout.server listens on {wildcard!r} (every interface): anyone on the network could "
                                  "reach its routes\n  fix: rollout.server.host: 127.0.0.1 (and no --host in extra_args), "
                                  "or rollout.server.allow_remote: true to mean it (every route still takes the run's secret)")
            port = srv.port + rank if srv.port else free_port(srv.host)       # one server per rank
            self.base_url = f"http://{srv.host}:{port}"
            self.log = Path(log_dir or tempfile.mkdtemp(prefix="rltune-server-")) / (log_name or (
                "rollout-server.log" if rank == 0 else f"rollout-server-rank{rank}.log"))
            cmd = self._command(model_dir, srv, port, precision, seed, trust_remote_code)
            if self.device == "cpu":   # exact bytes; vLLM's CPU default (a share of all memory) rarely fits
                kv, self.kv_cache_line = cpu_kv_cache(rollout_cfg, text_cfg, precision, max_len, self.max_model_len,
                                                      seqs_per_call)
                cmd += ["--kv-cache-memory-bytes", str(kv)]
            self.secret = new_secret()   # in the child's environment, never its argv (world-readable)
            env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", **{SECRET_ENV: self.secret},
                       RLTUNE_WEIGHT_FILES=os.path.join(weights_dir(), weight_file_prefix()))   # the guard's clean-up
            if srv.weight_transfer == "ipc":   # vLLM unpickles the handles; only this trainer can reach its routes
                env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
            if own_device and self.device == "cuda":   # several ranks: each rank's server on the rank's GPU
                env["CUDA_VISIBLE_DEVICES"] = visible_device(str(device))
            if srv.devices:                            # a placement of its own (rollout.server.devices)
                check_devices(srv.devices, self.device)
                ids = ",".join(str(int(d)) for d in srv.devices)
                if self.device == "cuda":
                    env["CUDA_VISIBLE_DEVICES"] = ids
                else:   # pinned by the guard; vLLM binds its OpenMP threads to the same cores
                    env.update(RLTUNE_SERVER_CPUS=ids, VLLM_CPU_OMP_THREADS_BIND=ids)
            self.process = ServerProcess(cmd, self.base_url, self.log, env, srv.startup_timeout_s,
                                         secret=self.secret).start()
        self.init_s = time.perf_counter() - t0
        self.transfer = srv.weight_transfer
        self.group = self.store = None
        if self.transfer == "file":
            sweep_weight_files()   # those a killed trainer left (in RAM on /dev/shm, until a reboot)
        try:
            if self.transfer == "gloo":
                self._init_gloo(srv.trainer_address)
            else:
                self._init_transfer({})
            self.expected_version = self.weight_version()   # the weights it loaded ("default")
            if self.process is not None:   # its first generation compiles and warms up (16 s on a busy 2-core CPU):
                self._warm_up(srv.startup_timeout_s)   # within the start's time, not a request's
        except ServerError as err:
            log = self.log
            self.close()
            if self.process is None and log is not None and srv.url is None:   # a failed start: keep its log
                from .server import failed_start

                raise failed_start(err, log) from None
            raise

    def _init_transfer(self, init_info: dict) -> None:
        try:
            self._post("/init_weight_transfer_engine", {"init_info": init_info})
        except ServerError as err:
            raise ServerError(f"{err}\n  hint: the server's --weight-transfer-config backend must be "
                              f"{backend_name(self.transfer)} for rollout.server.weight_transfer: {self.transfer}") from None

    def _init_gloo(self, trainer_address: str | None) -> None:
        """rltune_gloo: a gloo group of the trainer (rank 0) and the server's workers, rendezvous
        at a TCPStore this process serves (vllm_gloo_transfer.py)."""
        from .vllm_gloo_transfer import join_group

        workers = int(self._get("/get_world_size").get("world_size") or 1)
        address = trainer_address or route_address(self.base_url)
        port = free_port(address)
        import secrets

        key = secrets.token_hex(16)   # travels in the authenticated init call, never to the store
        info = {"master_address": address, "master_port": port, "rank_offset": 1, "world_size": workers + 1,
                "timeout_s": self.timeout_s, "group_key": key}
        joined = self.pool.submit(self._init_transfer, info)   # the workers join while this process does
        try:
            self.store, self.group = join_group(address, port, 0, workers + 1, self.timeout_s, is_master=True, key=key)
        except Exception as err:  # noqa: BLE001 - a group that never forms: the server's side says why
            if joined.done() and joined.exception() is not None:
                raise joined.exception() from None
            raise ServerError(f"the rollout server's workers did not join the weight-transfer group at "
                              f"{address}:{port} within {self.timeout_s:g} s ({type(err).__name__})\n  fix: set "
                              "rollout.server.trainer_address to an address the server can reach this machine at"
                              ) from None
        joined.result()

    def _command(self, model_dir: str, srv, port: int, precision: str, seed, trust_remote_code: bool) -> list[str]:
        cmd = [sys.executable, "-m", LAUNCH, "--model", model_dir, "--served-model-name", "policy",
               "--host", srv.host, "--port", str(port), "--dtype", _DTYPES[precision],
               "--seed", str(0 if seed is None else int(seed)), "--max-model-len", str(self.max_model_len),
               *token_in_args(self.api), "--weight-transfer-config", '{"backend": "%s"}' % backend_name(srv.weight_transfer),
               "--logprobs-mode", "processed_logprobs", "--max-logprobs", "1", "--enable-prefix-caching",
               "--disable-log-stats", "--disable-uvicorn-access-log",
               "--tensor-parallel-size", str(int(self.cfg.tensor_parallel_size))]
        if self.device == "cpu":
            # a prefill is never split across scheduler steps: vLLM rewinds a split request's seeded
            # generator (Generator.set_offset), which a CPU generator refuses, and the engine dies on
            # the first seeded episode turn whose prompt is split (vllm-cpu 0.32)
            cmd += ["--enforce-eager", "--no-enable-chunked-prefill",
                    "--max-num-batched-tokens", str(max(int(self.max_model_len), 2048))]
        else:
            cmd += ["--gpu-memory-utilization", str(float(self.cfg.gpu_memory_utilization))]
        if self.sleep_enabled:
            cmd.append("--enable-sleep-mode")
        if trust_remote_code:
            cmd.append("--trust-remote-code")
        return cmd + [str(a) for a in srv.extra_args]

    def _attached_secret(self, srv) -> str | None:
        """rollout.server.secret_env: the attached server's secret, from the variable it names."""
        if not srv.secret_env:
            return None
        secret = os.environ.get(srv.secret_env)
        problem = secret_problem(secret)
        if problem:
            problem = problem.replace(SECRET_ENV, srv.secret_env)
            raise ServerError(f"rollout.server.secret_env {srv.secret_env}: {problem}\n  fix: export {srv.secret_env} "
                              "with the secret the server at rollout.server.url was started with "
                              f"({SECRET_ENV}, docs/rollout-server.md)")
        return secret

    def _check_attached(self) -> None:
        """rollout.server.url: the server proves it holds the secret (with secret_env), answers,
        with the RL routes (dev mode) on; syncs number their versions on from the one it has."""
        if self.secret is not None:
            try:
                proven = prove_identity(self.base_url, self.secret, timeout_s=min(self.timeout_s, 10.0),
                                        what="rollout.server.url's server")
            except NotOurServer as err:
                raise ServerError(f"{err}\n  fix: start it with rltune's launcher and the secret in "
                                  f"{self.cfg.server.secret_env} (docs/rollout-server.md, attaching)") from None
            if not proven:
                raise ServerError(f"rollout.server.url {self.base_url} does not answer GET /rltune/identity\n  fix: "
                                  "start the server (docs/rollout-server.md says how) or remove rollout.server.url to "
                                  "have rltune start one")
        try:
            call(self.base_url, "GET", "/health", timeout_s=min(self.timeout_s, 10.0), secret=self.secret)
        except ServerError as err:
            if "answered HTTP 401" in str(err):
                raise ServerError(f"rollout.server.url {self.base_url} refused the trainer (HTTP 401): it takes a "
                                  "secret\n  fix: set rollout.server.secret_env to the name of a variable holding the "
                                  "secret it was started with") from None
            raise ServerError(f"rollout.server.url {self.base_url} does not answer GET /health\n  fix: start the "
                              "server (docs/rollout-server.md says how) or remove rollout.server.url to have "
                              "rltune start one") from None
        try:
            info = self._get("/weight_info")
        except ServerError as err:
            if "HTTP 404" in str(err) and self._has_rl_routes():   # vLLM 0.26: the RL routes, no versions
                self.api, self.version = DEV, 0
                self._check_served()
                return
            raise ServerError(f"rollout.server.url {self.base_url} has no RL API (GET /weight_info failed)\n  fix: "
                              f"start it with rltune's launcher, docs/rollout-server.md ({str(err).splitlines()[0]})") from None
        self.version = parse_version(info.get("weight_version"), self.base_url)
        self._check_served()

    def _check_served(self) -> None:
        """An attached server serves the policy, in trainer.precision's dtype, with a context that
        holds prompt + response (server_checks.check_served): GET /v1/models (the model's path or
        hub id, max_model_len) and dev mode's GET /server_info (its dtype). The model is compared
        by path, else by config.json where the server's path is readable here, else not (another
        machine): the first weight sync fails on weights that do not fit."""
        import json

        models = self._get("/v1/models")
        try:   # vLLM gathers its environment once for this route (seconds): more than a request's time here
            info = call(self.base_url, "GET", "/server_info?config_format=json", None, max(self.timeout_s, 60.0),
                        self.log, secret=self.secret)
        except ServerError:
            info = None   # a vLLM without the route: its dtype is not compared
        served = served_model(models, info)
        model = served["model"]
        same = None
        if model:
            if os.path.isdir(model) and os.path.isdir(self.model_dir):
                if os.path.realpath(model) == os.path.realpath(self.model_dir):
                    model = self.model_dir
                else:
                    try:
                        with open(os.path.join(model, "config.json"), encoding="utf-8") as f:
                            served_config = json.load(f)
                    except (OSError, ValueError):
                        served_config = None
                    same = same_model(model, self.model_dir, served_config if isinstance(served_config, dict)
                                      else None, self.policy_config)
            if same is None:
                same = same_model(model, self.model_dir, None, None)
        check_served(self.base_url, served, self.model_dir, same, _DTYPES.get(self.precision, self.precision),
                     self.precision, self.max_len, self.max_model_len)

    def _warm_up(self, timeout_s: float) -> None:
        body = {"token_ids": [int(min(self.eos_ids or {0}))], "sampling_params": {"max_tokens": 1, "logprobs": 0}}
        call(self.base_url, "POST", "/inference/v1/generate", body, float(timeout_s), self.log, secret=self.secret)

    # -- HTTP --
    def _post(self, route: str, body: dict | None = None) -> dict:
        return call(self.base_url, "POST", route, body, self.timeout_s, self.log, secret=self.secret)

    def _get(self, route: str) -> dict:
        return call(self.base_url, "GET", route, None, self.timeout_s, self.log, secret=self.secret)

    # -- generation --
    def _params(self, s: Sampling) -> dict:
        greedy = s.greedy
        return {"n": int(s.n), "max_tokens": int(s.max_new_tokens), "min_tokens": int(s.min_new_tokens),
                "temperature": 0.0 if greedy else float(s.temperature), "top_p": 1.0, "top_k": -1,
                "stop": list(s.stop) or None, "include_stop_str_in_output": True,
                "stop_token_ids": sorted(self.eos_ids), "logprobs": 0, "skip_special_tokens": False,
                "detokenize": bool(s.stop)}

    def check_call(self, prompt_ids: list[list[int]], sampling: Sampling) -> list[dict]:
        """Each prompt's request parameters, after the checks every generation call passes."""
        from .vllm import _truncates

        if not sampling.greedy and _truncates(sampling.top_p, sampling.top_k):
            raise ServerError("rollout.engine vllm-server cannot report log-probs before top-p / top-k truncation")
        longest = max(len(p) for p in prompt_ids)
        if longest + sampling.max_new_tokens > self.max_model_len:
            raise ValueError(f"prompt ({longest} tokens) + rollout.max_new_tokens ({sampling.max_new_tokens}) exceeds "
                             f"the rollout server's max_model_len {self.max_model_len}; raise rollout.max_model_len "
                             "or lower data.max_prompt_length")
        params = self._params(sampling)
        seeds = sampling.seeds if len(sampling.seeds) == len(prompt_ids) and not sampling.greedy else None
        # seeded from the prompt's draw (sample j: seed + j, vLLM's n > 1): the same samples whatever
        # order the requests arrive in and whichever server takes them
        return [params if seeds is None else {**params, "seed": int(seeds[i])} for i in range(len(prompt_ids))]

    def request(self, prompt: list[int], params: dict, sampling: Sampling) -> list[tuple]:
        """One prompt's samples from this server: [(token ids, log-probs, per-token versions)]."""
        sent_version = self.version
        answer = self._post("/inference/v1/generate", {"token_ids": [int(t) for t in prompt], "sampling_params": params})
        out = []
        for c in check_answer(answer, sampling.n, sampling.max_new_tokens, self.vocab_size, self.base_url):
            ids, logps = self._sample(c)
            out.append((ids, logps, token_versions(c.get("weight_versions"), len(ids), sent_version)))
        return out

    @_mid_run
    def generate(self, prompt_ids: list[list[int]], sampling: Sampling):
        params = self.check_call(prompt_ids, sampling)
        self.wake_up()
        answers = list(self.pool.map(lambda i: self.request(prompt_ids[i], params[i], sampling), range(len(prompt_ids))))
        return experience_of(prompt_ids, answers, sampling, self.pad_id, self.eos_ids)

    def _sample(self, choice: dict) -> tuple[list[int], list[float]]:
        """(token ids, log-probs) of one sample (checked by check_answer); counts it stale when it
        was (partly) sampled with weights other than the latest sync's."""
        ids = [int(t) for t in choice.get("token_ids") or []]
        logps = [float(x["logprob"]) for x in (choice.get("logprobs") or {}).get("content") or []]
        if any(str(v.get("version")) != self.expected_version for v in choice.get("weight_versions") or []):
            self.stale_samples += 1
        return ids, logps

    # -- weights --
    @_mid_run
    def sync_weights(self, actor) -> float:
        """The actor's full weights (a LoRA actor's merged) -> the server, through vLLM's RL API;
        returns milliseconds. The server is paused for the update (no request sees half the
        weights) and its prefix cache reset after it (no KV computed with the old weights).
        Weights travel in files of about `sync_bucket_bytes` each, one `/update_weights` call per
        file, as they are gathered (under ZeRO-3, parameter by parameter): at most one bucket is
        held in host memory and on /dev/shm at a time."""
        t0 = time.perf_counter()
        self.begin_sync()
        try:
            for bucket in weight_buckets(self, actor):
                self._send_bucket(bucket)
            self.finish_sync(self.version + 1)
        finally:
            self._post("/resume")
        if self.pause_mode != "keep":
            self._post("/reset_prefix_cache")
        self.last_sync_ms = (time.perf_counter() - t0) * 1000.0
        return self.last_sync_ms

    def begin_sync(self) -> None:
        """Pause the server and open a weight update (sync_weights' first phase; a fleet's too)."""
        self.wake_up()
        self._post(f"/pause?mode={self.pause_mode}")
        self._post("/start_weight_update")

    def finish_sync(self, version: int) -> None:
        """Close the weight update as `version`; the caller resumes the server (POST /resume)."""
        self._post("/finish_weight_update", {"weight_version": str(version)})
        self.version = int(version)
        self.expected_version = str(self.version)
        if self.pause_mode == "keep":
            # the paused requests' keys/values were computed with the old weights: they are
            # preempted and computed again with the new ones when generation resumes, so every
            # token sampled from here on is the new policy's, given its whole context
            self._post("/reset_prefix_cache?reset_running_requests=true")

    def _send_bucket(self, tensors: dict) -> None:
        """One bucket of weights -> one `/update_weights` call (a file, a gloo broadcast, or CUDA IPC
        handles of the bucket's tensors, which live until the call returns)."""
        if self.transfer == "ipc":
            self._post("/update_weights", {"update_info": ipc_update_info(tensors)})
            return
        (self._send_gloo if self.transfer == "gloo" else self._send_file)(tensors)

    def _send_gloo(self, tensors: dict) -> None:
        """One flat byte buffer (64-byte aligned tensors), broadcast to the workers while they
        take the `/update_weights` call that describes it."""
        import torch

        from .vllm_gloo_transfer import broadcast

        names, dtypes, shapes, offsets, total = [], [], [], [], 0
        for name, t in tensors.items():
            names.append(name)
            dtypes.append(str(t.dtype).removeprefix("torch."))
            shapes.append(list(t.shape))
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // 64) * 64
        buf = torch.empty(total, dtype=torch.uint8)
        for t, offset in zip(tensors.values(), offsets):
            n = t.numel() * t.element_size()
            buf[offset:offset + n] = t.reshape(-1).view(torch.uint8)
        info = {"names": names, "dtypes": dtypes, "shapes": shapes, "offsets": offsets, "nbytes": total}
        taken = self.pool.submit(self._post, "/update_weights", {"update_info": info})
        work = broadcast(self.group, buf)
        while not work.is_completed():           # a refused update fails now, not at the group's timeout
            if taken.done() and taken.exception() is not None:
                raise taken.exception()
            time.sleep(0.002)
        work.wait()
        taken.result()

    def _send_file(self, tensors: dict) -> None:
        """One safetensors file (in /dev/shm where there is one) -> one `/update_weights` call."""
        from safetensors.torch import save_file

        fd, path = tempfile.mkstemp(prefix=weight_file_prefix(), suffix=".safetensors", dir=weights_dir())
        os.close(fd)
        try:
            save_file(tensors, path)
            self._post("/update_weights", {"update_info": {"path": path}})
        finally:
            try:
                os.unlink(path)
            except FileNotFoundError:   # the guard removed it: the server is gone, and the request says so
                pass

    def weight_version(self) -> str:
        if self.api == DEV:   # no versions: the trainer numbers its syncs itself
            return "default"
        return str(self._get("/weight_info").get("weight_version"))[:64]

    def _has_rl_routes(self) -> bool:
        """vLLM 0.26 in dev mode answers GET /get_world_size (one of its RL routes)."""
        try:
            return "world_size" in self._get("/get_world_size")
        except ServerError:
            return False

    def keep_requests_across_syncs(self) -> None:
        """rollout.asynchronous.partial: a sync pauses the requests in flight and they go on with the
        new weights, each token labelled with its version (refused where the server has no labels)."""
        problem = partial_problem(self.api)
        if problem:
            raise ServerError(problem)
        self.pause_mode = "keep"

    # -- memory and lifetime --
    def sleep(self) -> None:
        """Free the server's GPU memory while the trainer runs (a started server on the trainer's GPU)."""
        if getattr(self, "sleep_enabled", False) and not self.asleep:
            self._post("/sleep?level=1")
            self.asleep = True

    def wake_up(self) -> None:
        if getattr(self, "asleep", False):
            self._post("/wake_up")
            self.asleep = False

    def close(self) -> None:
        if getattr(self, "group", None) is not None and self.process is None:   # attached: let it drop our group
            try:
                call(self.base_url, "POST", "/shutdown_weight_transfer_engine", None, min(self.timeout_s, 10.0), None,
                     secret=self.secret)
            except ServerError:
                pass
        self.group = self.store = None
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.process is not None:
            self.process.stop()
            self.process = None

