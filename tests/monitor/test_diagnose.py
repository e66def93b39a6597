import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rltune.commands.diagnose import run
from rltune.recipe.schema import Recipe
from synth import RECIPE, fault, healthy, write_run

SRC = str(Path(__file__).resolve().parents[2] / "src")


def diag_json(capsys, *a, **kw):
    rc = run(*a, fmt="json", **kw)
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("seed", [0, 1])
def test_healthy_run_exit_0(tmp_path, capsys, seed):
    d = write_run(tmp_path / "run", healthy(60, seed, 0.05), RECIPE)
    rc, out = diag_json(capsys, d)
    assert rc == 0 and out["events"] == [] and out["verdict"] is None and out["healthy"] is True
    assert run(d) == 0
    assert "Healthy" in capsys.readouterr().out


@pytest.mark.parametrize("kind,verdict", [("critic_nan", "critic_nan"), ("kl_spike", "kl_spike"),
                                          ("reward_swing", "reward_swing"), ("kl_high", "kl_high"),
                                          ("sync_slow", "sync_slow")])
def test_fault_run_json_shape_and_exit_1(tmp_path, capsys, kind, verdict):
    trace, at = fault(kind)
    d = write_run(tmp_path / "run", trace, RECIPE)
    rc, out = diag_json(capsys, d)
    assert rc == 1
    assert [(e["step"], e["kind"]) for e in out["events"]] == [(at, kind)]
    e = out["events"][0]
    assert set(e) >= {"step", "kind", "severity", "message", "advice"}
    v = out["verdict"]
    assert v["kind"] == verdict and v["summary"] and isinstance(v["changes"], dict)


def test_text_output_names_cause_and_changes(tmp_path, capsys):
    trace, _ = fault("critic_nan")
    trace[29]["kl"] = 1.0
    d = write_run(tmp_path / "run", trace, RECIPE)
    assert run(d) == 1
    out = capsys.readouterr().out
    assert "Critic loss NaN at step 12" in out and "KL spike at step 30" in out
    assert "Most likely cause" in out and "critic lr too high or reward normalisation broken" in out
    assert "critic.lr 3e-06 -> 1.5e-06" in out


def test_patch_writes_a_valid_recipe(tmp_path, capsys):
    trace, _ = fault("reward_swing")
    recipe = {**RECIPE, "actor": {"lr": 1e-5}, "critic": {"lr": 3e-5}}
    d = write_run(tmp_path / "run", trace, recipe)
    out_yaml = tmp_path / "fixed.yaml"
    assert run(d, patch=out_yaml) == 1
    r = Recipe.model_validate(yaml.safe_load(out_yaml.read_text()))
    assert r.actor.lr == 5e-07 and r.critic.lr == 1.5e-06
    assert r.model.policy == "builtin:tiny-llama"  # the rest of the recipe is kept
    # collapse -> the anti-overfit values land in the patch
    trace, _ = fault("reward_collapse")
    d = write_run(tmp_path / "run2", trace, RECIPE)
    assert run(d, patch=tmp_path / "p2.yaml") == 1
    r = Recipe.model_validate(yaml.safe_load((tmp_path / "p2.yaml").read_text()))
    assert (r.algorithm.kl.coef, r.algorithm.entropy_coef, r.algorithm.clip_range) == (0.08, 0.01, 0.12)


def test_patch_without_recipe_writes_changes_only(tmp_path, capsys):
    d = write_run(tmp_path / "run", fault("kl_high")[0])
    assert run(d, patch=tmp_path / "p.yaml") == 1
    doc = yaml.safe_load((tmp_path / "p.yaml").read_text())
    assert doc == {"algorithm": {"kl": {"coef": 0.075}}}


def test_truncated_last_line_is_tolerated(tmp_path, capsys):
    trace, at = fault("critic_nan")
    d = write_run(tmp_path / "run", trace, RECIPE, truncate_last=True)
    rc, out = diag_json(capsys, d)
    assert rc == 1 and out["last_step"] == len(trace) - 1
    assert any("truncated last line" in n for n in out["notes"])
    assert out["events"][0]["message"].startswith("Critic loss NaN at step 12")


