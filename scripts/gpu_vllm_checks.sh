#!/usr/bin/env bash
# On the GPU machine, once every part of gpu-kit/ is there (docs/gpu.md, "vLLM on the GPU"): unpack the
# kit, then run what is asked, each under its own time limit, logs into $OUT (or /tmp/out).
#   scripts/gpu_vllm_checks.sh checks [PYTEST_ARGS...]   tests/gpu/test_gpu_vllm.py (vLLM on CUDA)
#   scripts/gpu_vllm_checks.sh suite  [PYTEST_ARGS...]   every GPU check (make test-gpu)
#   scripts/gpu_vllm_checks.sh bench  [BENCH_ARGS...]    benchmarks/bench_grpo_gpu.py
set -o pipefail
what=${1:-checks}; shift || true
. scripts/gpu_kit_install.sh || exit 1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
O=${OUT:-/tmp/out}; mkdir -p "$O"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$O/gpu.txt"
case "$what" in
  checks) timeout "${LIMIT_S:-480}" python3 -m pytest -q -s -m gpu tests/gpu/test_gpu_vllm.py -p no:cacheprovider "$@" 2>&1 | tee "$O/vllm-checks.log" ;;
  suite)  timeout "${LIMIT_S:-480}" python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider "$@" 2>&1 | tee "$O/gpu-suite.log" ;;
  bench)  timeout "${LIMIT_S:-300}" python3 benchmarks/bench_grpo_gpu.py "$@" 2>&1 | tee "$O/bench-gpu.log" ;;
  *) echo "usage: $0 checks|suite|bench [args]"; exit 2 ;;
esac
rc=$?
# a server that failed to start keeps its log under /tmp (rollout/server.py): their ends come back too
for f in /tmp/rltune-server-failed-*.log; do [ -f "$f" ] && { echo "== $f"; tail -n 80 "$f"; }; done > "$O/server-failures.log" 2>/dev/null
exit $rc
