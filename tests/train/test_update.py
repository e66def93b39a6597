"""The update step on real DeepSpeed engines (CPU, gloo): accumulation invariance and the
non-finite guard."""

from __future__ import annotations

import pytest
import torch

from rltune.recipe.schema import Recipe


@pytest.fixture(scope="module")
def dist():
    from rltune.engine.distributed import init_distributed

    return init_distributed("cpu")


def _recipe(agg="token-mean", grad_clip=None, micro=8):
    return Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
        "reward": {"functions": ["builtin:format"]},
        "algorithm": {"name": "grpo", "loss_agg": agg},
        # eps 1e-2: Adam's first step is ~lr * sign(g) where |g| << eps would be; a large eps keeps
        # the update linear in the gradient so float-rounding differences stay float-sized
        "actor": {"lr": 1e-2, "warmup_steps": 0, "grad_clip": grad_clip, "eps": 1e-2},
        "rollout": {"batch_size": 8}, "train": {"batch_size": 8, "micro_batch_size": micro}})


def _experience(seed=0):
    from rltune.rollout.experience import Experience

    g = torch.Generator().manual_seed(seed)
    B, P, T = 8, 4, 5
    lengths = torch.tensor([5, 1, 3, 5, 2, 4, 5, 1])      # different response lengths
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    return Experience(
        prompt_ids=torch.randint(4, 60, (B, P), generator=g), prompt_mask=torch.ones(B, P, dtype=torch.long),
        response_ids=torch.randint(4, 60, (B, T), generator=g), response_mask=mask,
        advantages=torch.randn(B, T, generator=g) * mask)


def _params(engine):
    return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_accumulation_1x8_equals_8x1(dist, agg):
    from rltune.engine.roles import build_actor
    from rltune.recipe.knobs import Knobs
    from rltune.train.update import make_actor_loss, run_update

    r = _recipe(agg)
    exp = _experience()
    knobs = Knobs(1e-2, 3e-2, 0.0, 0.2, 0.0)
    one = build_actor(r, "cpu", 10)     # one micro-batch of 8
    eight = build_actor(r, "cpu", 10)   # eight micro-batches of 1
    before = _params(one)
    assert all(torch.equal(before[n], p) for n, p in _params(eight).items())
    res1 = run_update(one, [exp], make_actor_loss(one, r, knobs), agg)
    res8 = run_update(eight, [exp.select(torch.tensor([i])) for i in range(8)],
                      make_actor_loss(eight, r, knobs), agg)
    assert abs(res1.loss - res8.loss) < 1e-6
    assert abs(res1.grad_norm - res8.grad_norm) < 1e-5 * max(1.0, res1.grad_norm)
    after1, after8 = _params(one), _params(eight)
    moved = max(float((after1[n] - before[n]).abs().max()) for n in before)
    assert moved > 1e-4  # the update did something
    for n in after1:
        torch.testing.assert_close(after1[n], after8[n], rtol=1e-5, atol=1e-6)


def test_nonfinite_update_leaves_weights_and_optimizer_untouched(dist):
    from rltune.engine.roles import build_actor, current_lr
    from rltune.recipe.knobs import Knobs
    from rltune.train.update import make_actor_loss, run_update

    r = _recipe(grad_clip=1.0)
    engine = build_actor(r, "cpu", 10)
    loss_fn = make_actor_loss(engine, r, Knobs(1e-2, 3e-2, 0.0, 0.2, 0.0))
    exp = _experience(1)
    run_update(engine, [exp], loss_fn, "token-mean")          # one real step: optimizer has state
    before = _params(engine)
    opt_before = {k: {n: v.clone() for n, v in s.items() if torch.is_tensor(v)}
                  for k, s in engine.optimizer.state.items()}
    lr_before = current_lr(engine)

    def inf_loss(mb):
        loss, stats = loss_fn(mb)
        return loss * float("inf"), stats

    res = run_update(engine, [exp], inf_loss, "token-mean")
    assert res.skipped and "inf" in res.reason
    for n, p in _params(engine).items():
        assert torch.equal(p, before[n]), n                       # bit-identical
    for k, s in engine.optimizer.state.items():
        for n, v in opt_before[k].items():
            assert torch.equal(s[n], v)
    assert current_lr(engine) == lr_before                        # the schedule did not advance
    assert all(p.grad is None or not p.grad.abs().sum() for p in engine.module.parameters())


@pytest.mark.parametrize("mode,factor", [("none", 1.0), ("tis", 2.0), ("mis", 0.0)])
def test_rollout_correction_weights_reach_the_actor_loss(dist, mode, factor):
    """pi_rollout = pi_behaviour / 4 on every token: w = 4, so tis (cap 2) doubles the policy
    loss, mis (band [1/2, 2]) drops every token, none leaves it as is."""
    import math

    from rltune.engine.roles import build_actor
    from rltune.recipe.knobs import Knobs
    from rltune.train.update import make_actor_loss, response_logits
    from rltune.algo import logprobs_from_logits

    r = _recipe()
    engine = build_actor(r, "cpu", 10)
    exp = _experience(2)
    with torch.no_grad():
        exp.behavior_logp = logprobs_from_logits(response_logits(engine.module, exp, 1.0), exp.response_ids)
    exp.rollout_logp = exp.behavior_logp - math.log(4.0)
    knobs = Knobs(1e-2, 3e-2, 0.0, 0.2, 0.0)
    base, _ = make_actor_loss(engine, r, knobs, "none")(exp)
    loss, _ = make_actor_loss(engine, r, knobs, mode)(exp)
    assert float(loss) == pytest.approx(factor * float(base), rel=1e-5, abs=1e-7)
    assert abs(float(base)) > 1e-4


