"""`zerotune tune`: DeepSpeed's `--autotuning tune|run`, but it runs only the configurations the model ranks
best and stops as soon as measurement settles the race.

    zerotune tune [--run] [--num_gpus N] [--num_nodes M] [--hostfile F] [--top_k K] [--profile P]
                  [--model M] [--hardware H] [--seq_len S] [--timeout_s T] user_script.py --deepspeed ds.json ...

Workflow: (1) the model from --model, or from one short profiling run of the script
(zerotune.validate.profiling_run: the model read inside the user's process, its step measured);
(2) rank the whole space (zerotune.predictor.space reads the ds_config as DeepSpeed's autotuner does, keeping the
user's zero_optimization, offload included) with the cluster's calibration profile when there is one
(zerotune.validate.calibration);
(3) run the most promising configuration as a real experiment (zerotune.validate.runs, through
zerotune.calibrate.launch: own folder, own master port, mapped arguments rewritten, DeepSpeed's engine timing
start_profile_step..end_profile_step);
(4) correct the predictions with what was measured, by family (zerotune.validate.search: errors are shared within a
ZeRO stage / offload / checkpointing family and smooth in micro-batch), choose the next experiment by expected
improvement, and stop when no remaining configuration's optimistic band beats the measured best; never more
than top_k (and tuner_num_trials) experiments, a ceiling the stopping rule usually stays under. Each experiment
takes the whole --num_gpus x --num_nodes the tuned configuration is for, so experiments run one at a time
(DeepSpeed's tuner also gives full-size experiments the whole allocation). The command line and its checks:
zerotune.validate.settings.

Zerotune's own departures: `autotuning.overwrite` defaults to false (DeepSpeed: true), so rerunning an
interrupted tune resumes it and skips what finished; `metric: latency` is minimised.
"""

from __future__ import annotations

import argparse
import collections
import os
import shlex
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from zerotune.calibrate.launch import deepspeed_command, launch
from zerotune.calibrate.measurement import Measurement, append_jsonl
from zerotune.predictor import Efficiency, Job, estimate, experiment_name
from zerotune.predictor.dsconfig import AutotuningConfig
from zerotune.predictor.rank import MAXIMISED, Metric, SpaceTable, Uncertainty, _band, evaluate_space, rank
from zerotune.predictor.space import SearchSpace, explorable_on, space_from_ds_config
from zerotune.predictor.units import GIB
from zerotune.validate.calibration import (Calibration, allreduce_paced, calibration_for, host_paced,
                                           micro_paced, paced, update_paced)
from zerotune.validate.experiments import (TRAINER_FLAGS, batch_as_given, check_arg_mappings, flag_value,
                                           optimal_ds_config, rewrite_args)
from zerotune.validate.plan import build_job, check_parallelism
from zerotune.validate.plots import plot_predicted_vs_measured, plot_space
from zerotune.validate.profiled_inputs import expected_longest
from zerotune.validate.profiling_run import (as_the_script_runs, moe_space, profile_model, trainable_space,
                                             with_script_optimizer)
from zerotune.validate.results import (ExperimentResult, Layout, best_result, format_summary, lr_advice, near_ties,
                                       write_json_atomic, write_text_atomic)
from zerotune.validate.runs import (EARLY_STOP_MARGIN, ENDED_EARLY, finished_earlier, launch_spec,
                                   max_samples_for_window, measurement_of, run_experiment, window_rel_error)
from zerotune.validate.search import (MEASURED, NOISE_STD, Choice, Observation, SearchTable, already_measured,
                                      candidate_table, choice_at, fit_probabilities, measured_job,
                                      measured_memory_ratio, observation_of, prediction_of, run_search)
from zerotune.validate.settings import BUILTIN_SCRIPT, Launcher, TuneSettings, autotuning_of, settings_from_args

__all__ = ["TuneOutcome", "tune", "run_tune", "EXPERIMENT_STARTUP_S"]

