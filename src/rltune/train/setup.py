"""Build everything a run needs from a validated recipe: data, rewards, engines, rollout."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

from ..data import PromptSampler, PromptSet, load_prompts
from ..engine.distributed import DistInfo
from ..envs import generated as generated_source
from ..errors import UserError
from ..recipe.schema import Recipe
from .console import LOG
from .prompts import truncation_warning, uses_chat_template

if TYPE_CHECKING:  # types only: building them imports torch, transformers and deepspeed
    from deepspeed import DeepSpeedEngine
    from transformers import PreTrainedTokenizerBase

    from ..algo.kl import AdaptiveKLController, FixedKLController
    from ..models.lora import AdapterDisabledReference
    from ..reward import RewardComputer
    from ..rollout.base import RolloutEngine


class TrainError(UserError):
    """A run that cannot go on (message is user-facing)."""


@dataclass
class Components:
    recipe: Recipe
    dist: DistInfo
    tokenizer: "PreTrainedTokenizerBase"
    train_set: PromptSet
    eval_set: PromptSet | None
    sampler: PromptSampler
    rewards: "RewardComputer"
    actor: "DeepSpeedEngine"
    critic: "DeepSpeedEngine | None"        # PPO only
    reference: "DeepSpeedEngine | AdapterDisabledReference | None"  # None when no KL is computed
    rollout: "RolloutEngine"
    kl_ctl: "Union[FixedKLController, AdaptiveKLController]"
    correction: str = "none"                # algorithm.rollout_correction.mode, resolved: none | tis | mis
    seed: int | None = None                 # the run's seed (drawn on rank 0 when trainer.seed is null)
    env: object = None                      # rollout.env: (environment class, Renderer); None = single-turn
    pipeline: object = None                 # rollout.asynchronous: the producer (pipeline.Pipeline); None = synchronous


def resolve_correction(recipe: Recipe, engine_name: str) -> str:
    """`auto` corrects the mismatch where there is one to correct: vLLM's kernels differ from
    the trainer's, and samples generated ahead (rollout.asynchronous) come from older weights; the
    hf engine runs the trainer's own model code, so its on-policy log-probs match pi_behaviour to
    rounding."""
    mode = recipe.algorithm.rollout_correction.mode
    if mode != "auto":
        return mode
    if recipe.rollout.asynchronous.max_staleness > 0:   # stale samples: pi_prox / pi_sample (pipeline.py)
        return "tis"
    return "tis" if engine_name in ("vllm", "vllm-server") else "none"


def seed_everything(seed: int | None, rank: int) -> None:
    import numpy as np
    import torch

    if seed is None:
        return
    s = seed + rank
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def needs_reference(recipe: Recipe) -> bool:
    return recipe.algorithm.kl.coef > 0 or recipe.algorithm.kl.target is not None or recipe.autotune.enabled


def build(recipe: Recipe, dist: DistInfo, recipe_dir: Path, seed: int | None = None) -> Components:
    """`seed`: the seed a resumed `trainer.seed: null` run drew (its checkpoint keeps it)."""
    import torch

    from ..algo import make_kl_controller
    from ..engine.roles import build_actor, build_critic, build_reference
    from ..models.adaptation import adaptation_for
    from ..models.loading import load_causal_lm, load_tokenizer
    from ..reward import RewardComputer

    adaptation = adaptation_for(recipe)   # full weights or a LoRA adapter: every role asks it
    adaptation.check_start()              # before anything heavy
    if recipe.trainer.threads:
        torch.set_num_threads(recipe.trainer.threads)
    seed = recipe.trainer.seed if recipe.trainer.seed is not None else seed
    if seed is None:  # drawn once on rank 0 and shared: every rank must shuffle the prompts alike
        from .collective import broadcast_int

        seed = broadcast_int(random.randrange(2**31))
    seed_everything(seed, dist.rank)

    # tokenizer and data
    tokenizer = load_tokenizer(recipe.model.tokenizer or recipe.model.policy)
    chat = uses_chat_template(tokenizer, recipe.data)
    d = recipe.data
    train_set = load_prompts(_data_path(d.train, recipe_dir), d.prompt_key, size=d.builtin_size,
                             digits=d.builtin_digits, seed=seed, split="train", chat=chat, options=d.options)
    eval_set = None
    if d.eval or (generated_source(d.train) and recipe.trainer.eval_every > 0):
        spec = d.eval or d.train
        eval_set = load_prompts(_data_path(spec, recipe_dir), d.prompt_key, size=d.eval_size,
                                digits=d.builtin_digits, seed=seed, split="eval", chat=chat, options=d.options)
    if eval_set is not None and len(eval_set) > d.eval_size:
        eval_set = PromptSet(eval_set.rows[:d.eval_size], eval_set.prompt_key, eval_set.source)
    if dist.rank == 0:  # prompts longer than data.max_prompt_length: one warning per set, with the count
        for key, prompt_set in (("data.train", train_set), ("data.eval", eval_set if d.eval else None)):
            warning = prompt_set and truncation_warning(prompt_set.rows, tokenizer, d, prompt_set.prompt_key, key)
            if warning:
                LOG.warning(warning)
    _check_meshes(recipe, dist)
    prompts_per_call = max(1, recipe.rollout.batch_size // recipe.algorithm.group_size // dist.world_size)
    try:
        sampler = PromptSampler(len(train_set), prompts_per_call, seed, d.shuffle, d.drop_last,
                                dist.rank, dist.world_size)
    except ValueError as err:
        raise TrainError(f"data.train {d.train}: {err}") from err

    # rewards (the only user code a recipe can run)
    reward_model = None
    if recipe.reward.model:
        from ..reward.model import RewardModelScorer

        reward_model = RewardModelScorer(recipe.reward.model, recipe.reward.max_length,
                                         recipe.trainer.precision, dist.device)
    from .episodes import load_environment

    env = load_environment(recipe, tokenizer, recipe_dir)     # rollout.env: episodes (docs/agents.md)
    env_reward = env is not None and _env_gives_reward(env[0])   # an agent's run() returns its reward
    rewards = RewardComputer(recipe.reward, recipe_dir, reward_model, LOG, gather=gather_floats,
                             env_reward=env_reward)

    # engines: one deepspeed.initialize per role
    _check_precision(recipe, dist)
    total_updates = recipe.trainer.max_steps * recipe.optimizer_updates_per_step  # the LR schedule counts updates
    actor = build_actor(recipe, dist.device, total_updates, adaptation)
    critic = build_critic(recipe, dist.device, total_updates, adaptation) if recipe.has_critic else None
    reference = None
    if needs_reference(recipe):   # LoRA: the actor with its adapter disabled (no copy)
        reference = adaptation.reference(actor, lambda: build_reference(recipe, dist.device))

    # rollout engine (its own copy of the policy, synced from the actor after every update)
    from ..rollout import make_rollout

    def hf_model():
        model = load_causal_lm(recipe.model.policy, recipe.trainer.precision if dist.device != "cpu" else "fp32",
                               recipe.model.attn_implementation, dist.device)
        return adaptation.wrap(model, "rollout")

    rollout = make_rollout(recipe, hf_model, tokenizer, dist.device, world_size=dist.world_size,
                           adaptation=adaptation, log_dir=Path(recipe.trainer.output_dir), rank=dist.rank)  # its choice and why: in the start-up block (progress.py)
    rollout.sync_weights(actor)
    if hasattr(rollout, "seed"):   # hf: its own sampling RNG (rollout/hf.py), seeded like the global ones
        rollout.seed(seed + dist.rank)

    kl = recipe.algorithm.kl
    kl_ctl = make_kl_controller(kl.coef, kl.target, kl.horizon)
    correction = resolve_correction(recipe, rollout.name)
    return Components(recipe, dist, tokenizer, train_set, eval_set, sampler, rewards, actor, critic,
                      reference, rollout, kl_ctl, correction, seed, env)


def _check_precision(recipe: Recipe, dist: DistInfo) -> None:
    """DeepSpeed refuses fp16 where its accelerator has none (e.g. a CPU torch without fp16
    kernels): say so in the recipe's terms instead of a traceback from deepspeed.initialize."""
    if recipe.trainer.precision != "fp16":
        return
    from deepspeed.accelerator import get_accelerator

    if not get_accelerator().is_fp16_supported():
        raise TrainError(f"trainer.precision: fp16 is not supported by DeepSpeed on this device ({dist.device}: "
                         f"{get_accelerator().device_name()})\n  fix: set trainer.precision: bf16 (or fp32)")


