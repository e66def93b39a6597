#!/usr/bin/env bash
# On the GPU machine: unpack the vLLM kit (scripts/gpu_vllm_kit.sh) into /tmp/site and check that vLLM
# imports with CUDA. Source it, so that PYTHONPATH stays set:  . scripts/gpu_kit_install.sh
SITE=${SITE:-/tmp/site}
if [ ! -f "$SITE/.rltune-kit" ]; then
  (cd gpu-kit && sha256sum -c --quiet <(sed -n '/^[0-9a-f]\{64\} /p' MANIFEST)) || { echo "gpu-kit: a part is missing or damaged"; return 1 2>/dev/null || exit 1; }
  mkdir -p "$SITE" && cat gpu-kit/vllm-kit.tar.xz.part-* | xz -d -T0 | tar -x -C "$SITE" && touch "$SITE/.rltune-kit"
fi
export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
python3 -c "import torch, vllm, deepspeed; print('vllm', vllm.__version__, '| torch', torch.__version__, '| deepspeed', deepspeed.__version__, '| cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
