"""DeepSpeed ZeRO 0-3 on CUDA with NCCL in bf16: one real optimizer step each on the tiny
Llama; the loss is finite, the weights move, and ZeRO 3 makes the same update as ZeRO 0."""

from __future__ import annotations

import math

import pytest
import torch

from gpulib import GPU

pytestmark = GPU
LR = 1e-3


@pytest.fixture(scope="module")
def dist():
    from rltune.engine.distributed import init_distributed

    info = init_distributed("cuda")
    import torch.distributed as td

    assert td.get_backend() == "nccl", td.get_backend()
    assert info.device.startswith("cuda")
    return info


def _recipe(zero: int):
    from rltune.recipe.schema import Recipe

    return Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
        "reward": {"functions": ["builtin:format"]},
        "algorithm": {"name": "grpo"},
        # eps 1e-2: Adam's first step stays linear in the gradient (not ~lr * sign(g)), so bf16
        # rounding differences between the stages stay small instead of flipping signs
        "actor": {"lr": LR, "warmup_steps": 0, "eps": 1e-2, "grad_clip": 1.0, "zero_stage": zero},
        "rollout": {"batch_size": 8}, "train": {"batch_size": 8, "micro_batch_size": 8},
        "trainer": {"device": "cuda", "precision": "bf16"}})


def _experience(device):
    from rltune.rollout.experience import Experience

    g = torch.Generator().manual_seed(0)
    B, P, T = 8, 6, 8
    lengths = torch.tensor([8, 1, 3, 8, 2, 5, 8, 4])
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    exp = Experience(prompt_ids=torch.randint(4, 60, (B, P), generator=g),
                     prompt_mask=torch.ones(B, P, dtype=torch.long),
                     response_ids=torch.randint(4, 60, (B, T), generator=g), response_mask=mask,
                     advantages=torch.randn(B, T, generator=g) * mask)
    return exp.to(device)


def _weights(engine) -> dict[str, torch.Tensor]:
    """Full fp32 copies on the CPU (ZeRO 3: gathered from the partitions)."""
    import deepspeed

    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
        return {n: p.detach().float().cpu().clone() for n, p in params.items()}


def _one_step(dist, zero: int):
    from rltune.engine.roles import build_actor
    from rltune.recipe.knobs import Knobs
    from rltune.train.update import make_actor_loss, run_update

    r = _recipe(zero)
    engine = build_actor(r, dist.device, 10)
    assert engine.zero_optimization_stage() == zero
    assert engine.bfloat16_enabled()
    assert next(engine.module.parameters()).device.type == "cuda"
    before = _weights(engine)
    loss_fn = make_actor_loss(engine, r, Knobs(LR, 3 * LR, 0.0, 0.2, 0.0))
    res = run_update(engine, [_experience(dist.device)], loss_fn, r.algorithm.loss_agg)
    after = _weights(engine)
    torch.cuda.synchronize()
    return res, before, after


STEPS: dict = {}


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_stage_takes_one_real_bf16_step(dist, zero):
    res, before, after = _one_step(dist, zero)
    STEPS[zero] = (before, after)
    assert not res.skipped, res.reason
    assert math.isfinite(res.loss) and math.isfinite(res.grad_norm) and res.grad_norm > 0, (res.loss, res.grad_norm)
    moved = max(float((after[n] - before[n]).abs().max()) for n in before)
    assert moved > LR / 10, f"ZeRO {zero}: the weights did not move (largest change {moved:g})"
    assert all(torch.isfinite(p).all() for p in after.values())


@pytest.mark.parametrize("zero", [3, 1, 2])
def test_zero_stage_makes_the_same_update_as_zero0(dist, zero):
    """Same initial weights (the builtin model is seeded), same batch: the updates (after - before)
    agree within bf16 tolerance: cosine > 0.99, norms within 5%, and under 1% of the weights apart
    by more than a few bf16 steps of their size plus lr / 10. (On a CPU, DeepSpeed's bf16 stage 0
    with a torch optimizer moved the weights 37% less than stages 1-3 and fp32: this catches that.)"""
    runs = {z: STEPS.get(z) or _one_step(dist, z)[1:] for z in (0, zero)}
    (b0, a0), (bz, az) = runs[0], runs[zero]
    assert b0.keys() == bz.keys()
    for n in b0:
        assert torch.equal(b0[n], bz[n]), f"{n}: different initial weights"
    assert_same_bf16_update(b0, a0, az, LR, f"ZeRO 0 vs {zero}")


def assert_same_bf16_update(before: dict, ref: dict, other: dict, lr: float, what: str) -> None:
    """Two updates from the same weights agree within bf16 tolerance: the updates (after - before)
    have cosine > 0.99 and norms within 5%, and under 1% of the weights are apart by more than a
    few bf16 steps of their size plus lr / 10."""
    d_ref = torch.cat([(ref[n] - before[n]).flatten() for n in before])
    d_other = torch.cat([(other[n] - before[n]).flatten() for n in before])
    cos = float(torch.nn.functional.cosine_similarity(d_ref, d_other, dim=0))
    assert cos > 0.99, f"{what}: the update directions differ: cosine {cos:.4f}"
    assert abs(float(d_other.norm()) / float(d_ref.norm()) - 1) < 0.05, (what, float(d_ref.norm()), float(d_other.norm()))
    for n in before:
        assert torch.isfinite(other[n]).all(), (what, n)
        tol = 4 * 2 ** -8 * ref[n].abs() + lr / 10      # bf16: 8 significant bits
        bad = ((other[n] - ref[n]).abs() > tol).float().mean()
        assert bad < 0.01, f"{what} {n}: {float(bad):.1%} of the weights differ beyond bf16 tolerance"


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_gradients_added_early_make_the_same_bf16_update(dist, zero):
    """The update adds some gradients to .grad as backward reaches them (the shared-prompt response
    pass's weights, a tied output layer: train/shared_prompt.py), beside DeepSpeed's own gradient
    hooks. On CUDA in bf16 at every ZeRO stage (3: they stay off, the shared-prompt passes stay on)
    one update of a tied model (tiny-qwen2, two groups of 4 sharing prompts) equals the one without
    them: the same loss (the forward is the same), and the same update within bf16 rounding."""
    from test_update import tied_updates

    from rltune.models.loading import load_causal_lm

    (a, b), (early, plain), rows = tied_updates(zero, True, 3, dist.device, "bf16", _weights)
    assert all(1 in r for r in rows), rows                          # a group's prompt computed once
    assert not a.skipped and not b.skipped, (a.reason, b.reason)
    assert a.loss == pytest.approx(b.loss, rel=1e-6, abs=1e-7)
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=0.02), (a.grad_norm, b.grad_norm)
    before = {n: w.detach().float().cpu() for n, w in                # the builtin model is seeded
              load_causal_lm("builtin:tiny-qwen2", "bf16", "sdpa", "cuda").named_parameters()}
    assert before.keys() == early.keys()
    assert max(float((plain[n] - before[n]).abs().max()) for n in before) > 1e-3, "the update did not move the weights"
    assert_same_bf16_update(before, plain, early, 1e-2, f"ZeRO {zero} early adds")   # test_update's lr