def tied_updates(zero: int, shared: bool, seed: int, device: str = "cpu", precision: str = "fp32",
                 weights=_params) -> tuple[list, list[dict], list[list[int]]]:
    """One update of a tied model (tiny-qwen2) at ZeRO `zero`, with the gradients added early and
    again without (`shared_prompt.into_grad` a no-op), from the same weights, on two groups of 4
    samples: (both UpdateResults, both weights after (`weights(engine)`), the first decoder layer's
    rows per call). tests/gpu runs it on CUDA in bf16."""
    import contextlib

    from rltune.engine.roles import build_actor
    from rltune.recipe.knobs import Knobs
    from rltune.train import shared_prompt
    from rltune.train.update import make_actor_loss, run_update

    r = _recipe()
    r = r.model_copy(update={"model": r.model.model_copy(update={"policy": "builtin:tiny-qwen2"}),
                             "actor": r.actor.model_copy(update={"zero_stage": zero}),
                             "train": r.train.model_copy(update={"share_prompts": shared}),
                             "trainer": r.trainer.model_copy(update={"device": device, "precision": precision})})
    exp = _experience(seed).to(device)
    exp.prompt_ids = exp.prompt_ids[:2].repeat_interleave(4, 0)      # two groups of 4 samples
    knobs, results, params, rows = Knobs(1e-2, 3e-2, 0.0, 0.2, 0.0), [], [], []
    real, floor = shared_prompt.into_grad, shared_prompt.MIN_SAVED_FLOP
    shared_prompt.MIN_SAVED_FLOP = 0.0                               # tiny prompts: share them all the same
    try:
        for early in (True, False):
            shared_prompt.into_grad = real if early else contextlib.nullcontext
            torch.manual_seed(0)
            engine = build_actor(r, device, 10)
            assert engine.module.get_output_embeddings().weight is engine.module.get_input_embeddings().weight
            rows.append([])
            hook = engine.module.model.layers[0].register_forward_pre_hook(lambda m, a, k: rows[-1].append(
                (a[0] if a else k["hidden_states"]).shape[0]), with_kwargs=True)
            results.append(run_update(engine, [exp.select(torch.arange(0, 4)), exp.select(torch.arange(4, 8))],
                                      make_actor_loss(engine, r, knobs), "token-mean"))
            hook.remove()
            params.append(weights(engine))
    finally:
        shared_prompt.into_grad, shared_prompt.MIN_SAVED_FLOP = real, floor
    return results, params, rows


@pytest.mark.parametrize("zero,shared", [(0, True), (1, True), (2, True), (2, False)])
def test_gradients_added_early_are_exact_on_engines(dist, zero, shared):
    """Inside the update's forward the passes add gradients to .grad as backward reaches them (the
    shared-prompt response pass's weights, a tied output layer's weight: train/shared_prompt.py),
    beside the weight's own accumulation, on which DeepSpeed's ZeRO-1/2 hooks hang. On a tied model
    (tiny-qwen2), one update equals the one without early adds (loss, gradient norm, weights)."""
    (a, b), params, rows = tied_updates(zero, shared, 3)
    assert all((1 in r) == shared for r in rows), rows              # a group's prompt computed once
    assert abs(a.loss - b.loss) < 1e-6 and not a.skipped
    assert abs(a.grad_norm - b.grad_norm) < 1e-5 * max(1.0, b.grad_norm)
    for n in params[0]:
        torch.testing.assert_close(params[0][n], params[1][n], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("zero", [1, 2])
def test_gradients_added_early_are_exact_on_two_ranks(tmp_path, zero):
    """The same on two real ranks (ZeRO-1/2: DeepSpeed's gradient hooks and reductions), each with
    its own experience: both updates agree, and the ranks with each other."""
    import json
    import subprocess
    import sys

    from trainlib import ROOT, cli_env, free_port

    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           str(ROOT / "tests" / "train" / "early_grads_case.py"), str(zero), str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=cli_env(OMP_NUM_THREADS="1"), cwd=ROOT)
    assert res.returncode == 0, res.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    for r in ranks:
        assert r["skipped"] == [False, False]
        assert abs(r["loss"][0] - r["loss"][1]) < 1e-6
        assert abs(r["grad_norm"][0] - r["grad_norm"][1]) < 1e-5 * max(1.0, r["grad_norm"][1])
        assert r["diff"] <= 1e-6, r
    assert ranks[0]["grad_norm"] == ranks[1]["grad_norm"]        # one all-reduced gradient
