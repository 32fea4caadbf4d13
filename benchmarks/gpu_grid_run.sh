#!/usr/bin/env bash
# The GPU grid on a bare GPU machine: install the carried wheels (.whl: DeepSpeed built with DS_BUILD_OPS=0 and
# the packages it needs that the machine lacks), start DeepSpeedCPUAdam's build in the background (the offload
# runs come last and wait for it), record the environment, then run the plan until SECONDS have passed,
# restarting the worker after a crash or a hung run (gpu_grid_worker.py marks that run failed).
#   bash benchmarks/gpu_grid_run.sh SECONDS OUT_DIR [PLAN]   (PLAN: data/measurements/gpu_grid/plan.json)
set -u
seconds=$1
out=$2
start=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/torch_ext
plan=${3:-data/measurements/gpu_grid/plan.json}
(MAX_JOBS=4 nice -n 19 python3 -c "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()" \
    >"$out/cpu_adam_build.log" 2>&1 &)
python3 benchmarks/gpu_grid_worker.py --env "$out/env.json" 2>&1 | grep -v "^\[" | tail -3
deadline=$((start + seconds))
for attempt in $(seq 1 20); do
    python3 benchmarks/gpu_grid_worker.py --plan "$plan" --out "$out/rows.jsonl" --deadline "$deadline" \
        >>"$out/worker.log" 2>&1
    rc=$?
    echo "worker exit $rc (attempt $attempt, $(( $(date +%s) - start )) s)"
    [ "$rc" -eq 0 ] && break
    [ "$(date +%s)" -ge "$deadline" ] && break
done
grep -E ": (ok|oom|failed|skipped)|hung|restarting" "$out/worker.log" | cut -c1-160
