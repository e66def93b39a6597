"""`make test` is quiet where nothing is wrong: pyproject's pytest filterwarnings hides DeepSpeed's
`torch.distributed.reduce_scatter_tensor` deprecation notice (and only that message)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = '''
import os
import warnings

import torch
import torch.distributed as dist


def test_reduce_scatter_tensor_notice_is_filtered():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29400 + os.getpid() % 500))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        dist.reduce_scatter_tensor(torch.zeros(2), torch.ones(2))   # what DeepSpeed ZeRO calls
    except Exception:  # noqa: BLE001 - the notice comes before the collective runs
        pass
    finally:
        dist.destroy_process_group()


def test_other_future_warnings_still_show():
    warnings.warn("some other deprecation", FutureWarning)
'''


def test_pyproject_filters_exactly_deepspeeds_reduce_scatter_notice(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
                        "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
                       capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "reduce_scatter_tensor` is deprecated" not in out, out[-3000:]
    assert "some other deprecation" in out, out[-3000:]   # the filter is that one message, not all warnings
