"""Head to head: `deepspeed --autotuning tune` against `zerotune tune` on the same jobs, one after the other.

For each job both tuners read the same ds_config and run in folders of their own; then the two chosen
configurations are re-measured by independent runs alternated A B A B (--repeats each), and every
configuration of an exhaustive grid (stages x micro-batch sizes; rows of data/measurements/cpu_grid_*.jsonl
are reused when they cover it) is run once to score both choices against the grid's best.

    python -m benchmarks.headtohead --out /tmp/h2h            # builtin, wide and latency jobs (about an hour)
    python -m benchmarks.headtohead --quick --out /tmp/h2h    # CI: one tiny job, 2 micro-batch sizes
    python -m benchmarks.headtohead --jobs encoder,decoder    # users' own scripts (tests/fixtures/scripts)
    python -m benchmarks.headtohead --jobs gpu01 --hardware h100-80gb --grid skip  # one GPU: gpu_headtohead_run.sh

A user's script job has no grid: its verdict is the alternated re-measurement of the two choices.

Writes OUT/results.md (the table), OUT/results.json, OUT/timeline.png and every run's folder.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Sequence

from benchmarks.jobs import FULL_JOBS, QUICK_JOB, BenchJob, job_by_name
from benchmarks.measure import Remeasured, ab_remeasure, config_name, grid_configs, load_published_grid, \
    measure_grid
from benchmarks.report import TOOLS, JobResult, format_markdown, grid_best, grid_score, kept_user_zero, \
    metric_ratio, plot_timeline
from benchmarks.tools import build_ops, run_tool
from zerotune.calibrate.measurement import Measurement
from zerotune.predictor import experiment_name, load_hardware, load_model

__all__ = ["run_job", "grid_for", "summary_dict", "main"]

MIN_REPEATS = 3
"""Issue 6: at least three independent re-measurements of each choice."""


def _by_name(job: BenchJob, rows: Sequence[Measurement]) -> dict[str, Measurement]:
    model = load_model(job.model).name
    return {experiment_name(m.config): m for m in rows
            if m.seq_len == job.seq_len and m.world_size == job.num_gpus and load_model(m.model).name == model}


def grid_for(job: BenchJob, chosen: dict[str, dict[str, Any]], published: Sequence[Measurement],
             measured_here: list[Measurement], folder: Path) -> tuple[Measurement, ...]:
    """The grid plus the chosen configurations, all measured one way: published rows when they cover all of
    it, else this run's own (an earlier job's rows for the same model and sequence length are reused, the
    rest are run now and added to `measured_here`). Never a mix, so no row is judged by another method."""
    wanted = {**grid_configs(job), **chosen}
    for rows in (published, measured_here):
        have = _by_name(job, rows)
        if all(name in have for name in wanted):
            return tuple(have[name] for name in wanted)
    have = _by_name(job, measured_here)
    measured = measure_grid(job, {n: doc for n, doc in wanted.items() if n not in have}, folder)
    measured_here.extend(measured)
    have.update({experiment_name(m.config): m for m in measured})
    return tuple(have[name] for name in wanted if name in have)


def _log(message: str) -> None:
    print(f"headtohead: {message}", file=sys.stderr, flush=True)


def run_job(job: BenchJob, out: Path, repeats: int, grid: str, published: Sequence[Measurement],
            measured_here: list[Measurement], tool_timeout_s: float, reuse: bool = False) -> JobResult:
    folder = out / job.name
    runs = {}
    for tool in TOOLS:
        _log(f"job {job.name}: {tool} tuning in {folder / tool}")
        runs[tool] = run_tool(tool, job, folder / tool, tool_timeout_s, reuse)
        _log(f"job {job.name}: {tool} ran {len(runs[tool].experiments)} experiments in {runs[tool].wall_s:.0f} s")
    chosen = {tool: run.optimal_ds_config for tool, run in runs.items() if run.optimal_ds_config is not None}
    _log(f"job {job.name}: re-measuring {', '.join(chosen)} {repeats} times each, alternated")
    again = ab_remeasure(job, chosen, repeats, folder / "ab") if chosen else {}
    named = {config_name(doc, job.num_gpus): doc for doc in chosen.values()}
    scored = grid != "skip" and not job.script  # a user's script has no grid of record
    rows = grid_for(job, named, published, measured_here, folder / "grid") if scored else ()
    return JobResult(job, runs, again, rows)  # type: ignore[arg-type]


def _remeasured_dict(again: Remeasured | None) -> dict[str, Any] | None:
    if again is None:
        return None
    return {**asdict(again), "median_samples_per_s": again.median_samples_per_s,
            "median_step_s": again.median_step_s, "spread_rel": again.spread_rel}


def summary_dict(result: JobResult) -> dict[str, Any]:
    """The job's figures as JSON: per tool experiments, wall time, choice, re-measurement, grid score."""
    job, best = result.job, grid_best(result.job, result.grid)
    tools = {tool: {"experiments": [asdict(e) for e in run.experiments], "num_experiments": len(run.experiments),
                    "wall_s": run.wall_s, "returncode": run.returncode, "chosen": result.chosen_name(tool),
                    "chosen_ds_config": run.optimal_ds_config,
                    "remeasured": _remeasured_dict(result.remeasured.get(tool)),
                    "grid_score": grid_score(job, result.grid, result.chosen_name(tool)),
                    "kept_user_zero": kept_user_zero(job, run.optimal_ds_config)}
             for tool, run in result.runs.items()}
    return {"job": asdict(job), "tools": tools, "grid_best": best[0] if best else None,
            "grid_runs": len(result.grid),
            "ratio_zerotune_over_deepspeed": metric_ratio(job, result.remeasured.get("zerotune"),
                                                          result.remeasured.get("deepspeed"))}


