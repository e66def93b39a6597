"""Whole or one shard per rank: how a role's optimizer state is laid out in a checkpoint decides how a
resume on another world size loads it (world.py). Decided by what the checkpoint holds (names
only: it is received data), checked against what DeepSpeed does for the engine; a checkpoint that
does not fit is one message, never DeepSpeed's missing-file traceback. (issue 44, item 4: a bf16
ZeRO-0 optimizer was taken for a partitioned one; DeepSpeed keeps it whole.)"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from rltune.errors import UserError
from rltune.train import world as ws

SHARD = "zero_pp_rank_{}_mp_rank_00_optim_states.pt"


def _role(tmp_path, shards=0, name="actor"):
    ds = tmp_path / "step-00000002" / name / "ds"
    ds.mkdir(parents=True)
    (ds / "mp_rank_00_model_states.pt").write_bytes(b"m")
    for r in range(shards):
        (ds / SHARD.format(r)).write_bytes(b"s")
    return ds.parent


def _engine(stage, sharding):
    opt = SimpleNamespace(dp_process_group=object()) if sharding else SimpleNamespace()
    return SimpleNamespace(optimizer=opt, zero_optimization_stage=lambda: stage)


def test_the_checkpoint_decides(tmp_path):
    assert ws.sharded(_role(tmp_path / "a", shards=2), _engine(1, True), "actor", 2) is True
    assert ws.sharded(_role(tmp_path / "b"), _engine(0, False), "actor", 2) is False


def test_a_checkpoint_that_does_not_fit_the_engine_is_one_message(tmp_path):
    with pytest.raises(UserError, match=r"actor/ds holds no optimizer shard .*ZeRO-1.*written at ZeRO-0.*\n  fix:"):
        ws.sharded(_role(tmp_path / "a"), _engine(1, True), "actor", 2)
    with pytest.raises(UserError, match=r"critic/ds holds the optimizer state one shard per rank \(2 .*ZeRO-0"):
        ws.sharded(_role(tmp_path / "b", shards=2, name="critic"), _engine(0, False), "critic", 2)
    with pytest.raises(UserError, match=r"holds 1 optimizer shard\(s\) .*written by 2 rank\(s\)"):
        ws.sharded(_role(tmp_path / "c", shards=1), _engine(1, True), "actor", 2)


def test_only_regular_files_inside_the_checkpoint_count(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    for r in range(2):
        (outside / SHARD.format(r)).write_bytes(b"s")
    role = _role(tmp_path / "a", shards=1)
    os.symlink(outside / SHARD.format(1), role / "ds" / SHARD.format(1))    # a link is not a shard
    (role / "ds" / "x_optim_states.pt").mkdir()                             # nor a directory
    assert ws.shards(role) == [SHARD.format(0)]
    linked = tmp_path / "b" / "actor"                                       # ds/ a link out of it
    linked.mkdir(parents=True)
    os.symlink(outside, linked / "ds")
    assert ws.shards(linked) == []
    assert ws.shards(tmp_path / "missing") == []


def test_a_missing_checkpoint_file_is_named(tmp_path):
    from rltune.train.checkpoint import load_tensors_only

    with pytest.raises(UserError, match=r"checkpoint file .*gone\.pt is missing.*\n  fix:"):
        load_tensors_only(tmp_path / "gone.pt")


@pytest.fixture(scope="module")
def dist():
    from rltune.engine.distributed import init_distributed

    return init_distributed("cpu")


@pytest.mark.parametrize("zero,precision", [(0, "fp32"), (0, "bf16"), (1, "bf16"), (1, "fp32")])
def test_saves_shards_is_what_deepspeed_writes(dist, tmp_path, zero, precision):
    """Pinned against the installed DeepSpeed: the engine's own save writes shards exactly where
    saves_shards says; a bf16 ZeRO-0 optimizer is whole (FP16_UnfusedOptimizer, in the
    model-states file), like an fp32 one."""
    from rltune.engine.roles import build_actor
    from rltune.recipe.schema import Recipe

    r = Recipe.model_validate({
        "model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
        "reward": {"functions": ["builtin:format"]}, "algorithm": {"name": "grpo"},
        "actor": {"zero_stage": zero}, "rollout": {"batch_size": 8}, "train": {"batch_size": 8, "micro_batch_size": 8},
        "trainer": {"device": "cpu", "precision": precision}})
    engine = build_actor(r, dist.device, 10)
    engine.save_checkpoint(str(tmp_path / "actor"), tag="ds", save_latest=False)
    assert ws.saves_shards(engine) is (zero >= 1)
    assert bool(ws.shards(tmp_path / "actor")) is ws.saves_shards(engine)
    assert ws.sharded(tmp_path / "actor", engine, "actor", 1) is (zero >= 1)
