"""Lint rules for settings that do nothing in the recipe around them, and for a run that would
mask most of its own responses out of the loss.

A setting that silently does nothing is an error (as `cispo-dual-clip` says): the user believes
it acts. Registered in RULES by rules.py, like rules_algo.
"""

from __future__ import annotations

from typing import Iterator

from rltune.recipe.rules_async import async_settings_without_effect
from rltune.recipe.rules_base import RULES, Ctx, Hit, num, rule
from rltune.recipe.schema import Recipe, RewardCfg, RolloutCfg, RolloutServerCfg
from rltune.envs import generated

MASK_TRUNCATED_MIN_TOKENS = 64   # below this many new tokens, most answers of a real task are cut


@rule("rollback-inactive", "error",
      "autotune.rollback true without autotune.enabled true and autotune.mode act",
      "rollback is one of autotune's actions: with autotune off, or in advise mode, it never rolls back, "
      "and nothing would say so")
def rollback_inactive(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    a = r.autotune
    if a.rollback and not (a.enabled and a.mode == "act"):
        why = "autotune.enabled is false" if not a.enabled else f"autotune.mode is {a.mode}"
        yield Hit("autotune.rollback", f"autotune.rollback true but {why}: {RULES['rollback-inactive'].why}",
                  "set autotune.enabled: true and autotune.mode: act, or remove autotune.rollback")


@rule("rollback-no-target", "error",
      "autotune.rollback active with trainer.keep_checkpoints 1",
      "a rollback goes back to a checkpoint saved before the spike began; keeping one checkpoint, each save deletes "
      "the one before, so the only one left is usually the step just saved, inside the spike")
def rollback_no_target(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    a, t = r.autotune, r.trainer
    if a.rollback and a.enabled and a.mode == "act" and t.keep_checkpoints < 2:
        yield Hit("trainer.keep_checkpoints",
                  f"trainer.keep_checkpoints {t.keep_checkpoints} with autotune.rollback (save_every {t.save_every}, "
                  f"rollback_every {a.rollback_every}): {RULES['rollback-no-target'].why}",
                  "set trainer.keep_checkpoints: 3")


@rule("setting-without-effect", "error",
      "trainer.save_merged without model.lora; reward.timeout other than its default without reward.isolate; "
      "rollout.lora_sync adapter without model.lora; logging.mlflow_tracking_uri without logging.mlflow; "
      "trainer.eval_every on file data without data.eval; rollout.env_isolate without rollout.env or with a "
      "library's environment; rollout.env_args without one; data.options without a library's tasks; "
      "trainer.max_restarts with one process; rollout.asynchronous.partial or on_stale with max_staleness 0",
      "the setting only acts together with another one that is off, so it would be silently ignored")
def setting_without_effect(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    why = RULES["setting-without-effect"].why
    if r.trainer.save_merged and r.model.lora is None:
        yield Hit("trainer.save_merged", f"trainer.save_merged true without model.lora: {why} (final/ already holds "
                  "the full model)", "remove trainer.save_merged, or set model.lora")
    # compared with the defaults, not "written by the user": a run's resolved recipe.yaml writes every key
    defaults = {"timeout": RewardCfg.model_fields["timeout"].default,
                "lora_sync": RolloutCfg.model_fields["lora_sync"].default}
    if r.reward.timeout != defaults["timeout"] and not r.reward.isolate:
        yield Hit("reward.timeout", f"reward.timeout {num(r.reward.timeout)} without reward.isolate: {why} (a call "
                  "in the trainer's process cannot be stopped)", "set reward.isolate: true, or remove reward.timeout")
    lg = r.logging
    if lg.mlflow_tracking_uri and not lg.mlflow:
        yield Hit("logging.mlflow_tracking_uri", f"logging.mlflow_tracking_uri set without logging.mlflow: {why}",
                  "set logging.mlflow: true, or remove logging.mlflow_tracking_uri")
    if r.rollout.env_isolate and not r.rollout.env:
        yield Hit("rollout.env_isolate", f"rollout.env_isolate true without rollout.env: {why}",
                  "remove rollout.env_isolate, or set rollout.env (docs/agents.md)")
    from rltune.envs import DATA, ENVS, prefix_of

    library_env = bool(r.rollout.env) and prefix_of(r.rollout.env, ENVS) is not None
    if r.rollout.env_isolate and library_env:
        yield Hit("rollout.env_isolate", f"rollout.env_isolate true with {r.rollout.env}: {why} (an OpenEnv "
                  "environment already runs in a server process of its own; a verifiers environment runs as an "
                  "agent, in threads of the trainer)", "remove rollout.env_isolate")
    if r.rollout.env_args and not library_env:
        yield Hit("rollout.env_args", f"rollout.env_args set without a library's environment in rollout.env: {why}",
                  "remove rollout.env_args, or set rollout.env: verifiers:NAME or openenv:NAME (docs/agents.md)")
    if r.data.options and not any(s and prefix_of(s, DATA) for s in (r.data.train, r.data.eval)):
        yield Hit("data.options", f"data.options set without a library's tasks in data.train or data.eval: {why}",
                  "remove data.options, or set data.train: reasoning_gym:NAME (docs/agents.md)")
    d = r.data
    if r.trainer.eval_every > 0 and d.eval is None and not generated(d.train):
        yield Hit("trainer.eval_every", f"trainer.eval_every {r.trainer.eval_every} without data.eval: {why} (held-out "
                  f"prompts come from data.eval; only builtin tasks have a split of their own, so {d.train} is "
                  "never evaluated)", "set data.eval: PATH (held-out prompts, same format), or trainer.eval_every: 0")
    t = r.trainer
    if t.max_restarts and t.nproc * t.nnodes == 1:
        yield Hit("trainer.max_restarts", f"trainer.max_restarts {t.max_restarts} with one process: {why} (the "
                  "launcher that restarts a failed job starts only with trainer.nproc or nnodes above 1)",
                  "remove trainer.max_restarts, or run several ranks (--nproc N)")
    yield from async_settings_without_effect(r, why)
    if r.rollout.lora_sync != defaults["lora_sync"] and r.model.lora is None:
        yield Hit("rollout.lora_sync", f"rollout.lora_sync {r.rollout.lora_sync} without model.lora: {why}",
                  "remove rollout.lora_sync, or set model.lora")


@rule("mask-truncated-short", "warning",
      f"rollout.mask_truncated with rollout.max_new_tokens < {MASK_TRUNCATED_MIN_TOKENS}",
      "responses cut at max_new_tokens get no loss; with short limits most responses are cut, so most steps train on "
      "few rows or none (the tiny recipes: 95-100% masked, grad norm 0); the run reports "
      "rollout/masked_truncated_frac and the health monitor warns when most rows are masked")
def mask_truncated_short(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    ro = r.rollout
    if ro.mask_truncated and ro.max_new_tokens < MASK_TRUNCATED_MIN_TOKENS:
        yield Hit("rollout.mask_truncated",
                  f"rollout.mask_truncated with rollout.max_new_tokens {ro.max_new_tokens}: "
                  f"{RULES['mask-truncated-short'].why}",
                  f"raise rollout.max_new_tokens (to at least {MASK_TRUNCATED_MIN_TOKENS}), or use reward.overlong "
                  "instead of rollout.mask_truncated")


@rule("mask-truncated-episodes", "warning", "rollout.mask_truncated with rollout.env",
      "an episode the environment has not ended after rollout.max_turns turns is truncated, and masked out of the "
      "loss with the rest; while the policy cannot yet finish its episodes (the start of most runs), every episode "
      "is, and nothing trains")
def mask_truncated_episodes(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    ro = r.rollout
    if ro.mask_truncated and ro.env:
        yield Hit("rollout.mask_truncated",
                  f"rollout.mask_truncated with rollout.env {ro.env} (rollout.max_turns {ro.max_turns}): "
                  f"{RULES['mask-truncated-episodes'].why}",
                  "set rollout.mask_truncated: false (truncated episodes still count in their group's baseline; "
                  "episode/truncated reports them), or raise rollout.max_turns")


@rule("vllm-server-unsupported", "error",
      "rollout.engine vllm-server with top_p < 1 or top_k > 0 (sampling), rollout.lora_sync adapter, "
      "rollout.server.trainer_address without weight_transfer gloo, weight_transfer ipc on a CPU or with the "
      "server on other GPUs, rollout.server.devices with url, or "
      "rollout.server settings without rollout.engine vllm-server",
      "the server reports log-probs after top-p / top-k truncation (not the full distribution the trainer's ratios "
      "use) and takes full weights only; server settings without the server engine do nothing")
def vllm_server_unsupported(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    ro = r.rollout
    if ro.engine != "vllm-server":
        default = RolloutServerCfg()
        if any(getattr(ro.server, k) != getattr(default, k) for k in RolloutServerCfg.model_fields):
            yield Hit("rollout.server", f"rollout.server set with rollout.engine {ro.engine}: it configures the "
                      "vllm-server engine only", "set rollout.engine: vllm-server, or remove rollout.server")
        return
    if ro.do_sample and (ro.top_p < 1.0 or ro.top_k > 0):
        yield Hit("rollout.top_p" if ro.top_p < 1.0 else "rollout.top_k",
                  f"rollout.engine vllm-server with top_p {num(ro.top_p)} / top_k {ro.top_k}: the server's log-probs "
                  "would be those of the truncated distribution (docs/rollout-server.md)",
                  "set rollout.top_p: 1.0 and rollout.top_k: 0, or rollout.engine: vllm (it reports full log-probs)")
    if ro.server.trainer_address and ro.server.weight_transfer != "gloo":
        yield Hit("rollout.server.trainer_address", "rollout.server.trainer_address with weight_transfer "
                  f"{ro.server.weight_transfer}: only the gloo transfer connects back to the trainer",
                  "set rollout.server.weight_transfer: gloo (a server on another machine), or remove trainer_address")
    if ro.server.weight_transfer == "ipc":
        from rltune.rollout.vllm_ipc import ipc_problem

        problem = ipc_problem(r.trainer.device if r.trainer.device in ("cpu", "cuda") else "cuda", ro.server)
        if problem:
            yield Hit("rollout.server.weight_transfer", problem, "set rollout.server.weight_transfer: file")
    if ro.server.devices and ro.server.url:
        yield Hit("rollout.server.devices", "rollout.server.devices with rollout.server.url: an attached server runs "
                  "where it was started", "remove rollout.server.devices (or rollout.server.url, to start one)")
    if ro.lora_sync == "adapter":
        yield Hit("rollout.lora_sync", "rollout.lora_sync adapter with rollout.engine vllm-server: the server takes "
                  "full (merged) weights only", "set rollout.lora_sync: merged, or rollout.engine: vllm")


@rule("server-fleet", "error",
      "rollout.server.urls with url or replicas > 1; rollout.server.devices with urls, or not in equal shares "
      "for rollout.server.replicas; started replicas on a loopback host with trainer.nnodes > 1",
      "a fleet is either started (replicas, each on its share of devices) or attached (urls); rank 0 starts "
      "replicas on its own machine, where other nodes cannot reach a loopback address")
def server_fleet(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    ro, srv = r.rollout, r.rollout.server
    if ro.engine != "vllm-server" or (srv.replicas == 1 and not srv.urls):
        return
    if srv.urls and srv.url:
        yield Hit("rollout.server.urls", "rollout.server.urls with rollout.server.url: one attaches to a fleet, the "
                  "other to one server", "put every server in urls and remove url")
    if srv.urls and srv.replicas > 1:
        yield Hit("rollout.server.replicas", f"rollout.server.replicas {srv.replicas} with rollout.server.urls: "
                  "replicas are servers rltune starts, urls servers it attaches to", "remove one of them")
    if srv.devices and srv.urls:
        yield Hit("rollout.server.devices", "rollout.server.devices with rollout.server.urls: attached servers run "
                  "where they were started", "remove rollout.server.devices")
    elif srv.devices and len(srv.devices) % srv.replicas:
        yield Hit("rollout.server.devices", f"{len(srv.devices)} rollout.server.devices cannot be split into "
                  f"{srv.replicas} equal shares (one per replica)",
                  f"list a multiple of {srv.replicas} devices, or set replicas to a divisor of {len(srv.devices)}")
    loopback = srv.host.strip() in ("127.0.0.1", "localhost", "::1") or srv.host.strip().startswith("127.")
    if r.trainer.nnodes > 1 and not srv.urls and loopback:
        yield Hit("rollout.server.replicas", f"rollout.server.replicas with trainer.nnodes {r.trainer.nnodes}: rank 0 "
                  f"starts the fleet on {srv.host}, which the other nodes cannot reach",
                  "start the servers yourself and list them in rollout.server.urls (with secret_env), reachable "
                  "from every node")


@rule("server-remote-access", "error",
      "rollout.server.host 0.0.0.0 / :: (or --host in rollout.server.extra_args) without "
      "rollout.server.allow_remote: true (a warning with it); rollout.server.url without rollout.server.secret_env "
      "(a warning)",
      "the server's routes change its weights and state (/update_weights, /collective_rpc, /pause): a wildcard host "
      "opens them to the network, guarded by the run's secret only; an attached server without a secret cannot "
      "prove it is the one you started, and anyone who reaches it can change what the trainer samples")
def server_remote_access(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    ro = r.rollout
    if ro.engine != "vllm-server":
        return
    srv = ro.server
    if srv.url or srv.urls:
        if not srv.secret_env:
            yield Hit("rollout.server.secret_env", f"rollout.server.url{'s' if srv.urls else ''} "
                      f"{srv.url or ', '.join(srv.urls)} without rollout.server.secret_env: "
                      "the trainer sends weights and prompts to whatever answers there, unauthenticated",
                      "start the server with rltune's launcher and a secret (docs/rollout-server.md, attaching) and set "
                      "rollout.server.secret_env to the variable holding it", severity="warning")
        return
    args = [str(a) for a in srv.extra_args]
    host = next((a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
                 for i, a in enumerate(args) if a == "--host" or a.startswith("--host=")), None)
    where = "rollout.server.extra_args" if host is not None else "rollout.server.host"
    host = srv.host if host is None else host
    loopback = host.strip() in ("127.0.0.1", "localhost", "::1") or host.strip().startswith("127.")
    if host.strip() in ("0.0.0.0", "::", "[::]", "", "*") or (where == "rollout.server.extra_args" and not loopback):
        if srv.allow_remote:
            yield Hit(where, f"the started server listens on {host!r} (rollout.server.allow_remote: true): anyone who "
                      "reaches this machine reaches its routes, guarded by the run's secret only",
                      "rollout.server.host: 127.0.0.1 unless another machine must reach it", severity="warning")
        else:
            yield Hit(where, f"the started server would listen on {host!r}: {RULES['server-remote-access'].why}",
                      "rollout.server.host: 127.0.0.1 (and no --host in extra_args), or rollout.server.allow_remote: "
                      "true to mean it")


@rule("open-store", "info",
      "trainer.nnodes > 1, or rollout.server.weight_transfer: gloo",
      "torch's TCPStore (the rendezvous store of a multi-node launch; the trainer's store for the gloo weight "
      "transfer) has no bind address and no authentication: it listens on every interface of its machine, and "
      "whoever reaches it can read and write its keys (docs/reliability.md, Sockets: a documented limit)")
def open_store(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    fix = ("run the job on a private network, or firewall the port to the job's own hosts; set GLOO_SOCKET_IFNAME / "
           "NCCL_SOCKET_IFNAME to the private interface")
    if r.trainer.nnodes > 1:
        yield Hit("trainer.nnodes", f"trainer.nnodes {r.trainer.nnodes}: the launcher's rendezvous store on the "
                  f"first node listens on every interface; {RULES['open-store'].why.split(': ', 1)[1]}", fix)
    if r.rollout.engine == "vllm-server" and r.rollout.server.weight_transfer == "gloo":
        yield Hit("rollout.server.weight_transfer", "rollout.server.weight_transfer gloo: the trainer's store for "
                  "the weight broadcast listens on every interface for the whole run; the group's keys carry a "
                  "per-run secret (sent to the server over its authenticated init call), so one who reaches the "
                  "store cannot join the group or read the weights, but can still disturb the rendezvous",
                  fix + "; or weight_transfer: file where the server runs on this machine")


@rule("restarts-without-checkpoints", "warning", "trainer.max_restarts with trainer.save_every 0",
      "a restart goes on from the last valid checkpoint; with none saved during the run, every restart starts "
      "the run over from step 0")
def restarts_without_checkpoints(r: Recipe, ctx: Ctx) -> Iterator[Hit]:
    t = r.trainer
    if t.max_restarts and t.save_every == 0 and t.nproc * t.nnodes > 1:
        yield Hit("trainer.max_restarts", f"trainer.max_restarts {t.max_restarts} with trainer.save_every 0: "
                  f"{RULES['restarts-without-checkpoints'].why}", "set trainer.save_every (e.g. 50 steps)")
