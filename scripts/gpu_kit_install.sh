#!/usr/bin/env bash
# On the GPU machine: unpack the vLLM kit (scripts/gpu_vllm_kit.sh) into /tmp/site and check that vLLM
# imports with CUDA. Source it, so that PYTHONPATH stays set:  . scripts/gpu_kit_install.sh
SITE=${SITE:-/tmp/site}
if [ ! -f "$SITE/.rltune-kit" ]; then
  (cd gpu-kit && sha256sum -c --quiet <(sed -n '/^[0-9a-f]\{64\} /p' MANIFEST)) || { echo "gpu-kit: a part is missing or damaged"; return 1 2>/dev/null || exit 1; }
  mkdir -p "$SITE" && cat gpu-kit/vllm-kit.tar.xz.part-* | xz -d -T0 | tar -x -C "$SITE" && touch "$SITE/.rltune-kit"
fi
if ls gpu-kit/extra/*.whl >/dev/null 2>&1; then   # wheels added after the kit was cut
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" --upgrade gpu-kit/extra/*.whl
fi
export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
# the kit has no FlashInfer: vLLM 0.26's CUDA sampler imports it unless its sampler is off (rltune asks for
# processed log-probs, with which vLLM never samples through FlashInfer anyway)
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
python3 -c "import torch, vllm, deepspeed; print('vllm', vllm.__version__, '| torch', torch.__version__, '| deepspeed', deepspeed.__version__, '| cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
