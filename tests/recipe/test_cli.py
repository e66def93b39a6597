from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from recipe_testlib import ROOT, MINIMAL, PPO

ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_COLOR": "1"}
ENV.pop("RLTUNE_DEBUG", None)


def test_validate_clean(cli, write):
    code, out = cli("validate", write(MINIMAL))
    assert code == 0
    assert "batch plan" in out and "4 generation call(s) x 8 sequences" in out
    assert "ok — 0 error(s), 0 warning(s)" in out


def test_validate_text_is_compiler_style(cli, write):
    path = write(PPO + "actor:\n  lr: 1.0e-6\ncritic:\n  lr: 1.0e-6\n")
    code, out = cli("validate", path)
    assert code == 1
    assert f"{path}:12:3: error lr-order: actor.lr 1.0e-06 equals critic.lr 1.0e-06" in out
    assert "    fix: set critic.lr: 3.0e-06 (3 x actor.lr)" in out
    assert "FAILED — 1 error(s)" in out


def test_validate_warnings_exit_0_and_strict_exit_1(cli, write):
    path = write(MINIMAL + "trainer:\n  precision: fp16\n")
    code, out = cli("validate", path)
    assert code == 0 and "warning precision" in out
    code, out = cli("validate", "--strict", path)
    assert code == 1 and "error precision" in out


def test_overrides_as_set_and_trailing(cli, write):
    path = write(MINIMAL)
    code, out = cli("validate", path, "--set", "actor.lr=1e-5")
    assert code == 0 and "actor-lr-range" in out and "from the override `actor.lr=1e-5`" in out
    code, out = cli("validate", path, "actor.lr=1e-5", "-o", "trainer.seed=null", "--format", "json")
    assert code == 0
    assert {f["rule"] for f in json.loads(out)} == {"actor-lr-range", "seed"}
    code, out = cli("validate", path, "actor.lrr=1e-5")
    assert code == 1 and "did you mean `actor.lr`" in out


def test_json_output_keys(cli, write):
    p1 = write(MINIMAL + "trainer:\n  seed: null\n", "a.yaml")
    p2 = write(PPO + "critic:\n  lr: 1.0e-6\n", "b.yaml")
    code, out = cli("validate", "--format", "json", p1, p2)
    assert code == 1
    data = json.loads(out)
    assert isinstance(data, list) and len(data) == 2
    keys = ["file", "line", "column", "rule", "severity", "path", "message", "fix"]
    for d in data:
        assert list(d) == keys
    assert {d["file"] for d in data} == {p1, p2}
    waived = write(MINIMAL + "actor:\n  lr: 1.0e-4\nlint:\n  waive: {actor-lr-range: tiny model}\n", "c.yaml")
    code, out = cli("validate", "-f", "json", waived)
    [d] = json.loads(out)
    assert code == 0 and list(d) == keys + ["waived"] and d["severity"] == "info"


def test_github_output(cli, write):
    path = write(PPO + "critic:\n  lr: 1.0e-6\n")
    code, out = cli("validate", "--format", "github", path)
    assert code == 1
    [line] = out.strip().splitlines()
    assert line.startswith(f"::error file={path},line=10,col=3,title=lr-order::actor.lr 1.0e-06")
    assert "set critic.lr: 3.0e-06" in line


@pytest.mark.parametrize("text,needle", [
    ("model:\n  policy: [x\n", "not valid YAML"),
    ("model:\n\tpolicy: x\n", "tab character"),
    ("model:\n  policy: a\n  policy: b\n", "duplicate key"),
    ("", "is empty"),
    (MINIMAL + "preset: warp-speed\n", "unknown preset `warp-speed`"),
])
def test_unreadable_input_exits_2(cli, write, text, needle):
    path = write(text)
    for fmt in ("text", "json", "github"):
        code, out = cli("validate", "--format", fmt, path)
        assert code == 2, out
        assert needle in out
        assert "Traceback" not in out
    code, out = cli("validate", "-f", "json", path)
    [d] = json.loads(out)
    assert d["rule"] == "input" and d["severity"] == "error"


def test_schema_errors_exit_1(cli, write):
    code, out = cli("validate", write(MINIMAL + "critc:\n  lr: 1\nactor:\n  lr: fast\n"))
    assert code == 1
    assert "error schema: unknown key `critc`" in out and "did you mean `critic`" in out
    assert "actor.lr" in out and "Traceback" not in out


def test_missing_file_and_bad_usage(cli, tmp_path):
    code, out = cli("validate", str(tmp_path / "nope.yaml"))
    assert code == 2 and "not found" in out
    code, out = cli("validate", "--format", "xml", str(tmp_path / "nope.yaml"))
    assert code == 2 and "unknown --format" in out
    code, out = cli("validate", "actor.lr=1")
    assert code == 2 and "no recipe file" in out


def test_presets_list_show(cli):
    code, out = cli("presets", "list")
    assert code == 0
    for name in ("cold-start", "acceleration", "anti-overfit", "1x40gb", "8-gpu"):
        assert name in out
    assert "reward rose > 5% for 2 consecutive epochs" in out
    code, out2 = cli("presets")
    assert code == 0 and out2 == out
    code, out = cli("presets", "show", "cold-start")
    assert code == 0 and "lr: 1.0e-6" in out and out.startswith("#")
    code, out = cli("presets", "show", "warm-start")
    assert code == 2 and "unknown preset `warm-start`" in out and "cold-start" in out and "Traceback" not in out


