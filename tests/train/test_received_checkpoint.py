"""A checkpoint someone else wrote is data: its manifest cannot point outside it, make rltune read
without end, or smuggle in a file it does not list; a tampered RNG file is refused by name.
(issue 25: "What you receive is untrusted", items 3 and 4.)"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import pytest
import torch

from rltune.train.manifest import verify
from trainlib import run_inproc, tiny_recipe


def _checkpoint(root: Path, files: dict[str, bytes], extra: dict | None = None) -> Path:
    """A checkpoint directory whose manifest lists `files` truthfully, plus crafted `extra` entries."""
    root.mkdir(parents=True)
    listing = {}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        listing[rel] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    listing.update(extra or {})
    (root / "manifest.json").write_text(json.dumps({"step": 1, "files": listing}))
    return root


def test_an_honest_checkpoint_verifies(tmp_path):
    assert verify(_checkpoint(tmp_path / "c", {"state.json": b"{}", "actor/ds/x.pt": b"abc"})) is None


def test_a_manifest_entry_that_leaves_the_checkpoint_is_refused_at_once(tmp_path):
    # ../../../../dev/zero used to be hashed forever (its size, 0, matched a declared 0)
    zero = {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}
    for rel in ("../../../../../../dev/zero", "/dev/zero", "/etc/hostname", "actor/../../../x"):
        root = _checkpoint(tmp_path / f"c{abs(hash(rel))}", {"state.json": b"{}"}, {rel: zero})
        t0 = time.monotonic()
        problem = verify(root)
        assert problem and ("leaves the checkpoint" in problem or "absolute path" in problem), problem
        assert time.monotonic() - t0 < 5


def test_links_devices_and_unlisted_files_are_refused(tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("not yours")
    # a listed file that is a link to outside the checkpoint
    root = _checkpoint(tmp_path / "a", {"state.json": b"{}"})
    (root / "rng-rank0.pt").symlink_to(outside)
    assert "is a link" in verify(root)
    # a listed name that is a device (declared size 0: hashing /dev/zero never ends)
    root = _checkpoint(tmp_path / "b", {"state.json": b"{}"},
                       {"dev": {"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}})
    os.symlink("/dev/zero", root / "dev")
    assert "is a link" in verify(root)
    # a file the manifest does not list (the loader would read it unchecked)
    root = _checkpoint(tmp_path / "c", {"state.json": b"{}"})
    (root / "actor").mkdir()
    (root / "actor" / "extra.pt").write_bytes(b"x")
    assert "not in manifest.json" in verify(root)
    # the checkpoint directory itself a link
    (tmp_path / "d").symlink_to(tmp_path / "a")
    assert "is a link" in verify(tmp_path / "d")


def test_crafted_manifest_contents_get_a_message(tmp_path):
    for i, manifest in enumerate(['[1, 2]', '{"files": [1]}', '{"files": {"state.json": {"size": -1, "sha256": "x"}}}',
                                  '{"files": {"state.json": {"size": true, "sha256": "' + "0" * 64 + '"}}}',
                                  "[" * 100_000, "\xff\xfe"]):
        root = tmp_path / f"m{i}"
        root.mkdir()
        (root / "state.json").write_text("{}")
        (root / "manifest.json").write_bytes(manifest.encode("utf-8", errors="surrogateescape")
                                             if isinstance(manifest, str) else manifest)
        assert verify(root), manifest[:20]


def test_a_lying_size_is_read_no_further_than_declared(tmp_path):
    # a 50 MB file declared as 10 bytes: refused on its size, without reading it
    root = _checkpoint(tmp_path / "c", {"state.json": b"{}", "big.bin": b"0123456789"})
    with open(root / "big.bin", "ab") as f:
        f.truncate(50 << 20)
    assert "expected 10" in verify(root)


def test_a_tampered_rng_file_is_refused_by_name(tmp_path, capfd):
    # a real 1-step run, then its rng-rank0.pt replaced by a pickle that names a class (code could
    # run), and the manifest re-signed as the sender would: resume refuses it, naming the file
    recipe = tiny_recipe(tmp_path, trainer__max_steps=1, trainer__save_every=1, trainer__eval_every=0)
    assert run_inproc(capfd, "train", recipe, "--quiet").returncode == 0
    ckpt = next((tmp_path / "run" / "checkpoints").glob("step-*"))
    rng = ckpt / "rng-rank0.pt"
    torch.save({"python": argparse.Namespace(a=1)}, rng)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    data = rng.read_bytes()
    manifest["files"]["rng-rank0.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    res = run_inproc(capfd, "train", recipe, "trainer.max_steps=2", "--resume", str(ckpt))
    assert res.returncode != 0
    assert "rng-rank0.pt" in res.stderr and "holds more than tensors" in res.stderr, res.stderr[-2000:]
    assert "weights_only=False" not in res.stderr and "Traceback" not in res.stderr
