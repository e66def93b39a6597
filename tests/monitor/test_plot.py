
from rltune.commands.plot import run
from rltune.monitor.autotune import AutoTuner
from rltune.monitor.detectors import HealthMonitor
from rltune.recipe.schema import Recipe
from synth import RECIPE, fault, write_run


def test_plot_writes_a_png_with_events_and_stages(tmp_path, capsys):
    rec = {**RECIPE, "autotune": {"enabled": True}}
    r = Recipe.model_validate(rec)
    d = tmp_path / "run"
    trace, _ = fault("reward_collapse")
    trace[44]["kl"] = 1.2
    trace[19]["critic/loss"] = float("nan")
    mon, tuner = HealthMonitor(r, d), AutoTuner(r, d)
    for m in trace:
        tuner.step(m, mon.observe(m))
        m.update(tuner.metrics())
    write_run(d, trace, rec)
    assert run(d) == 0
    png = d / "run.png"
    assert png.stat().st_size > 10_000
    import matplotlib.image as mpimg
    img = mpimg.imread(png)
    assert img.shape[0] > 500 and img.shape[1] > 500


def test_plot_other_output_and_bad_input(tmp_path, capsys):
    d = write_run(tmp_path / "run", fault("kl_spike")[0])   # no recipe, no events.jsonl
    out = tmp_path / "x" / "p.png"
    assert run(d, out) == 0 and out.stat().st_size > 10_000
    assert run(tmp_path / "missing") == 2
    assert "no such run directory" in capsys.readouterr().err


# ---- issue 26 item 6: what the plot decides (pure functions, no pixels) -----------------------------

def _log(tmp_path, trace, name="run"):
    from rltune.monitor.runlog import read_metrics
    return read_metrics(write_run(tmp_path / name, trace))


def test_eval_before_training_is_drawn_at_step_0(tmp_path):
    import json

    from rltune.commands.plot import eval_points, panels
    from synth import healthy

    d = write_run(tmp_path / "run", healthy(30))
    assert eval_points(d) == {}                              # no eval.json: nothing to draw
    (d / "eval.json").write_text(json.dumps({"before": 0.70, "after": 0.85, "before_parts": {}}))
    assert eval_points(d) == {"before": 0.70, "after": 0.85}
    (d / "eval.json").write_text(json.dumps({"before": float("nan"), "after": "x"}))
    assert eval_points(d) == {}                              # nothing finite: no marker
    # a log with only the eval before training still gets its reward panel
    log = _log(tmp_path, [{"step": s, "kl": 0.01} for s in range(1, 6)], "kl_only")
    assert "reward" not in panels(log)
    assert panels(log, eval_before=0.7)[0] == "reward"


def test_constant_kl_coef_gets_no_twin_axis(tmp_path):
    from rltune.commands.plot import kl_coef_axis
    from synth import healthy

    trace = healthy(30)                                      # kl_coef 0.05 on every step
    assert kl_coef_axis(_log(tmp_path, trace, "const")) == (False, 0.05)
    for i, m in enumerate(trace):
        m["kl_coef"] = 0.05 * (1 + 0.01 * i)                 # an adaptive controller: it moves
    assert kl_coef_axis(_log(tmp_path, trace, "adaptive")) == (True, None)
    for m in trace:
        del m["kl_coef"]
    assert kl_coef_axis(_log(tmp_path, trace, "none")) == (False, None)


def test_kl_is_drawn_per_token_where_logged(tmp_path):
    """The quickstart's `kl` (summed over a response) reads 1.5 while its per-token KL, what the
    monitor compares with health.kl_high 0.6, is 0.16: the plot draws the per-token figure."""
    from rltune.commands.plot import kl_series

    rows = [{"step": s, "kl": 1.5, "kl/token_mean": 0.16} for s in range(1, 6)]
    assert kl_series(_log(tmp_path, rows, "both")) == ("kl/token_mean", "KL per token")
    assert kl_series(_log(tmp_path, [{"step": 1, "kl": 0.3}], "other_tool")) == ("kl", "KL")


def test_clipfrac_all_zero_gets_no_empty_twin_axis(tmp_path):
    from rltune.commands.plot import lr_panel_title
    from synth import healthy

    trace = healthy(20, ppo=False)
    assert lr_panel_title(_log(tmp_path, trace, "moving"))[0] is True
    for m in trace:
        m["actor/clipfrac"] = 0.0                            # GRPO, one update per batch
    assert lr_panel_title(_log(tmp_path, trace, "zero")) == (False, "learning rate (clipfrac 0 on every step)")
    for m in trace:
        del m["actor/clipfrac"]
    assert lr_panel_title(_log(tmp_path, trace, "none")) == (False, "learning rate")


def test_panels_without_data_are_dropped(tmp_path):
    from rltune.commands.plot import PANELS, panels
    from synth import healthy

    assert panels(_log(tmp_path, healthy(30), "ppo")) == list(PANELS)
    grpo = panels(_log(tmp_path, healthy(30, ppo=False), "grpo"))
    assert "critic_loss" not in grpo and "grad_norm" in grpo
    bare = healthy(30, ppo=False)
    for m in bare:
        for k in ("actor/clipfrac", "actor/lr"):
            del m[k]
    assert panels(_log(tmp_path, bare, "bare")) == ["reward", "kl", "grad_norm", "entropy", "length", "timing"]


def test_resume_points_are_found(tmp_path):
    from rltune.commands.plot import resume_steps
    from synth import healthy

    trace = healthy(40)
    plain = write_run(tmp_path / "plain", trace)
    assert resume_steps(plain) == []
    # killed after step 27, resumed from the checkpoint of step 20: steps 21.. are appended again
    resumed = write_run(tmp_path / "resumed", trace[:27] + trace[20:])
    assert resume_steps(resumed) == [20]
    # an autotune rollback at step 27 (back to 20) also repeats steps: not a resume
    assert resume_steps(resumed, [{"step": 27, "kind": "rollback", "severity": "warning"}]) == []
    # a resume at the last step logged repeats nothing: train.log names it
    clean = write_run(tmp_path / "clean", trace)
    (clean / "train.log").write_text("2026-01-01 10:00:00 INFO resumed from /x/checkpoints/step_30 at step 30\n")
    assert resume_steps(clean) == [30]


def test_plot_grpo_resumed_run_with_eval(tmp_path):
    import json

    from synth import healthy

    trace = healthy(40, ppo=False)
    for m in trace:
        del m["actor/clipfrac"]
    d = write_run(tmp_path / "run", trace[:27] + trace[20:])   # 7 panels: an odd count
    (d / "eval.json").write_text(json.dumps({"before": 0.7, "after": 0.85}))
    assert run(d) == 0 and (d / "run.png").stat().st_size > 10_000
