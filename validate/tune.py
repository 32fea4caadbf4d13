"""`zerotune tune`: DeepSpeed's `--autotuning tune|run`, but it runs only the configurations the model ranks
best and stops as soon as measurement settles the race.

    zerotune tune [--run] [--num_gpus N] [--num_nodes M] [--hostfile F] [--top_k K] [--profile P]
                  [--model M] [--hardware H] [--seq_len S] [--timeout_s T] user_script.py --deepspeed ds.json ...

Workflow: (1) the model from --model, or from one short profiling run of the script (DeepSpeed's
model_info profile: parameter count -> a GPT-2-shaped ModelSpec, experiments.model_from_num_params);
(2) rank the whole space (zerotune.predictor.space reads the ds_config as DeepSpeed's autotuner does, keeping the
user's zero_optimization, offload included) with the cluster's calibration profile when there is one;
(3) run the most promising configuration as a real experiment through zerotune.calibrate.launch (own folder, own
master port, mapped arguments rewritten, DeepSpeed's engine timing start_profile_step..end_profile_step);
(4) correct the predictions with what was measured, by family (zerotune.validate.search: errors are shared within a
ZeRO stage / offload / checkpointing family and smooth in micro-batch), choose the next experiment by expected
improvement, and stop when no remaining configuration's optimistic band beats the measured best; never more
than top_k (and tuner_num_trials) experiments, a ceiling the stopping rule usually stays under. Each experiment takes the whole --num_gpus x --num_nodes the tuned configuration is for, so
experiments run one at a time (DeepSpeed's tuner also gives full-size experiments the whole allocation).

Zerotune's own departures: `autotuning.overwrite` defaults to false (DeepSpeed: true), so rerunning an
interrupted tune resumes it and skips what finished; `metric: latency` is minimised.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from zerotune.calibrate.launch import LaunchSpec, RunResult, StopRule, deepspeed_command, free_port, launch
from zerotune.calibrate.measurement import Measurement, append_jsonl
from zerotune.calibrate.profiles import CalibrationProfile, find_profile, load_profile, profile_measurements
from zerotune.predictor import ClusterSpec, DSConfig, Efficiency, Job, estimate, experiment_name, load_hardware, parse_ds_config
from zerotune.predictor.dsconfig import AUTO, AutotuningConfig, OptimizerImpl
from zerotune.predictor.hardware import Precision
from zerotune.predictor.rank import MAXIMISED, Metric, Uncertainty, _band, evaluate_space, rank
from zerotune.predictor.space import EXPLORABLE, SearchSpace, explorable_on, space_from_ds_config
from zerotune.predictor.units import GIB
from zerotune.validate.experiments import (BATCH_KEYS, TRAINER_FLAGS, UserCommand, batch_as_given, check_arg_mappings,
                                          experiment_ds_config, filtered_resources, optimal_ds_config,
                                          flag_value, read_ds_config, read_hostfile, rewrite_args,
                                          split_user_command, trainer_arg_mappings)
from zerotune.validate.args import positive_float, positive_int
from zerotune.validate.plan import build_job, check_parallelism
from zerotune.validate.plots import plot_predicted_vs_measured, plot_space
from zerotune.validate.search import (NOISE_STD, Choice, Observation, SearchTable, candidate_table, fit_probability,
                                     memory_bounds, observation_of, prediction_of, run_search)
from zerotune.validate.profiled import (MatmulPace, ProfiledRun, median_step_s, model_yaml, precision_of_dtype,
                                        profiling_env, read_profiled, step_rel_error)
from zerotune.validate.results import (ExperimentResult, Layout, Prediction, best_result, exp_document, format_summary, lr_advice,
                              load_finished, measured_from_metrics, result_dict, write_json_atomic,
                              write_text_atomic)

__all__ = ["TuneSettings", "TuneOutcome", "Launcher", "add_tune_arguments", "run_tune", "tune", "settings_from_args",
           "lr_advice", "measurement_of", "run_experiment", "autotuning_of", "ProfileOutcome",
           "profile_model", "load_profile_for", "NO_PROFILE", "stop_rule_for", "BUILTIN_SCRIPT", "DEFAULT_TOP_K",
           "EARLY_STOP_MIN_STEPS", "EARLY_STOP_MARGIN"]

Launcher = Callable[[LaunchSpec], RunResult]
REPO = Path(__file__).resolve().parent.parent
BUILTIN_SCRIPT = REPO / "calibrate" / "workload.py"
BUILTIN_MODEL = "zt-gpt-small"
BUILTIN_SEQ_LEN = 128
EARLY_STOP_MIN_STEPS = 2
"""Timed steps an experiment runs before it may be stopped early: one step can be a warm-up outlier."""
EARLY_STOP_MARGIN = 0.05
"""An experiment is stopped early only when even its fastest step is this much worse than the measured best
(step times spread by a few percent from step to step)."""
NO_PROFILE = "none"
"""--profile's value that tunes uncalibrated even where a calibration profile exists."""
EXPERIMENT_STARTUP_S = 20.0
"""Wall seconds an experiment takes before its first step: DeepSpeed's launcher, the process group and the engine
(15-25 s a warm run on this project's 2-core CPU machine; more on GPU nodes, where it only makes the step times
matter less). The search weighs expected improvement against start-up plus the timed steps."""
DEFAULT_TOP_K = 8
"""--top_k's default: a ceiling on experiments; the stopping rule usually ends the search well before it."""


@dataclass(frozen=True)
class TuneSettings:
    command: UserCommand
    doc: dict[str, Any]
    """The user's ds_config as read."""
    model: str
    """Catalog name or model file, as Measurement.model records it."""
    hardware: str
    num_gpus: int
    num_nodes: int = 1
    hostfile: Path | None = None
    seq_len: int | None = None
    top_k: int = DEFAULT_TOP_K
    profile: Path | None = None
    timeout_s: float = 600.0
    env: Mapping[str, str] = field(default_factory=dict)
    memory_limit_bytes: int | None = None
    explore: tuple[str, ...] = EXPLORABLE
    run_after: bool = False
    launch_flags: LauncherOptions = field(default_factory=lambda: LauncherOptions())
    """DeepSpeed launcher flags passed through as the user gave them."""
    optimizer_impl: OptimizerImpl | None = None
    """How the script's own optimizer runs its update, as the profiling run read it; it stands for a ds_config
    without an optimizer section (None: DSConfig.optimizer_impl from the ds_config)."""
    script_checkpointing: bool | None = None
    """Whether the script recomputes its blocks in backward, as the profiling run saw it (ProfiledRun.
    activation_checkpointing); every configuration of a user's script is costed so (_as_the_script_runs). None: no
    profiling run (--model given), and the ds_config's activation_checkpointing section says it, as for predict."""
    script_precision: Precision | None = None
    """The precision the profiling run's engine held its weights in (ProfiledRun.dtype); it stands for a precision
    section the Hugging Face Trainer fills ("enabled": "auto", set by its --fp16 / --bf16). None: no profiling run."""
    device_matmul: MatmulPace | None = None
    """The square matmul the profiling run timed on this device (ProfiledRun.matmul): the device's pace today,
    against the calibration profile's microbenchmark of the same shape (_paced)."""
    device_copy_bytes_per_s: float | None = None
    """The tensor copy the profiling run timed (ProfiledRun.copy_bytes_per_s), against the calibration's memory
    microbenchmark (_paced)."""


