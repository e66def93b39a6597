"""`plot` / `diagnose` input and output paths (issue 11, item 13): unreadable lines counted right,
symlink loops named, `plot --output DIR` writes where it says."""

from __future__ import annotations

import json
import os

import pytest

from synth import fault, write_run


def test_diagnose_counts_every_unreadable_line(tmp_path, capsys):
    from rltune.commands.diagnose import run

    d = write_run(tmp_path / "run", fault("kl_spike")[0])
    lines = (d / "metrics.jsonl").read_text().splitlines()
    # 5 unreadable lines: two broken, three valid JSON that is not a record
    bad = {3: "{\"step\": 3, \"kl\"", 10: "garbage", 20: "[1, 2, 3]", 30: "42", 40: "null"}
    for i in sorted(bad):
        lines.insert(i, bad[i])
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert run(d, fmt="json") == 1
    notes = json.loads(capsys.readouterr().out)["notes"]
    note = next(n for n in notes if "unreadable" in n)
    assert "5 unreadable line(s)" in note, notes
    assert "lines 4, 11, 21, 31, 41" in note                       # 1-based line numbers
    assert not any("truncated" in n for n in notes)


def test_truncated_last_line_is_not_an_unreadable_one(tmp_path, capsys):
    from rltune.commands.diagnose import run

    d = write_run(tmp_path / "run", fault("kl_spike")[0])
    with open(d / "metrics.jsonl", "a") as f:
        f.write("oops\n{\"step\": 61, \"kl\": 0.")
    assert run(d, fmt="json") == 1
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any("1 unreadable line(s)" in n for n in notes), notes
    assert any("line 62: truncated last line" in n for n in notes), notes


@pytest.mark.parametrize("where", ["run_dir", "metrics"])
def test_symlink_loop_is_named(tmp_path, capsys, where):
    from rltune.commands.diagnose import run as diagnose
    from rltune.commands.plot import run as plot

    if where == "run_dir":
        target = tmp_path / "loop"
        os.symlink(target, target)
    else:
        target = tmp_path / "run"
        target.mkdir()
        os.symlink(target / "metrics.jsonl", target / "metrics.jsonl")
    assert diagnose(target) == 2
    err = capsys.readouterr().err
    assert "symlink loop" in err and "not found" not in err and "no such" not in err, err
    assert "Traceback" not in err
    assert plot(target) == 2
    assert "symlink loop" in capsys.readouterr().err


def test_broken_symlink_is_named(tmp_path, capsys):
    from rltune.commands.diagnose import run

    os.symlink(tmp_path / "gone", tmp_path / "link")
    assert run(tmp_path / "link") == 2
    assert "broken symlink" in capsys.readouterr().err


def test_plot_output_paths(tmp_path, capsys):
    from rltune.commands.plot import run

    d = write_run(tmp_path / "run", fault("kl_spike")[0])
    # an existing directory: DIR/plot.png, and the message names it
    out_dir = tmp_path / "plots"
    out_dir.mkdir()
    assert run(d, out_dir) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out_dir / 'plot.png'}"
    assert (out_dir / "plot.png").stat().st_size > 10_000 and not (tmp_path / "plots.png").exists()
    # a path ending in '/': created, DIR/plot.png
    assert run(d, str(tmp_path / "new") + "/") == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'new' / 'plot.png'}"
    assert (tmp_path / "new" / "plot.png").is_file()
    # no suffix: NAME.png, said so
    assert run(d, tmp_path / "myplot") == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'myplot.png'}"
    assert (tmp_path / "myplot.png").is_file()
    # an unknown format: exit 2, a fix, no traceback
    assert run(d, tmp_path / "p.jpgx") == 2
    err = capsys.readouterr().err
    assert "p.jpgx" in err and ".png" in err and "Traceback" not in err