def _write_outputs(results: Sequence[JobResult], out: Path, command: str) -> str:
    table = format_markdown(results, datetime.date.today().isoformat(), command)
    (out / "results.md").write_text(table)
    (out / "results.json").write_text(json.dumps([summary_dict(r) for r in results], indent=1, default=str))
    plot_timeline(results, out / "timeline.png")
    return table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.headtohead", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one tiny job, fewest steps (CI)")
    p.add_argument("--jobs", help="comma list of jobs (default: builtin,wide,latency,uncalibrated; --quick: quick; "
                                       "users' scripts: encoder,decoder,vit,hfloop,cnn,albert)")
    p.add_argument("--out", type=Path, default=Path("headtohead_results"), help="folder for every run and the table")
    p.add_argument("--repeats", type=int, default=MIN_REPEATS, help="re-measurements of each choice (>= 3)")
    p.add_argument("--grid", choices=("auto", "skip"), default="auto",
                   help="auto: data/measurements/cpu_grid_*.jsonl rows when they cover the job's grid and both "
                        "choices (validate/grid.py writes them), else measure it here; skip: no grid")
    p.add_argument("--tool_timeout_s", type=float, default=3600.0, help="time limit of each tuner per job")
    p.add_argument("--hardware", help="run every job on this catalog hardware (cpu, or a GPU DeepSpeed detects: "
                                      "h100-80gb, h200 ...) in place of the job's own")
    p.add_argument("--reuse", action="store_true",
                   help="read back a tuner's finished run of the same command and config from --out instead of "
                        "running it again (e.g. to resume a head-to-head cut short)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.repeats < MIN_REPEATS:
            raise ValueError(f"--repeats {args.repeats}: the verdict needs at least {MIN_REPEATS} runs of each choice")
        names = args.jobs.split(",") if args.jobs else None
        jobs = [job_by_name(n) for n in names] if names else ([QUICK_JOB] if args.quick else list(FULL_JOBS))
        if args.hardware:
            load_hardware(args.hardware)  # an unknown name is refused before anything runs
            jobs = [replace(job, hardware=args.hardware) for job in jobs]
    except ValueError as exc:
        print(f"headtohead: error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        cpu_jobs = [job for job in jobs if job.hardware == "cpu"]
        if cpu_jobs:
            build_ops(max(job.num_gpus for job in cpu_jobs))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"headtohead: error: {exc}; check the DeepSpeed install and that ninja is on PATH", file=sys.stderr)
        return 2
    published = [m for job in jobs for m in load_published_grid(job)] if args.grid == "auto" else []
    measured_here: list[Measurement] = []
    command = shlex.join(["python", "-m", "benchmarks.headtohead", *(argv if argv is not None else sys.argv[1:])])
    results: list[JobResult] = []
    table = ""
    for job in jobs:  # the table is rewritten after each job: a run cut short keeps what it finished
        results.append(run_job(job, args.out, args.repeats, args.grid, published, measured_here,
                               args.tool_timeout_s, args.reuse))
        table = _write_outputs(results, args.out, command)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