@dataclass(frozen=True)
class LauncherOptions:
    """The deepspeed launcher's flags a user brings (launcher/runner.py), passed through unchanged."""

    include: str | None = None
    exclude: str | None = None
    launcher: str | None = None
    launcher_args: str | None = None
    no_ssh: bool = False
    master_addr: str | None = None
    master_port: int | None = None
    """None: a free port per run (zerotune's default, so a stale run cannot collide)."""


@dataclass(frozen=True)
class TuneOutcome:
    results: tuple[ExperimentResult, ...]
    best: ExperimentResult | None
    stop_reason: str
    layout: Layout
    optimal_cmd: tuple[str, ...] = ()
    duration_s: float = 0.0


@dataclass(frozen=True)
class _Model:
    """The model the search starts from: efficiency parameters and the uncertainty of their predictions."""

    efficiency: Efficiency
    uncertainty: Uncertainty
    calibration_matmul_flops_per_s: Mapping[tuple[str, int], float] = field(default_factory=dict)
    """The calibration's microbenchmark FLOP/s of square matmuls by (dtype, edge); empty when uncalibrated."""
    calibration_copy_bytes_per_s: float | None = None
    """The calibration's memory microbenchmark (tensor copy, read + write); None when uncalibrated."""


def autotuning_of(doc: Mapping[str, Any], world_size: int) -> AutotuningConfig:
    section = doc.get("autotuning") or {}
    at = parse_ds_config({"autotuning": section}, world_size=world_size).autotuning
    if "overwrite" not in section:  # zerotune resumes by default (module docstring)
        at = replace(at, overwrite=False)
    if at.end_profile_step < at.start_profile_step:
        raise ValueError(f"ds_config autotuning.end_profile_step {at.end_profile_step} is before start_profile_step "
                         f"{at.start_profile_step}; make it at least as large")
    return at


MODEL_TRANSFER_REL = 0.15
"""What a calibration's step-time band leaves out when the job's model is not one it was fitted on: its
out-of-sample band holds configurations of the fitted model (held out by configuration, calibrate/fit.py), not
other models. Measured transfers: calibrating on three rows of one model of the published 16-V100 table and
predicting its others, 7.6% mean error on the test half (validate/fewshot.py; about 19% as the band's two standard
deviations of a half-normal error); the CPU profile fitted on zt-gpt-small predicted the encoder and decoder fixture
scripts within +1% to -14% (data/measurements/cpu_probes_other_models/README.md); five scripts written as users
write them, tuned on the 2-vCPU machine on 2026-11-26: +22% to +170% at micro-batch 1, where the band claimed +-3%.
Added in quadrature to the profile's band."""


def _load_profile(settings: TuneSettings, log: Callable[[str], None] = print) -> _Model:
    profile = _resolve_profile(settings.hardware, settings.profile, log)
    if profile is None:
        return _Model(Efficiency(), Uncertainty())
    micro = profile.environment.get("microbenchmarks") or {}
    copy = micro.get("memory_bandwidth_bytes_per_s")
    bands = profile.uncertainty.bands()
    fitted = sorted({m.model for m in profile_measurements(profile)})
    if settings.model not in fitted:
        wider = math.hypot(bands.step_time_rel, MODEL_TRANSFER_REL)
        log(f"zerotune tune: the profile was fitted on {', '.join(fitted) or 'no named model'}; for another model "
            f"its step-time band widens from {bands.step_time_rel:.1%} to {wider:.1%} (MODEL_TRANSFER_REL)")
        bands = replace(bands, step_time_rel=wider)
    return _Model(profile.efficiency, bands, _square_matmuls(profile),
                  float(copy) if isinstance(copy, (int, float)) and copy > 0 else None)


def load_profile_for(hardware: str, given: Path | None = None, log: Callable[[str], None] = lambda _: None
                     ) -> tuple[Efficiency, Uncertainty]:
    """The efficiency and bands of the profile tune uses (_resolve_profile); the uncalibrated defaults without one."""
    profile = _resolve_profile(hardware, given, log)
    return (profile.efficiency, profile.uncertainty.bands()) if profile else (Efficiency(), Uncertainty())


def _resolve_profile(hardware: str, given: Path | None, log: Callable[[str], None]) -> CalibrationProfile | None:
    """The profile named by --profile, else the user's calibration of this hardware, else the shipped one;
    which one is used (or that none is) is said through `log`, never picked up silently. --profile none
    (NO_PROFILE): none, the uncalibrated defaults, even where a calibration exists."""
    if given is not None and str(given) == NO_PROFILE:
        log(f"zerotune tune: --profile {NO_PROFILE}: predicting {hardware} uncalibrated (default efficiencies and "
            f"bands)")
        return None
    if given is not None and not Path(given).is_file():
        raise ValueError(f"--profile {given}: no such file; give a calibration profile (zerotune calibrate "
                         f"writes one)")
    path = given or find_profile(load_hardware(hardware).name)  # honours ZEROTUNE_HOME / ZEROTUNE_DATA
    if path is None:
        log(f"zerotune tune: no calibration profile for {hardware}; predicting uncalibrated "
            f"(zerotune calibrate --hardware {hardware} makes one)")
        return None
    profile = load_profile(Path(path))
    if profile.hardware != hardware:
        warnings.warn(f"--profile {path} was fitted on {profile.hardware}, not {hardware}; tuning uncalibrated")
        return None
    log(f"zerotune tune: calibration profile {path}")
    return profile


