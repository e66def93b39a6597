"""Checking a checkpoint (or final/) against its manifest.json, as received data.

A checkpoint may come from someone else, so its manifest is data, never trusted paths:
  - manifest.json itself is a regular file of bounded size, a JSON object with a `files` map
    of relative path -> {size: int >= 0, sha256: 64 hex digits};
  - every listed path stays inside the checkpoint: no absolute path, no `..`, no link, and
    names a regular file (not a device, a FIFO or a directory);
  - the tree holds nothing the manifest does not list (a file the loader would read unchecked),
    and no link anywhere;
  - every file is read at most to its declared size + 1 byte: time and memory linear in what
    the manifest declares, whatever the file turns out to be.
`verify` returns None or one line saying what is wrong (the caller names the checkpoint).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path, PurePosixPath

MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 16 << 20          # a manifest lists files; 16 MiB is ~100,000 entries
_HEX64 = re.compile(r"[0-9a-f]{64}")


def sha256_bounded(path: Path, limit: int) -> tuple[str, int]:
    """(sha256 hex, bytes read) of at most `limit` bytes, opened without following a link."""
    h, n = hashlib.sha256(), 0
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as f:
        while n < limit:
            block = f.read(min(1 << 20, limit - n))
            if not block:
                break
            h.update(block)
            n += len(block)
    return h.hexdigest(), n


def _bad_path(rel: str) -> str | None:
    p = PurePosixPath(rel)
    if not rel or "\\" in rel or "\x00" in rel:
        return "is not a plain relative path"
    if p.is_absolute():
        return "is an absolute path (a manifest lists files inside its checkpoint)"
    if any(part in ("..", ".") for part in p.parts):
        return "leaves the checkpoint (`..`)"
    return None


def _tree(root: Path) -> tuple[set[str], str | None]:
    """Relative paths of the regular files under root (manifest.json excluded), or a problem."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            mode = os.lstat(full).st_mode
            rel = full.relative_to(root).as_posix()
            if stat.S_ISLNK(mode):
                return found, f"{rel} is a link (a checkpoint holds none: rltune never writes one)"
            if name in filenames:
                if not stat.S_ISREG(mode):
                    return found, f"{rel} is not a regular file"
                if rel != MANIFEST:
                    found.add(rel)
    return found, None


def _read_manifest(path: Path) -> tuple[dict | None, str | None]:
    manifest = path / MANIFEST
    try:
        st = os.lstat(manifest)
    except FileNotFoundError:
        return None, "no manifest.json (written last: the save did not finish)"
    if not stat.S_ISREG(st.st_mode):
        return None, "manifest.json is not a regular file"
    if st.st_size > MAX_MANIFEST_BYTES:
        return None, f"manifest.json has {st.st_size} bytes, more than a manifest holds ({MAX_MANIFEST_BYTES})"
    try:
        fd = os.open(manifest, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            info = json.loads(f.read(MAX_MANIFEST_BYTES + 1).decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        return None, f"manifest.json unreadable: {str(err)[:200]}"
    if not isinstance(info, dict) or not isinstance(info.get("files", {}), dict):
        return None, "manifest.json is not a manifest (an object with a `files` map)"
    return info, None


def verify(path: Path) -> str | None:
    """None when the checkpoint (or final/) is complete and intact, else what is wrong."""
    if not path.exists():
        return "it does not exist"
    if path.is_symlink():
        return "it is a link (a checkpoint directory is never one)"
    if not path.is_dir():
        return "it is a file, not a checkpoint directory"
    info, problem = _read_manifest(path)
    if problem:
        return problem
    present, problem = _tree(path)
    if problem:
        return problem
    files = info.get("files", {})
    for rel, meta in files.items():
        why = _bad_path(rel) if isinstance(rel, str) else "is not a path"
        if why:
            return f"manifest entry {str(rel)[:120]!r} {why}"
        if not (isinstance(meta, dict) and isinstance(meta.get("size"), int) and not isinstance(meta["size"], bool)
                and meta["size"] >= 0 and isinstance(meta.get("sha256"), str) and _HEX64.fullmatch(meta["sha256"])):
            return f"manifest entry {rel!r} has no valid size and sha256"
        if rel not in present:
            return f"{rel} is missing"
        size = os.lstat(path / rel).st_size
        if size != meta["size"]:
            return f"{rel} has {size} bytes, expected {meta['size']} (truncated)"
        digest, read = sha256_bounded(path / rel, meta["size"] + 1)
        if read != meta["size"] or digest != meta["sha256"]:
            return f"{rel} checksum mismatch"
    extra = sorted(present - set(files))
    if extra:
        return (f"{extra[0]} is not in manifest.json ({len(extra)} unlisted file(s)): a checkpoint holds only "
                "what its writer listed")
    return None
