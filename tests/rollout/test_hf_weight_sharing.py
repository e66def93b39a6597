"""The hf engine shares the actor's tensors (ZeRO 0-2: no second copy of the weights) and so
samples with every optimizer update; `own_copy` gives it its own weights again."""

from __future__ import annotations

import torch

from rltune.recipe.schema import Recipe


def test_hf_engine_shares_the_actor_tensors_and_follows_its_updates():
    from rltune.engine.distributed import init_distributed
    from rltune.engine.roles import build_actor
    from rltune.models.loading import load_causal_lm, load_tokenizer
    from rltune.rollout.hf import HFRollout

    init_distributed("cpu")
    r = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                               "reward": {"functions": ["builtin:format"]}})
    actor = build_actor(r, "cpu", 10)
    engine = HFRollout(load_causal_lm("builtin:tiny-llama", "fp32", "eager", "cpu"), load_tokenizer("builtin:tiny-llama"))
    engine.sync_weights(actor)
    own = dict(engine.model.named_parameters())
    for name, p in actor.module.named_parameters():
        assert own[name].data_ptr() == p.data_ptr(), name             # the same storage: no copy

    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        before = engine.model(input_ids=ids).logits
        next(actor.module.parameters()).data.add_(0.5)                   # an in-place optimizer update
        after = engine.model(input_ids=ids).logits
        assert not torch.equal(before, after)                            # sampled with the new weights

        engine.own_copy()                                                # e.g. the skip_sync fault
        for name, p in actor.module.named_parameters():
            assert own[name].data_ptr() != p.data_ptr()
        next(actor.module.parameters()).data.add_(0.5)
        assert torch.equal(engine.model(input_ids=ids).logits, after)    # stale until the next sync
        engine.sync_weights(actor)
        torch.testing.assert_close(engine.model(input_ids=ids).logits, actor.module(input_ids=ids).logits)
        for name, p in actor.module.named_parameters():
            assert own[name].data_ptr() != p.data_ptr()                  # copied in, not shared again