def _square_matmuls(profile: CalibrationProfile) -> dict[tuple[str, int], float]:
    """The profile's microbenchmark FLOP/s of each edge^3 matmul, by (dtype, edge)."""
    micro = profile.environment.get("microbenchmarks") or {}
    rates: dict[tuple[str, int], float] = {}
    for r in micro.get("matmul") or []:
        if isinstance(r, dict) and r.get("m") == r.get("n") == r.get("k") and r.get("flops_per_s"):
            key = (str(r.get("dtype")), int(r["m"]))
            rates[key] = max(rates.get(key, 0.0), float(r["flops_per_s"]))
    return rates


MAX_PACE_RATIO = 4.0
"""A device timed more than this many times faster or slower than its calibration is not the calibrated one
(another machine, a thermal fault): the rescaling stops here."""


def _paced(model: "_Model", settings: TuneSettings, log: Callable[[str], None]) -> "_Model":
    """The model with its GEMM rate scaled by the device's matmul pace now over the calibration's, and its memory
    bandwidth by its copy pace: a calibration holds for the machine as it ran that day, and a shared machine's
    pace moves (this CPU VM's single-thread fp32 matmul: 95 GFLOP/s in the shipped profile's microbenchmark on
    2026-11-23, 153-172 on 2026-11-25; its tensor copy 35 GB/s then, 12 now: the VM had moved from an AMD EPYC host
    to an Intel Xeon one). Each is clipped at MAX_PACE_RATIO; the profiling run's own measurement corrects the rest."""
    eff = model.efficiency
    if settings.device_matmul is not None:
        dtype, edge, now = settings.device_matmul
        then = model.calibration_matmul_flops_per_s.get((dtype, edge))
        if then and now > 0:
            ratio = _clip_pace(now / then)
            log(f"zerotune tune: a {edge}^3 {dtype} matmul ran at {now / 1e9:.4g} GFLOP/s in the profiling run against "
                f"{then / 1e9:.4g} in the calibration: GEMMs predicted x{ratio:.3g} as fast")
            eff = replace(eff, gemm_efficiency_scale=eff.gemm_efficiency_scale * ratio)
    now_copy, then_copy = settings.device_copy_bytes_per_s, model.calibration_copy_bytes_per_s
    if now_copy and then_copy:
        ratio = _clip_pace(now_copy / then_copy)
        log(f"zerotune tune: a tensor copy ran at {now_copy / 1e9:.3g} GB/s in the profiling run against "
            f"{then_copy / 1e9:.3g} in the calibration: memory-bound kernels predicted x{ratio:.3g} as fast")
        eff = replace(eff, memory_bandwidth_efficiency=eff.memory_bandwidth_efficiency * ratio)
    return replace(model, efficiency=eff)


def _clip_pace(ratio: float) -> float:
    return min(max(ratio, 1.0 / MAX_PACE_RATIO), MAX_PACE_RATIO)


# -- predictions and measurements ---------------------------------------------------------------------

def _nothing_fits(job: Job, space: SearchSpace, efficiency: Efficiency, uncertainty: Uncertainty) -> ValueError:
    least = rank(job, space, efficiency, "throughput", 1, 0.0, uncertainty).least_memory
    return ValueError(f"no configuration of the space fits {job.cluster.hardware.name} "
                      f"({least.memory.capacity_bytes / GIB:.1f} GiB): the least memory is "
                      f"{least.memory.total_bytes / GIB:.1f} GiB ({experiment_name(least.config)}); widen the space "
                      f"(stage 3, offload, checkpointing, smaller micro-batches), add GPUs or shorten --seq_len")


def measurement_of(settings: TuneSettings, job: Job, result: ExperimentResult, layout: Layout) -> Measurement:
    ok = result.status in ("ok", "stopped") and result.step_s is not None
    return Measurement(model=settings.model, hardware=settings.hardware, num_nodes=job.cluster.num_nodes,
                       num_gpus_per_node=job.cluster.num_gpus_per_node, seq_len=job.seq_len, config=result.config,
                       status=result.status, step_s=result.step_s if ok else None,
                       throughput_samples_per_s=result.throughput_samples_per_s if ok else None,
                       source=str(layout.run_dir(result.name)), reason=result.reason)


def _first_predictions(job: Job, model: _Model, measured: Sequence[Measurement], metric: Metric) -> list[str]:
    """The uncorrected prediction of each earlier measurement against what it measured, one line each."""
    lines = []
    for m in measured:
        if m.status != "ok" or not m.measured_step_s:
            continue
        step_s = estimate(job, m.config, model.efficiency).time.step_s
        low, high = _band(m.samples_per_step / step_s, "throughput", model.uncertainty.step_time_rel)
        lines.append(f"zerotune tune: profiling run {experiment_name(m.config)}: measured "
                     f"{m.samples_per_step / m.measured_step_s:.4g} samples/s, predicted {m.samples_per_step / step_s:.4g}"
                     f" (band {low:.4g}-{high:.4g}); the predictions are corrected with it"
                     + (f", weighted as a measurement within +-{m.step_s_rel_error:.0%} (its steps spread)"
                        if (m.step_s_rel_error or 0) > NOISE_STD else ""))
    return lines


# -- one experiment ----------------------------------------------------------------------------------------

def _launch_spec(settings: TuneSettings, ds_config: dict[str, Any], run_dir: Path, args: Sequence[str],
                 stop_rule: StopRule | None = None) -> LaunchSpec:
    o = settings.launch_flags
    filtered = o.include is not None or o.exclude is not None  # the runner refuses counts beside a filter
    return LaunchSpec(script=settings.command.script, ds_config=ds_config, run_dir=run_dir,
                      master_port=o.master_port or free_port(), timeout_s=settings.timeout_s, script_args=tuple(args),
                      num_gpus=None if filtered else settings.num_gpus,
                      num_nodes=settings.num_nodes if settings.hostfile and not filtered else None,
                      hostfile=settings.hostfile, include=o.include, exclude=o.exclude, launcher=o.launcher,
                      launcher_args=o.launcher_args, no_ssh=o.no_ssh, master_addr=o.master_addr,
                      env=dict(settings.env), memory_limit_bytes=settings.memory_limit_bytes,
                      ds_config_flag=settings.command.ds_config_flag, stop_rule=stop_rule)


def _metric_of_step(metric: Metric, step_s: float, samples: int, flops: float) -> float:
    return {"throughput": samples / step_s, "latency": step_s * 1e3, "flops": flops / step_s}[metric]


