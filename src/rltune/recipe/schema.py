"""The recipe schema: the single source of truth for every option.

Every field has a type, a default, bounds where numeric and a one-line description
(`rltune schema`, docs/recipe.md and editors read them from here). Models are frozen and
forbid unknown keys; the validated `Recipe` is what the rest of the program receives.
No torch import here.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

AlgoName = Literal["ppo", "grpo", "rloo", "reinforce_pp"]
AggMode = Literal[
    "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
# algorithms that train a critic (value model)
CRITIC_ALGOS = ("ppo",)
# algorithms whose advantage is computed within groups of samples of one prompt
GROUP_ALGOS = ("grpo", "rloo")


class Section(BaseModel):
    # strict: YAML already gives every value its type, so `"16"`, `"yes"` or `true` where a
    # number is expected are mistakes to report, not strings to coerce (an int where a float is
    # expected is still fine: `lr: 1`, `kl.coef: 0`). Overrides are parsed as YAML first.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True)


def F(default, description: str, **kw):
    """A field with its one-line description (kept short: it is shown by `rltune schema`)."""
    return Field(default, description=description, **kw)


class LoraCfg(Section):
    r: int = F(16, "LoRA rank of each adapted weight.", ge=1, le=4096)
    alpha: float = F(32.0, "LoRA alpha: the adapter's output is scaled by alpha / r.", gt=0, le=1e6)
    dropout: float = F(0.0, "Unused (accepted for PEFT-style configs): every RL forward runs without dropout, so the first update's ratio is exactly 1; lint lora-dropout warns above 0.", ge=0, lt=1)
    target_modules: Union[Literal["all-linear"], list[str]] = F(
        "all-linear", "Modules that get an adapter: all-linear (every linear layer but the output head) or a list of module names, e.g. [q_proj, v_proj]; a name that matches nothing stops the run at start with the names that exist.")
    bias: Literal["none", "all", "lora_only"] = F("none", "Which biases train: none, all, or only those of adapted modules.")


class ModelCfg(Section):
    policy: str = F(..., description="Policy (actor) model: a local HF directory, a hub id, or builtin:tiny-llama | builtin:tiny-qwen2 | builtin:smollm2-135m-instruct.")
    critic: Optional[str] = F(None, "Critic backbone (PPO); defaults to the policy's weights with a fresh value head.")
    reference: Optional[str] = F(None, "Frozen reference model for the KL term; defaults to the policy.")
    tokenizer: Optional[str] = F(None, "Tokenizer; defaults to the policy's.")
    attn_implementation: Literal["auto", "eager", "sdpa", "flash_attention_2"] = F(
        "auto", "Attention kernel: auto = flash_attention_2 when installed on CUDA, else sdpa.")
    trust_remote_code: bool = F(False, "Allow model repos to run their own Python code (off: only code you name runs).")
    lora: Optional[LoraCfg] = F(None, "Train LoRA adapters (PEFT) instead of the full weights: the actor's, and for PPO the critic backbone's (its value head trains fully); the reference is the policy with its adapter disabled (no second copy). None = full fine-tuning.")


class DataCfg(Section):
    train: str = F(..., description="Training prompts: a .jsonl/.json/.parquet/.csv file, hf:NAME[:CONFIG][:SPLIT] (a Hugging Face hub id or a local dataset directory; split train by default), or builtin:arithmetic.")
    eval: Optional[str] = F(None, "Held-out prompts for eval reward (same forms; an hf: source defaults to split test); builtin tasks use a disjoint split. Without it, a run on file data has no eval: no eval before and after training, no eval every trainer.eval_every steps.")
    prompt_key: str = F("prompt", "Column holding the prompt text (or a list of chat messages).")
    max_prompt_length: int = F(256, "Prompts are left-truncated to this many tokens.", ge=8, le=131072)
    apply_chat_template: bool = F(True, "Wrap prompts with the tokenizer's chat template when it has one.")
    system_prompt: Optional[str] = F(None, "System message prepended when the chat template is applied.")
    shuffle: bool = F(True, "Shuffle prompts each epoch (seeded by trainer.seed).")
    drop_last: bool = F(True, "true: skip an epoch's last prompts that cannot fill a global batch; false: use them, topped up with the next epoch's first prompts (every rank always gets full batches).")
    builtin_size: int = F(2000, "Number of prompts a builtin task generates for training.", ge=8, le=1_000_000)
    builtin_digits: int = F(1, "Digits per operand for builtin:arithmetic.", ge=1, le=6)
    eval_size: int = F(32, "Number of eval prompts used per evaluation.", ge=1, le=100_000)
    options: dict[str, Any] = F({}, "Options of a library's task source (data.train reasoning_gym:NAME: the generator's config; docs/agents.md, 'Environments from the ecosystem').")

    @field_validator("train", "eval")
    @classmethod
    def _hf_form(cls, v):
        # the form of an hf: source (what `validate --skip-files` checks); loading it is files.py's
        if isinstance(v, str) and v.startswith("hf:"):
            from rltune.data.hub import hf_syntax_problem

            problem = hf_syntax_problem(v)
            if problem:
                raise ValueError(problem)
        return v


class OverlongCfg(Section):
    buffer: int = F(64, "DAPO soft overlong penalty: the last `buffer` tokens before rollout.max_new_tokens, where the penalty grows linearly from 0 to -penalty.", ge=1, le=131072)
    penalty: float = F(1.0, "Penalty at rollout.max_new_tokens (added to the weighted reward, x (length - (max_new_tokens - buffer)) / buffer inside the buffer).", ge=0, le=1000)


class RewardCfg(Section):
    functions: list[str] = F([], "Reward functions: builtin:NAME, module:function or path/to/file.py:function.")
    weights: Optional[list[float]] = F(None, "Weights of the reward functions (default 1 each); the model, if any, weighs 1.")
    model: Optional[str] = F(None, "Reward model (sequence classification, one logit) scoring the conversation rendered with its own tokenizer's chat template (plain prompt + response without one).")
    max_length: int = F(1024, "Reward model max input length (prompt + response tokens).", ge=8, le=131072)
    normalize: bool = F(False, "Normalise rewards with a running mean/std over the global batch (all ranks) before advantages.")
    clip: Optional[float] = F(None, "Clip rewards to [-clip, clip] after normalisation.", gt=0, le=1e6)
    on_error: Literal["raise", "zero"] = F("raise", "A reward function that raises, or a score (function, reward model or environment) that is NaN, inf or beyond float32's range (|r| > 3.4e38, the trainer's reward type): stop the run, or score 0 and warn.")
    isolate: bool = F(False, "Run user reward functions (not builtins) in a worker process: one that exits (os._exit), crashes or exceeds reward.timeout is reported and handled by reward.on_error instead of ending the run.")
    timeout: float = F(60.0, "Seconds per reward-function call with reward.isolate; a call that takes longer is stopped and reported.", gt=0, le=86400)
    overlong: Optional[OverlongCfg] = F(None, "DAPO's soft overlong punishment (arXiv:2503.14476 sec. 3.4): a length penalty in the last buffer tokens before rollout.max_new_tokens, added to the training reward (not to eval); None = off.")

    @model_validator(mode="after")
    def _weights_match(self):
        if self.weights is not None and len(self.weights) != len(self.functions):
            raise ValueError(
                f"reward.weights has {len(self.weights)} entries but reward.functions has "
                f"{len(self.functions)}; give one weight per function")
        return self


class KLCfg(Section):
    coef: float = F(0.05, "KL penalty coefficient (initial value when adaptive).", ge=0, le=10)
    mode: Literal["reward", "loss"] = F("reward", "reward: subtract coef*KL from token rewards; loss: add coef*KL to the actor loss.")
    estimator: Literal["k1", "k2", "k3", "abs"] = F("k1", "KL estimator (k3 = low-variance, unbiased, non-negative).")
    target: Optional[float] = F(None, "Target KL for the adaptive controller; None = fixed coef.", gt=0, le=100)
    horizon: int = F(10000, "Adaptive controller horizon (samples).", ge=1, le=10_000_000)


class RolloutCorrectionCfg(Section):
    mode: Literal["auto", "none", "tis", "mis"] = F(
        "auto", "Rollout/trainer mismatch correction: tis = truncated importance weights, mis = masked; auto = tis with vllm or rollout.asynchronous, none with hf (synchronous).")
    cap: float = F(2.0, "Importance-weight cap C: tis clips weights at C; mis zeroes tokens whose weight is outside [1/C, C].", gt=1, le=1000)


class FilterGroupsCfg(Section):
    metric: Literal["acc", "reward"] = F("acc", "What must vary within a group for it to be kept: acc = the first reward function's score (the correctness check), reward = the weighted training reward.")
    max_gen_calls: int = F(10, "Most generation calls (of rollout.batch_size sequences) per step; when reached, the batch is topped up with dropped groups and a warning says so.", ge=1, le=100_000)


class AlgorithmCfg(Section):
    name: AlgoName = F("grpo", "ppo (GAE + critic), grpo (group-normalised), rloo (leave-one-out), reinforce_pp (REINFORCE++).")
    group_size: int = F(4, "Samples per prompt (GRPO/RLOO groups; also n for the others).", ge=1, le=1024)
    gamma: float = F(1.0, "Discount factor.", ge=0, le=1)
    lam: float = F(0.95, "GAE lambda (PPO).", ge=0, le=1)
    clip_range: float = F(0.2, "PPO ratio clip epsilon (lower side: ratio >= 1 - clip_range); cispo: the IS weight's lower epsilon (1.0 = no lower bound).", gt=0, le=1)
    clip_range_high: Optional[float] = F(None, "Upper clip epsilon (clip-higher: ratio <= 1 + clip_range_high); defaults to clip_range.", gt=0, le=10)
    dual_clip: Optional[float] = F(None, "Dual-clip bound c > 1 for negative advantages; None = off.", gt=1, le=100)
    value_clip: Optional[float] = F(0.2, "Value-loss clip around old values (PPO); None = off.", gt=0, le=100)
    entropy_coef: float = F(0.0, "Entropy bonus coefficient.", ge=0, le=1)
    loss_agg: AggMode = F("token-mean", "How token losses are aggregated.")
    policy_loss: Literal["ppo", "cispo"] = F("ppo", "ppo: the clipped surrogate (PPO, GRPO, DAPO, GSPO); cispo: log-prob x advantage weighted by the clipped, stop-gradient importance ratio (MiniMax-M1, arXiv:2506.13585), bounds [1 - clip_range, 1 + clip_range_high].")
    ratio_level: Literal["token", "sequence", "sequence-token"] = F("token", "Importance ratio: token = one per token; sequence = GSPO's exp(mean_t log(pi / pi_old)) per sequence, clipped per sequence (arXiv:2507.18071); sequence-token = GSPO-token (the sequence ratio's value, each token's own gradient).")
    filter_groups: Optional[FilterGroupsCfg] = F(None, "DAPO dynamic sampling (arXiv:2503.14476 sec. 3.2): drop groups whose samples all score alike and generate more until the step is full; None = off.")
    scale_by_std: bool = F(True, "GRPO: divide by the group std (False = Dr.GRPO).")
    whiten_advantages: bool = F(True, "PPO: whiten GAE advantages over the batch.")
    kl: KLCfg = F(KLCfg(), "KL regularisation to the reference model.")
    rollout_correction: RolloutCorrectionCfg = F(
        RolloutCorrectionCfg(), "Importance weights pi_behaviour / pi_rollout per token on the policy loss (docs/training.md).")


class OptimCfg(Section):
    lr: float = F(1e-6, "Learning rate.", gt=0, le=1)
    warmup_steps: int = F(10, "Linear LR warmup, in optimizer updates.", ge=0, le=1_000_000)
    lr_schedule: Literal["constant", "cosine", "linear"] = F("constant", "LR schedule after warmup.")
    min_lr_ratio: float = F(0.0, "Final lr / lr for cosine and linear schedules.", ge=0, le=1)
    weight_decay: float = F(0.0, "AdamW weight decay.", ge=0, le=1)
    betas: tuple[float, float] = F((0.9, 0.999), "AdamW betas.")
    eps: float = F(1e-8, "AdamW epsilon.", gt=0, le=1e-2)
    grad_clip: Optional[float] = F(1.0, "Max global gradient norm; None = no clipping.", gt=0, le=1e6)
    zero_stage: int = F(0, "DeepSpeed ZeRO stage (0-3).", ge=0, le=3)
    gradient_checkpointing: Literal[False, "full", "selective"] = F(
        False, "Recompute activations in training passes (never during generation): false = keep them (fastest); "
        "full = recompute every decoder layer in backward (Hugging Face's checkpointing; the shared-prompt passes are "
        "off); selective = recompute every decoder layer too, with each group's prompt computed once and its "
        "keys/values kept (the shared-prompt passes stay on; full where they do not apply). true = full. "
        "docs/memory.md.")
    offload_optimizer: bool = F(False, "ZeRO optimizer-state offload to CPU (GPU runs; needs the cpu_adam op).")
    device_mesh: Optional[list[int]] = F(None, "Device ids (ranks) this role runs on; None = all.")

    @field_validator("gradient_checkpointing", mode="before")
    @classmethod
    def _checkpointing_words(cls, v):
        # YAML's true/false are booleans; the recipe may also write the words
        if v is True or (isinstance(v, str) and v.lower() in ("true", "on")):
            return "full"
        if isinstance(v, str) and v.lower() in ("false", "off", "none"):
            return False
        return v

    @field_validator("betas", mode="before")
    @classmethod
    def _betas_from_list(cls, v):
        # YAML and JSON have lists, not tuples (strict mode accepts only a tuple)
        return tuple(v) if isinstance(v, list) else v

    @field_validator("device_mesh", mode="before")
    @classmethod
    def _mesh_is_list(cls, v):
        if isinstance(v, (str, int)):
            raise ValueError(
                f"device_mesh must be a list of device ids like [0, 1], not {v!r}: a single "
                "'cuda:0' string puts the whole role on one card")
        return v


class ActorCfg(OptimCfg):
    lr: float = F(1e-6, "Actor learning rate (playbook: 1e-7..5e-6, below critic.lr).", gt=0, le=1)


class CriticCfg(OptimCfg):
    lr: float = F(3e-6, "Critic learning rate (playbook: 1-5 x actor.lr, 3x by default).", gt=0, le=1)


class RolloutServerCfg(Section):
    url: Optional[str] = F(None, "rollout.engine vllm-server: attach to this running server (http://host:port; started with rltune's launcher, a secret, --enable-scale-out and the weight-transfer backend, as docs/rollout-server.md says) instead of starting one. Credentials in it are refused: the secret goes in secret_env.")
    host: str = F("127.0.0.1", "rollout.engine vllm-server: the address the started server listens on (every route takes a per-run secret; a wildcard address, 0.0.0.0 or ::, needs allow_remote: true).")
    allow_remote: bool = F(False, "rollout.engine vllm-server: let the started server listen on every interface (host 0.0.0.0 / ::, or --host in extra_args). Its routes still take the run's secret, but anyone on the network can reach them; without this, such a host is an error (lint server-remote-access).")
    secret_env: Optional[str] = F(None, "rollout.server.url: the name of an environment variable holding the attached server's secret (the RLTUNE_SERVER_SECRET it was started with, docs/rollout-server.md); never the secret itself. The trainer checks the server proves it holds it before sending anything, and sends it on every request.", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    port: Optional[int] = F(None, "rollout.engine vllm-server: its port; null = a free one. A port already in use is refused at start.", ge=1, le=65535)
    startup_timeout_s: float = F(600.0, "Seconds the started server may take to answer /health.", gt=0, le=7200)
    request_timeout_s: float = F(300.0, "Seconds the whole of one request (a generation, a step of a weight sync: connecting, sending, every byte of the answer) may take before the run stops with the server's log tail.", gt=0, le=7200)
    max_in_flight: int = F(64, "Generation requests sent at once (one per prompt).", ge=1, le=4096)
    extra_args: list[str] = F([], "More `vllm serve` arguments, e.g. [--max-num-seqs, '128'].")
    devices: Optional[list[int]] = F(None, "Where the started server runs: GPU ids on CUDA (its CUDA_VISIBLE_DEVICES: GPUs the trainer does not use give the separate placement), CPU core ids on a CPU (the server pinned to them, vLLM's OpenMP threads bound there; pin the trainer to the others with taskset); null = the trainer's devices (colocated). docs/async.md, placement.")
    weight_transfer: Literal["file", "gloo", "ipc"] = F("file", "How synced weights reach the server: file = safetensors files in /dev/shm (the server on this machine); gloo = a gloo broadcast over TCP from the trainer to the server's workers (a server on another machine: start it with --weight-transfer-config '{\"backend\": \"rltune_gloo\"}'); ipc = CUDA IPC handles of the trainer's tensors (vLLM's own ipc backend: a server on the trainer's GPU, no copy through host memory; not yet run on a GPU). docs/rollout-server.md.")
    trainer_address: Optional[str] = F(None, "weight_transfer gloo: the address the server's workers reach the trainer at; null = the address this machine uses to reach the server.")
    replicas: int = F(1, "A fleet: start this many servers, each on its share of rollout.server.devices (equal shares, in order; none: all share the trainer's devices), behind a router in the trainer (least-loaded; a group's samples stay on one server; a server that fails is taken out and the run goes on). One fleet for the job: with trainer.nproc > 1, rank 0 starts it and every rank routes its share there. docs/rollout-server.md, 'A fleet of servers'.", ge=1, le=256)
    urls: list[str] = F([], "A fleet of running servers to attach to (http://host:port each, started as rollout.server.url's server is; one secret for all in secret_env) instead of starting any; routed and failed over as rollout.server.replicas' are. Not with url or replicas.")


class AsyncCfg(Section):
    max_staleness: int = F(0, "Generation one step ahead (docs/async.md): 0 = synchronous (generate, then train: on-policy); K >= 1 = the next K steps' batches are generated while the trainer trains, and no trained token was sampled more than K weight versions ago (checked per token from the version that sampled it).", ge=0, le=16)
    partial: bool = F(False, "rollout.engine vllm-server with max_staleness >= 1: a weight sync does not wait for the batch being generated; its requests are paused (kept), the weights swapped and generation resumed, each token carrying the version that sampled it (partial rollouts). Off: the sync waits, and every batch is sampled with one version.")
    on_stale: Literal["regenerate", "drop"] = F("regenerate", "A group with a token older than max_staleness versions when its step comes (after a rollback, or a resume on another world size): generate it again with the current weights, or drop it (counted in async/dropped; groups stay whole).")


class RolloutCfg(Section):
    engine: Literal["auto", "hf", "vllm", "vllm-server"] = F("auto", "Generation engine: auto = vllm when installed and usable, else hf; vllm-server = vLLM's own server in a child process (or rollout.server.url), docs/rollout-server.md.")
    server: RolloutServerCfg = F(RolloutServerCfg(), "rollout.engine vllm-server: the server rltune starts, or attaches to.")
    asynchronous: AsyncCfg = F(AsyncCfg(), "Overlap generation with training (one step ahead, a staleness bound, off-policy correction): docs/async.md.")
    batch_size: int = F(8, "Sequences generated per generation call (prompts x group_size).", ge=1, le=1_000_000)
    max_new_tokens: int = F(64, "Max tokens generated per response.", ge=1, le=131072)
    do_sample: bool = F(True, "Sample (True) or decode greedily (False: deterministic, for debugging; not with groups).")
    temperature: float = F(1.0, "Sampling temperature.", gt=0, le=10)
    top_p: float = F(1.0, "Nucleus sampling p.", gt=0, le=1)
    top_k: int = F(0, "Top-k sampling; 0 = off.", ge=0, le=1_000_000)
    stop: list[str] = F([], "Stop strings; generation of a response ends after one appears.")
    mask_truncated: bool = F(False, "Drop responses cut at max_new_tokens (no EOS, no stop string) from the loss (DAPO's overlong filtering): they still count in their group's baseline.")
    gpu_memory_utilization: float = F(0.5, "vLLM: fraction of GPU memory for weights + KV cache.", gt=0, le=1)
    tensor_parallel_size: int = F(1, "vLLM tensor parallel size.", ge=1, le=64)
    max_model_len: Optional[int] = F(None, "vLLM max sequence length; default prompt + response length.", ge=16, le=1_048_576)
    cpu_kvcache_gb: Optional[float] = F(None, "vLLM on CPU: KV cache size in GiB (fractions honoured); null = auto: sequences per generation call (rollout.batch_size, or an eval call's up to 32) x (data.max_prompt_length + max_new_tokens) tokens x per-token KV bytes, x1.5 in whole 128-token blocks, at least one max_model_len sequence.", gt=0, le=1024)
    lora_sync: Literal["merged", "adapter"] = F("merged", "With model.lora: push the merged weights into the rollout engine (works with every engine), or only the adapter (vLLM builds with LoRA support).")
    sleep_mode: bool = F(True, "vLLM: free rollout memory while training where the platform supports it.")
    logprob_tolerance: float = F(0.05, "Stale-weight guard: max mean |rollout logp - actor logp| before a warning.", gt=0, le=100)
    env: Optional[str] = F(None, "Episodes instead of single completions (docs/agents.md): an environment class, builtin:NAME (calculator, guess), module:Class or path/to/file.py:Class; one instance per episode. Its tools (public methods) or its step() answer each assistant turn; its reward(), if defined, scores the episode. Or an agent function, path/to/file.py:run: run(client, row) -> reward, written against the OpenAI client, which rltune points at its recording endpoint.")
    max_turns: int = F(4, "Episodes: assistant turns at most; an episode the environment has not ended by then is truncated.", ge=1, le=1000)
    max_episode_tokens: int = F(1024, "Episodes: response-side tokens at most (the model's and the environment's, after the prompt); an episode that reaches it is truncated.", ge=8, le=1_048_576)
    env_args: dict[str, Any] = F({}, "Arguments of a library's environment (rollout.env verifiers:NAME or openenv:NAME; docs/agents.md, 'Environments from the ecosystem').")
    prefix_break: Literal["rows", "context"] = F("rows", "Episodes: what the samples before a prefix break (the chat template rewrote earlier turns, or an agent edited its history) become. rows = rows of the batch of their own, trained with their episode's advantage (docs/agents.md); context = only the prompt of the sample after the break, not trained.")
    env_isolate: bool = F(False, "Episodes: run the environment in a worker process (its module imported there only): one that exits, crashes or hangs ends the episodes it hosted (episode/env_crashes, reward 0) instead of the run, and a fresh worker starts.")
    tool_timeout_s: float = F(10.0, "Episodes: seconds a tool call or step() may take before it is cut and reported to the model as an error.", gt=0, le=3600)


class TrainCfg(Section):
    batch_size: int = F(32, "Sequences per optimizer update (via accumulation over micro batches).", ge=1, le=10_000_000)
    micro_batch_size: int = F(4, "Sequences per forward/backward pass, per rank (accumulated up to train.batch_size / world size); not used to cut when train.max_tokens_per_micro_batch is set.", ge=1, le=1_000_000)
    max_tokens_per_micro_batch: Optional[int] = F(None, "Cut micro-batches by tokens instead of rows (verl's ppo_max_token_len_per_gpu), per rank, in the updates and the reference, behaviour and value passes: length-sorted sequences are packed greedily so that rows x (longest prompt + longest response) stays within this many tokens (with train.padding_free: their real tokens); a group stays whole where it fits, a longer sequence goes alone. Exact (each micro-batch is weighted by its share); for long-tail response lengths. None = train.micro_batch_size rows per micro-batch.", ge=1, le=100_000_000)
    ppo_epochs: int = F(1, "Passes over each step's experience.", ge=1, le=100)
    updates_per_step: int = F(1, "Optimizer updates per epoch: a step gathers this many train.batch_size batches (PPO mini-batches).", ge=1, le=1000)
    share_prompts: bool = F(True, "Compute each prompt once per group in the reference, behaviour, value and training passes (its keys/values shared by the group's responses; exact). Off, or where the model does not support it (full gradient checkpointing, caches we cannot vouch for), every sequence is computed whole.")
    padding_free: bool = F(False, "Lay each micro-batch's sequences end to end without padding in the reference, behaviour, value and training passes (one sequence, attention kept within each row by a dense mask; a group's prompt once with train.share_prompts). Exact; for long-tail response lengths, where train.max_tokens_per_micro_batch then counts real tokens instead of rows x longest. SDPA or eager attention on verified model types (llama, qwen2, qwen3, mistral); elsewhere the padded passes run and the run's header says why. The mask costs (tokens per micro-batch)^2 bytes.")


class TrainerCfg(Section):
    output_dir: str = F("runs/rltune", "Run directory: metrics, events, checkpoints, final model.")
    max_steps: int = F(100, "Training steps of progress (one step = one batch of experience, then updates); steps undone by a rollback are redone.", ge=1, le=10_000_000)
    seed: Optional[int] = F(42, "Seed for python, numpy, torch and the sampler; None = drawn once on rank 0 and shared by all ranks (not reproducible).", ge=0, le=2**32 - 1)
    precision: Literal["fp32", "bf16", "fp16"] = F("fp32", "Training precision (fp16 is discouraged: spikes).")
    save_every: int = F(0, "Checkpoint every N steps; 0 = only at the end and on interrupt.", ge=0, le=10_000_000)
    keep_checkpoints: int = F(2, "How many recent checkpoints to keep.", ge=1, le=1000)
    eval_every: int = F(0, "Evaluate every N steps (and before the first and after the last); 0 = off.", ge=0, le=10_000_000)
    nproc: int = F(1, "Processes (ranks) on this node; > 1 starts the launcher.", ge=1, le=1024)
    nnodes: int = F(1, "Nodes (multi-node runs need the launcher's rendezvous or a hostfile).", ge=1, le=4096)
    launcher: Literal["torchrun", "deepspeed"] = F("torchrun", "Launcher for nproc > 1.")
    max_restarts: int = F(0, "Several ranks: times the job restarts after a rank fails, each time a fresh torchrun resuming from the last valid checkpoint (--resume auto); 0: stop and print the command that resumes (docs/scale.md).", ge=0, le=100)
    rendezvous_timeout_s: float = F(600.0, "Several nodes: seconds torchrun's rendezvous waits for every node to join before the job stops with a message (a node that never starts).", gt=0, le=86400)
    collective_timeout_s: float = F(1800.0, "Several ranks: seconds a collective (a gradient all-reduce, a metric gather, the stop check) waits for the other ranks; a rank that died or stalls ends the job within it, the waiting rank naming the phase (docs/reliability.md).", gt=0, le=86400)
    device: Literal["auto", "cpu", "cuda"] = F("auto", "Device: auto = cuda when available.")
    threads: Optional[int] = F(None, "torch CPU threads per rank; None = torch default.", ge=1, le=1024)
    save_merged: bool = F(False, "With model.lora: final/ also holds the merged model (HF format) next to the adapter.")


class LoggingCfg(Section):
    console: Literal["rich", "plain", "quiet"] = F("rich", "Console output: rich = Rich-formatted log lines, plain = LEVEL message lines (both with a "
                                                            "progress bar where stderr is a terminal), quiet = warnings and errors only.")
    log_every: int = F(1, "Print a [Rollout] line (with step/total, s/step and ETA) every N steps.", ge=1, le=1_000_000)
    tensorboard: bool = F(False, "Write TensorBoard events to RUN_DIR/tb (extra: tracking).")
    wandb: bool = F(False, "Log to Weights & Biases (offline mode works with no network).")
    wandb_project: str = F("rltune", "W&B project.")
    wandb_mode: Literal["online", "offline", "disabled"] = F("offline", "W&B mode.")
    mlflow: bool = F(False, "Log to MLflow.")
    mlflow_tracking_uri: Optional[str] = F(None, "MLflow tracking URI; default a file store in RUN_DIR/mlruns.")
    sample_every: int = F(0, "Print one sampled completion every N steps; 0 = off.", ge=0, le=1_000_000)


class HealthCfg(Section):
    enabled: bool = F(True, "Run the health detectors during training.")
    warmup_steps: int = F(3, "Steps before detectors that need history may fire.", ge=0, le=100000)
    window: int = F(5, "Window (steps) for sustained-condition and trend detectors.", ge=2, le=100000)
    swing_sigmas: float = F(4.0, "Early reward swing: a deviation from the recent trend beyond this many standard errors of the batch mean (reward/std / sqrt(sequences per step)).", gt=0, le=1000)
    reward_swing: Optional[float] = F(None, "Deprecated, ignored: swings are judged against the batch's sampling noise (swing_sigmas). Kept so that older recipe.yaml files load.", gt=0, le=100)
    swing_steps: int = F(50, "The reward-swing detector watches the first N steps (early training).", ge=1, le=10_000_000)
    kl_high: float = F(0.6, "KL per token level (playbook figure): sustained above it while the reward stalls, or above 2x it and growing >= 1.5x per step, is a warning; otherwise an info (kl_level).", gt=0, le=1000)
    kl_spike_factor: float = F(10.0, "KL spike: a value this many times its running max.", gt=1, le=1e6)
    kl_spike_min: float = F(0.3, "KL spike: ignore values below this.", ge=0, le=1000)
    grad_spike_factor: float = F(10.0, "Grad-norm spike: this many times its running median.", gt=1, le=1e6)
    clip_long_steps: int = F(200, "Gradient clipping on >= 90% of this many steps in a row is reported: an info alone, a warning with harm (loss or KL rising, a spike, the reward falling).", ge=2, le=10_000_000)
    collapse_drop: float = F(0.3, "Reward collapse: drop from the peak, relative to the rise.", gt=0, le=10)
    entropy_floor: float = F(0.05, "Entropy collapse below this (nats/token).", ge=0, le=100)
    length_collapse: float = F(0.3, "Response length below this fraction of its start.", gt=0, lt=1)
    length_runaway: float = F(0.95, "Mean response length above this fraction of max_new_tokens (and grown from its start) is a runaway.", gt=0, le=1)
    length_growth: float = F(3.0, "Mean response length above this many times its start is a runaway.", gt=1, le=1e6)
    sync_ms: Optional[float] = F(None, "Rollout weight sync (resharding) slower than this (ms); None = 200 ms (playbook, 7B) x max(1, size / 7B); models under 1B: max(200 ms, 5x the run's own early syncs).", gt=0, le=1e7)
    is_weight_max: float = F(10.0, "Importance-ratio extreme: rollout/is_weight_max above this (and 5x its running median) 2 steps in a row.", gt=1, le=1e12)
    zero_adv_max: float = F(0.95, "Share of zero-advantage groups (batch/zero_adv_frac or rollout/zero_std_frac) above this for 2 x window steps: the batch teaches almost nothing (sooner: a sudden jump, or a storm: 0.8 or more over window steps while the reward does not rise).", gt=0, le=1)
    clipfrac_max: float = F(0.3, "actor/clipfrac above this and 3x its start, for window steps: the update runs away from the rollout policy.", gt=0, le=1)
    logprob_drift: float = F(3.0, "Rollout/trainer log-prob mismatch growing: rollout/logprob_diff_mean over a window this many times its start (and above half rollout.logprob_tolerance).", gt=1, le=1e6)
    async_capped_frac: float = F(0.05, "rollout.asynchronous: rollout/is_capped_frac (tokens whose importance weight pi_prox / pi_sample the cap truncated or masked) above this for 2 steps, with stale samples: the staleness outruns the correction (async_drift).", gt=0, le=1)
    async_weight_drift: float = F(0.2, "rollout.asynchronous: |rollout/is_weight_mean - 1| above this for 2 steps, with stale samples (async_drift).", gt=0, le=100)
    max_skipped_steps: int = F(3, "Consecutive non-finite steps before the run stops.", ge=1, le=1000)


class AutotuneCfg(Section):
    enabled: bool = F(False, "Let the stage controller act on the run (see docs/health.md).")
    mode: Literal["act", "advise"] = F("act", "act: change knobs; advise: only log what it would change.")
    cooldown: int = F(5, "Steps between two spike fixes.", ge=0, le=100000)
    window: int = F(3, "Steps per window for the stage transitions.", ge=1, le=100000)
    rollback: bool = F(False, "mode act: on a hard spike (kl_spike/grad_spike more than rollback_factor x its recent max, an entropy_collapse, or max_skipped_steps - 1 non-finite steps in a row) restore the last good checkpoint (the step counter goes back to it), apply the spike fix, skip the batch, continue.")
    rollback_every: int = F(5, "With rollback: save a checkpoint every N steps at which no warning fired (the rollback target).", ge=1, le=10_000_000)
    rollback_factor: float = F(20.0, "A kl_spike/grad_spike is hard (rolls back) when its value is more than this many times its recent max.", gt=1, le=1e6)
    max_rollbacks: int = F(2, "Most rollbacks per run (counted across resumes); later hard spikes get the ordinary spike fix.", ge=0, le=1000)


class HardwareCfg(Section):
    gpus: int = F(1, "GPUs (ranks) the run uses.", ge=1, le=1_000_000)
    gpu_mem_gb: float = F(..., description="Memory of one GPU in GiB, as the card is named (an '80GB' A100 has 80 GiB).", gt=0, le=100_000)


class LintCfg(Section):
    waive: dict[str, str] = F({}, "Waived lint rules: RULE_ID: reason. Warnings and infos only; waiving an error is itself an error (waived-error).")


class Recipe(Section):
    """One RL post-training run."""

    model: ModelCfg
    data: DataCfg
    reward: RewardCfg = F(RewardCfg(), "Reward functions and/or a reward model.")
    algorithm: AlgorithmCfg = F(AlgorithmCfg(), "RL algorithm and loss options.")
    actor: ActorCfg = F(ActorCfg(), "Actor (policy) optimisation.")
    critic: CriticCfg = F(CriticCfg(), "Critic (value model) optimisation; PPO only.")
    rollout: RolloutCfg = F(RolloutCfg(), "Generation.")
    train: TrainCfg = F(TrainCfg(), "Batches and epochs.")
    trainer: TrainerCfg = F(TrainerCfg(), "Run directory, steps, precision, seed, checkpoints, processes.")
    logging: LoggingCfg = F(LoggingCfg(), "Console and experiment trackers.")
    health: HealthCfg = F(HealthCfg(), "Health detectors (thresholds from the playbook).")
    autotune: AutotuneCfg = F(AutotuneCfg(), "Automatic stage transitions and spike fixes.")
    preset: Union[str, list[str], None] = F(None, "Preset name(s) merged under this recipe, in order (the recipe wins).")
    hardware: Optional[HardwareCfg] = F(None, "The GPUs this recipe is meant for (hardware presets set it): `rltune plan` and validate's memory-budget rule check the per-device memory budget against it (docs/plan.md); None = unknown (validate --gpus N --gpu-mem SIZE gives it for one check).")
    lint: LintCfg = F(LintCfg(), "Lint settings.")

    # -- derived quantities, used by validate (batch plan) and the trainer --
    @property
    def has_critic(self) -> bool:
        return self.algorithm.name in CRITIC_ALGOS

    @property
    def samples_per_prompt(self) -> int:
        return self.algorithm.group_size

    @property
    def response_tokens(self) -> int:
        """Tokens after the prompt one sample may hold: rollout.max_new_tokens; for episodes
        (rollout.env) max_episode_tokens (every turn, the environment's too) plus one turn's
        max_new_tokens (the last turn is sampled with the episode's whole context in front of it)."""
        ro = self.rollout
        return ro.max_episode_tokens + ro.max_new_tokens if ro.env else ro.max_new_tokens

    @property
    def response_label(self) -> str:
        """The keys behind `response_tokens`, with their values (for messages)."""
        ro = self.rollout
        if ro.env:
            return f"rollout.max_episode_tokens {ro.max_episode_tokens} + rollout.max_new_tokens {ro.max_new_tokens}"
        return f"rollout.max_new_tokens {ro.max_new_tokens}"

    @property
    def gen_calls_per_step(self) -> int:
        return max(1, self.train.updates_per_step * self.train.batch_size // self.rollout.batch_size)

    @property
    def optimizer_updates_per_step(self) -> int:
        """Optimizer updates one step runs: ppo_epochs passes x train.updates_per_step batches."""
        return self.train.ppo_epochs * self.train.updates_per_step

    @property
    def logprob_temperature(self) -> float:
        """The temperature every log-prob uses (rollout, behaviour, reference, update): the
        sampling temperature, or 1 with greedy decoding (argmax ignores it)."""
        return self.rollout.temperature if self.rollout.do_sample else 1.0

    @property
    def prompts_per_call(self) -> int:
        return max(1, self.rollout.batch_size // self.algorithm.group_size)

    @property
    def micro_rows(self) -> int:
        """Sequences in one micro-batch at the longest (data.max_prompt_length + response_tokens):
        train.micro_batch_size, or as many as train.max_tokens_per_micro_batch holds (one at least:
        a longer sequence goes alone)."""
        budget = self.train.max_tokens_per_micro_batch
        if budget is None:
            return self.train.micro_batch_size
        return max(1, budget // (self.data.max_prompt_length + self.response_tokens))

    @property
    def micro_steps_per_update(self) -> int:
        """Micro-batches per update (at the longest sequences with train.max_tokens_per_micro_batch)."""
        return max(1, self.train.batch_size // self.micro_rows)


def batch_plan(r: Recipe) -> dict:
    """What the batch sizes mean for one training step (printed by `validate`)."""
    calls = r.gen_calls_per_step
    return {
        "generation_calls_per_step": calls,
        "prompts_per_generation_call": r.prompts_per_call,
        "samples_per_prompt": r.samples_per_prompt,
        "sequences_per_step": calls * r.rollout.batch_size,
        "sequences_per_optimizer_update": r.train.batch_size,
        "micro_batches_per_update": r.micro_steps_per_update,
        "updates_per_epoch": r.train.updates_per_step,
        "ppo_epochs": r.train.ppo_epochs,
        "optimizer_updates_per_step": r.optimizer_updates_per_step,
    }