EXPERIMENT_STARTUP_S = 20.0
"""Wall seconds an experiment takes before its first step: DeepSpeed's launcher, the process group and the engine
(15-25 s a warm run on this project's 2-core CPU machine; more on GPU nodes, where it only makes the step times
matter less). The search weighs expected improvement against start-up plus the timed steps."""


@dataclass(frozen=True)
class TuneOutcome:
    results: tuple[ExperimentResult, ...]
    best: ExperimentResult | None
    stop_reason: str
    layout: Layout
    optimal_cmd: tuple[str, ...] = ()
    duration_s: float = 0.0


# -- predictions and measurements ---------------------------------------------------------------------

def _nothing_fits(job: Job, space: SearchSpace, efficiency: Efficiency, uncertainty: Uncertainty) -> ValueError:
    least = rank(job, space, efficiency, "throughput", 1, 0.0, uncertainty).least_memory
    return ValueError(f"no configuration of the space fits {job.cluster.hardware.name} "
                      f"({least.memory.capacity_bytes / GIB:.1f} GiB): the least memory is "
                      f"{least.memory.total_bytes / GIB:.1f} GiB ({experiment_name(least.config)}); widen the space "
                      f"(stage 3, offload, checkpointing, smaller micro-batches), add GPUs or shorten --seq_len")


def _first_predictions(job: Job, model: Calibration, measured: Sequence[Measurement], metric: Metric) -> list[str]:
    """The uncorrected prediction of each earlier measurement against what it measured, one line each."""
    lines = []
    for m in measured:
        if m.status != "ok" or not m.measured_step_s:
            continue
        step_s = estimate(measured_job(job, m), m.config, model.efficiency).time.step_s
        low, high = _band(m.samples_per_step / step_s, "throughput", model.uncertainty.step_time_rel)
        lines.append(f"zerotune tune: profiling run {experiment_name(m.config)}: measured "
                     f"{m.samples_per_step / m.measured_step_s:.4g} samples/s, predicted {m.samples_per_step / step_s:.4g}"
                     f" (band {low:.4g}-{high:.4g}); the predictions are corrected with it"
                     + (f", weighted as a measurement within +-{m.step_s_rel_error:.0%} (its steps spread)"
                        if (m.step_s_rel_error or 0) > NOISE_STD else ""))
    return lines


# -- the loop ------------------------------------------------------------------------------------------------

def _observation(table: SearchTable, index: int, result: ExperimentResult, job: Job,
                 efficiency: Efficiency, at: AutotuningConfig) -> Observation:
    cands = table.candidates
    used = None
    if result.status == "ok" and result.peak_memory_bytes:
        used = measured_memory_ratio(estimate(job, table.config(index), efficiency).memory,
                                     job.cluster.hardware.kind, result.peak_memory_bytes)
    spread = window_rel_error(result, at) if result.status in MEASURED else None  # as measurement_of records it
    return Observation(cands.families[cands.family[index]], int(cands.micro_batch[index]), float(cands.step_s[index]),
                       float(cands.memory_ratio[index]), result.status,
                       result.step_s if result.status in MEASURED else None, index, measured_memory_ratio=used,
                       max_samples_per_step=max_samples_for_window(result, job.cluster.world_size, at),
                       noise_std=max(NOISE_STD, spread or 0.0))


def _resumed(settings: TuneSettings, job: Job, at: AutotuningConfig, layout: Layout, table: SearchTable,
             log: Callable[[str], None]) -> list[tuple[int, ExperimentResult]]:
    """The experiments an earlier tune of this script finished in this results folder (none with overwrite)."""
    if at.overwrite or not any(layout.results_dir.glob("*/exp.json")):
        return []
    configs = {}
    for index in range(len(table.candidates)):
        cfg = table.config(index)
        configs.setdefault(experiment_name(cfg), (index, cfg))
    earlier = finished_earlier(settings, job, at, layout, configs)
    for _, result in earlier:
        log(f"zerotune tune: resumed {result.name} from an earlier tune in {layout.results_dir}: {result.status}"
            + (f", {at.metric} {result.metric_value:.4g}" if result.metric_value is not None else ""))
    return earlier


