"""Files rltune writes on request: never through a link, an existing file only with --force, and a
run directory's default output (RUN/run.png) never through a link either (issue 25, item 2)."""

from __future__ import annotations

import os

import pytest

from rltune.outputs import write_output

NEWS = "not yours to overwrite\n"


def _victim(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text(NEWS)
    return victim


@pytest.mark.parametrize("argv", [["schema", "--output", "{out}"],
                                  ["presets", "apply", "cold-start", "{recipe}", "--output", "{out}"],
                                  ["recipes", "copy", "tiny-grpo", "{out}"]])
def test_an_existing_output_needs_force_and_a_link_is_never_written_through(tmp_path, cli, argv):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {policy: builtin:tiny-llama}\ndata: {train: builtin:arithmetic}\n"
                      "reward: {functions: [builtin:exact_answer]}\n")
    fill = lambda out: [a.format(out=out, recipe=recipe) for a in argv]  # noqa: E731
    # an existing file: refused (exit 2, the path named, the fix), untouched; replaced with --force
    existing = tmp_path / "existing.txt"
    existing.write_text(NEWS)
    code, text = cli(*fill(existing))
    assert code == 2 and "exists; not overwriting it" in text and "--force" in text, text
    assert existing.read_text() == NEWS
    code, text = cli(*fill(existing), "--force")
    assert code == 0, text
    assert existing.read_text() != NEWS
    # a link, to a file or dangling, is refused even with --force; its target is untouched
    victim = _victim(tmp_path)
    for name, target in (("link.txt", victim), ("dangling.txt", tmp_path / "nowhere" / "x")):
        link = tmp_path / name
        link.symlink_to(target)
        for extra in ((), ("--force",)):
            code, text = cli(*fill(link), *extra)
            assert code == 2 and "is a link" in text, text
        assert link.is_symlink() and victim.read_text() == NEWS
        assert not (tmp_path / "nowhere").exists()


def test_plot_never_writes_through_a_link_in_the_run_directory(tmp_path, cli):
    import json

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": i, "reward/mean": 0.1 * i, "kl": 0.01} for i in range(1, 6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    victim = _victim(tmp_path)
    (run / "run.png").symlink_to(victim)
    code, text = cli("plot", str(run))
    assert code == 2 and "is a link" in text and str(run / "run.png") in text, text
    assert victim.read_text() == NEWS
    # rltune's own default output is rewritten by a later call without --force
    (run / "run.png").unlink()
    assert cli("plot", str(run))[0] == 0
    assert cli("plot", str(run))[0] == 0 and not (run / "run.png").is_symlink()


def test_write_output_leaves_the_old_file_whole_when_writing_fails(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")

    def fails(path):
        path.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_output(target, fails, force=True)
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["out.txt"]
