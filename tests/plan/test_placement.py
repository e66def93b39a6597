"""`rltune plan --times RUN_DIR` (plan/placement.py): the step time of each placement of the rollout
engine from a run's phase times, against hand-computed values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rltune.plan.placement import PhaseTimes, TimesError, fleet_split, split_keys, step_times

ROOT = Path(__file__).resolve().parents[2]


def _times(G=4.0, R=1.0, E=1.0, U=3.0, S=0.5):
    return PhaseTimes(generate=G, reward=R, experience=E, update=U, sync=S, steps=5, asynchronous=False)


def test_each_placement_against_hand_computed_values():
    st = step_times(_times(), devices=8)
    assert st["synchronous"] == pytest.approx(4 + 1 + 1 + 3 + 0.5)            # 9.5
    assert st["colocated"] == pytest.approx(max(4 + 1 + 3, 4 + 1) + 0.5)      # 8.5: only R overlaps
    # server on d of 8: max(4 * 8/d + 1, 4 * 8/(8-d)) + 0.5; d = 4: max(9, 8) + 0.5 = 9.5,
    # d = 5: max(7.4, 10.67); the best is d = 4
    assert st["server_devices"] == 4 and st["separate"] == pytest.approx(9.5)
    # a generation-bound step: generation gets most devices (d = 6: max(8*8/6 + 1, 1.5*8/2) = 11.67;
    # d = 7: max(10.14, 12)); with ideal scaling a split cannot beat sharing all 8 (colocated 10)
    st = step_times(_times(G=8.0, U=1.0, E=0.5), devices=8)
    assert st["server_devices"] == 6 and st["separate"] == pytest.approx(8 * 8 / 6 + 1 + 0.5)
    assert st["colocated"] == pytest.approx(10.0) and st["synchronous"] == pytest.approx(11.0)
    assert "separate" not in step_times(_times(), devices=1)


def test_replica_split_with_tensor_parallel_replicas():
    # k replicas of r = 2 devices on 8: d = 2, 4, 6 only. max(4 * 8/d + 1, 4 * 8/(8-d)) + 0.5:
    # d = 2: max(17, 5.33) = 17; d = 4: max(9, 8) = 9; d = 6: max(6.33, 16) = 16 -> 2 replicas, 9.5
    st = step_times(_times(), devices=8, tp=2)
    assert (st["replicas"], st["server_devices"]) == (2, 4) and st["separate"] == pytest.approx(9.5)
    assert st["fleet"]["sync_parallel"]["trainer_devices"] == 4
    # S' = k x S: 17 + 0.5, 9 + 1.0, 16 + 1.5 -> still 2 replicas, 10.0
    shared = st["fleet"]["sync_shared"]
    assert (shared["replicas"], shared["sync_s"]) == (2, pytest.approx(1.0)) and shared["step_s"] == pytest.approx(10.0)
    # r = 3 on 8: d = 3 (11.67 + 0.5) or 6 (16 + 0.5): one replica of 3
    sp = fleet_split(_times(), 8, tp=3)
    assert (sp["replicas"], sp["server_devices"]) == (1, 3) and sp["step_s"] == pytest.approx(4 * 8 / 3 + 1 + 0.5)
    # r = 8 on 8 leaves the trainer nothing: no split
    assert "separate" not in step_times(_times(), devices=8, tp=8) and fleet_split(_times(), 8, tp=8) is None
    # with r = 1 the fleet is the old "server on d of D": k = d
    assert step_times(_times(), devices=8, tp=1)["replicas"] == 4


def test_the_sync_assumption_can_move_the_best_split():
    # G 8, R 0, E + U 4, S 4 on 8 devices, r = 1: max(64/k, 32/(8-k)) =
    # k = 3: 21.33, 4: 16, 5: 12.8, 6: 16 -> with S' = S: k = 5, 12.8 + 4 = 16.8;
    # with S' = k x S: k = 3: 21.33 + 12 = 33.33, 4: 16 + 16 = 32, 5: 12.8 + 20 = 32.8 -> k = 4, 32
    t = _times(G=8.0, R=0.0, E=1.0, U=3.0, S=4.0)
    par, shared = fleet_split(t, 8, 1, "parallel"), fleet_split(t, 8, 1, "shared")
    assert par["replicas"] == 5 and par["step_s"] == pytest.approx(16.8)
    assert shared["replicas"] == 4 and shared["step_s"] == pytest.approx(32.0) and shared["sync_s"] == 16.0
    with pytest.raises(ValueError):
        fleet_split(t, 8, 1, "sometimes")


def test_two_nodes_arithmetic_of_the_benchmarks_page():
    # docs/BENCHMARKS.md, "Rollout fleet": ASSUMED inputs G 60, R 2, E 10, U 30, S 5 s (a step on all
    # D devices), replicas of r = 2. D = 8: d = 2: max(242, 53.3) = 242; d = 4: max(122, 80) = 122;
    # d = 6: max(82, 160) = 160 -> 2 replicas, 127 s (S' = S) or 132 s (S' = 2 S)
    t = _times(G=60.0, R=2.0, E=10.0, U=30.0, S=5.0)
    one = step_times(t, 8, tp=2)
    assert one["synchronous"] == pytest.approx(107.0) and one["colocated"] == pytest.approx(105.0)
    assert (one["replicas"], one["separate"]) == (2, pytest.approx(127.0))
    assert one["fleet"]["sync_shared"]["step_s"] == pytest.approx(132.0)
    # D = 16 (two nodes, the batch doubled: each GPU's work, so each phase time, as on one node):
    # max(60 * 16/d + 2, 40 * 16/(16 - d)), d = 2k: d = 6: max(162, 64) = 162; d = 8: max(122, 80) = 122;
    # d = 10: max(98, 106.67) = 106.67; d = 12: max(82, 160) = 160 -> 5 replicas, 111.67 s (S' = S);
    # S' = k x S: d = 8: 122 + 20 = 142, d = 10: 106.67 + 25 = 131.67, d = 12: 160 + 30 -> 5 replicas too
    two = step_times(t, 16, tp=2)
    assert (two["replicas"], two["separate"]) == (5, pytest.approx(40 * 16 / 6 + 5))
    assert two["fleet"]["sync_parallel"]["trainer_devices"] == 6
    sh = two["fleet"]["sync_shared"]
    assert sh["replicas"] == 5 and sh["step_s"] == pytest.approx(40 * 16 / 6 + 25)
    assert two["colocated"] == pytest.approx(105.0)


def test_split_keys_name_the_recipe_keys_and_the_trainers_devices():
    sp = fleet_split(_times(), 8, tp=2)
    assert split_keys(sp, 8, "GPU") == ("rollout.server.replicas: 2, rollout.server.devices: [0, 1, 2, 3]; the trainer "
                                        "on GPU(s) 4,5,6,7: CUDA_VISIBLE_DEVICES=4,5,6,7 rltune train ... (trainer.nproc: 4)")
    sp = fleet_split(_times(), 2, tp=1)
    assert split_keys(sp, 2, "CPU core") == ("rollout.server.replicas: 1, rollout.server.devices: [0]; the trainer on "
                                             "core(s) 1: taskset -c 1 rltune train ...")
    # across machines the servers are attached (rollout.server.replicas starts them on one machine only)
    sp = fleet_split(_times(G=60.0, R=2.0, E=10.0, U=30.0, S=5.0), 16, tp=2)
    assert split_keys(sp, 16, "GPU", nodes=2).startswith("rollout.server.urls: [5 URL(s)] of servers you start on "
                                                         "10 of the 16 GPUs, 2 each")


def _run_dir(tmp_path: Path, rows: list[dict]) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_phase_times_are_medians_after_the_first_step(tmp_path):
    rows = [{"step": 1, "timing/rollout_s": 50.0, "timing/reward_s": 9.0, "timing/reference_s": 9.0,
             "timing/old_s": 9.0, "timing/train_s": 9.0, "timing/sync_ms": 9000.0}]
    rows += [{"step": s, "timing/rollout_s": g, "timing/reward_s": 0.1, "timing/reference_s": 0.2, "timing/old_s": 0.3,
              "timing/train_s": 1.0, "timing/sync_ms": 100.0} for s, g in ((2, 2.0), (3, 3.0), (4, 9.0))]
    t = PhaseTimes.from_run(_run_dir(tmp_path, rows))
    assert (t.generate, t.reward, t.experience, t.update, t.sync, t.steps) == (3.0, 0.1, 0.5, 1.0, 0.1, 3)


def test_a_directory_without_phase_times_is_refused(tmp_path):
    with pytest.raises(TimesError, match="timing/rollout_s"):
        PhaseTimes.from_run(_run_dir(tmp_path, [{"step": 1, "reward/mean": 0.1}]))


def test_plan_times_through_the_cli(tmp_path):
    rows = [{"step": s, "timing/rollout_s": 4.0, "timing/reward_s": 1.0, "timing/reference_s": 0.5,
             "timing/old_s": 0.5, "timing/train_s": 3.0, "timing/sync_ms": 500.0} for s in range(1, 5)]
    run = _run_dir(tmp_path, rows)
    cmd = [sys.executable, "-m", "rltune", "plan", str(ROOT / "recipes" / "quickstart.yaml"), "--gpus", "8",
           "--gpu-mem", "80GB", "--times", str(run)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "step time by placement (a phase model on 8 GPU(s)" in res.stdout
    assert "separate: rollout on 4 of 8 GPU(s)" in res.stdout and "9.50 s/step" in res.stdout
    assert "4 replica(s) x 1 GPU(s) (tensor_parallel_size 1), the trainer on the other 4" in res.stdout
    assert ("best split (S' = S): rollout.server.replicas: 4, rollout.server.devices: [0, 1, 2, 3]; the trainer on "
            "GPU(s) 4,5,6,7: CUDA_VISIBLE_DEVICES=4,5,6,7") in res.stdout
    # S' = k x S: k = 2: max(17, 5.33) + 1 = 18; k = 3: max(11.67, 6.4) + 1.5 = 13.17; k = 4: 9 + 2 = 11;
    # k = 5: max(7.4, 10.67) + 2.5 = 13.17 -> 4 replicas again, 11 s
    assert "or, sync per replica (S' = k x S)" in res.stdout and "11.00 s/step" in res.stdout
    assert "faster for this recipe: colocated (8.50 s/step, 1.12x the synchronous step)" in res.stdout
    res = subprocess.run(cmd[:-2] + ["--format", "json", "--times", str(run)], capture_output=True, text=True, cwd=ROOT)
    placement = json.loads(res.stdout)["placement"]
    assert placement["devices"] == 8 and placement["colocated"] == pytest.approx(8.5)
    assert placement["replicas"] == 4 and placement["fleet"]["sync_shared"]["step_s"] == pytest.approx(11.0)
    # rollout.tensor_parallel_size 2: replicas of 2 GPUs (d = 2: 17, d = 4: 9, d = 6: 16 -> 2 replicas)
    res = subprocess.run(cmd[:-2] + ["--format", "json", "--times", str(run), "rollout.tensor_parallel_size=2"],
                         capture_output=True, text=True, cwd=ROOT)
    placement = json.loads(res.stdout)["placement"]
    assert placement["replicas"] == 2 and placement["server_devices"] == 4
    res = subprocess.run(cmd[:-1] + [str(tmp_path / "none")], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "--times" in res.stderr and "Traceback" not in res.stderr