class ScriptBroken(Exception):
    """The script failed the same way in every run so far and has never trained: no configuration will change that
    (an import error, a typo, a missing file), so the budget is not spent on it."""


def _check_script_runs(settings: TuneSettings, results: Sequence[ExperimentResult],
                       initial: Sequence[Measurement]) -> None:
    """ScriptBroken after two experiments that failed with the same reason while nothing (profiling run included)
    has trained, or while the same configuration trained at a smaller micro-batch (_fails_larger); a run that
    ended before the engine's window is left to max_samples_for_window."""
    if len(results) < 2:
        return
    last, before = results[-1], results[-2]
    if not (last.status == before.status == "failed" and last.reason == before.reason
            and not last.reason.startswith(ENDED_EARLY)):
        return
    _fails_larger(settings, (before, last), initial, results)
    trained = any(m.status in ("ok", "oom") for m in initial) or any(
        r.status in ("ok", "stopped", "oom") for r in results)
    if not trained:
        raise ScriptBroken(f"training script {settings.command.script}: experiments {before.name} and {last.name} "
                           f"failed the same way and nothing has trained ({last.reason}); make the script train "
                           f"under deepspeed with this ds_config, then rerun")


def _fails_larger(settings: TuneSettings, failed: Sequence[ExperimentResult], initial: Sequence[Measurement],
                  results: Sequence[ExperimentResult]) -> None:
    """ScriptBroken when experiments failed the same way (not out of memory) and a run of one of them, the same in
    everything but a smaller micro-batch (and accumulation), trained: the script fails from some micro-batch on (a
    .view() of a sliced tensor, a shape written for batch 1), and every larger configuration would fail alike.
    Seen on this project's CPU VM (2026-11-29): a decoder script's `labels.view(-1)` of `ids[:, 1:]` trained in
    the profiling run at micro-batch 1 and failed in all 8 experiments at micro-batch 50, ZeRO-2's knobs varied."""
    trained = [(m.config, "the profiling run" if i == 0 else f"run {i}")
               for i, m in enumerate(initial) if m.status in ("ok", "stopped")]
    trained += [(r.config, r.name) for r in results if r.status in ("ok", "stopped")]
    for f in failed:
        mb = f.config.train_micro_batch_size_per_gpu
        for cfg, name in trained:
            smaller = cfg.train_micro_batch_size_per_gpu
            same = experiment_name(cfg.replace(train_micro_batch_size_per_gpu=mb, gradient_accumulation_steps=f.config
                                               .gradient_accumulation_steps)) == experiment_name(f.config)
            if same and smaller < mb:
                low = min(r.config.train_micro_batch_size_per_gpu for r in failed)
                raise ScriptBroken(f"training script {settings.command.script} fails at larger micro-batches: fix "
                                   f"it (the traceback is in its runs' stderr.log) or set autotuning."
                                   f"max_train_micro_batch_size_per_gpu below {low}, then rerun; {name} trained at "
                                   f"micro-batch {smaller}, and the same configuration at micro-batch {mb} failed "
                                   f"({failed[0].name} and {failed[1].name} alike: {f.reason})")


