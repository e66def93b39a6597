"""Autotune rollback (docs/health.md, autotune): a hard spike restores the last good checkpoint
exactly, applies the spike fix, skips the batch and goes back to the checkpoint's step (the steps
after it are taken again, on new batches: docs/training.md, "Rollback and the step count"); the
count is limited and survives a resume. Faults are injected (actor_inf: non-finite steps) on
tiny-grpo; a fault fires at the n-th step taken, so a step taken again after a rollback is clean."""

from __future__ import annotations

import json

import pytest
from trainlib import read_metrics, run_inproc

ROLLBACK = {"enabled": True, "mode": "act", "rollback": True, "rollback_every": 2, "max_rollbacks": 1}


def _events(run_dir, kind):
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["kind"] == kind]


def _weights(engine):
    return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def _updates(engine) -> tuple[int, int]:
    """(LR scheduler count, optimizer updates the weights carry: AdamW's step count)."""
    opt = getattr(engine.optimizer, "optimizer", engine.optimizer)
    counts = {int(s["step"]) for s in opt.state.values() if "step" in s}
    assert len(counts) == 1, counts
    return engine.lr_scheduler.last_epoch, counts.pop()


@pytest.fixture
def spy(monkeypatch):
    """Actor weights and (scheduler count, optimizer updates) as saved, per checkpoint step (the
    last save of a step wins), and the actor weights right after each rollback."""
    from rltune.train import checkpoint as ckpt
    from rltune.train import steps

    seen = {"saved": {}, "after": [], "updates": {}}
    orig_save, orig_rollback = ckpt.save, steps._rollback

    def save(run_dir, step, engines, *a, **kw):
        seen["saved"][step] = _weights(engines["actor"])
        seen["updates"][step] = _updates(engines["actor"])
        return orig_save(run_dir, step, engines, *a, **kw)

    def rollback(c, engines, *a, **kw):
        out = orig_rollback(c, engines, *a, **kw)
        seen["after"].append(_weights(engines["actor"]))
        return out

    monkeypatch.setattr(ckpt, "save", save)
    monkeypatch.setattr(steps, "_rollback", rollback)
    return seen