def gather_floats(values: list[float]) -> list[float]:
    """The values of every rank, rank-major (every rank holds as many)."""
    import torch

    from .collective import gather_rows

    return gather_rows(torch.tensor(values, dtype=torch.float64)).tolist()


def _env_gives_reward(env) -> bool:
    """Whether the loaded `rollout.env` scores its episodes: an agent function (run() returns the
    reward), an environment class with reward(), or an isolated one (rollout.env_isolate) whose
    worker said so. (hasattr(env, "reward") missed the first and the last: 'no reward' at set-up.)"""
    from ..agents.env import gives_reward
    from ..agents.isolate import EnvPool

    return bool(env.gives_reward) if isinstance(env, EnvPool) else gives_reward(env)


def _check_meshes(recipe: Recipe, dist: DistInfo) -> None:
    """Device meshes against the real world size. Every role is colocated on every rank
    (HybridFlow in small); placing a role on a subset of ranks is not implemented yet."""
    for role in ("actor", "critic"):
        mesh = getattr(recipe, role).device_mesh
        if mesh is None or (role == "critic" and not recipe.has_critic):
            continue
        bad = [i for i in mesh if i < 0 or i >= dist.world_size]
        if bad:
            raise TrainError(f"{role}.device_mesh {mesh} names device ids {bad} but this run has "
                             f"{dist.world_size} rank(s) (ids 0..{dist.world_size - 1})\n"
                             f"  fix: set {role}.device_mesh: {list(range(dist.world_size))} or remove it")
        if sorted(set(mesh)) != list(range(dist.world_size)):
            raise TrainError(f"{role}.device_mesh {mesh} is a subset of the {dist.world_size} ranks: every role "
                             "runs colocated on all ranks; placing a role on a subset is not supported yet\n"
                             f"  fix: remove {role}.device_mesh (or list all ranks)")


def _data_path(spec: str, recipe_dir: Path) -> str:
    """Where train reads a data spec: the places `validate` checks (data.datasets.resolve_data_path)."""
    from ..data.datasets import resolve_data_path

    if generated_source(spec):
        return spec
    if spec.startswith("hf:"):
        from ..data.hub import resolve_hf_spec

        return resolve_hf_spec(spec, recipe_dir)
    path = resolve_data_path(spec, recipe_dir)
    return str(path) if path is not None else spec