def _search(settings: TuneSettings, job: Job, at: AutotuningConfig, layout: Layout, model: Calibration,
            table: SearchTable, launcher: Launcher, log: Callable[[str], None], results: list[ExperimentResult],
            initial: Sequence[Measurement] = (), earlier: Sequence[tuple[int, ExperimentResult]] = ()) -> str:
    """Run experiments into `results` until the stopping rule or the budget ends it (zerotune.validate.search decides
    which); returns why it stopped. `earlier`: (candidate index, result) of an earlier tune's experiments
    (_resumed), measured configurations to the search that spend no budget."""
    metric, budget = at.metric, min(settings.top_k, at.tuner_num_trials)

    def run(choice: Choice) -> Observation:
        assert choice.index is not None
        cfg = table.config(choice.index)
        prediction = prediction_of(choice, metric, float(table.table.memory_bytes.ravel()[choice.index]))
        limit = f"at most {budget}" + (f" after the {len(earlier)} resumed" if earlier else "")
        log(f"zerotune tune: experiment {len(results) + 1} ({limit}) {experiment_name(cfg)} (predicted "
            f"{metric} {prediction.metric_value:.4g}, band {prediction.metric_low:.4g}-{prediction.metric_high:.4g}"
            + (f", fits with p={choice.fit_probability:.2f}" if choice.fit_probability < 1 else "") + ")")
        result = run_experiment(settings, job, at, layout, len(results), cfg, prediction, launcher,
                                best_result(results, metric))
        spread = window_rel_error(result, at)
        log(f"  -> {result.status}" + (" (resumed)" if result.resumed else "")
            + (f": {metric} {result.metric_value:.4g}" if result.metric_value is not None else f": {result.reason}")
            + (f" (its steps spread: weighted as a measurement within +-{spread:.1%})"
               if result.metric_value is not None and spread is not None and spread > NOISE_STD else ""))
        results.append(result)
        _check_script_runs(settings, results, initial)
        return _observation(table, choice.index, result, job, model.efficiency, at)

    initial_obs = [observation_of(job, model.efficiency, m) for m in initial]
    initial_obs += [_observation(table, index, result, job, model.efficiency, at) for index, result in earlier]
    done = already_measured(table, initial)
    done[[index for index, _ in earlier]] = True
    ran, reason = run_search(table.candidates, model.uncertainty, budget, run, initial_obs, done)
    rerun = _profiling_rerun(table, initial, best_result(results, metric), metric)
    if rerun is not None and len(ran) < budget:
        index, value = rerun
        log(f"zerotune tune: the profiling run ({experiment_name(table.config(index))}) measured {metric} "
            f"{value:.4g}, better than every experiment by more than their spread: running its configuration as an "
            f"experiment, to compare like with like")
        run(choice_at(table.candidates, initial_obs + ran, model.uncertainty, index))
        reason = (reason or f"the budget of {budget} experiments is spent") + \
            "; then the profiling run's configuration, which had measured better than every experiment, was rerun"
    if reason is not None:
        best = best_result(results, metric)
        return reason + (f" ({best.name}: {metric} {best.metric_value:.4g})" if best is not None else "")
    return f"stopped: the budget of {budget} experiments (top_k {settings.top_k}, tuner_num_trials " \
           f"{at.tuner_num_trials}) is spent"


def _optimal_cmd(settings: TuneSettings, layout: Layout, best: ExperimentResult, at: AutotuningConfig,
                 world_size: int) -> list[str]:
    doc = optimal_ds_config(best.config, world_size)
    args = rewrite_args(settings.command.args, at.arg_mappings, doc)
    spec = launch_spec(settings, doc, layout.results_dir, args)
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
    write_json_atomic(layout.optimal_config, optimal_ds_config(best.config, job.cluster.world_size, settings.doc,
                                                               job.model.hidden_size))
    cmd = _optimal_cmd(settings, layout, best, at, job.cluster.world_size)
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(settings.env.items())]
    write_text_atomic(layout.optimal_cmd, " ".join(env + [shlex.join(cmd)]) + "\n")
    return tuple(cmd)


def _plots(job: Job, space: SearchSpace, model: Calibration, results: Sequence[ExperimentResult], layout: Layout) -> None:
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


