"""One experiment of `tune`: its launch, its early stop and its result, read from DeepSpeed's engine timing."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from zerotune.calibrate.fit import IMPLAUSIBLE_RATIO
from zerotune.calibrate.launch import LaunchSpec, RunResult, StopRule, free_port
from zerotune.calibrate.measurement import Measurement
from zerotune.predictor import DSConfig, Job, estimate, experiment_name
from zerotune.predictor.dsconfig import AutotuningConfig
from zerotune.predictor.rank import MAXIMISED, Metric
from zerotune.validate.experiments import experiment_ds_config, rewrite_args
from zerotune.validate.profiled import steps_rel_error
from zerotune.validate.site_env import peak_env, read_peak_bytes
from zerotune.validate.results import (ExperimentResult, Layout, Prediction, exp_document, load_finished,
                                       measured_from_metrics, result_dict, write_json_atomic)
from zerotune.validate.settings import Launcher, TuneSettings, autotuning_of

__all__ = ["window_rel_error", "launch_spec", "run_experiment", "experiment_result", "window_step_s",
           "stop_rule_for", "measurement_of", "EARLY_STOP_MIN_STEPS", "EARLY_STOP_MARGIN", "paired_step_ratios",
           "stopped_step_s", "ENDED_EARLY", "max_samples_for_window"]


PEAK_PREFIX = "peak"
"""Each rank of an experiment writes its peak memory to <run_dir>/peak.rank<R>.json (validate.site_env.peak_env)."""
EARLY_STOP_MIN_STEPS = 2
"""Timed steps an experiment runs before it may be stopped early: one step can be a warm-up outlier."""
EARLY_STOP_MARGIN = 0.05
"""An experiment is stopped early only when even its fastest step is this much worse than the measured best
(step times spread by a few percent from step to step)."""


def measurement_of(settings: TuneSettings, job: Job, result: ExperimentResult, layout: Layout) -> Measurement:
    """The experiment as a measurement for the search; its noise is the standard error of its window's median step
    where the steps spread more than NOISE_STD says (validate/candidates.py Observation.noise_std): on a shared
    2-core machine one window's steps swung 2.4-6.2 s while the next configuration's held 2.0-2.2, and both had been
    trusted to +-2% (a helper's tunes, 2026-11-29)."""
    ok = result.status in ("ok", "stopped") and result.step_s is not None
    at = autotuning_of(settings.doc, job.cluster.num_nodes * job.cluster.num_gpus_per_node)
    return Measurement(model=settings.model, hardware=settings.hardware, num_nodes=job.cluster.num_nodes,
                       num_gpus_per_node=job.cluster.num_gpus_per_node, seq_len=job.seq_len, config=result.config,
                       status=result.status, step_s=result.step_s if ok else None,
                       throughput_samples_per_s=result.throughput_samples_per_s if ok else None,
                       step_s_rel_error=window_rel_error(result, at) if ok else None,
                       peak_memory_bytes=result.peak_memory_bytes if ok else None,
                       source=str(layout.run_dir(result.name)), reason=result.reason)


def window_rel_error(result: ExperimentResult, at: AutotuningConfig) -> float | None:
    """Standard error of the median step of the experiment's measuring window (its steps from start_profile_step,
    all of them when it ran fewer) relative to it (validate/profiled.py steps_rel_error); None with fewer than
    three."""
    return steps_rel_error(result.step_times_s[at.start_profile_step:] or result.step_times_s)


def launch_spec(settings: TuneSettings, ds_config: dict[str, Any], run_dir: Path, args: Sequence[str],
                stop_rule: StopRule | None = None) -> LaunchSpec:
    o = settings.launch_flags
    filtered = o.include is not None or o.exclude is not None  # the runner refuses counts beside a filter
    return LaunchSpec(script=settings.command.script, ds_config=ds_config, run_dir=run_dir,
                      master_port=o.master_port or free_port(), timeout_s=settings.timeout_s, script_args=tuple(args),
                      num_gpus=None if filtered else settings.num_gpus,
                      num_nodes=settings.num_nodes if settings.hostfile and not filtered else None,
                      hostfile=settings.hostfile, include=o.include, exclude=o.exclude, launcher=o.launcher,
                      launcher_args=o.launcher_args, no_ssh=o.no_ssh, master_addr=o.master_addr,
                      runner_flags=o.runner_flags,
                      env=dict(settings.env), memory_limit_bytes=settings.memory_limit_bytes,
                      ds_config_flag=settings.command.ds_config_flag, stop_rule=stop_rule)


def _metric_of_step(metric: Metric, step_s: float, samples: int, flops: float) -> float:
    return {"throughput": samples / step_s, "latency": step_s * 1e3, "flops": flops / step_s}[metric]


def paired_step_ratios(steps: Sequence[float], best: ExperimentResult | None, at: AutotuningConfig) -> list[float]:
    """Each timed step of a run (from start_profile_step) over the measured best's step of the same index: the two
    runs compared at the same point of their training. On the CPU a script's steps speed up for many steps (the
    encoder fixture, 2026-11-28: 1.71 s at step 0, 1.16 at step 5, 0.94 at step 23, micro-batch 9; its logits'
    gradient loses its subnormal values as it trains, README "subnormal"), and the same shape recurs in every
    configuration (step 5 / step 0: 0.68-0.72 at micro-batches 5-21), so a run's step i is comparable with the
    best's step i, not with the best's window. Empty when the best has no step at those indices (a result read
    back from before step times were kept, or a metrics.json that was already a median)."""
    if best is None or best.step_s is None:
        return []
    return [step / best.step_times_s[i] for i, step in enumerate(steps)
            if i >= at.start_profile_step and i < len(best.step_times_s) and best.step_times_s[i] > 0]


def stop_rule_for(best: ExperimentResult, metric: Metric, samples: int, flops: float,
                  at: AutotuningConfig) -> StopRule:
    """Stop an experiment once EARLY_STOP_MIN_STEPS steps of the engine's measuring window (start_profile_step to
    end_profile_step; the steps before it are warm-up) are timed and even the most favourable is more than
    EARLY_STOP_MARGIN worse than the measured best: the mean the full run would report cannot beat it. Each step is
    compared with the best's step of the same index (paired_step_ratios: its window's step time x the ratio), so a
    run still speeding up is not judged against a best that had sped up; without the best's steps, the fastest
    step against the best's window. A run whose whole window is timed is finishing anyway and is left to write its
    metrics."""
    assert best.metric_value is not None
    best_value = float(best.metric_value)
    window = at.end_profile_step - at.start_profile_step + 1

    def rule(steps: tuple[float, ...]) -> str | None:
        timed = steps[at.start_profile_step:]
        if not EARLY_STOP_MIN_STEPS <= len(timed) < window:
            return None
        ratios = paired_step_ratios(steps, best, at)
        paired = len(ratios) == len(timed)
        fastest_s = float(best.step_s) * min(ratios) if paired else min(timed)  # paired: best.step_s is set
        value = _metric_of_step(metric, fastest_s, samples, flops)
        ratio = value / best_value if MAXIMISED[metric] else best_value / value
        if ratio >= 1.0 - EARLY_STOP_MARGIN:
            return None
        how = (f"its most favourable step against {best.name}'s step of the same index (a step of "
               f"{fastest_s:.4g} s in its window, {metric} {value:.4g})" if paired
               else f"its fastest ({min(timed):.4g} s, {metric} {value:.4g})")
        return (f"stopped early after {len(timed)} of {window} timed steps: {how} is {100 * (1 - ratio):.0f}% worse "
                f"than the measured best ({best.name}, {best_value:.4g}), so it cannot beat it")
    return rule


def stopped_step_s(run: RunResult, best: ExperimentResult | None, at: AutotuningConfig) -> float | None:
    """What a run stopped early would have measured over the window: the best's window step time x the median of
    its steps' ratios to the best's (paired_step_ratios); without those, the median of its timed steps (of all
    its steps when it was stopped before its window)."""
    ratios = paired_step_ratios(run.step_times_s, best, at)
    if ratios and best is not None and best.step_s is not None:
        return float(best.step_s) * statistics.median(ratios)
    timed = run.step_times_s[at.start_profile_step:] or run.step_times_s
    return statistics.median(timed) if timed else None


def experiment_result(name: str, cfg: DSConfig, prediction: Prediction, run: RunResult, job: Job,
                      at: AutotuningConfig, best: ExperimentResult | None = None) -> ExperimentResult:
    metric = at.metric
    if run.status == "stopped":  # its partial step times still correct the predictions (zerotune.validate.search)
        return ExperimentResult(name, cfg, prediction, "stopped", run.reason, step_s=stopped_step_s(run, best, at),
                                wall_s=run.wall_s, step_times_s=run.step_times_s)
    if run.status != "ok" or run.metrics is None:
        return ExperimentResult(name, cfg, prediction, run.status, run.reason, wall_s=run.wall_s)
    samples = cfg.samples_per_step(job.cluster.world_size)
    flops = estimate(job, cfg).time.model_flops_per_gpu
    try:
        step_s = window_step_s(run, samples, at)
    except ValueError as exc:
        return ExperimentResult(name, cfg, prediction, "failed", str(exc), wall_s=run.wall_s)
    if prediction.step_s and step_s * IMPLAUSIBLE_RATIO < prediction.step_s:  # corrected into every prediction else
        return ExperimentResult(name, cfg, prediction, "failed",
                                f"its metrics give a step of {step_s:.3g} s, over {IMPLAUSIBLE_RATIO:g}x faster than "
                                f"predicted ({prediction.step_s:.3g} s): not taken as a measurement (does the script "
                                f"write the metrics file itself?)", wall_s=run.wall_s)
    return ExperimentResult(name, cfg, prediction, "ok", "", _metric_of_step(metric, step_s, samples, flops), step_s,
                            samples / step_s, run.wall_s, step_times_s=run.step_times_s,
                            peak_memory_bytes=read_peak_bytes(run.run_dir / PEAK_PREFIX))


def window_step_s(run: RunResult, samples: int, at: AutotuningConfig) -> float:
    """Seconds per optimizer step over the engine's measuring window, start_profile_step to end_profile_step.

    DeepSpeed's metrics.json is one step, not the window: with wall_clock_breakdown on (experiment_ds_config sets
    it) the engine logs and resets its global timers after every step (runtime/engine.py:3677 timers.log,
    utils/timer.py:141-147 reset=True), and it writes the metrics in the exit step before that step's log
    (engine.py:3657-3658 _autotuning_exit -> timers.get_mean), so they hold the last step alone. On a shared
    machine one step can be twice its neighbours. The window is the printed steps before the exit step plus that
    step; its median is the measurement. A metrics.json with its own step_s (zerotune's workload: a median
    already) is taken as it is. ValueError when metrics.json holds no step time."""
    assert run.metrics is not None
    last_s = measured_from_metrics(run.metrics, samples, 0.0, "throughput")[0]
    window = at.end_profile_step - at.start_profile_step
    if isinstance(run.metrics.get("step_s"), (int, float)) or window <= 0 or len(run.step_times_s) < window:
        return last_s
    return statistics.median([*run.step_times_s[-window:], last_s])


def _run_of(settings: TuneSettings, job: Job, at: AutotuningConfig, cfg: DSConfig
            ) -> tuple[dict[str, Any], list[str], dict[str, Any]]:
    """(ds_config, script arguments, what exp.json must agree on for a recorded result to be this run's)."""
    ds_config = experiment_ds_config(cfg, job.cluster.world_size, at)
    args = rewrite_args(settings.command.args, at.arg_mappings, ds_config)
    same_run = {"ds_config": ds_config, "user_script": str(settings.command.script), "user_args": list(args),
                "job": {"model": settings.model, "hardware": settings.hardware, "seq_len": job.seq_len}}
    return ds_config, args, same_run


def finished_earlier(settings: TuneSettings, job: Job, at: AutotuningConfig, layout: Layout,
                     configs: Mapping[str, tuple[int, DSConfig]]) -> list[tuple[int, ExperimentResult]]:
    """(candidate index, result) of every experiment an earlier tune in this results folder finished (or stopped)
    with this script, arguments and job: a rerun resumes with them as measured, as DeepSpeed's autotuner skips
    finished experiments. `configs`: experiment name -> (candidate index, configuration)."""
    found = []
    for exp_json in sorted(layout.results_dir.glob("*/exp.json")):
        name = exp_json.parent.name
        if name not in configs:
            continue
        index, cfg = configs[name]
        result = load_finished(layout, name, job.cluster.world_size, _run_of(settings, job, at, cfg)[2])
        if result is not None and result.status in ("ok", "stopped", "oom"):  # the configuration as tuned, not as
            found.append((index, replace(result, config=cfg)))           # the experiment ran it (its timers on)
    return found


ENDED_EARLY = "the script ended before DeepSpeed's engine reached"
"""How an experiment's reason begins when the script exited cleanly before the engine's profile window ended (its
data or its own step count ran out), so no metrics were written."""


def max_samples_for_window(result: ExperimentResult, world_size: int, at: AutotuningConfig) -> float | None:
    """For an experiment that ended early (ENDED_EARLY) after k optimizer steps of S samples each (the global timer
    lines the engine printed, one a step with wall_clock_breakdown on: runtime/engine.py step), the samples a
    configuration may take a step and still run the end_profile_step + 1 steps after which the engine writes its
    metrics (engine.py step: _autotuning_exit at global_steps == end_profile_step + 1). The script's data held
    at least k x S samples, so k x S / (end_profile_step + 1) is sure to reach the window; with no step printed,
    fewer than S, and S / (end_profile_step + 1) is the most that might. None for any other result."""
    if result.status != "failed" or not result.reason.startswith(ENDED_EARLY):
        return None
    cfg = result.config
    samples = cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * cfg.dp_size(world_size)
    return max(len(result.step_times_s), 1) * samples / (at.end_profile_step + 1)


def run_experiment(settings: TuneSettings, job: Job, at: AutotuningConfig, layout: Layout, exp_id: int,
                   cfg: DSConfig, prediction: Prediction, launcher: Launcher,
                   best: ExperimentResult | None = None) -> ExperimentResult:
    """Run one configuration (or read back its earlier result) and record it in the layout; with a measured
    `best`, the run is stopped as soon as its steps show it cannot beat it (stop_rule_for)."""
    name, world = experiment_name(cfg), job.cluster.world_size
    ds_config, args, same_run = _run_of(settings, job, at, cfg)
    if not at.overwrite:
        finished = load_finished(layout, name, world, same_run)
        if finished is not None:  # `cfg`, not the experiment's ds_config, which switched wall_clock_breakdown on
            return replace(finished, config=cfg)
    run_dir = layout.run_dir(name)
    exp = exp_document(name, exp_id, ds_config, job.cluster.num_gpus_per_node, job.cluster.num_nodes, run_dir,
                       prediction)
    write_json_atomic(layout.exp_path(name), exp)
    exp.update(same_run)
    write_json_atomic(run_dir / "exp.json", exp)  # no result yet: an interrupted experiment is rerun
    try:
        rule = None
        if best is not None:
            samples = cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * cfg.dp_size(world)
            rule = stop_rule_for(best, at.metric, samples, estimate(job, cfg).time.model_flops_per_gpu, at)
        for stale in run_dir.glob(f"{PEAK_PREFIX}.rank*.json"):  # an earlier, interrupted run's
            stale.unlink()
        spec = launch_spec(settings, ds_config, run_dir, args, rule)
        run = launcher(replace(spec, env=peak_env(spec.env, run_dir / PEAK_PREFIX)))
    except (RuntimeError, OSError) as exc:  # the launcher could not start: recorded, the tuner goes on
        run = RunResult("failed", f"launcher error: {exc}", None, 0.0, run_dir, None)
    if run.status == "failed" and run.returncode == 0 and run.reason == "no metrics written":
        run = replace(run, reason=f"{ENDED_EARLY} autotuning.end_profile_step "
                                  f"{at.end_profile_step}, where it writes its metrics: let the script run at least "
                                  f"{at.end_profile_step + 1} optimizer steps (more steps or data), or lower "
                                  f"end_profile_step")
    result = experiment_result(name, cfg, prediction, run, job, at, best)
    write_json_atomic(run_dir / "exp.json", {**exp, "result": result_dict(result)})
    return result