def test_rollback_restores_exactly_then_continues_and_is_limited_across_resume(capfd, recipe_factory, tmp_path, spy):
    run_dir = tmp_path / "run"
    path = recipe_factory("tiny-grpo.yaml", trainer__max_steps=8, trainer__eval_every=0, autotune=ROLLBACK)
    # steps 5 and 6 non-finite: a streak of 2 = health.max_skipped_steps (3) - 1 -> rollback at step 6
    res = run_inproc(capfd, "train", path, env=dict(RLTUNE_FAULTS="actor_inf@5,actor_inf@6"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rollback 1/1" in res.stderr
    evs = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    assert any(e["step"] == 5 and e["kind"] in ("actor_nan", "skipped_step") for e in evs)  # not truncated
    (ev,) = _events(run_dir, "rollback")
    n = ev["numbers"]
    assert ev["step"] == 6 and n["trigger"] == "nonfinite" and n["from_step"] == 4 and n["rollback"] == 1
    assert n["sampler_now"] != n["sampler_from"]          # the batches since step 4 are not replayed
    assert n["fix"]["actor.lr"][1] < n["fix"]["actor.lr"][0]  # the spike fix: lower actor lr
    assert ev["changes"]["actor.lr"] == n["fix"]["actor.lr"][1]
    # bit-identical weights: after the rollback == as saved at step 4
    (after,) = spy["after"]
    saved = spy["saved"][4]
    assert after.keys() == saved.keys()
    assert all(after[k].equal(saved[k]) for k in saved)
    assert any(not after[k].equal(spy["saved"][8][k]) for k in saved)  # and training moved on
    m = read_metrics(run_dir)
    assert [x["step"] for x in m] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]  # back to step 4, steps 5-8 taken again
    assert m[5]["autotune/rollbacks"] == 1 and m[5]["health/skipped_steps"] == 0
    assert all(x["actor/skipped_updates"] == 0 for x in m[6:])  # steps 5-8 train on finite numbers
    assert all(x["reward/mean"] == x["reward/mean"] and x["kl"] == x["kl"] for x in m[6:])
    assert m[6]["autotune/actor_lr"] == n["fix"]["actor.lr"][1]
    state = json.loads((run_dir / "checkpoints" / "step-00000008" / "state.json").read_text())
    assert state["autotune"]["rollbacks"] == 1 and state["autotune"]["rollback_log"][0]["from_step"] == 4

    # resume: the count comes from the checkpoint, so a second streak is not rolled back (max 1)
    path2 = recipe_factory("tiny-grpo.yaml", trainer__max_steps=12, trainer__eval_every=0, autotune=ROLLBACK)
    res = run_inproc(capfd, "train", path2, "--resume", "auto", env=dict(RLTUNE_FAULTS="actor_inf@10,actor_inf@11"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "autotune.max_rollbacks (1) reached" in res.stderr
    assert len(_events(run_dir, "rollback")) == 1
    m = read_metrics(run_dir)
    assert [x["step"] for x in m] == [1, 2, 3, 4, 5, 6] + list(range(5, 13)) and m[-1]["autotune/rollbacks"] == 1
    assert len(spy["after"]) == 1


def test_no_rollback_without_a_good_checkpoint(capfd, recipe_factory, tmp_path):
    # a streak at steps 1-2: nothing saved before it; the run goes on with the ordinary handling
    path = recipe_factory("tiny-grpo.yaml", trainer__max_steps=3, trainer__eval_every=0, autotune=ROLLBACK)
    res = run_inproc(capfd, "train", path, env=dict(RLTUNE_FAULTS="actor_inf@1,actor_inf@2"))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "no good checkpoint before this step" in res.stderr
    assert not _events(tmp_path / "run", "rollback")


def test_rollback_goes_back_to_the_checkpoint_step_and_keeps_the_lr_plan(capfd, recipe_factory, tmp_path, spy):
    """A rollback from step 6 to checkpoint 4 takes steps 5-8 again: the final weights carry
    max_steps x updates-per-step optimizer updates, the LR scheduler has counted exactly those
    and the schedule ends where it was planned; the checkpoints of the discarded steps are moved
    aside (never resumed from, never pruned in favour of them)."""
    from rltune.recipe import load_recipe

    run_dir = tmp_path / "run"
    path = recipe_factory("tiny-grpo.yaml", trainer__max_steps=8, trainer__eval_every=0, trainer__save_every=5,
                          trainer__keep_checkpoints=10, autotune=ROLLBACK, actor__lr_schedule="linear",
                          actor__min_lr_ratio=0.1)
    ups = load_recipe(path).recipe.optimizer_updates_per_step
    res = run_inproc(capfd, "train", path, env=dict(RLTUNE_FAULTS="actor_inf@5,actor_inf@6"))
    assert res.returncode == 0, res.stderr[-3000:]
    (ev,) = _events(run_dir, "rollback")
    assert ev["step"] == 6 and ev["numbers"]["from_step"] == 4
    assert "goes back to step 4" in res.stderr

    # the step counter went back to 4: steps 5 and 6 show twice, the second time trained
    m = read_metrics(run_dir)
    assert [x["step"] for x in m] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]
    assert [x["actor/skipped_updates"] for x in m[4:6]] == [1, 1]
    assert all(x["actor/skipped_updates"] == 0 for x in m[6:])
    # scheduler count == optimizer updates == the plan, at every checkpoint of the continuation
    assert spy["updates"][8] == (8 * ups, 8 * ups)
    assert spy["updates"][5] == (5 * ups, 5 * ups)   # the redone step 5's checkpoint (save_every)
    # the LR schedule ends where it was planned: linear to min_lr_ratio x the (autotuned) base lr
    from rltune.engine.roles import lr_factor

    total, warmup = 8 * ups, load_recipe(path).recipe.actor.warmup_steps
    last = [lr_factor(u, warmup, total, "linear", 0.1) for u in range(total - ups, total)]   # step 8's updates
    assert m[-1]["actor/lr"] == pytest.approx(sum(last) / ups * m[-1]["autotune/actor_lr"], rel=1e-6)
    assert m[-1]["autotune/actor_lr"] == ev["numbers"]["fix"]["actor.lr"][1]

    # checkpoint 5 of the discarded steps (save_every) was moved aside; step-5 now is the redone one
    (moved,) = list((run_dir / "previous").glob("*/checkpoints/step-00000005"))
    assert json.loads((moved / "state.json").read_text())["autotune"]["rollbacks"] == 0
    state = json.loads((run_dir / "checkpoints" / "step-00000005" / "state.json").read_text())
    assert state["autotune"]["rollbacks"] == 1 and state["step"] == 5
    assert json.loads((run_dir / "final" / "manifest.json").read_text())["step"] == 8
    # autotune's cooldown counts from the step the run went back to (the fix applies from step 5 on)
    final = json.loads((run_dir / "checkpoints" / "step-00000008" / "state.json").read_text())
    assert final["autotune"]["last_fix"] == 4