def stop_rule_for(best: ExperimentResult, metric: Metric, samples: int, flops: float,
                  at: AutotuningConfig) -> StopRule:
    """Stop an experiment once EARLY_STOP_MIN_STEPS steps of the engine's measuring window (start_profile_step to
    end_profile_step; the steps before it are warm-up) are timed and even the fastest is more than EARLY_STOP_MARGIN
    worse than the measured best: the mean the full run would report cannot beat it. A run whose whole window
    is timed is finishing anyway and is left to write its metrics."""
    assert best.metric_value is not None
    best_value = float(best.metric_value)
    window = at.end_profile_step - at.start_profile_step + 1

    def rule(steps: tuple[float, ...]) -> str | None:
        timed = steps[at.start_profile_step:]
        if not EARLY_STOP_MIN_STEPS <= len(timed) < window:
            return None
        value = _metric_of_step(metric, min(timed), samples, flops)
        ratio = value / best_value if MAXIMISED[metric] else best_value / value
        if ratio >= 1.0 - EARLY_STOP_MARGIN:
            return None
        return (f"stopped early after {len(timed)} of {window} timed steps: its fastest ({min(timed):.4g} s, "
                f"{metric} {value:.4g}) is {100 * (1 - ratio):.0f}% worse than the measured best ({best.name}, "
                f"{best_value:.4g}), so it cannot beat it")
    return rule


def _result(name: str, cfg: DSConfig, prediction: Prediction, run: RunResult, job: Job, at: AutotuningConfig) -> ExperimentResult:
    metric = at.metric
    if run.status == "stopped":  # its partial step times still correct the predictions (zerotune.validate.search)
        step_s = statistics.median(run.step_times_s) if run.step_times_s else None
        return ExperimentResult(name, cfg, prediction, "stopped", run.reason, step_s=step_s, wall_s=run.wall_s)
    if run.status != "ok" or run.metrics is None:
        return ExperimentResult(name, cfg, prediction, run.status, run.reason, wall_s=run.wall_s)
    samples = cfg.samples_per_step(job.cluster.world_size)
    flops = estimate(job, cfg).time.model_flops_per_gpu
    try:
        step_s = window_step_s(run, samples, at)
    except ValueError as exc:
        return ExperimentResult(name, cfg, prediction, "failed", str(exc), wall_s=run.wall_s)
    return ExperimentResult(name, cfg, prediction, "ok", "", _metric_of_step(metric, step_s, samples, flops), step_s,
                            samples / step_s, run.wall_s)


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


def run_experiment(settings: TuneSettings, job: Job, at: AutotuningConfig, layout: Layout, exp_id: int,
                   cfg: DSConfig, prediction: Prediction, launcher: Launcher,
                   best: ExperimentResult | None = None) -> ExperimentResult:
    """Run one configuration (or read back its earlier result) and record it in the layout; with a measured
    `best`, the run is stopped as soon as its steps show it cannot beat it (stop_rule_for)."""
    name, world = experiment_name(cfg), job.cluster.world_size
    ds_config = experiment_ds_config(cfg, world, at)
    args = rewrite_args(settings.command.args, at.arg_mappings, ds_config)
    same_run = {"ds_config": ds_config, "user_script": str(settings.command.script), "user_args": list(args),
                "job": {"model": settings.model, "hardware": settings.hardware, "seq_len": job.seq_len}}
    if not at.overwrite:
        finished = load_finished(layout, name, world, same_run)
        if finished is not None:
            return finished
    run_dir = layout.run_dir(name)
    exp = exp_document(name, exp_id, ds_config, job.cluster.num_gpus_per_node, job.cluster.num_nodes, run_dir,
                       prediction)
    write_json_atomic(layout.exp_path(name), exp)
    exp.update(same_run)
    write_json_atomic(run_dir / "exp.json", exp)  # no result yet: an interrupted experiment is rerun
    try:
        rule = None
        if best is not None:
            from zerotune.predictor import estimate
            samples = cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * cfg.dp_size(world)
            rule = stop_rule_for(best, at.metric, samples, estimate(job, cfg).time.model_flops_per_gpu, at)
        run = launcher(_launch_spec(settings, ds_config, run_dir, args, rule))
    except (RuntimeError, OSError) as exc:  # the launcher could not start: recorded, the tuner goes on
        run = RunResult("failed", f"launcher error: {exc}", None, 0.0, run_dir, None)
    if run.status == "failed" and run.returncode == 0 and run.reason == "no metrics written":
        run = replace(run, reason=f"the script ended before DeepSpeed's engine reached autotuning.end_profile_step "
                                  f"{at.end_profile_step}, where it writes its metrics: let the script run at least "
                                  f"{at.end_profile_step + 1} optimizer steps (more steps or data), or lower "
                                  f"end_profile_step")
    result = _result(name, cfg, prediction, run, job, at)
    write_json_atomic(run_dir / "exp.json", {**exp, "result": result_dict(result)})
    return result


# -- the loop ------------------------------------------------------------------------------------------------

def _search(settings: TuneSettings, job: Job, at: AutotuningConfig, layout: Layout, model: _Model,
            table: SearchTable, launcher: Launcher, log: Callable[[str], None], results: list[ExperimentResult],
            initial: Sequence[Measurement] = ()) -> str:
    """Run experiments into `results` until the stopping rule or the budget ends it (zerotune.validate.search decides
    which); returns why it stopped."""
    metric, budget = at.metric, min(settings.top_k, at.tuner_num_trials)

    def run(choice: Choice) -> Observation:
        assert choice.index is not None
        cfg = table.config(choice.index)
        prediction = prediction_of(choice, metric, float(table.table.memory_bytes.ravel()[choice.index]))
        log(f"zerotune tune: experiment {len(results) + 1} (at most {budget}) {experiment_name(cfg)} (predicted "
            f"{metric} {prediction.metric_value:.4g}, band {prediction.metric_low:.4g}-{prediction.metric_high:.4g}"
            + (f", fits with p={choice.fit_probability:.2f}" if choice.fit_probability < 1 else "") + ")")
        result = run_experiment(settings, job, at, layout, len(results), cfg, prediction, launcher,
                                best_result(results, metric))
        log(f"  -> {result.status}" + (" (resumed)" if result.resumed else "")
            + (f": {metric} {result.metric_value:.4g}" if result.metric_value is not None else f": {result.reason}"))
        results.append(result)
        cands = table.candidates
        return Observation(cands.families[cands.family[choice.index]], int(cands.micro_batch[choice.index]),
                           float(cands.step_s[choice.index]), float(cands.memory_ratio[choice.index]),
                           result.status, result.step_s if result.status in ("ok", "stopped") else None,
                           choice.index)

    initial_obs = [observation_of(job, model.efficiency, m) for m in initial]
    _, reason = run_search(table.candidates, model.uncertainty, budget, run, initial_obs)
    if reason is not None:
        best = best_result(results, metric)
        return reason + (f" ({best.name}: {metric} {best.metric_value:.4g})" if best is not None else "")
    return f"stopped: the budget of {budget} experiments (top_k {settings.top_k}, tuner_num_trials " \
           f"{at.tuner_num_trials}) is spent"


