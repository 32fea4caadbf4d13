"""The exhaustive baseline a `tune` is judged against: every configuration of the same space run for real,
kept as data, and one line comparing zerotune's pick with the grid's best.

    python -m zerotune.validate.grid --deepspeed ds.json [--model M] [--seq_len S] [--tune_results DIR] [--out FILE]

runs the space the ds_config describes (as `zerotune tune --deepspeed ds.json` reads it, built-in workload
unless a script is given after the options) into <results_dir>_grid/ in DeepSpeed's layout, appends every
run to data/measurements/cpu_grid_<job>.jsonl (zerotune.calibrate.measurement records; each record's `source` names
its run folder and carries that run's environment.json in one line) and, given the tune's results folder,
prints the comparison. Experiments run one at a time, like tune's, and a rerun resumes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from zerotune.calibrate.launch import launch
from zerotune.calibrate.measurement import append_jsonl
from zerotune.predictor import DSConfig, Job, estimate, experiment_name, parse_ds_config
from zerotune.predictor.rank import MAXIMISED, Metric, evaluate_space
from zerotune.predictor.space import space_from_ds_config
from zerotune.validate.plan import build_job
from zerotune.validate.results import ExperimentResult, Layout, Prediction, best_result
from zerotune.validate.runs import measurement_of, run_experiment
from zerotune.validate.settings import Launcher, TuneSettings, add_tune_arguments, autotuning_of, settings_from_args

__all__ = ["grid_configs", "run_grid", "grid_path", "compare", "environment_note", "main"]

REPO = Path(__file__).resolve().parent.parent
UNCALIBRATED_BAND = 0.3  # zerotune.predictor.rank.Uncertainty's default step-time band, shown beside each grid run


def grid_configs(job: Job, settings: TuneSettings) -> list[DSConfig]:
    """Every configuration of the tune's space, in the space's order (none left out for memory: the grid
    measures what the model would have pruned too)."""
    world = job.cluster.world_size
    space = space_from_ds_config(settings.doc, world_size=world, hidden_size=job.model.hidden_size,
                                 explore=settings.explore)
    table = evaluate_space(job, space)
    return [table.config(row, col) for row in range(len(table.variants)) for col in range(len(table.micro_batch))]


def _prediction(job: Job, cfg: DSConfig, metric: Metric) -> Prediction:
    est = estimate(job, cfg)
    value = {"throughput": est.throughput_samples_per_s, "latency": est.latency_ms, "flops": est.flops_per_gpu}[metric]
    low, high = (value / (1 + UNCALIBRATED_BAND), value / (1 - UNCALIBRATED_BAND)) if MAXIMISED[metric] else \
        (value * (1 - UNCALIBRATED_BAND), value * (1 + UNCALIBRATED_BAND))
    return Prediction(est.time.step_s, value, low, high, est.memory.total_bytes)


def grid_path(settings: TuneSettings, job: Job) -> Path:
    """data/measurements/cpu_grid_<model>_seq<S>_<N>ranks.jsonl (the hardware's name first)."""
    model = Path(settings.model).stem if settings.model.endswith((".yaml", ".json")) else settings.model
    return (REPO / "data" / "measurements" /
            f"{settings.hardware}_grid_{model}_seq{job.seq_len}_{job.cluster.world_size}ranks.jsonl")


def run_grid(settings: TuneSettings, launcher: Launcher = launch, out: Path | None = None,
             log: Callable[[str], None] = print) -> list[ExperimentResult]:
    """Run every configuration of the space; append each to `out` (default grid_path) as it finishes."""
    world = settings.num_nodes * settings.num_gpus
    at = autotuning_of(settings.doc, world)
    job = build_job(settings.model, settings.hardware, settings.num_nodes, settings.num_gpus, settings.seq_len)
    layout = Layout(Path(str(Path(at.results_dir)) + "_grid"), Path(str(Path(at.exps_dir)) + "_grid"))
    out = out or grid_path(settings, job)
    results: list[ExperimentResult] = []
    configs = grid_configs(job, settings)
    for exp_id, cfg in enumerate(configs):
        log(f"zerotune grid: {exp_id + 1}/{len(configs)} {experiment_name(cfg)}")
        result = run_experiment(settings, job, at, layout, exp_id, cfg, _prediction(job, cfg, at.metric), launcher)
        log(f"  -> {result.status}" + (f": {result.metric_value:.4g}" if result.metric_value else f": {result.reason}"))
        results.append(result)
        if not result.resumed:
            source = f"zerotune grid run {layout.run_dir(result.name)}; {environment_note(layout.run_dir(result.name))}"
            append_jsonl(out, [replace(measurement_of(settings, job, result, layout), source=source)])
    return results


def environment_note(run_dir: Path) -> str:
    """The run's environment.json in one line, kept in each record's `source` (Measurement has no field for it)."""
    try:
        env = json.loads((run_dir / "environment.json").read_text())
    except (OSError, json.JSONDecodeError):
        return "environment not recorded"
    keys = ("date", "python", "torch", "deepspeed", "cuda", "nccl", "platform", "hostname")
    return "environment: " + ", ".join(f"{k} {env[k]}" for k in keys if env.get(k))


def compare(pick: str, tune_value: float | None, grid: Sequence[ExperimentResult], metric: Metric,
            num_tune_experiments: int) -> str:
    """One line: zerotune's pick against the grid's best, by the grid's own measurement of both."""
    best = best_result(grid, metric)
    if best is None or best.metric_value is None:
        return "grid: no configuration finished; nothing to compare"
    mine = next((r for r in grid if r.name == pick and r.metric_value is not None), None)
    grid_value = f"{mine.metric_value:.4g}" if mine else "not measured"
    ratio = (mine.metric_value / best.metric_value if MAXIMISED[metric] else best.metric_value / mine.metric_value) \
        if mine else float("nan")
    tuned = f"{tune_value:.4g}" if tune_value is not None else "-"
    return (f"zerotune picked {pick} after {num_tune_experiments} experiments ({metric} {tuned} in the tune, "
            f"{grid_value} in the grid); the grid's best of {len(grid)} is {best.name} ({best.metric_value:.4g}): "
            f"pick / best = {ratio:.3f}")


def _tune_pick(results_dir: Path, world_size: int) -> tuple[str, float | None, int]:
    optimal = json.loads((results_dir / "ds_config_optimal.json").read_text())
    name = experiment_name(parse_ds_config(optimal, world_size=world_size))
    done = [p for p in results_dir.iterdir() if (p / "exp.json").is_file()]
    exp = json.loads((results_dir / name / "exp.json").read_text())
    return name, (exp.get("result") or {}).get("metric_val"), len(done)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerotune.validate.grid", description=__doc__.splitlines()[0])
    parser.add_argument("--tune_results", type=Path, help="a tune's results_dir, to compare its pick")
    parser.add_argument("--out", type=Path, help="JSONL to append to (default data/measurements/<hw>_grid_<job>.jsonl)")
    add_tune_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
        if not settings.model:
            raise ValueError("give --model: the grid predicts each configuration for its report")
        grid = run_grid(settings, out=args.out)
    except ValueError as exc:
        print(f"zerotune grid: error: {exc}", file=sys.stderr)
        return 2
    if args.tune_results:
        world = settings.num_nodes * settings.num_gpus
        pick, value, count = _tune_pick(args.tune_results, world)
        print(compare(pick, value, grid, autotuning_of(settings.doc, world).metric, count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
