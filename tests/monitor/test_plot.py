
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