def _optimal_cmd(settings: TuneSettings, layout: Layout, best: ExperimentResult, at: AutotuningConfig,
                 world_size: int) -> list[str]:
    doc = optimal_ds_config(best.config, world_size)
    args = rewrite_args(settings.command.args, at.arg_mappings, doc)
    spec = _launch_spec(settings, doc, layout.results_dir, args)
    cmd = deepspeed_command(spec)
    cmd[-1] = str(layout.optimal_config.resolve())  # the optimal config, not an experiment's
    return cmd


def _write_outputs(settings: TuneSettings, job: Job, at: AutotuningConfig, layout: Layout,
                   results: Sequence[ExperimentResult], stop_reason: str, duration_s: float) -> tuple[str, ...]:
    """summary.txt, measurements.jsonl, the optimal config and command, and the plots, all atomically."""
    write_text_atomic(layout.summary, format_summary(results, at.metric, duration_s, stop_reason))
    tmp = layout.measurements.with_name(layout.measurements.name + ".tmp")
    tmp.unlink(missing_ok=True)
    append_jsonl(tmp, [measurement_of(settings, job, r, layout) for r in results])
    os.replace(tmp, layout.measurements)
    best = best_result(results, at.metric)
    if best is None:
        return ()
    write_json_atomic(layout.optimal_config, optimal_ds_config(best.config, job.cluster.world_size))
    cmd = _optimal_cmd(settings, layout, best, at, job.cluster.world_size)
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(settings.env.items())]
    write_text_atomic(layout.optimal_cmd, " ".join(env + [shlex.join(cmd)]) + "\n")
    return tuple(cmd)


def _plots(job: Job, space: SearchSpace, model: _Model, results: Sequence[ExperimentResult], layout: Layout) -> None:
    try:
        plot_space(job, evaluate_space(job, space, model.efficiency), layout.results_dir / "space.png",
                   model.efficiency)
        ok = [r for r in results if r.status == "ok" and r.step_s]
        if ok:
            plot_predicted_vs_measured([r.prediction.step_s for r in ok], [r.step_s for r in ok],  # type: ignore[misc]
                                       layout.results_dir / "predicted_vs_measured.png",
                                       labels=[r.name for r in ok], title="tune experiments: step time")
    except ImportError as exc:  # matplotlib is optional at run time
        warnings.warn(f"plots skipped: {exc}")


def _explorable(settings: TuneSettings, hardware_kind: str) -> tuple[str, ...]:
    """Offload is tried only when DeepSpeed builds the optimizer: with a client optimizer (no `optimizer` section)
    ZeRO-Offload stops at start-up unless zero_force_ds_cpu_optimizer is false, so the experiment would be wasted;
    and never where the device is the CPU (predictor.space.explorable_on).
    Checkpointing is tried only on the built-in workload, which switches it by the ds_config's section: a user's
    script recomputes where it calls a checkpoint function, whatever the section says (ActivationCheckpointing.by_script),
    so an experiment that only adds the section runs the same program."""
    doc = settings.doc
    client_optimizer = "optimizer" not in doc and doc.get("zero_force_ds_cpu_optimizer") is not False
    builtin = settings.command.script == BUILTIN_SCRIPT
    return tuple(e for e in explorable_on(settings.explore, hardware_kind) if not (e == "offload" and client_optimizer)
                 and not (e == "checkpointing" and not builtin))


def _as_the_script_runs(cfg: DSConfig, settings: TuneSettings) -> DSConfig:
    """A user script's configuration costed with the checkpointing its profiling run saw, its section kept as the user
    wrote it (ActivationCheckpointing.by_script); the built-in workload's as the ds_config switches it."""
    if settings.command.script == BUILTIN_SCRIPT:
        return cfg
    ckpt = cfg.activation_checkpointing
    section = ckpt.section if ckpt.by_script else ckpt.enabled  # parsed from the user's ds_config: its presence
    seen = section if settings.script_checkpointing is None else settings.script_checkpointing
    auto = any(isinstance(settings.doc.get(p), dict) and settings.doc[p].get("enabled") == AUTO for p in ("fp16", "bf16"))
    if auto and settings.script_precision is not None:  # the Trainer filled it: its engine's weights say how
        cfg = cfg.replace(precision=settings.script_precision)
    return cfg.replace(activation_checkpointing=replace(ckpt, enabled=seen, by_script=True, section=section))


def tune(settings: TuneSettings, launcher: Launcher = launch, log: Callable[[str], None] = print,
         initial: Sequence[Measurement] = ()) -> TuneOutcome:
    """Rank, run the most promising experiments, write the results folder; see the module docstring.

    `initial`: measurements of this job made before the tune (a profiling run of the script, an earlier tune's
    measurements.jsonl). They correct the predictions exactly as experiments do (zerotune.validate.search) but are not
    experiments: they count against no budget, are not candidates for the optimum and are not written to the
    results folder. Their `config` must be a configuration of this job (same GPUs, model, sequence length)."""
    start = time.monotonic()
    world = settings.num_nodes * settings.num_gpus
    at = autotuning_of(settings.doc, world)
    check_arg_mappings(settings.doc, settings.command.args, at.arg_mappings)
    job = build_job(settings.model, settings.hardware, settings.num_nodes, settings.num_gpus, settings.seq_len)
    check_parallelism(job, settings.doc)
    space = _with_script_optimizer(settings, space_from_ds_config(settings.doc, world_size=world,
                                                                  hidden_size=job.model.hidden_size,
                                                                  explore=_explorable(settings, job.cluster.hardware.kind)))
    if settings.script_checkpointing is False and "activation_checkpointing" in settings.doc \
            and settings.command.script != BUILTIN_SCRIPT:
        warnings.warn("ds_config activation_checkpointing: DeepSpeed's engine does not switch recomputation by this "
                      "section (only deepspeed.checkpointing.configure reads it) and the profiling run saw the script "
                      "recompute nothing; configurations are costed without checkpointing")
    variants = {repr(v): v for v in (_as_the_script_runs(v, settings) for v in space.variants)}
    space = replace(space, variants=tuple(variants.values()))
    model = _paced(_load_profile(settings, log), settings, log)
    if initial:
        for line in _first_predictions(job, model, initial, at.metric):
            log(line)
    table = candidate_table(job, space, model.efficiency, at.metric)
    table = replace(table, candidates=table.candidates.with_cost(EXPERIMENT_STARTUP_S, at.end_profile_step + 1))
    bounds = memory_bounds([observation_of(job, model.efficiency, m) for m in initial], model.uncertainty)
    if not fit_probability(table.candidates.memory_ratio, bounds).any():
        raise _nothing_fits(job, space, model.efficiency, model.uncertainty)
    layout = Layout(Path(at.results_dir), Path(at.exps_dir))
    results: list[ExperimentResult] = []
    try:
        stop_reason = _search(settings, job, at, layout, model, table, launcher, log, results, initial)
    except KeyboardInterrupt:  # the launcher has killed its ranks; leave a consistent folder, then stop
        _write_outputs(settings, job, at, layout, results, "interrupted (Ctrl-C): rerun to resume",
                       time.monotonic() - start)
        raise
    duration_s = time.monotonic() - start
    cmd = _write_outputs(settings, job, at, layout, results, stop_reason, duration_s)
    _plots(job, space, model, results, layout)
    return TuneOutcome(tuple(results), best_result(results, at.metric), stop_reason, layout, cmd, duration_s)