def test_unreadable_input_exit_2(tmp_path, capsys):
    assert run(tmp_path / "nope") == 2
    err = capsys.readouterr().err
    assert "no such run directory" in err and "Traceback" not in err
    (tmp_path / "empty").mkdir()
    assert run(tmp_path / "empty") == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    assert run(tmp_path / "empty") == 2
    d = write_run(tmp_path / "run", fault("kl_spike")[0])
    assert run(d, maps=["nonsense"]) == 2
    assert "expected OUR_KEY=THEIR_KEY" in capsys.readouterr().err
    assert run(d, source="nemo") == 2 and run(d, fmt="xml") == 2


def test_from_trl(tmp_path, capsys):
    """TRL GRPO log lines: reward, kl, entropy, completions/mean_length, grad_norm, learning_rate."""
    rows = []
    for m in fault("kl_spike")[0]:
        rows.append({"loss": m["actor/loss"], "grad_norm": m["actor/grad_norm"], "learning_rate": m["actor/lr"],
                     "reward": m["reward/mean"], "reward_std": m["reward/std"], "kl": m["kl"],
                     "entropy": m["actor/entropy"], "completions/mean_length": m["response/length_mean"],
                     "epoch": round(m["step"] / 60, 4)})   # keyed by epoch: no step
    rows.append({"train_runtime": 123.0, "train_loss": 0.1, "epoch": 1.0})
    f = tmp_path / "trl" / "log.jsonl"
    f.parent.mkdir()
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rc, out = diag_json(capsys, f, source="trl")
    assert rc == 1 and out["steps"] == 60
    assert [(e["step"], e["kind"]) for e in out["events"]] == [(30, "kl_spike")]
    # the same with explicit --map
    maps = ["reward/mean=reward", "kl=kl", "actor/grad_norm=grad_norm", "actor/lr=learning_rate"]
    rc, out = diag_json(capsys, f, maps=maps)
    assert rc == 1 and [(e["step"], e["kind"]) for e in out["events"]] == [(30, "kl_spike")]


def test_from_verl(tmp_path, capsys):
    rows = []
    for m in fault("critic_nan")[0]:
        data = {"critic/score/mean": m["reward/mean"], "actor/ppo_kl": m["kl"], "actor/entropy": m["actor/entropy"],
                "actor/grad_norm": m["actor/grad_norm"], "actor/pg_loss": m["actor/loss"],
                "critic/vf_loss": m["critic/loss"], "critic/grad_norm": m["critic/grad_norm"],
                "response_length/mean": m["response/length_mean"],
                "timing_s/update_weights": 0.45 if m["step"] >= 40 else 0.05}
        rows.append({"step": m["step"], "data": data} if m["step"] % 2 else {"step": m["step"], **data})
    d = tmp_path / "verl"
    d.mkdir()
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rc, out = diag_json(capsys, d, source="verl")
    assert rc == 1
    assert [(e["step"], e["kind"]) for e in out["events"]] == [(12, "critic_nan"), (41, "sync_slow")]
    assert out["verdict"]["kind"] == "critic_nan"


def test_diagnose_does_not_import_torch(tmp_path):
    d = write_run(tmp_path / "run", fault("grad_spike")[0], RECIPE)
    code = (f"import sys; from rltune.commands.diagnose import run; rc = run({str(d)!r}, fmt='json'); "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert 'matplotlib' not in sys.modules; sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": SRC},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stderr
    assert json.loads(p.stdout)["verdict"]["kind"] == "grad_spike"


def test_an_info_event_is_not_summed_up_as_no_detector_fired(tmp_path, capsys):
    """Issue 46 item 9: under a table that lists an event (here autotune's, from events.jsonl),
    the summary says what fired, not "no detector fired"."""
    d = write_run(tmp_path / "run", healthy(60, 0, 0.05), RECIPE)
    (d / "events.jsonl").write_text(json.dumps({"step": 3, "kind": "autotune", "severity": "info",
                                                "message": "tuned actor.lr"}) + "\n")
    assert run(d) == 0
    out = capsys.readouterr().out
    assert "tuned actor.lr" in out and "no detector fired" not in out, out
    assert "No problem found over 60 steps: 1 info event (autotune), none a warning or an error." in out, out