def tune(settings: TuneSettings, launcher: Launcher = launch, log: Callable[[str], None] = print,
         initial: Sequence[Measurement] = ()) -> TuneOutcome:
    """Rank, run the most promising experiments, write the results folder; see the module docstring.

    `initial`: measurements of this job made before the tune (a profiling run of the script, an earlier tune's
    measurements.jsonl). They correct the predictions exactly as experiments do (zerotune.validate.search) but are not
    experiments: they count against no budget, are not candidates for the optimum and are not written to the
    results folder; one that measured better than every experiment has its configuration run as an experiment
    when the budget allows (_profiling_rerun). Their `config` must be a configuration of this job (same GPUs,
    model, sequence length)."""
    start = time.monotonic()
    world = settings.num_nodes * settings.num_gpus
    at = autotuning_of(settings.doc, world)
    check_arg_mappings(settings.doc, settings.command.args, at.arg_mappings)
    job = build_job(settings.model, settings.hardware, settings.num_nodes, settings.num_gpus, settings.seq_len)
    check_parallelism(job, settings.doc)
    explore = _explorable(settings, job.cluster.hardware.kind)
    space = with_script_optimizer(settings, space_from_ds_config(settings.doc, world_size=world,
                                                                 hidden_size=job.model.hidden_size, explore=explore))
    if settings.script_checkpointing is False and "activation_checkpointing" in settings.doc \
            and settings.command.script != BUILTIN_SCRIPT:
        warnings.warn("ds_config activation_checkpointing: DeepSpeed's engine does not switch recomputation by this "
                      "section (only deepspeed.checkpointing.configure reads it) and the profiling run saw the script "
                      "recompute nothing; configurations are costed without checkpointing")
    variants = {repr(v): v for v in (as_the_script_runs(v, settings) for v in space.variants)}
    space = trainable_space(settings, moe_space(settings, replace(space, variants=tuple(variants.values())), log))
    model = update_paced(paced(calibration_for(settings, log), settings, log), job, initial, settings, log)
    model = micro_paced(model, job, initial, settings, log)
    model = host_paced(allreduce_paced(model, job, initial, settings, log), job, initial, settings, log)
    if initial:
        for line in _first_predictions(job, model, initial, at.metric):
            log(line)
    spaced = padding_paced(evaluate_space(job, space, model.efficiency), job, space, model.efficiency, settings)
    table = candidate_table(job, space, model.efficiency, at.metric, spaced)
    table = replace(table, candidates=table.candidates.with_cost(EXPERIMENT_STARTUP_S, at.end_profile_step + 1))
    if not fit_probabilities(table.candidates, [observation_of(job, model.efficiency, m) for m in initial],
                             model.uncertainty).any():
        raise _nothing_fits(job, space, model.efficiency, model.uncertainty)
    layout = Layout(Path(at.results_dir), Path(at.exps_dir))
    earlier = _resumed(settings, job, at, layout, table, log)
    results = [result for _, result in earlier]
    try:
        stop_reason = _search(settings, job, at, layout, model, table, launcher, log, results, initial, earlier)
    except KeyboardInterrupt:  # the launcher has killed its ranks; leave a consistent folder, then stop
        _write_outputs(settings, job, at, layout, results, "interrupted (Ctrl-C): rerun to resume",
                       time.monotonic() - start)
        raise
    except ScriptBroken as exc:  # the failures stay in the folder; a rerun retries them (failed runs do not resume)
        _write_outputs(settings, job, at, layout, results, f"stopped: {exc}", time.monotonic() - start)
        raise ValueError(str(exc)) from None
    duration_s = time.monotonic() - start
    faster = _faster_before(initial, best_result(results, at.metric), at.metric)
    if faster:
        log(f"zerotune tune: {faster}")
        stop_reason = f"{stop_reason}; note: {faster}"
    cmd = _write_outputs(settings, job, at, layout, results, stop_reason, duration_s)
    _plots(job, space, model, results, layout)
    return TuneOutcome(tuple(results), best_result(results, at.metric), stop_reason, layout, cmd, duration_s)