# -- the command line --------------------------------------------------------------------------------------

def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    """The `tune` verb's arguments; everything after the script belongs to the script."""
    p = parser
    p.add_argument("--run", action="store_true", help="then train with the optimal configuration")
    p.add_argument("--num_gpus", type=positive_int("--num_gpus"), help="devices per node, as deepspeed's (default: the hostfile's "
                                                "slots, else the hardware catalog's devices per node)")
    p.add_argument("--num_nodes", type=positive_int("--num_nodes"), help="nodes (default: the hostfile's hosts, else 1)")
    p.add_argument("--hostfile", type=Path, help="DeepSpeed hostfile ('host slots=N' lines); one node needs none")
    p.add_argument("--top_k", type=positive_int("--top_k"), default=DEFAULT_TOP_K,
                   help=f"most experiments to run, a ceiling: the search stops sooner once no configuration can "
                        f"beat the measured best (default {DEFAULT_TOP_K}; autotuning.tuner_num_trials caps it too)")
    p.add_argument("--profile", type=Path, help="calibration profile (default: the user's calibration of the "
                                                "hardware, else the shipped data/profiles/<hardware>.json; the one "
                                                "used is printed; 'none': uncalibrated)")
    p.add_argument("--model", help="catalog name, model YAML or config.json (default: one profiling run of "
                                   f"the script; {BUILTIN_MODEL} for the built-in workload)")
    p.add_argument("--hardware", help="catalog name or YAML (default: cpu when DS_ACCELERATOR=cpu or no "
                                      "nvidia-smi is on PATH)")
    p.add_argument("--seq_len", type=positive_int("--seq_len"), help=f"tokens per sample the script trains on (built-in: {BUILTIN_SEQ_LEN})")
    p.add_argument("--timeout_s", type=positive_float("--timeout_s"), default=600.0, help="seconds before an experiment counts as hung")
    p.add_argument("--memory_cap_gib", type=positive_float("--memory_cap_gib"), help="per-process address-space cap for experiments (RLIMIT_AS)")
    p.add_argument("--explore", default=",".join(EXPLORABLE),
                   help="what the space may add that the ds_config does not set: offload,checkpointing or none")
    p.add_argument("--deepspeed", dest="tune_ds_config", metavar="DS_CONFIG",
                   help="the ds_config, when no script is given (the built-in workload, calibrate/workload.py)")
    add_launcher_arguments(p)
    p.add_argument("script", nargs="?", help="the training script (default: the built-in workload)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments, --deepspeed ds.json among them")


LAUNCHERS = ("pdsh", "openmpi", "mpich", "impi", "slurm", "mvapich")
"""DeepSpeed's multi-node backends (launcher/constants.py)."""


def add_launcher_arguments(p: argparse.ArgumentParser) -> None:
    """deepspeed's own launcher flags, passed through to every run as the user gives them."""
    p.add_argument("--include", help="deepspeed --include: hosts and slots to use, e.g. 'worker-0:0,1@worker-1'")
    p.add_argument("--exclude", help="deepspeed --exclude: hosts and slots to leave out, same format")
    p.add_argument("--launcher", type=str.lower, choices=LAUNCHERS, help="deepspeed --launcher: the multi-node "
                   "backend (default pdsh)")
    p.add_argument("--launcher_args", help="deepspeed --launcher_args: passed to the backend as one string")
    p.add_argument("--no_ssh", action="store_true", help="deepspeed --no_ssh: each node runs the command itself")
    p.add_argument("--master_addr", help="deepspeed --master_addr (default: the runner's)")
    p.add_argument("--master_port", type=int, help="deepspeed --master_port (default: a free port per run)")


def _launcher_options(args: argparse.Namespace) -> LauncherOptions:
    return LauncherOptions(getattr(args, "include", None), getattr(args, "exclude", None),
                           getattr(args, "launcher", None), getattr(args, "launcher_args", None),
                           bool(getattr(args, "no_ssh", False)), getattr(args, "master_addr", None),
                           getattr(args, "master_port", None))


def _resources(args: argparse.Namespace, devices_per_node: int) -> tuple[int, int]:
    """(nodes, devices per node): the flags, else the hostfile (and --include / --exclude), else one node."""
    hosts = read_hostfile(args.hostfile) if args.hostfile else None
    if getattr(args, "include", None) or getattr(args, "exclude", None):
        if args.num_gpus or args.num_nodes:
            raise ValueError("--include / --exclude cannot be combined with --num_gpus / --num_nodes (as for "
                             "deepspeed); give one or the other")
        pool = hosts or [("localhost", devices_per_node)]
        hosts = filtered_resources(pool, args.include, args.exclude)
        if not hosts or len({n for _, n in hosts}) != 1:
            raise ValueError(f"--include/--exclude leave {hosts or 'no devices'}: zerotune models the same number "
                             f"of devices on every node; choose an even selection")
        return len(hosts), hosts[0][1]
    if hosts is None and (args.num_nodes or 1) > 1:
        raise ValueError(f"--num_nodes {args.num_nodes} needs --hostfile listing the nodes; give one")
    num_nodes = args.num_nodes or (len(hosts) if hosts else 1)
    return num_nodes, args.num_gpus or (min(s for _, s in hosts) if hosts else devices_per_node)


