"""Test hooks that inject faults at chosen steps (RLTUNE_FAULTS="actor_inf@3,reward_nan@5").

One seam: `Faults.install(components)` wraps what a fault needs (the engines' training forward, the
reward computer, the rollout engine's `sync_weights`) and the driver sets `faults.step` before
each step. The loop and the update code know nothing about faults. Inert when unset.

Kinds:
  actor_inf / critic_nan   the role's training forward returns nan (a non-finite loss)
  actor_grad_inf / critic_grad_inf
                           the loss stays finite, its gradient becomes inf (non-finite gradient)
  reward_nan               the first sample's reward is nan
  skip_sync                the actor -> rollout weight sync is skipped (stale rollout weights)
  slow_save                the checkpoint of that step pauses after its model files are written,
                           before its manifest (RLTUNE_SLOW_SAVE_S seconds, default 30): a window to
                           interrupt a save in
  sigterm / sigkill        the rank sends itself SIGTERM / SIGKILL as that step begins (only rank
                           RLTUNE_FAULT_RANK where that is set): a signal or a death on one rank
  stall                    the rank sleeps RLTUNE_STALL_S seconds (default 600) as that step begins
                           (same rank rule): a stalled peer
"""

from __future__ import annotations

import os


def inf_grad(x):
    """`x` unchanged in the forward pass; its gradient becomes inf in the backward pass."""
    y = x.clone()
    y.register_hook(lambda g: g * float("inf"))
    return y


class Faults:
    def __init__(self, spec: str):
        self.at: dict[str, set[int]] = {}
        self.step = 0
        for item in filter(None, (s.strip() for s in spec.split(","))):
            kind, _, step = item.partition("@")
            self.at.setdefault(kind, set()).add(int(step))

    @classmethod
    def from_env(cls) -> "Faults | None":
        spec = os.environ.get("RLTUNE_FAULTS", "")
        return cls(spec) if spec else None

    def on(self, kind: str) -> bool:
        return self.step in self.at.get(kind, ())

    def signal_self(self, rank: int) -> None:
        """The sigterm / sigkill / stall faults of this step, on this rank."""
        only = os.environ.get("RLTUNE_FAULT_RANK")
        if only is not None and int(only) != rank:
            return
        if os.environ.get("RLTUNE_ATTEMPT", "0") != "0":   # a restarted job (trainer.max_restarts): once only
            return
        import signal

        for kind, sig in (("sigterm", signal.SIGTERM), ("sigkill", signal.SIGKILL)):
            if self.on(kind):
                os.kill(os.getpid(), sig)
        if self.on("stall"):
            import time

            time.sleep(float(os.environ.get("RLTUNE_STALL_S", "600")))

    def save_pause(self, step: int) -> None:
        """Called by the checkpoint writer between the model files and the manifest."""
        if step in self.at.get("slow_save", ()):
            import time

            time.sleep(float(os.environ.get("RLTUNE_SLOW_SAVE_S", "30")))

    def install(self, c) -> None:
        """Wrap the components' seams (in place)."""
        self._hook_forward(c.actor, "actor_inf", "actor_grad_inf")
        if c.critic is not None:
            self._hook_forward(c.critic, "critic_nan", "critic_grad_inf")
        rewards, faults = c.rewards, self

        class Rewards:
            def __getattr__(self, name):
                return getattr(rewards, name)

            def __call__(self, *args, **kw):
                result = rewards(*args, **kw)
                if faults.on("reward_nan") and result.scores:
                    result.scores[0] = float("nan")
                return result

        c.rewards = Rewards()
        if "skip_sync" in self.at and hasattr(c.rollout, "own_copy"):
            c.rollout.own_copy()   # an hf engine sharing the actor's tensors could not go stale
        sync = c.rollout.sync_weights
        c.rollout.sync_weights = lambda actor: 0.0 if self.on("skip_sync") else sync(actor)

    def _hook_forward(self, engine, loss_kind: str, grad_kind: str) -> None:
        """Corrupt the role's training forward (grad enabled; no-grad forwards stay clean)."""
        import torch

        def corrupt(x):
            if self.on(loss_kind):
                return x * float("nan")          # a non-finite loss
            return inf_grad(x)              # a finite loss with an inf gradient

        def hook(module, args, out):
            if not torch.is_grad_enabled() or not (self.on(loss_kind) or self.on(grad_kind)):
                return None
            if isinstance(out, torch.Tensor):
                return corrupt(out)
            out.logits = corrupt(out.logits)
            return out

        engine.module.register_forward_hook(hook)
