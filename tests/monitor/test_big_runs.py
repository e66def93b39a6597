"""Long runs (issue 11, item 12): `plot` and `diagnose` on a 200k-step metrics.jsonl stream the
file, draw at most ~2000 points per series (spikes kept), every event, and summarise repeated
events instead of printing one line each."""

from __future__ import annotations

import json
import random

import pytest

STEPS = 200_000
SPIKE_STEP = 123_457          # one grad-norm spike, must survive downsampling
KL_SPIKE_EVERY = 50           # a KL spike every 50 steps: ~4000 kl_spike events


def _write_metrics(d, n=STEPS):
    rng = random.Random(0)
    lines = []
    for t in range(1, n + 1):
        kl = 0.9 if t % KL_SPIKE_EVERY == 0 else 0.02 + 0.01 * rng.random()
        g = 50.0 if t == SPIKE_STEP else 0.3 + 0.05 * rng.random()
        lines.append(f'{{"step": {t}, "reward/mean": {0.5 + 0.01 * rng.random():.5f}, "reward/std": 0.4, '
                     f'"kl": {kl:.5f}, "kl_coef": 0.05, "actor/grad_norm": {g:.5f}, "actor/entropy": 1.2, '
                     f'"response/length_mean": 40.0, "actor/lr": 1e-06, "timing/sync_ms": 50.0}}\n')
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.jsonl").write_text("".join(lines))
    return d


@pytest.fixture(scope="module")
def big_run(tmp_path_factory):
    return _write_metrics(tmp_path_factory.mktemp("big") / "run")


def test_plot_downsamples_keeps_spikes_and_draws_every_event(big_run, tmp_path, monkeypatch, capsys):
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.figure

    from rltune.commands import plot

    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.jsonl").symlink_to(big_run / "metrics.jsonl")
    # a live run's events.jsonl: thousands of events of two kinds, plus autotune changes
    events = [{"step": s, "kind": "kl_spike", "severity": "error", "message": f"KL spike at step {s}"}
              for s in range(KL_SPIKE_EVERY, STEPS + 1, KL_SPIKE_EVERY)]
    events += [{"step": s, "kind": "kl_high", "severity": "warning", "message": "KL high"}
               for s in range(7, STEPS, 97)]
    events += [{"step": s, "kind": "autotune", "severity": "info", "message": "tuned"}
               for s in range(1000, STEPS, 10_000)]
    (d / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))

    figs = []
    save = matplotlib.figure.Figure.savefig

    def spy(self, *a, **kw):
        figs.append(self)
        return save(self, *a, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    assert plot.run(d) == 0
    assert (d / "run.png").stat().st_size > 10_000
    assert f"{STEPS} steps" in figs[0]._suptitle.get_text()
    axes = figs[0].axes
    lines = [ln for a in axes for ln in a.lines]
    assert lines and max(len(ln.get_xdata()) for ln in lines) <= plot.MAX_POINTS
    grad = next(a for a in axes if a.get_title() == "grad norm")
    actor = next(ln for ln in grad.lines if ln.get_label() == "actor")
    assert max(actor.get_ydata()) == 50.0                     # the spike is kept
    assert SPIKE_STEP in list(actor.get_xdata())
    kl = next(ln for a in axes for ln in a.lines if ln.get_label() == "kl")
    assert max(kl.get_ydata()) == 0.9 and min(kl.get_ydata()) < 0.03   # spikes and the floor
    # every event is drawn (one collection per colour), on every panel
    reward_ax = axes[0]
    drawn = sum(len(c.get_segments()) for c in reward_ax.collections if hasattr(c, "get_segments"))
    n_problem = sum(1 for e in events if e["severity"] != "info")
    n_tuned = len({e["step"] for e in events if e["kind"] == "autotune"})
    assert drawn == n_problem + n_tuned
    # labels are summarised per kind, the first one names the count
    labels = [t.get_text() for t in reward_ax.texts]
    assert len(labels) <= 2 * plot.LABELS_PER_KIND
    assert any(t.startswith("kl_spike ×") for t in labels) and any(t.startswith("kl_high ×") for t in labels)


def test_downsample_indices_min_max_per_bucket():
    from rltune.commands.plot import downsample_indices

    ys = [0.0] * 10_000
    ys[4321] = 7.0
    ys[9000] = -3.0
    ys[200:400] = [float("nan")] * 200                          # one whole bucket of 200 points
    idx = downsample_indices(ys, 100)
    assert len(idx) <= 100 and idx == sorted(idx)
    assert 4321 in idx and 9000 in idx
    assert any(200 <= i < 400 for i in idx)                    # an all-NaN bucket keeps its gap
    assert downsample_indices([1.0, 2.0], 100) == [0, 1]


def test_diagnose_summarises_repeated_events(big_run, capsys):
    from rltune.commands import diagnose

    assert diagnose.run(big_run, fmt="json") == 1
    doc = json.loads(capsys.readouterr().out)
    diagnose._print_text(doc)              # the text output of the same diagnosis (one detector pass)
    out = capsys.readouterr().out
    assert f"{STEPS} steps" in out
    n_lines = len(out.splitlines())
    assert n_lines < 80, out
    assert "kl_spike ×" in out and "(first, last shown)" in out
    assert "KL spike at step 50:" in out                       # the first one is shown
    assert f"KL spike at step {STEPS}:" in out                # and the last
    rep = {r["kind"]: r for r in doc["repeated"]}
    spikes = [e for e in doc["events"] if e["kind"] == "kl_spike"]
    assert len(spikes) > 1000                                  # JSON keeps every event
    assert rep["kl_spike"]["count"] == len(spikes)
    assert (rep["kl_spike"]["first_step"], rep["kl_spike"]["last_step"]) == (50, STEPS)


def test_streamed_log_merges_repeated_and_unordered_steps(tmp_path):
    from rltune.monitor.runlog import read_metrics

    rows = [{"step": s, "kl": 0.1 * s} for s in (1, 2, 3, 4)] + [{"step": 3, "kl": 9.0, "x": 1},
                                                                 {"step": 2, "reward/mean": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    log = read_metrics(tmp_path)
    assert log.steps == [1, 2, 3, 4]
    assert log.rows[2] == {"step": 3, "kl": 9.0, "x": 1.0}
    assert log.rows[1] == {"step": 2, "kl": 0.2, "reward/mean": 0.5}
    assert log.series("x") == ([3], [1.0])
    assert any("2 repeated step(s) merged" in n for n in log.notes)
