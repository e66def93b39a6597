"""How a run trains a role's weights: all of them (`FullWeights`), or a LoRA adapter on a frozen
base (`LoraAdapter`, through models/lora.py).

One object, chosen once from the recipe (`adaptation_for`), owns everything that differs between
the two; the run calls it instead of asking `recipe.model.lora`. The roles it builds record it
(`attach`), so whatever holds a role asks the role (`adaptation_of(engine)`):

| the run's step                         | FullWeights          | LoraAdapter                                  |
| -------------------------------------- | -------------------- | -------------------------------------------- |
| start (`check_start`, nothing loaded)  | -                    | vLLM's adapter limits; a tied adapted module where merged weights are needed |
| a fresh model (`wrap`: actor, critic backbone, the hf rollout copy) | as it is | PEFT adapter, base frozen; target names checked |
| the reference (`reference`)            | a frozen copy        | the actor with its adapter disabled (no copy) |
| the rollout engine (`check_rollout`, `rollout_name`, `full_weights`, `vllm_lora_rank`, `write_adapter`) | the weights | merged weights, or the adapter |
| the start-up line (`summary`)          | -                    | r, alpha, targets, what trains, reference, sync |
| checkpoints (`checkpoint_frozen`, `save_base`, `check_base`) | every weight | trainable weights + the base's fingerprint, checked on resume |
| final/ (`write_final`)                 | the HF model         | the adapter (PEFT), + final/merged/          |
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable, Iterator

BASE_FILE = "base.json"        # in a checkpoint's role directory: the frozen base's fingerprint
LOG = logging.getLogger("rltune")


def adaptation_for(recipe) -> "FullWeights":
    """The recipe's adaptation: a LoRA adapter with `model.lora`, else full weights."""
    return LoraAdapter(recipe) if recipe.model.lora is not None else FullWeights(recipe)


def adaptation_of(engine) -> "FullWeights":
    """The adaptation a role was built with (`attach`); full weights for anything else."""
    return getattr(engine, "adaptation", None) or FullWeights()


class FullWeights:
    """`model.lora: null`: every weight trains, checkpoints hold them all, the rollout engine and
    final/ take them as they are."""

    adapted = False
    vllm_lora_rank: int | None = None    # vLLM's max LoRA rank when it takes an adapter (None: weights)

    def __init__(self, recipe=None):
        self.recipe = recipe

    # -- start and build --
    def check_start(self) -> None:
        """Before anything heavy: refuse what the recipe (and configs read without loading) rules out."""

    def wrap(self, model, role: str):
        """A freshly built model of `role`: actor, critic (its backbone), rollout (the hf engine's copy)."""
        return model

    def attach(self, engine):
        """The role records how it is trained: `adaptation_of(engine)` answers for it from now on."""
        engine.adaptation = self
        return engine

    def reference(self, actor, build_copy: Callable):
        """The reference role: `build_copy()` builds a frozen copy of the reference model."""
        return build_copy()

    # -- the rollout engine --
    def check_rollout(self, engine_name: str) -> str | None:
        """None when the rollout engine `engine_name` can take the actor's weights, else why not."""
        return None

    def rollout_name(self, name: str) -> str:
        """An actor parameter's name in the hf engine's model."""
        return name

    def full_weights(self, actor) -> Iterator:
        """(name, tensor) of the whole policy under the base model's names (gathered under ZeRO-3)."""
        from ..engine.weights import iter_full_params

        return iter_full_params(actor)

    def input_embedding_name(self, actor) -> str | None:
        """The input embedding's name among `full_weights` (vLLM's tied head is sent under it)."""
        module = getattr(actor, "module", actor)
        try:
            emb = module.get_input_embeddings().weight
        except Exception:  # noqa: BLE001
            return None
        return next((name for name, p in module.named_parameters() if p is emb), None)

    def write_adapter(self, actor, out: Path) -> None:
        raise TypeError("full weights have no adapter to write")

    # -- the start-up line --
    def summary(self, c) -> str | None:
        return None

    # -- checkpoints --
    def checkpoint_frozen(self, engine) -> bool:
        """True: the checkpoint holds the trainable parameters only (the frozen base comes from the model again)."""
        return False

    def save_base(self, engine, role_dir: Path, rank: int, role: str) -> None:
        """What the checkpoint keeps of the frozen base (every rank calls it; rank 0 writes)."""

    def check_base(self, engine, role_dir: Path, role: str) -> None:
        """On resume, before the weights load: the frozen base must be the checkpoint's."""

    # -- final/ --
    def write_final(self, engine, tokenizer, out: Path, rank: int, save_merged: bool) -> dict:
        """Write the final policy into `out` (every rank calls it; rank 0 writes); returns the
        manifest's extra header fields."""
        from ..engine.weights import full_state_dict

        state = full_state_dict(engine)  # every rank takes part in the gather
        if rank == 0:
            engine.module.save_pretrained(out, state_dict={k: v.float() if v.is_floating_point() else v
                                                           for k, v in state.items()}, safe_serialization=True)
            tokenizer.save_pretrained(out)
        return {}


