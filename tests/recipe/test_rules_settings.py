"""Settings that do nothing where they are, rollback's preconditions and the truncation mask
(rules_settings.py; issue 25, items 14 and 15), generation ahead (rules_async.py) and a token budget
per micro-batch (rules_memory.py): each rule fires on a held case with its fix and stays silent once
the fix is applied."""

from __future__ import annotations

import pytest
from recipe_testlib import MINIMAL, assert_rule_case

from rltune.recipe import RULES

ACT = ["autotune.enabled=true", "autotune.mode=act"]
LORA = "model.lora={r: 8, alpha: 16}"
# generation ahead (rules_async.py)
K1, K2 = "rollout.asynchronous.max_staleness=1", "rollout.asynchronous.max_staleness=2"
SERVER = "rollout.engine=vllm-server"
GSPO = ["algorithm.ratio_level=sequence", "algorithm.clip_range=0.0003", "algorithm.clip_range_high=0.0004"]

CASES = [
    ("rollback-inactive", MINIMAL, ["autotune.rollback=true"], "error",
     "set autotune.enabled: true and autotune.mode: act", ["autotune.rollback=true", *ACT]),
    ("rollback-inactive", MINIMAL, ["autotune.rollback=true", "autotune.enabled=true", "autotune.mode=advise"], "error",
     "set autotune.enabled: true and autotune.mode: act", ["autotune.rollback=true", *ACT]),
    ("rollback-no-target", MINIMAL, ["autotune.rollback=true", *ACT, "trainer.save_every=1", "trainer.keep_checkpoints=1"],
     "error", "set trainer.keep_checkpoints: 3", ["autotune.rollback=true", *ACT, "trainer.save_every=1",
                                                 "trainer.keep_checkpoints=3"]),
    ("setting-without-effect", MINIMAL, ["trainer.save_merged=true"], "error", "remove trainer.save_merged",
     ["trainer.save_merged=true", LORA]),
    ("setting-without-effect", MINIMAL, ["reward.timeout=5"], "error", "set reward.isolate: true",
     ["reward.timeout=5", "reward.isolate=true"]),
    ("setting-without-effect", MINIMAL, ["rollout.lora_sync=adapter"], "error", "remove rollout.lora_sync",
     ["rollout.lora_sync=merged"]),
    ("setting-without-effect", MINIMAL, ["logging.mlflow_tracking_uri=http://h:5000"], "error", "set logging.mlflow: true",
     ["logging.mlflow_tracking_uri=http://h:5000", "logging.mlflow=true"]),
    ("setting-without-effect", MINIMAL, ["data.train=prompts.jsonl", "trainer.eval_every=5"], "error",
     "set data.eval: PATH", ["data.train=prompts.jsonl", "trainer.eval_every=5", "data.eval=held-out.jsonl"]),
    ("setting-without-effect", MINIMAL, ["rollout.env_isolate=true"], "error", "remove rollout.env_isolate",
     ["rollout.env_isolate=true", "rollout.env=builtin:calculator"]),
    ("setting-without-effect", MINIMAL, ["rollout.env_isolate=true", "rollout.env=openenv:rltune.envs.openenv_guess"],
     "error", "remove rollout.env_isolate", ["rollout.env=openenv:rltune.envs.openenv_guess"]),
    ("setting-without-effect", MINIMAL, ["rollout.env_args={timeout_s: 5}"], "error", "remove rollout.env_args",
     ["rollout.env_args={timeout_s: 5}", "rollout.env=openenv:rltune.envs.openenv_guess"]),
    ("setting-without-effect", MINIMAL, ["data.options={min_value: 1}"], "error", "remove data.options",
     ["data.train=reasoning_gym:basic_arithmetic"]),
    ("vllm-server-unsupported", MINIMAL, ["rollout.engine=vllm-server", "rollout.server.weight_transfer=ipc",
                                          "trainer.device=cpu"], "error", "set rollout.server.weight_transfer: file",
     ["rollout.engine=vllm-server", "rollout.server.weight_transfer=ipc", "trainer.device=cuda"]),
    ("setting-without-effect", MINIMAL, ["trainer.max_restarts=2"], "error", "remove trainer.max_restarts",
     ["trainer.max_restarts=2", "trainer.nproc=2", "trainer.save_every=10"]),
    ("restarts-without-checkpoints", MINIMAL, ["trainer.max_restarts=2", "trainer.nproc=2", "trainer.save_every=0"],
     "warning", "set trainer.save_every", ["trainer.max_restarts=2", "trainer.nproc=2", "trainer.save_every=10"]),
    ("mask-truncated-episodes", MINIMAL, ["rollout.mask_truncated=true", "rollout.env=builtin:calculator",
                                          "rollout.max_new_tokens=256"], "warning", "set rollout.mask_truncated: false",
     ["rollout.env=builtin:calculator", "rollout.max_new_tokens=256"]),
    ("mask-truncated-short", MINIMAL, ["rollout.mask_truncated=true", "rollout.max_new_tokens=6"], "warning",
     "raise rollout.max_new_tokens (to at least 64)", ["rollout.mask_truncated=true", "rollout.max_new_tokens=256"]),
    ("vllm-server-unsupported", MINIMAL, ["rollout.engine=vllm-server", "rollout.top_p=0.9"], "error",
     "set rollout.top_p: 1.0 and rollout.top_k: 0", ["rollout.engine=vllm-server", "rollout.top_p=1.0"]),
    ("vllm-server-unsupported", MINIMAL, ["rollout.engine=vllm-server", "rollout.top_k=20"], "error",
     "or rollout.engine: vllm", ["rollout.engine=vllm", "rollout.top_k=20"]),
    ("vllm-server-unsupported", MINIMAL, ["rollout.engine=vllm-server", "rollout.lora_sync=adapter", LORA], "error",
     "set rollout.lora_sync: merged", ["rollout.engine=vllm-server", LORA]),
    ("vllm-server-unsupported", MINIMAL, ["rollout.server={port: 8000}"], "error",
     "set rollout.engine: vllm-server", ["rollout.server={port: 8000}", "rollout.engine=vllm-server"]),
    ("vllm-server-unsupported", MINIMAL, ["rollout.engine=vllm-server", "rollout.server.devices=[0]",
                                          "rollout.server.url=http://h:8000"], "error", "remove rollout.server.devices",
     ["rollout.engine=vllm-server", "rollout.server.devices=[0]"]),
    ("server-fleet", MINIMAL, ["rollout.engine=vllm-server", "rollout.server.replicas=2", "rollout.server.devices=[0, 1, 2]"],
     "error", "list a multiple of 2 devices", ["rollout.engine=vllm-server", "rollout.server.replicas=2",
                                               "rollout.server.devices=[0, 1]"]),
    ("server-fleet", MINIMAL, ["rollout.engine=vllm-server", "rollout.server.urls=[http://a:1, http://b:2]",
                               "rollout.server.url=http://a:1", "rollout.server.secret_env=S"], "error",
     "put every server in urls and remove url", ["rollout.engine=vllm-server", "rollout.server.secret_env=S",
                                                 "rollout.server.urls=[http://a:1, http://b:2]"]),
    ("server-fleet", MINIMAL, ["rollout.engine=vllm-server", "rollout.server.replicas=2", "trainer.nnodes=2"], "error",
     "list them in rollout.server.urls", ["rollout.engine=vllm-server", "rollout.server.replicas=2", "trainer.nproc=2"]),
    ("server-remote-access", MINIMAL, ["rollout.engine=vllm-server", "rollout.server.urls=[http://a:1, http://b:2]"],
     "warning", "rollout.server.secret_env to the variable holding it",
     ["rollout.engine=vllm-server", "rollout.server.urls=[http://a:1, http://b:2]", "rollout.server.secret_env=S"]),
    ("server-remote-access", MINIMAL, ["rollout.engine=vllm-server", "rollout.server.host=0.0.0.0"], "error",
     "rollout.server.allow_remote: true", ["rollout.engine=vllm-server", "rollout.server.host=127.0.0.1"]),
    ("server-remote-access", MINIMAL, ["rollout.engine=vllm-server", "rollout.server.extra_args=[--host, '::']"],
     "error", "no --host in extra_args", ["rollout.engine=vllm-server", "rollout.server.extra_args=[--max-num-seqs, '8']"]),
    ("server-remote-access", MINIMAL, ["rollout.engine=vllm-server", "rollout.server.url=http://h:8000"], "warning",
     "rollout.server.secret_env", ["rollout.engine=vllm-server", "rollout.server.url=http://h:8000",
                                   "rollout.server.secret_env=MY_SECRET"]),
    ("open-store", MINIMAL, ["trainer.nnodes=2"], "info", "firewall the port", ["trainer.nnodes=1"]),
    ("open-store", MINIMAL, ["rollout.engine=vllm-server", "rollout.server.weight_transfer=gloo",
                             "rollout.server.url=http://h:8000", "rollout.server.secret_env=S"], "info",
     "weight_transfer: file", ["rollout.engine=vllm-server", "rollout.server.url=http://h:8000",
                               "rollout.server.secret_env=S"]),
    ("vllm-server-unsupported", MINIMAL, ["rollout.engine=vllm-server", "rollout.server.trainer_address=10.0.0.2"],
     "error", "set rollout.server.weight_transfer: gloo",
     ["rollout.engine=vllm-server", "rollout.server.trainer_address=10.0.0.2", "rollout.server.weight_transfer=gloo"]),
    # generation ahead (rules_async.py)
    ("async-unsupported", MINIMAL, [K1, "rollout.engine=vllm"], "error", "set rollout.engine: vllm-server",
     [K1, SERVER]),
    ("async-unsupported", MINIMAL, [K1, "trainer.nproc=2", "rollout.asynchronous.on_stale=drop"], "error",
     "set rollout.asynchronous.on_stale: regenerate", [K1, "trainer.nproc=2"]),
    ("async-unsupported", MINIMAL, [K1, "rollout.asynchronous.partial=true", "rollout.engine=hf"], "error",
     "set rollout.engine: vllm-server", [K1, "rollout.asynchronous.partial=true", SERVER]),
    ("async-unsupported", MINIMAL, [K1, "rollout.asynchronous.partial=true", SERVER, "rollout.env=builtin:calculator",
                                    "rollout.max_new_tokens=256"], "error", "set rollout.asynchronous.partial: false",
     [K1, SERVER, "rollout.env=builtin:calculator", "rollout.max_new_tokens=256"]),
    ("async-without-correction", MINIMAL, [K1, "algorithm.rollout_correction.mode=none"], "warning",
     "set algorithm.rollout_correction.mode: tis", [K1, "algorithm.rollout_correction.mode=auto"]),
    # (1 + 0.2)^4 = 2.07 > cap 2: the fix's K keeps (1.2)^K under it
    ("staleness-vs-cap", MINIMAL, ["rollout.asynchronous.max_staleness=4"], "warning",
     "set rollout.asynchronous.max_staleness: 3", ["rollout.asynchronous.max_staleness=3"]),
    ("staleness-vs-cap", MINIMAL, [K2, "train.updates_per_step=2", "train.batch_size=32", "rollout.batch_size=8"],
     "warning", "or algorithm.rollout_correction.cap: 2.1", [K2, "train.updates_per_step=2", "train.batch_size=32",
                                                            "rollout.batch_size=8", "algorithm.rollout_correction.cap=2.1"]),
    ("staleness-vs-cap", MINIMAL, ["rollout.asynchronous.max_staleness=6", "algorithm.clip_range=0.1",
                                   "algorithm.rollout_correction.cap=5"], "warning",
     "set rollout.asynchronous.max_staleness: 4", ["rollout.asynchronous.max_staleness=4", "algorithm.clip_range=0.1",
                                                   "algorithm.rollout_correction.cap=5"]),
    ("staleness-gspo", MINIMAL, [K2, *GSPO], "warning", "set rollout.asynchronous.max_staleness: 1", [K1, *GSPO]),
    ("setting-without-effect", MINIMAL, ["rollout.asynchronous.partial=true"], "error",
     "set rollout.asynchronous.max_staleness: 1", ["rollout.asynchronous.partial=true", K1, SERVER]),
    ("setting-without-effect", MINIMAL, ["rollout.asynchronous.on_stale=drop"], "error",
     "remove rollout.asynchronous.on_stale", ["rollout.asynchronous.on_stale=drop", K1]),
    # a token budget under the longest sequence (rules_memory.py): 256 + 64 = 320 tokens
    ("micro-batch-tokens", MINIMAL, ["train.max_tokens_per_micro_batch=300"], "warning",
     "set train.max_tokens_per_micro_batch: 320", ["train.max_tokens_per_micro_batch=320"]),
    ("micro-batch-tokens", MINIMAL, ["train.max_tokens_per_micro_batch=1000", "rollout.max_new_tokens=1024"],
     "warning", "set train.max_tokens_per_micro_batch: 1280",
     ["train.max_tokens_per_micro_batch=2560", "rollout.max_new_tokens=1024"]),
    # padding-free passes need a dense mask (rules_memory.py)
    ("padding-free-attention", MINIMAL, ["train.padding_free=true", "model.attn_implementation=flash_attention_2"],
     "warning", "set model.attn_implementation: sdpa",
     ["train.padding_free=true", "model.attn_implementation=sdpa"]),
]


@pytest.mark.parametrize("rule,base,bad,severity,fix,good", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_with_its_fix_and_stays_silent(write, rule, base, bad, severity, fix, good):
    assert_rule_case(write(base), rule, bad, severity, fix, good)


def test_registered_before_the_waiver_rules():
    ids = list(RULES)
    assert {c[0] for c in CASES} <= set(ids) and ids[-2:] == ["unknown-waiver", "waived-error"]


def test_a_resolved_recipe_with_every_default_written_out_is_clean(write):
    # RUN/recipe.yaml writes every key; defaults (reward.timeout 60, rollout.lora_sync merged) do nothing
    # harmful and are not findings
    from rltune.recipe import check

    _, findings = check(write(MINIMAL), ["reward.timeout=60", "rollout.lora_sync=merged"])
    assert "setting-without-effect" not in {f.rule for f in findings}


def test_the_default_async_recipe_is_clean(write):
    from rltune.recipe import check

    _, findings = check(write(MINIMAL), [K1])
    assert [f for f in findings if f.rule in RULES and f.rule.startswith(("async", "staleness"))] == []
