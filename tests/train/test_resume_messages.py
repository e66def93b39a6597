"""Messages a user reads when a resume or an override goes wrong (issue 14, item 8 and 4)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from trainlib import ROOT, run_inproc

LOG = logging.getLogger("test")


def test_resume_bogus_names_the_path_and_says_there_is_no_checkpoint(tmp_path):
    from rltune.train.resume import ResumeInputError, choose_checkpoint

    with pytest.raises(ResumeInputError) as e:
        choose_checkpoint(tmp_path / "run", str(tmp_path / "bogus"), LOG)
    assert e.value.exit_code == 2
    assert str(e.value).startswith(f"--resume {tmp_path / 'bogus'}: no such checkpoint: {tmp_path / 'bogus'} does not exist; "
                                   f"{tmp_path / 'run' / 'checkpoints'} holds no checkpoint")
    assert "did not finish" not in str(e.value)


def test_resume_bogus_lists_the_checkpoints_that_exist(tmp_path):
    from rltune.train.resume import ResumeInputError, choose_checkpoint

    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000001").mkdir(parents=True)
    (run / "checkpoints" / "step-00000001" / "manifest.json").write_text("{}")
    (run / "checkpoints" / "step-00000002").mkdir()
    with pytest.raises(ResumeInputError) as e:
        choose_checkpoint(run, "atuo", LOG)
    assert (f"checkpoints in {run / 'checkpoints'}: step-00000001, step-00000002 (incomplete) "
            "(did you mean `--resume auto`?)") in str(e.value)


def test_resume_of_a_directory_that_is_no_checkpoint(tmp_path):
    from rltune.train.resume import ResumeInputError, choose_checkpoint

    (tmp_path / "notes").mkdir()
    with pytest.raises(ResumeInputError, match="not a checkpoint .*without manifest.json") as e:
        choose_checkpoint(tmp_path / "run", str(tmp_path / "notes"), LOG)
    assert "did not finish" not in str(e.value)


def test_changed_recipe_ends_with_three_fix_lines(tmp_path):
    from rltune.train.resume import Change, check_changes
    from rltune.train.setup import TrainError

    with pytest.raises(TrainError) as e:
        check_changes([Change("actor.lr", 1e-5, 5e-7)], False, Path("step-00000002"), tmp_path)
    lines = str(e.value).splitlines()
    assert lines[0] == "the recipe changed since checkpoint step-00000002: actor.lr: 1e-05 -> 5e-07"
    assert lines[1] == "  fix: pass --allow-recipe-change to continue this run with the new values,"
    assert lines[2] == f"   or: --resume never to start a new run here (the old one is moved to {tmp_path / 'previous'}/),"
    assert lines[3] == "   or: set a new trainer.output_dir to start a new run elsewhere and keep this one as it is"


def test_failed_override_suggests_validate_with_the_override(capfd, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text((ROOT / "recipes" / "tiny-grpo.yaml").read_text())
    res = run_inproc(capfd, "train", path, "actor.lr=-1", "trainer.output_dir=a b")
    assert res.returncode == 1
    assert f"not training (see `rltune validate {path} actor.lr=-1 'trainer.output_dir=a b'`)" in res.stderr