def test_presets_apply_keeps_comments_and_shows_changes(cli, write, tmp_path):
    path = write("# my run\n" + PPO + "actor:\n  lr: 1.0e-5  # too fast?\nalgorithm2: {}\n".replace("algorithm2: {}\n", ""))
    out_path = tmp_path / "out.yaml"
    code, out = cli("presets", "apply", "cold-start", path, "--output", str(out_path))
    assert code == 0, out
    assert "actor.lr: 1.0e-05 -> 1.0e-06" in out
    # a preset value equal to the effective one (here the default) is not written (issue 26 5d)
    assert "critic.lr" not in out and "algorithm.kl.coef" not in out
    assert "ok — 0 error(s)" in out
    written = out_path.read_text()
    assert written.startswith("# my run\n") and "# too fast?" in written
    from rltune.recipe import load_recipe

    r = load_recipe(out_path).recipe
    assert r.actor.lr == 1e-6 and r.critic.lr == 3e-6 and r.algorithm.clip_range == 0.15


def test_presets_apply_to_stdout_skips_critic_for_grpo(cli, write):
    code, out = cli("presets", "apply", "cold-start", write(MINIMAL))
    assert code == 0
    assert "skipped critic.lr" in out
    assert "clip_range: 0.15" in out


def test_presets_apply_unknown_or_unreadable(cli, write, tmp_path):
    code, out = cli("presets", "apply", "nope", write(MINIMAL))
    assert code == 2 and "available presets" in out
    code, out = cli("presets", "apply", "cold-start", str(tmp_path / "missing.yaml"))
    assert code == 2 and "not found" in out and "Traceback" not in out


def test_schema_command(cli, tmp_path):
    code, out = cli("schema")
    assert code == 0
    s = json.loads(out)
    assert s["$schema"].startswith("https://json-schema.org/")
    assert s["title"] == "rltune recipe"
    assert {"model", "data", "actor", "critic", "lint"} <= set(s["properties"])
    assert s["required"] == ["model", "data"]


def test_main_turns_bugs_into_a_message(monkeypatch, cli, write):
    import rltune.commands.validate as v

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(v, "run", boom)
    code, out = cli("validate", write(MINIMAL))
    assert code == 1 and "kaboom" in out and "RLTUNE_DEBUG=1" in out and "Traceback" not in out
    monkeypatch.setenv("RLTUNE_DEBUG", "1")
    with pytest.raises(RuntimeError):
        from rltune.cli import main

        main(["validate", write(MINIMAL)])


# ---- a few real subprocesses: exit codes, no traceback, no torch


def _run(*args, env=ENV):
    return subprocess.run([sys.executable, "-m", "rltune", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=60)


def test_subprocess_exit_codes_and_no_traceback(write):
    bad = write("model:\n  policy: [x\n")
    p = _run("validate", bad)
    assert p.returncode == 2 and "not valid YAML" in p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    p = _run("validate", "recipes/minimal.yaml")
    assert p.returncode == 0, p.stdout + p.stderr
    p = _run("presets", "show", "nope")
    assert p.returncode == 2 and "Traceback" not in p.stderr and "available presets" in p.stderr
    p = _run("validate", bad, env={**ENV, "RLTUNE_DEBUG": "1"})
    assert p.returncode == 2  # input errors are handled, even in debug mode


def test_debug_shows_traceback_for_bugs(write):
    script = ("import sys, rltune.commands.validate as v\n"
              "def boom(*a, **k): raise RuntimeError('kaboom')\n"
              "v.run = boom\n"
              "from rltune.cli import main\n"
              f"main(['validate', {write(MINIMAL)!r}])\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       env={**ENV, "RLTUNE_DEBUG": "1"}, timeout=60)
    assert p.returncode == 1 and "Traceback" in p.stderr


def test_config_commands_import_no_torch():
    script = (
        "import sys\n"
        "from rltune.cli import main\n"
        "for argv in (['validate', 'recipes/minimal.yaml', 'recipes/ppo-rm-8gpu.yaml'], ['presets', 'list'],\n"
        "             ['presets', 'show', 'cold-start'], ['schema'], ['validate', '-f', 'json', 'recipes/tiny-ppo.yaml']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "import rltune.recipe as r\n"
        "r.check('recipes/quickstart.yaml'); r.load_preset('8-gpu'); r.list_presets()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'deepspeed', 'vllm', 'numpy'))\n"
        "print('HEAVY', bad, file=sys.stderr)\n"
    )
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
    assert "HEAVY []" in p.stderr, p.stderr[-2000:]


def test_colored_text_output(monkeypatch, capsys, write):
    import rltune.commands.validate as v

    monkeypatch.setattr(v, "_use_color", lambda: True)
    path = write(PPO + "critic:\n  lr: 1.0e-6\n")
    code = v.run([path], [])
    out = capsys.readouterr().out
    assert code == 1 and "error" in out and "lr-order" in out and "fix:" in out