def padding_paced(table: SpaceTable, job: Job, space: SearchSpace, efficiency: Efficiency,
                  settings: TuneSettings) -> SpaceTable:
    """The space's step times where the script pads each batch to its longest sample (TuneSettings.input_lengths):
    a micro-batch of b samples on d data-parallel ranks goes at the pace of the longest of b x d samples, whose
    expected length (validate.profiled_inputs.expected_longest over the profiling run's batches) grows with b, where
    memory stays costed at the longest seen (the job's seq_len). Each distinct length is one evaluation of the
    space. Seen on this project's CPU VM (2026-11-28): an encoder over lengths 32-250 measured 15.8 samples/s at
    micro-batch 1 in its profiling run and 13.6-14.0 at micro-batches 6-14, which the model, costing every
    configuration at 250 positions, had ranked the other way."""
    lengths = settings.input_lengths
    if not lengths or not space.variants:
        return table
    dp = space.variants[0].dp_size(job.cluster.world_size)
    longest = max(lengths)
    step, flops = table.step_s.copy(), table.model_flops_per_gpu.copy()
    by_length: dict[int, SpaceTable] = {}
    for col, micro_batch in enumerate(table.micro_batch):
        draws = float(micro_batch) * dp / max(settings.input_micro_batch, 1)
        positions = round(job.seq_len * expected_longest(lengths, draws) / longest)
        if positions >= job.seq_len:
            continue
        if positions not in by_length:
            by_length[positions] = evaluate_space(replace(job, seq_len=max(positions, 1)), space, efficiency)
        paced = by_length[positions]
        step[:, col], flops[:, col] = paced.step_s[:, col], paced.model_flops_per_gpu[:, col]
    return replace(table, step_s=step, model_flops_per_gpu=flops)


def _better_before(initial: Sequence[Measurement], best: ExperimentResult | None, metric: Metric
                   ) -> list[tuple[Measurement, float, float]]:
    """(measurement, its metric, gain over the best experiment) of each measurement made before the search (the
    profiling run) that beat every experiment by more than the step-to-step spread (EARLY_STOP_MARGIN)."""
    if best is None or best.metric_value is None or metric == "flops":
        return []
    beaten = []
    for m in initial:
        if m.status != "ok" or not m.measured_step_s:
            continue
        value = m.samples_per_step / m.measured_step_s if metric == "throughput" else m.measured_step_s * 1e3
        gain = value / best.metric_value if MAXIMISED[metric] else best.metric_value / value
        if gain > 1.0 + EARLY_STOP_MARGIN:
            beaten.append((m, value, gain))
    return beaten


def _profiling_rerun(table: SearchTable, initial: Sequence[Measurement], best: ExperimentResult | None,
                     metric: Metric) -> tuple[int, float] | None:
    """(candidate index, measured metric) of a measurement made before the search (the profiling run) that beat every
    experiment (_better_before), when its configuration is a candidate: the search does not rerun it
    (already_measured), and its few steps ran under the profiling site's hooks, so it is run again as an experiment
    before anything is chosen. Seen on this project's CPU VM (2026-11-28): a script padding each batch to its
    longest sequence measured 15.8 samples/s at micro-batch 1 in the profiling run, 13.6-14.0 at micro-batches 6-14
    in the four experiments, and the tune chose micro-batch 6 (longer padding at larger micro-batches, which the
    model, costing every configuration at the longest length seen, does not tell apart)."""
    for m, value, _ in _better_before(initial, best, metric):
        indices = np.flatnonzero(already_measured(table, [m]))
        if len(indices):
            return int(indices[0]), value
    return None


def _faster_before(initial: Sequence[Measurement], best: ExperimentResult | None, metric: Metric) -> str | None:
    """What to tell the user when a measurement made before the search (the profiling run) beat the chosen
    configuration by more than the step-to-step spread and could not be rerun (_profiling_rerun: not a candidate,
    or the budget spent), or was and measured slower: either the machine's pace changed while the tune ran, or the
    profiling run's steps misled. Seen on this project's CPU VM (2026-11-28, two tunes of one nanoGPT-style script
    side by side with other jobs): the profiling run measured 4.64 samples/s at micro-batch 1, the chosen
    micro-batch 5 3.75."""
    beaten = _better_before(initial, best, metric)
    if not beaten or best is None:
        return None
    m, value, gain = beaten[0]
    return (f"the profiling run ({experiment_name(m.config)}) measured {metric} {value:.4g}, "
            f"{100 * (gain - 1):.0f}% better than the chosen {best.name}'s {best.metric_value:.4g}: the "
            f"machine's pace may have changed during the tune; rerun it, or run "
            f"{experiment_name(m.config)} yourself to compare")


