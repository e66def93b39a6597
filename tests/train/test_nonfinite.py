"""A non-finite update is skipped at every ZeRO stage and precision, on real DeepSpeed engines
(CPU, gloo): a non-finite loss and a finite loss with an inf gradient leave the weights (module
and fp32 master copies), the optimizer state and the LR schedule bit-identical; under fp16 the
dynamic loss scaler sees the overflow and halves the scale."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from rltune.recipe.schema import Recipe

CONFIGS = [(s, p) for s in (0, 1, 2, 3) for p in ("fp32", "bf16", "fp16")]
_ENGINES: dict = {}   # one engine per (stage, precision), shared by the fault kinds


@pytest.fixture(scope="module")
def dist():
    from deepspeed.accelerator import get_accelerator

    from rltune.engine.distributed import init_distributed

    info = init_distributed("cpu")
    # DeepSpeed refuses fp16 on CPUs without mkldnn fp16; torch runs it (slowly) anyway, which is
    # enough to exercise the loss scaler here
    mp = pytest.MonkeyPatch()
    mp.setattr(get_accelerator(), "is_fp16_supported", lambda: True)
    yield info
    mp.undo()
    _ENGINES.clear()


def _recipe(stage, precision):
    return Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
        "reward": {"functions": ["builtin:format"]}, "algorithm": {"name": "grpo"},
        "actor": {"lr": 1e-2, "warmup_steps": 0, "grad_clip": 1.0, "eps": 1e-2, "zero_stage": stage},
        "trainer": {"precision": precision},
        "rollout": {"batch_size": 8}, "train": {"batch_size": 8, "micro_batch_size": 4}})


def _engine(stage, precision):
    from rltune.engine.roles import build_actor
    from rltune.recipe.knobs import Knobs
    from rltune.train.update import make_actor_loss

    if (stage, precision) not in _ENGINES:
        r = _recipe(stage, precision)
        engine = build_actor(r, "cpu", 10)
        _ENGINES[stage, precision] = engine, make_actor_loss(engine, r, Knobs(1e-2, 3e-2, 0.0, 0.2, 0.0))
    return _ENGINES[stage, precision]


def _micro_batches(seed):
    from test_update import _experience

    exp = _experience(seed)
    return [exp.select(torch.arange(0, 4)), exp.select(torch.arange(4, 8))]


def _snapshot(engine):
    """Module weights (gathered under ZeRO-3), the optimizer's parameters (DeepSpeed's fp32 master
    partitions, or the module's own at stage 0 fp32), its state, and the LR schedule."""
    import deepspeed

    params = list(engine.module.parameters())
    zero3 = engine.zero_optimization_stage() == 3
    with deepspeed.zero.GatheredParameters(params) if zero3 else contextlib.nullcontext():
        module = [p.detach().clone() for p in params]
    # the torch AdamW inside; its state is keyed by the tensors it updates (ZeRO-3 lends them to
    # param_groups only during `step`)
    opt = getattr(engine.optimizer, "optimizer", engine.optimizer)
    masters = [p.detach().clone() for p in opt.state]
    state = [v.clone() for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return {"module": module, "master": masters, "state": state,
            "lr": [engine.lr_scheduler.last_epoch, engine.get_lr()]}


def _assert_identical(a, b):
    assert a["lr"] == b["lr"]                                 # the schedule did not advance
    assert a["state"], "the optimizer has state after the first update"
    for key in ("module", "master", "state"):
        assert len(a[key]) == len(b[key])
        for i, (x, y) in enumerate(zip(a[key], b[key])):
            assert torch.equal(x, y), f"{key}[{i}] changed"   # bit-identical


def _run(engine, loss_fn, seed, fault=None):
    """One update over two micro-batches; `fault` corrupts only the second one."""
    from rltune.train.faults import inf_grad
    from rltune.train.update import run_update

    calls = []

    def faulty(mb):
        loss, stats = loss_fn(mb)
        calls.append(1)
        if len(calls) == 2 and fault == "loss":
            loss = loss * float("inf")                        # a non-finite loss
        elif len(calls) == 2 and fault == "grad":
            loss = inf_grad(loss)                       # a finite loss, an inf gradient
        return loss, stats

    return run_update(engine, _micro_batches(seed), faulty, "token-mean")


@pytest.mark.parametrize("fault", ["loss", "grad"])
@pytest.mark.parametrize("stage,precision", CONFIGS)
def test_nonfinite_update_is_skipped_untouched(dist, stage, precision, fault):
    engine, loss_fn = _engine(stage, precision)
    good = _run(engine, loss_fn, seed=1)                      # a real step: the optimizer has state
    assert not good.skipped and math.isfinite(good.grad_norm) and good.grad_norm > 0, good
    before = _snapshot(engine)

    bad = _run(engine, loss_fn, seed=2, fault=fault)
    assert bad.skipped and math.isnan(bad.grad_norm), bad
    _assert_identical(before, _snapshot(engine))
    if fault == "loss":
        assert "loss inf" in bad.reason and not bad.overflow
    if precision == "fp16":
        scale = good.stats["loss_scale"]
        assert bad.stats["loss_scale"] == scale / 2           # the scaler saw the overflow and backed off
        assert f"loss scale {scale:g} -> {scale / 2:g}" in bad.reason, bad.reason
        assert bad.overflow == (fault == "grad")              # a scaler back-off, not a broken loss
    else:
        assert "loss_scale" not in bad.stats and not bad.overflow
        if fault == "grad":
            assert "non-finite gradient" in bad.reason or "grad norm nan" in bad.reason, bad.reason

    after = _run(engine, loss_fn, seed=3)                     # the next good update applies
    assert not after.skipped and math.isfinite(after.grad_norm), after
    moved = _snapshot(engine)
    assert any(not torch.equal(x, y) for x, y in zip(before["master"], moved["master"]))
    assert all(torch.isfinite(x).all() for x in moved["module"] + moved["master"])


@pytest.mark.parametrize("stage", [0, 2])
def test_fp16_overflow_at_minimum_scale_counts_as_nonfinite(dist, stage):
    """At the scaler's floor an overflow cannot be fixed by backing off: still skipped (DeepSpeed's
    ZeRO scaler would raise), reported as a real non-finite update, not as a scaler back-off."""
    engine, loss_fn = _engine(stage, "fp16")
    _run(engine, loss_fn, seed=1)
    engine.optimizer.loss_scale = 1.0                          # DeepSpeed's min_loss_scale
    before = _snapshot(engine)
    bad = _run(engine, loss_fn, seed=2, fault="grad")
    assert bad.skipped and not bad.overflow and bad.stats["loss_scale"] == 1.0, bad
    _assert_identical(before, _snapshot(engine))
    assert not _run(engine, loss_fn, seed=3).skipped
