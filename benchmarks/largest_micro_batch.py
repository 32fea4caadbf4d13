"""The largest micro-batch that fits under a per-rank memory cap: the model's answer against runs of the script.

    python -m benchmarks.largest_micro_batch --cap_gib G --results R --stage S --micro_batches 8,16,32 \
        SCRIPT [script args] --deepspeed_config ds.json

R is a `zerotune tune` results folder of the same script: its model_profiled.yaml (the model the profiling run
read) and profile/measurement.jsonl (the profiling run's peak memory). Predicted: the largest micro-batch whose
estimated peak per rank (zerotune.predictor.estimate with the hardware's calibration profile: peak resident set size on the
CPU target) is at most the cap; "offset" adds the profiling run's measured minus predicted peak, the correction a
single run can make. Measured: the script at each micro-batch of the ladder (ascending) with the profiling hook
recording each rank's peak resident set size; the ladder stops at the first run that fails or passes the cap.

The cap applies to the measured peak RSS, the quantity the CPU model predicts. A resource limit cannot stand in
for it here: RLIMIT_AS and RLIMIT_DATA count address space, and DeepSpeed's ZeRO-1/2 allocate reduce_bucket_size
elements per bucket whatever the model size (stage_1_and_2.py setup_buckets: 2 GB of fp32 by default) of which a
CPU rank touches only what the gradients fill. RLIMIT_AS (--guard_gib per process) only protects the machine.
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from zerotune.calibrate.launch import LaunchSpec, free_port, launch
from zerotune.calibrate.measurement import read_jsonl
from zerotune.predictor import DSConfig, estimate
from zerotune.predictor.units import GIB
from zerotune.validate.experiments import experiment_ds_config, read_ds_config, rewrite_args, split_user_command
from zerotune.validate.plan import build_job
from zerotune.validate.site_env import profiling_env
from zerotune.validate.settings import autotuning_of
from zerotune.validate.calibration import load_profile_for

__all__ = ["predicted_largest", "measure_ladder", "main"]

MAX_MICRO_BATCH = 4096


def predicted_largest(job: Any, base: DSConfig, eff: Any, cap_bytes: float, offset_bytes: float = 0.0) -> int:
    """The largest micro-batch whose estimated peak per rank plus offset is at most cap_bytes (0 if none)."""
    best = 0
    for micro in range(1, MAX_MICRO_BATCH + 1):
        peak = estimate(job, base.replace(train_micro_batch_size_per_gpu=micro), eff).memory.total_bytes
        if peak + offset_bytes > cap_bytes:
            break
        best = micro
    return best


def measure_ladder(script: str, argv: list[str], cfg: DSConfig, micro_batches: list[int], out: Path,
                   timeout_s: float, cap_bytes: float, guard_bytes: int) -> list[dict[str, Any]]:
    """Run each micro-batch (ascending) until one fails or passes the cap; each row: micro, status, reason, peak RSS
    per rank."""
    command = split_user_command(script, argv)
    doc = read_ds_config(command.ds_config_path)
    at = autotuning_of(doc, 2)
    rows = []
    for micro in sorted(micro_batches):
        run_dir = out / f"mbs{micro}"
        ds = experiment_ds_config(cfg.replace(train_micro_batch_size_per_gpu=micro), 2, at)
        spec = LaunchSpec(script=command.script, ds_config=ds, run_dir=run_dir, master_port=free_port(),
                          timeout_s=timeout_s, script_args=rewrite_args(command.args, at.arg_mappings, ds), num_gpus=2,
                          env={"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}, ds_config_flag=command.ds_config_flag,
                          memory_limit_bytes=guard_bytes)
        prefix = (run_dir / "profiled").resolve()
        run = launch(replace(spec, env=profiling_env(spec.env, prefix)))
        peaks = []
        for rank in range(2):
            path = Path(f"{prefix}.rank{rank}.json")
            if path.is_file():
                peaks.append(json.loads(path.read_text()).get("peak_memory_bytes"))
        peaks = [p for p in peaks if p]
        under = run.status == "ok" and len(peaks) == 2 and max(peaks) <= cap_bytes
        rows.append({"micro_batch": micro, "status": run.status, "reason": run.reason[:200],
                     "peak_rss_gib": [round(p / GIB, 3) for p in peaks], "under_cap": under})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        if not under:
            break
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cap_gib", type=float, required=True)
    p.add_argument("--results", type=Path, required=True, help="a zerotune tune results folder of the script")
    p.add_argument("--stage", type=int, default=1)
    p.add_argument("--micro_batches", required=True, help="comma-separated ladder to run")
    p.add_argument("--out", type=Path, default=Path("largest_micro_batch"))
    p.add_argument("--timeout_s", type=float, default=600)
    p.add_argument("--guard_gib", type=float, default=8.0, help="RLIMIT_AS per process, a guard for the machine")
    p.add_argument("script")
    p.add_argument("script_args", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    profiled = read_jsonl(args.results / "profile" / "measurement.jsonl")[0]
    job = build_job(str(args.results / "model_profiled.yaml"), "cpu", 1, 2, profiled.seq_len)
    eff = load_profile_for("cpu")[0]  # the user's calibration of the CPU, else the shipped data/profiles/cpu.json
    base = profiled.config.replace(zero=replace(profiled.config.zero, stage=args.stage))
    measured_peak = profiled.peak_memory_bytes or 0.0
    offset = measured_peak - estimate(job, profiled.config, eff).memory.total_bytes
    cap = args.cap_gib * GIB
    rows = measure_ladder(args.script, args.script_args, base, [int(m) for m in args.micro_batches.split(",")],
                          args.out, args.timeout_s, cap, int(args.guard_gib * GIB))
    ran = [r["micro_batch"] for r in rows if r["under_cap"]]
    print(json.dumps({"cap_gib": args.cap_gib, "stage": args.stage, "seq_len": profiled.seq_len,
                      "predicted_largest": predicted_largest(job, base, eff, cap),
                      "predicted_largest_with_offset": predicted_largest(job, base, eff, cap, offset),
                      "profiling_run_offset_gib": round(offset / GIB, 3), "largest_under_cap": max(ran, default=0),
                      "ladder": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
