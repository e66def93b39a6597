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


def test_the_multi_gpu_smoke_test_meets_through_a_private_file_not_a_tcp_store(monkeypatch):
    """doctor's NCCL all-reduce on two or more GPUs used a TCPStore, which listens on every interface:
    its ranks now meet through a file in a private directory (removed after), nothing listening."""
    import os
    import queue
    import stat

    import torch.multiprocessing as mp

    from rltune.commands import doctor

    seen = []

    class FakeProcess:
        def __init__(self, target, args):
            self.args = args
            seen.append(args)

        def start(self):
            path = self.args[2].removeprefix("file://")
            seen.append(("mode", stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)))
            results.put((self.args[0], float(self.args[1])))

        def join(self, timeout=None):
            pass

        def is_alive(self):
            return False

    results = queue.Queue()
    ctx = type("Ctx", (), {"Queue": staticmethod(lambda: results), "Process": FakeProcess})()
    monkeypatch.setattr(mp, "get_context", lambda method: ctx)
    rep = doctor.Report(python="3", platform="x", packages={})
    rep.devices = [{"kind": "cuda"}, {"kind": "cuda"}]
    doctor._allreduce_smoke(rep, {})
    methods = [a[2] for a in seen if len(a) == 4]
    assert len(methods) == 2 and len(set(methods)) == 1 and methods[0].startswith("file://")
    assert ("mode", 0o700) in seen
    assert not os.path.exists(os.path.dirname(methods[0].removeprefix("file://")))   # removed after
    assert rep.checks[-1].status == "ok"
