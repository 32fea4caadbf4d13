#!/usr/bin/env bash
# The head-to-head on a bare GPU machine: DeepSpeed and the packages it needs that the machine lacks from the
# carried wheels (.whl, as for gpu_grid_run.sh), zerotune from this checkout, the environment recorded, then
# benchmarks.headtohead with the given arguments (and --hardware as zerotune detects the GPU) until SECONDS have
# passed; every run's folder comes back packed.
#   bash benchmarks/gpu_headtohead_run.sh SECONDS OUT_DIR --jobs gpu01 --grid skip --tool_timeout_s 330
# (gpu01, stages 0-1, fits one session's device time: about 9 minutes at 25-33 s a run; gpu, stages 0-3, does not)
set -u
seconds=$1
out=$2
shift 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
mkdir -p /tmp/zt && ln -sfn "$PWD" /tmp/zt/zerotune  # the checkout is the zerotune package (pyproject package-dir)
export PYTHONPATH=/tmp/zt:/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    python3 -c "import torch, deepspeed, transformers, platform; print('python', platform.python_version(), 'torch', \
torch.__version__, 'cuda', torch.version.cuda, 'deepspeed', deepspeed.__version__, 'transformers', \
transformers.__version__, 'cpus', __import__('os').cpu_count())"
} >"$out/env.txt" 2>&1
hw=$(python3 -c "from zerotune.validate.settings import _default_hardware; print(_default_hardware())" 2>>"$out/env.txt" \
    | tail -1)
echo "zerotune detects ${hw:-nothing}" >>"$out/env.txt"
grep -v "^\[" "$out/env.txt"
timeout --kill-after=15 "$seconds" python3 -m benchmarks.headtohead --out /tmp/h2h ${hw:+--hardware "$hw"} "$@" \
    >"$out/headtohead.log" 2>&1
echo "headtohead exit $? after $SECONDS s"
tar czf "$out/h2h.tgz" -C /tmp h2h
grep -v "^\[20" "$out/headtohead.log" | tail -40
