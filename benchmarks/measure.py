"""Independent re-measurements: the two tools' choices alternated A B A B, and the exhaustive grid.

Every run is the same workload (benchmarks/ds_workload.py, or the job's user script) launched fresh through
zerotune.calibrate.launch, with autotuning switched off so every step runs to the end. The built-in workload
times its own steps (median after warm-up); a user's script is timed by DeepSpeed's engine (wall_clock_breakdown:
one timer line per step, calibrate/engine_timers.py step_times_s), the median of the steps after warm-up. Alternating
the two configurations spreads slow phases of a shared machine over both instead of one.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from benchmarks.jobs import BenchJob, grid_points, script_args, workload
from benchmarks.tools import run_env
from zerotune.calibrate.launch import LaunchSpec, RunResult, free_port, launch
from zerotune.calibrate.measurement import Measurement, append_jsonl, read_jsonl
from zerotune.predictor import experiment_name, load_model, parse_ds_config
from zerotune.validate.experiments import rewrite_args

__all__ = ["Remeasured", "config_name", "measure_once", "ab_remeasure", "grid_configs", "measure_grid",
           "load_published_grid", "RUN_TIMEOUT_S"]

RUN_TIMEOUT_S = 600.0
"""A warm 2-rank run here takes 15-60 s on a quiet machine; with the 2 cores shared by ten other processes a
zt-gpt-wide run at micro-batch 8 passed 300 s, so only a run still going after ten minutes counts as hung."""
DATA_GRIDS = Path(__file__).resolve().parent.parent / "data" / "measurements"


@dataclass(frozen=True)
class Remeasured:
    label: str
    config_name: str
    throughput_samples_per_s: tuple[float, ...]
    step_s: tuple[float, ...]
    failures: tuple[str, ...]
    """'status: reason' of each run that did not finish."""

    @property
    def median_samples_per_s(self) -> float | None:
        return statistics.median(self.throughput_samples_per_s) if self.throughput_samples_per_s else None

    @property
    def median_step_s(self) -> float | None:
        return statistics.median(self.step_s) if self.step_s else None

    @property
    def spread_rel(self) -> float | None:
        """(max - min) / median of the throughputs: the whole range the repeats covered."""
        values = self.throughput_samples_per_s
        if len(values) < 2:
            return None
        return (max(values) - min(values)) / statistics.median(values)


def config_name(doc: Mapping[str, Any], world_size: int) -> str:
    """DeepSpeed-style experiment name (z1_gas1_tmbspg4): equal names, equal tuned knobs."""
    return experiment_name(parse_ds_config(dict(doc), world_size=world_size))


def _runnable(doc: Mapping[str, Any]) -> dict[str, Any]:
    # Without an autotuning section the engine never exits early: the workload measures all its steps.
    return {k: v for k, v in doc.items() if k != "autotuning"}


def measure_once(job: BenchJob, doc: Mapping[str, Any], run_dir: Path) -> RunResult:
    ds_config, args = _runnable(doc), script_args(job, for_tuner=False)
    if job.script:
        ds_config = {**ds_config, "wall_clock_breakdown": True}
        args = rewrite_args(args, job.arg_mappings, ds_config)
    spec = LaunchSpec(script=workload(job), ds_config=ds_config, run_dir=run_dir, master_port=free_port(),
                      timeout_s=RUN_TIMEOUT_S, script_args=args, num_gpus=job.num_gpus, env=run_env(job))
    result = launch(spec)
    return _engine_timed(job, ds_config, result) if job.script else result


def _engine_timed(job: BenchJob, ds_config: Mapping[str, Any], result: RunResult) -> RunResult:
    """A user script's run with metrics from the engine's step timers: the median after warm-up. The script
    writes no metrics.json, so a clean exit with its steps timed is what makes the run ok."""
    timed = result.step_times_s[job.warmup_steps:]
    batch = ds_config.get("train_batch_size")
    if result.returncode != 0 or not timed or not isinstance(batch, int):
        why = f"{len(result.step_times_s)} steps timed, train_batch_size {batch!r}"
        return replace(result, status="failed" if result.status == "ok" else result.status,
                       reason=result.reason if result.returncode != 0 else why)
    step_s = statistics.median(timed)
    return replace(result, status="ok", reason="",
                   metrics={"step_s": step_s, "throughput_samples_per_s": batch / step_s})


def ab_remeasure(job: BenchJob, configs: Mapping[str, Mapping[str, Any]], repeats: int,
                 folder: Path) -> dict[str, Remeasured]:
    """Each labelled configuration `repeats` times, in the order A B A B ... (labels in the given order)."""
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    runs: dict[str, list[RunResult]] = {label: [] for label in configs}
    for i in range(repeats):
        for label, doc in configs.items():
            runs[label].append(measure_once(job, doc, folder / f"{i + 1:02d}_{label}"))
    out = {}
    for label, results in runs.items():
        ok = [r.metrics for r in results if r.status == "ok" and r.metrics]
        out[label] = Remeasured(label, config_name(configs[label], job.num_gpus),
                                tuple(float(m["throughput_samples_per_s"]) for m in ok),
                                tuple(float(m["step_s"]) for m in ok),
                                tuple(f"{r.status}: {r.reason}" for r in results if r.status != "ok"))
    return out


def grid_configs(job: BenchJob) -> dict[str, dict[str, Any]]:
    """The exhaustive grid's ds_configs by name: every listed stage x power-of-two micro-batch, accumulation 1."""
    docs = [{"train_micro_batch_size_per_gpu": mbs, "gradient_accumulation_steps": 1,
             "zero_optimization": {"stage": stage, **job.extra_zero}} for stage, mbs in grid_points(job)]
    return {config_name(doc, job.num_gpus): doc for doc in docs}


def _as_measurement(job: BenchJob, doc: Mapping[str, Any], result: RunResult) -> Measurement:
    m = result.metrics or {}
    return Measurement(model=job.model, hardware=job.hardware, num_nodes=1, num_gpus_per_node=job.num_gpus,
                       seq_len=job.seq_len, config=parse_ds_config(_runnable(doc), world_size=job.num_gpus),
                       status=result.status, step_s=m.get("step_s"),
                       throughput_samples_per_s=m.get("throughput_samples_per_s"),
                       peak_memory_bytes=m.get("peak_memory_bytes"), forward_s=m.get("forward_s"),
                       backward_s=m.get("backward_s"), optimizer_s=m.get("optimizer_s"),
                       source=f"benchmarks/headtohead.py grid run {result.run_dir}", reason=result.reason)


def measure_grid(job: BenchJob, configs: Mapping[str, Mapping[str, Any]], folder: Path) -> list[Measurement]:
    """Run each configuration once; appended to folder/grid.jsonl as each finishes (a crash keeps the rest)."""
    out = []
    for name, doc in configs.items():
        measured = _as_measurement(job, doc, measure_once(job, doc, folder / name))
        append_jsonl(folder / "grid.jsonl", [measured])
        out.append(measured)
    return out


def load_published_grid(job: BenchJob) -> list[Measurement]:
    """This job's rows of data/measurements/cpu_grid_*.jsonl (validate/grid.py's output), if any."""
    if job.script:
        return []  # a user's script has no catalog model to match rows by
    name = load_model(job.model).name
    rows = []
    for path in sorted(DATA_GRIDS.glob("cpu_grid_*.jsonl")):
        rows += [m for m in read_jsonl(path) if m.seq_len == job.seq_len and m.world_size == job.num_gpus
                 and load_model(m.model).name == name]
    return rows