def _command(args: argparse.Namespace) -> tuple[UserCommand, str | None, int | None]:
    """(the command, the model, the sequence length): the user's, or the built-in workload's."""
    if args.script is None:
        if not args.tune_ds_config:
            raise ValueError("give a training script and its --deepspeed ds_config.json, or --deepspeed "
                             "ds_config.json alone to tune the built-in workload")
        path = Path(args.tune_ds_config)
        at = autotuning_of(read_ds_config(path), 1)
        model, seq_len = args.model or BUILTIN_MODEL, args.seq_len or BUILTIN_SEQ_LEN
        script_args = ("--model", model, "--seq_len", str(seq_len), "--steps", str(at.end_profile_step + 1),
                       "--warmup", "0")
        return UserCommand(BUILTIN_SCRIPT, script_args, "--deepspeed_config", path), model, seq_len
    if not Path(args.script).is_file():
        raise ValueError(f"training script {args.script}: no such file; give the path of the script to tune")
    try:
        command = split_user_command(args.script, args.script_args)
    except ValueError:
        if not args.tune_ds_config:
            raise
        raise _config_before_the_script(args) from None
    if args.tune_ds_config and command.ds_config_path.resolve() != Path(args.tune_ds_config).resolve():
        raise _config_before_the_script(args)
    return command, args.model, args.seq_len


def _config_before_the_script(args: argparse.Namespace) -> ValueError:
    """--deepspeed before the script is the built-in workload's flag: the script would never see that config."""
    name = Path(args.script).name
    return ValueError(f"--deepspeed {args.tune_ds_config} before the script configures the built-in workload; pass "
                      f"the ds_config among {name}'s arguments, as the script reads it (e.g. {name} --deepspeed_config "
                      f"{args.tune_ds_config})")


def _default_hardware() -> str:
    if os.environ.get("DS_ACCELERATOR") == "cpu" or shutil.which("nvidia-smi") is None:
        return "cpu"
    raise ValueError("which GPU is this? give --hardware (a data/hardware name or YAML)")


def settings_from_args(args: argparse.Namespace) -> TuneSettings:
    """Validated settings (argparse has range-checked the numbers); the model stays empty when it must come from a
    profiling run."""
    explore = tuple(i.strip() for i in args.explore.split(",") if i.strip() not in ("", "none"))
    for item in explore:
        if item not in EXPLORABLE:
            raise ValueError(f"--explore {item!r}: use any of {', '.join(EXPLORABLE)} or none")
    command, model, seq_len = _command(args)
    doc, mapped = trainer_arg_mappings(read_ds_config(command.ds_config_path, command.ds_config_flag), command.args)
    for key in mapped:
        print(f"zerotune tune: ds_config {key} is \"auto\" and the script is a Hugging Face Trainer's: each "
              f"experiment sets it through {dict(zip(BATCH_KEYS, TRAINER_FLAGS))[key]} (autotuning.arg_mappings)")
    hardware = args.hardware or _default_hardware()
    hw = load_hardware(hardware)
    num_nodes, num_gpus = _resources(args, hw.num_devices_per_node)
    ClusterSpec(hw, num_nodes, num_gpus)  # --num_gpus within the node, before anything runs
    at = autotuning_of(doc, num_nodes * num_gpus)  # the autotuning section's numbers, before anything runs
    check_arg_mappings(doc, command.args, at.arg_mappings)  # and its batch flags, before the profiling run
    env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")} if hw.kind == "cpu" else {}
    return TuneSettings(command, doc, model or "", hardware, num_gpus, num_nodes, args.hostfile, seq_len,
                        args.top_k, args.profile, args.timeout_s, env,
                        int(args.memory_cap_gib * GIB) if args.memory_cap_gib else None, explore, args.run,
                        _launcher_options(args))


def _script_optimizer(doc: dict[str, Any], impl: OptimizerImpl | None, cfg: DSConfig) -> DSConfig:
    """`cfg` costed with the script's own optimizer (as the profiling run read it) when the ds_config builds none."""
    return cfg if impl is None or "optimizer" in doc else cfg.replace(optimizer_impl=impl)


def _with_script_optimizer(settings: TuneSettings, space: SearchSpace) -> SearchSpace:
    """Every variant of the space costed with the script's own optimizer (_script_optimizer)."""
    return replace(space, variants=tuple(_script_optimizer(settings.doc, settings.optimizer_impl, v)
                                         for v in space.variants))


@dataclass(frozen=True)
class ProfileOutcome:
    """The profiling run: the model YAML it wrote, the sequence length it saw, and its measurement."""

    model_path: str
    seq_len: int | None
    measurement: Measurement | None
    """Its step time and peak memory, for the tuner's correction (None when it measured nothing)."""
    optimizer_impl: OptimizerImpl | None = None
    """The script's optimizer as the run read it (ProfiledRun.optimizer_impl)."""
    device_matmul: MatmulPace | None = None
    """The device's matmul pace the run timed (TuneSettings.device_matmul)."""
    device_copy_bytes_per_s: float | None = None
    """The device's copy pace the run timed (TuneSettings.device_copy_bytes_per_s)."""
    activation_checkpointing: bool = False
    """Whether the script recomputed its blocks in backward (TuneSettings.script_checkpointing)."""
    precision: Precision | None = None
    """The precision of the engine's weights (TuneSettings.script_precision)."""


def _profile_measurement(settings: TuneSettings, profiled: ProfiledRun, cfg: DSConfig, run: RunResult,
                         model_path: str, seq_len: int) -> Measurement | None:
    """DeepSpeed's engine timing (autotuning metrics) when written, else the hook's median wall step."""
    world = settings.num_nodes * settings.num_gpus
    samples = cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * world // cfg.mp_size
    step_s = median_step_s(profiled)
    if run.status == "ok" and run.metrics is not None:
        try:
            step_s = window_step_s(run, samples, autotuning_of(settings.doc, world))
        except ValueError:
            pass
    if step_s is None:
        return None
    return Measurement(model=model_path, hardware=settings.hardware, num_nodes=settings.num_nodes,
                       num_gpus_per_node=settings.num_gpus, seq_len=seq_len, config=cfg, status="ok", step_s=step_s,
                       throughput_samples_per_s=samples / step_s, step_s_rel_error=step_rel_error(profiled),
                       peak_memory_bytes=profiled.peak_memory_bytes, source=str(run.run_dir),
                       reason="zerotune tune's profiling run")