def _changed_flags(given: Sequence[str], optimal_cmd: Sequence[str], flags: Iterable[str]) -> str:
    """'flag value, ...' of the mapped flags (autotuning.arg_mappings: a Trainer's --per_device_train_batch_size, a
    script's own --batch_size) whose value the optimal command sets other than the user's arguments do."""
    changed = [(f, flag_value(optimal_cmd, f)) for f in dict.fromkeys(f.strip() for f in flags)]
    return ", ".join(f"{f} {v}" for f, v in changed if v is not None and v != flag_value(given, f))


def run_tune(args: argparse.Namespace, launcher: Launcher = launch) -> int:
    """The `tune` verb: 0 when a configuration was measured (and --run trained), 1 when none finished,
    130 on Ctrl-C (143 on SIGTERM, 129 on SIGHUP); user mistakes raise ValueError (the CLI prints one line and
    exits 2)."""
    settings = settings_from_args(args)
    try:
        initial: tuple[Measurement, ...] = ()
        if not settings.model:
            profiled = profile_model(settings, launcher)
            settings = replace(settings, model=profiled.model_path, seq_len=profiled.seq_len,
                               optimizer_impl=profiled.optimizer_impl, device_matmul=profiled.device_matmul,
                               device_copy_bytes_per_s=profiled.device_copy_bytes_per_s,
                               device_copy_curve=profiled.device_copy_curve,
                               device_fresh_copy_bytes_per_s=profiled.device_fresh_copy_bytes_per_s,
                               device_dropout_s_per_element=profiled.device_dropout_s_per_element,
                               script_checkpointing=profiled.activation_checkpointing,
                               script_precision=profiled.precision, script_moe=profiled.native_moe,
                               profiled_step_phase_s=profiled.step_phase_s, profiled_update_s=profiled.update_s,
                               profiled_allreduce_s=profiled.allreduce_s, profiled_forward_s=profiled.forward_s,
                               profiled_backward_s=profiled.backward_s,
                               input_lengths=profiled.input_lengths, input_micro_batch=profiled.input_micro_batch,
                               script_min_stage=profiled.min_stage)
            initial = tuple(m for m in (profiled.out_of_memory, profiled.measurement) if m is not None)
        outcome = tune(settings, launcher, initial=initial)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (calibrate.launch.terminate_as_interrupt)
        print("zerotune tune: interrupted; every rank was stopped. Rerun the same command to resume.", file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)
    print(outcome.layout.summary.read_text())
    if outcome.best is None:
        reasons = collections.Counter(r.reason.split(";")[0] for r in outcome.results if r.reason)
        why = f" ({len(outcome.results)} ran; most often: {reasons.most_common(1)[0][0]})" if reasons else ""
        print(f"zerotune tune: no experiment finished{why}; see {outcome.layout.summary}", file=sys.stderr)
        return 1
    print(f"zerotune tune: optimal {outcome.best.name} ({outcome.best.metric_value:.4g}); wrote "
          f"{outcome.layout.optimal_config} and {outcome.layout.optimal_cmd}")
    world = settings.num_nodes * settings.num_gpus
    tie = near_ties(outcome.results, autotuning_of(settings.doc, world).metric)
    if tie:
        print(f"zerotune tune: {tie}")
    given = batch_as_given(settings.doc, settings.command.args, autotuning_of(settings.doc, world).arg_mappings)
    advice = lr_advice(given, outcome.best.config, world)
    if advice:
        print(f"zerotune tune: {advice}")
    changed = _changed_flags(settings.command.args, outcome.optimal_cmd,
                             (autotuning_of(settings.doc, world).arg_mappings or {}).values())
    if changed:
        why = ("the Hugging Face Trainer refuses a ds_config whose batch differs from its arguments"
               if any(flag in changed for flag in TRAINER_FLAGS) else "the script takes its batch from them")
        print(f"zerotune tune: {outcome.layout.optimal_config.name} goes with the script's arguments in "
              f"{outcome.layout.optimal_cmd.name} ({changed}): run that command, or give those values yourself ({why})")
    if not settings.run_after:
        return 0
    return subprocess.call(list(outcome.optimal_cmd), env={**os.environ, **settings.env})
