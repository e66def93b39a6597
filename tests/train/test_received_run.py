"""One hostile run directory, as someone could send it, run through every command that reads a run
directory (issue 25): diagnose, diagnose --patch, plot, train --resume. Nothing it holds runs code,
writes outside it, hangs or ends in a traceback."""

from __future__ import annotations

import hashlib
import json
import time

from trainlib import run_inproc, tiny_recipe

NEWS = "not yours\n"


def _hostile(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text(NEWS)
    helper = tmp_path / "helper.py"
    helper.write_text("import pathlib\npathlib.Path(__file__).with_name('RAN').write_text('x')\n"
                      "def score(prompts, completions, **kw):\n    return [1.0] * len(prompts)\n")
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": i, "reward/mean": 0.1 + (0.3 if i % 2 else -0.3), "kl": 1e308 if i == 9 else 0.01,
             "actor/grad_norm": 0.5} for i in range(1, 30)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "[" * 50_000 + "\n")
    (run / "events.jsonl").write_text(json.dumps({"step": "x", "kind": 1}) + "\n")
    (run / "recipe.yaml").write_text(
        f"# source: {victim}\n# overrides: 'reward.functions=[{helper}:score]' model.trust_remote_code=true "
        "'actor.lr=1e-5' 'unclosed\nmodel: {policy: builtin:tiny-llama}\ndata: {train: builtin:arithmetic}\n"
        f"reward: {{functions: ['{helper}:score']}}\n")
    (run / "run.png").symlink_to(victim)
    (run / "train.log").symlink_to(victim)
    ckpt = run / "checkpoints" / "step-00000001"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text("{}")
    zero = {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps({"step": 1, "files": {"../../../../../../dev/zero": zero}}))
    return run, victim


def test_every_reading_command_treats_a_received_run_as_data(tmp_path, capfd):
    run, victim = _hostile(tmp_path)
    t0 = time.monotonic()
    res = run_inproc(capfd, "diagnose", run)
    assert res.returncode in (0, 1) and "Traceback" not in res.stderr and "probably a bug" not in res.stderr, res.stderr
    out = tmp_path / "patched.yaml"
    res = run_inproc(capfd, "diagnose", run, "--patch", out)
    assert "Traceback" not in res.stderr and "probably a bug" not in res.stderr, res.stderr
    if out.exists():   # the source named by the header is no recipe: refused, or the run's recipe patched
        text = out.read_text()
        assert "trust_remote_code" not in text and ("helper.py" not in text or "# CHECK before training" in text)
    res = run_inproc(capfd, "plot", run)
    assert res.returncode == 2 and "is a link" in res.stderr
    # resuming into it: refused before anything is written (train.log is a link) ...
    recipe = tiny_recipe(tmp_path, trainer__max_steps=1, trainer__eval_every=0, trainer__output_dir=str(run))
    res = run_inproc(capfd, "train", recipe, "--resume", "auto")
    assert res.returncode != 0 and "train.log is a link" in res.stderr
    # ... and with the links gone, the crafted checkpoint is not usable (never hashed forever)
    (run / "train.log").unlink()
    (run / "run.png").unlink()
    res = run_inproc(capfd, "train", recipe, "--resume", "auto")
    assert "leaves the checkpoint" in res.stderr, res.stderr[-3000:]
    assert time.monotonic() - t0 < 300
    assert victim.read_text() == NEWS and not (tmp_path / "RAN").exists()
