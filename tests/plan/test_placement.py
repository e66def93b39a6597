"""`rltune plan --times RUN_DIR` (plan/placement.py): the step time of each placement of the rollout
engine from a run's phase times, against hand-computed values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rltune.plan.placement import PhaseTimes, TimesError, step_times

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
    assert "separate: server on 4 of 8 GPU(s)" in res.stdout and "9.50 s/step" in res.stdout
    assert "faster for this recipe: colocated (8.50 s/step, 1.12x the synchronous step)" in res.stdout
    res = subprocess.run(cmd[:-2] + ["--format", "json", "--times", str(run)], capture_output=True, text=True, cwd=ROOT)
    placement = json.loads(res.stdout)["placement"]
    assert placement["devices"] == 8 and placement["colocated"] == pytest.approx(8.5)
    res = subprocess.run(cmd[:-1] + [str(tmp_path / "none")], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 2 and "--times" in res.stderr and "Traceback" not in res.stderr
