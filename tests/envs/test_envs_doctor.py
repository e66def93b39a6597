"""`rltune doctor` names each of the field's libraries rltune drives (rltune[envs]): installed with
its version and what it enables, or what installing it would enable; nothing imported."""

from __future__ import annotations

import subprocess
import sys

from rltune.envs import INSTALL_FIX, LIBRARIES, doctor_lines


def test_each_library_is_reported_installed_or_with_the_install_line():
    have = {"reasoning-gym": "0.1.25", "verifiers": "0.4.0"}
    lines = {name: (status, detail) for name, status, detail in doctor_lines(have.get)}
    assert set(lines) == set(LIBRARIES)
    assert lines["reasoning-gym"] == ("ok", "reasoning-gym 0.1.25: " + LIBRARIES["reasoning-gym"])
    assert lines["openenv-core"][0] == "info" and INSTALL_FIX in lines["openenv-core"][1]
    assert "rollout.env: openenv:NAME" in lines["openenv-core"][1]


def test_doctor_lists_them_without_importing_them():
    code = ("import sys; from rltune.commands.doctor import collect; rep = collect(); "
            "names = {c.name for c in rep.checks}; "
            "assert {'reasoning-gym', 'math-verify', 'verifiers', 'openenv-core'} <= names, names; "
            "mods = ('reasoning_gym', 'math_verify', 'verifiers', 'openenv'); "
            "assert not [m for m in mods if m in sys.modules], [m for m in mods if m in sys.modules]")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