def _check_followed(settings: TuneSettings, profiled: ProfiledRun, micro_batch: int, run_dir: Path) -> None:
    """ValueError (one line) when the profiling run's engine did not run the micro-batch of the ds_config it was
    given: the script builds its engine from a config of its own (a dict, or a path from its own flag), so no
    experiment would run what it is named for and every measurement would be scored at the wrong batch."""
    ran = profiled.engine_micro_batch
    if ran is None or ran == micro_batch:
        return
    flag = settings.command.ds_config_flag
    raise ValueError(f"the profiling run of {settings.command.script} asked for train_micro_batch_size_per_gpu "
                     f"{micro_batch} through {flag} but its DeepSpeed engine ran {ran} (see {run_dir}): the script "
                     f"builds the engine from a config of its own; make it pass the {flag} file to "
                     f"deepspeed.initialize (args=args or config=args.{flag.lstrip('-')}), as DeepSpeed's autotuner "
                     f"also requires")


def profile_model(settings: TuneSettings, launcher: Launcher = launch) -> ProfileOutcome:
    """One run of the script at the space's smallest micro-batch, measured by DeepSpeed's engine like an
    experiment, with calibrate/profiling_site reading the model inside the user's process (zerotune.validate.profiled).
    Writes model_profiled.yaml in the results folder; ValueError (one line) when the model cannot be read."""
    world = settings.num_nodes * settings.num_gpus
    at = autotuning_of(settings.doc, world)
    space = space_from_ds_config(settings.doc, world_size=world, explore=())
    cfg = space.variants[0].replace(train_micro_batch_size_per_gpu=min(space.micro_batches))
    run_dir = Path(at.results_dir) / "profile"
    prefix = (run_dir / "profiled").resolve()
    for old in run_dir.glob("profiled.*.json"):
        old.unlink()
    doc = experiment_ds_config(cfg, world, at)
    spec = _launch_spec(settings, doc, run_dir, rewrite_args(settings.command.args, at.arg_mappings, doc))
    run = launcher(replace(spec, env=profiling_env(spec.env, prefix)))
    name = f"profiled-{settings.command.script.stem}"
    try:
        profiled = read_profiled(prefix, name, world)
    except ValueError as exc:
        why = f"{run.status}{': ' + run.reason if run.reason else ''}"
        raise ValueError(f"the profiling run of {settings.command.script} could not read the model: {exc} ({why}; see "
                         f"{run_dir}); give --model (catalog name, model YAML or config.json) and --seq_len") from None
    _check_followed(settings, profiled, cfg.train_micro_batch_size_per_gpu, run_dir)
    seq_len, precision = settings.seq_len or profiled.seq_len, precision_of_dtype(profiled.dtype)
    cfg = _as_the_script_runs(_script_optimizer(settings.doc, profiled.optimizer_impl, cfg),
                              replace(settings, script_checkpointing=profiled.activation_checkpointing,
                                      script_precision=precision))
    if seq_len is None:
        raise ValueError(f"the profiling run of {settings.command.script} saw no token input (micro-batch x sequence);"
                         f" give --seq_len")
    path = Path(at.results_dir) / "model_profiled.yaml"
    write_text_atomic(path, model_yaml(profiled, f"read by zerotune tune's profiling run of "
                                                f"{settings.command.script} ({run_dir})"))
    measurement = _profile_measurement(settings, profiled, cfg, run, str(path), seq_len)
    if measurement is not None:
        (run_dir / "measurement.jsonl").unlink(missing_ok=True)
        append_jsonl(run_dir / "measurement.jsonl", [measurement])
    return ProfileOutcome(str(path), seq_len, measurement, profiled.optimizer_impl, profiled.matmul,
                          profiled.copy_bytes_per_s, profiled.activation_checkpointing, precision)


def _changed_flags(given: Sequence[str], optimal_cmd: Sequence[str], flags: Iterable[str]) -> str:
    """'flag value, ...' of the mapped flags (autotuning.arg_mappings: a Trainer's --per_device_train_batch_size, a
    script's own --batch_size) whose value the optimal command sets other than the user's arguments do."""
    changed = [(f, flag_value(optimal_cmd, f)) for f in dict.fromkeys(f.strip() for f in flags)]
    return ", ".join(f"{f} {v}" for f, v in changed if v is not None and v != flag_value(given, f))


def run_tune(args: argparse.Namespace, launcher: Launcher = launch) -> int:
    """The `tune` verb: 0 when a configuration was measured (and --run trained), 1 when none finished,
    130 on Ctrl-C; user mistakes raise ValueError (the CLI prints one line and exits 2)."""
    settings = settings_from_args(args)
    try:
        initial: tuple[Measurement, ...] = ()
        if not settings.model:
            profiled = profile_model(settings, launcher)
            settings = replace(settings, model=profiled.model_path, seq_len=profiled.seq_len,
                               optimizer_impl=profiled.optimizer_impl, device_matmul=profiled.device_matmul,
                               device_copy_bytes_per_s=profiled.device_copy_bytes_per_s,
                               script_checkpointing=profiled.activation_checkpointing,
                               script_precision=profiled.precision)
            initial = (profiled.measurement,) if profiled.measurement else ()
        outcome = tune(settings, launcher, initial=initial)
    except KeyboardInterrupt:
        print("zerotune tune: interrupted; every rank was stopped. Rerun the same command to resume.", file=sys.stderr)
        return 130
    print(outcome.layout.summary.read_text())
    if outcome.best is None:
        print(f"zerotune tune: no experiment finished; see {outcome.layout.summary}", file=sys.stderr)
        return 1
    print(f"zerotune tune: optimal {outcome.best.name} ({outcome.best.metric_value:.4g}); wrote "
          f"{outcome.layout.optimal_config} and {outcome.layout.optimal_cmd}")
    world = settings.num_nodes * settings.num_gpus
    given = batch_as_given(settings.doc, settings.command.args, autotuning_of(settings.doc, world).arg_mappings)
    advice = lr_advice(given, outcome.best.config, world)
    if advice:
        print(f"zerotune tune: {advice}")
    changed = _changed_flags(settings.command.args, outcome.optimal_cmd,
                             (autotuning_of(settings.doc, world).arg_mappings or {}).values())
    if changed:
        print(f"zerotune tune: {outcome.layout.optimal_config.name} goes with the script's arguments in "
              f"{outcome.layout.optimal_cmd.name} ({changed}): run that command, or give those values yourself (the "
              f"Hugging Face Trainer refuses a ds_config whose batch differs from its arguments)")
    if not settings.run_after:
        return 0
    return subprocess.call(list(outcome.optimal_cmd), env={**os.environ, **settings.env})