class LoraAdapter(FullWeights):
    """`model.lora`: PEFT adapters on a frozen base (models/lora.py has the mechanics)."""

    adapted = True

    def __init__(self, recipe):
        super().__init__(recipe)
        self.cfg = recipe.model.lora
        self.vllm_lora_rank = int(self.cfg.r) if recipe.rollout.lora_sync == "adapter" else None
        self.tied: list[str] | None = None   # the actor's adapted layers with a tied weight, once it is built

    # -- start and build --
    def check_start(self) -> None:
        self._refuse(self.recipe.rollout.engine)

    def _refuse(self, engine_name: str) -> None:
        """vLLM's limits (when the recipe names it; `auto` decides in make_rollout) and merged
        weights of a tied adapted module (trainer.save_merged)."""
        from .lora import LoraError

        problem = self.check_rollout(engine_name)
        if problem is None and self.recipe.trainer.save_merged:
            problem = self._tied_problem("trainer.save_merged's merged model (final/merged/)")
        if problem:
            raise LoraError(problem)

    def wrap(self, model, role: str):
        from .lora import apply_lora, rollout_model, tied_adapted_layers

        if role == "rollout":
            return rollout_model(model, self.cfg)   # the actor's adapter layers; sync points them at its tensors
        model = apply_lora(model, self.cfg, task_type="CAUSAL_LM" if role == "actor" else None)
        if role == "actor":   # now the tie is known exactly: check again before anything else is built
            self.tied = tied_adapted_layers(model)
            self._refuse(self.recipe.rollout.engine)
        return model

    def reference(self, actor, build_copy: Callable):
        from .lora import AdapterDisabledReference, adapter_reference_ok

        return AdapterDisabledReference(actor) if adapter_reference_ok(self.recipe) else build_copy()

    # -- the rollout engine --
    def check_rollout(self, engine_name: str) -> str | None:
        from .lora_names import check_rollout_sync

        problem = check_rollout_sync(self.recipe, engine_name)
        if problem is None and engine_name == "vllm" and self.recipe.rollout.lora_sync == "merged":
            problem = self._tied_problem("vLLM's merged-weight sync (rollout.lora_sync: merged)")
        return problem

    def _tied_problem(self, what: str) -> str | None:
        from .lora_names import tied_message

        tied = self.tied if self.tied is not None else self._config_tied()
        return tied_message(tied, what) if tied else None

    def _config_tied(self) -> list[str]:
        """Before the actor is loaded: the listed names of tied modules, where the policy's config
        can be read without loading it (builtin models, a local directory, the hub cache)."""
        from ..plan.arch import ArchUnknown, resolve_arch
        from .lora_names import tied_targets

        try:
            tied = resolve_arch(self.recipe.model.policy).tied
        except (ArchUnknown, OSError):
            return []
        return tied_targets(tied, self.cfg.target_modules)

    def rollout_name(self, name: str) -> str:
        from .lora import hf_rollout_name

        return hf_rollout_name(name)

    def full_weights(self, actor) -> Iterator:
        from .lora import merged_params

        return merged_params(actor)   # W + scale * B @ A, new tensors: the actor is untouched

    def input_embedding_name(self, actor) -> str | None:
        from .lora import input_embedding_base_name

        return input_embedding_base_name(actor)

    def write_adapter(self, actor, out: Path) -> None:
        from .lora import write_adapter

        write_adapter(actor, out)

    # -- the start-up line --
    def summary(self, c) -> str | None:
        from .lora import startup_line

        return startup_line(c)

    # -- checkpoints --
    def checkpoint_frozen(self, engine) -> bool:
        return True

    def _spec(self, role: str) -> tuple[str, str]:
        m = self.recipe.model
        return ("model.critic", m.critic) if role == "critic" and m.critic else ("model.policy", m.policy)

    @staticmethod
    def _fingerprint(engine) -> str:
        """The base's fingerprint, computed once per role (the base is frozen)."""
        fp = getattr(engine, "base_fingerprint", None)
        if fp is None:
            from .lora import base_fingerprint

            fp = engine.base_fingerprint = base_fingerprint(engine)
        return fp

    def save_base(self, engine, role_dir: Path, rank: int, role: str) -> None:
        fp = self._fingerprint(engine)
        if rank == 0:
            key, spec = self._spec(role)
            role_dir.mkdir(parents=True, exist_ok=True)
            (role_dir / BASE_FILE).write_text(json.dumps({"fingerprint": fp, key: spec}, indent=1))

    def check_base(self, engine, role_dir: Path, role: str) -> None:
        from .lora import LoraError

        key, spec = self._spec(role)
        ckpt = role_dir.parent
        path = role_dir / BASE_FILE
        if not path.exists():
            LOG.warning("checkpoint %s holds no fingerprint of the %s's base weights (saved by an older rltune): "
                        "resuming without checking that %s %s is the base its adapter was trained on",
                        ckpt.name, role, key, spec)
            return
        saved = json.loads(path.read_text())
        now = self._fingerprint(engine)
        if saved.get("fingerprint") != now:
            raise LoraError(
                f"checkpoint {ckpt.name}: the {role}'s adapter was trained on other base weights than {key} {spec} "
                f"loads now (base fingerprint {saved.get('fingerprint')} in the checkpoint, saved with {key} "
                f"{saved.get(key)}; {now} now): the weights were changed, or a hub id resolves to a new revision. "
                f"An adapter only fits the base it was trained on\n"
                f"  fix: point {key} at the original base model, or --resume never to start a new run (the old one "
                f"is moved to {ckpt.parent.parent / 'previous'}/)")

    # -- final/ --
    def write_final(self, engine, tokenizer, out: Path, rank: int, save_merged: bool) -> dict:
        from .lora import save_final

        save_final(engine, tokenizer, out, rank, save_merged)   # every rank takes part
        return {"lora": True, "merged": bool(save_merged)}
