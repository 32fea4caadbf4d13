"""What `tune`'s search works on: every configuration of the space it may run, flattened, with the model's
predictions (Candidates, built by candidate_table), and each configuration that ran (Observation, from a given
measurement by observation_of). zerotune.validate.search chooses among them, zerotune.validate.bounds holds them
to what DeepSpeed's structure allows."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from zerotune.calibrate.measurement import Measurement, Status
from zerotune.predictor.dsconfig import DSConfig
from zerotune.predictor.job import Efficiency, Job
from zerotune.predictor.memory import MemoryEstimate
from zerotune.predictor.rank import MAXIMISED, Metric, SpaceTable, evaluate_space
from zerotune.predictor.space import SearchSpace

__all__ = ["FamilyKey", "family_of", "larger_batch_better", "Candidates", "Observation", "metric_gain",
           "measured_memory_ratio",
           "metric_of_goodness", "MEASURED", "NOISE_STD", "SearchTable", "candidate_table", "already_measured",
           "measured_job", "observation_of"]

FamilyKey = tuple[int, str, str, bool, int, int]
"""(ZeRO stage, optimizer offload device, parameter offload device, activation checkpointing, tp, pp)."""
NOISE_STD = 0.02
"""Measurement noise of a log step time (run-to-run spread of DeepSpeed's engine timers, a few percent)."""
MEASURED = ("ok", "stopped")
"""Statuses whose step time was measured (a stopped run for fewer steps): both correct the predictions and
both fitted in memory; only ok runs compete for the optimum."""


def larger_batch_better(metric: Metric, hardware_kind: str) -> bool:
    """Candidates.larger_batch_better for a metric on a kind of device."""
    return metric != "latency" and hardware_kind != "cpu"


def family_of(cfg: DSConfig) -> FamilyKey:
    z = cfg.zero
    return (z.stage, z.offload_optimizer.device, z.offload_param.device, cfg.activation_checkpointing.enabled,
            cfg.mp_size, cfg.pp_size)


def metric_gain(metric: Metric, samples_per_step: np.ndarray, model_flops_per_gpu: np.ndarray) -> np.ndarray:
    """log of the metric's numerator: goodness = gain - log(step_s) is log(metric) for throughput (samples/s)
    and flops (FLOP/s per GPU), and -log(latency in ms) for latency, so larger goodness is always better."""
    if metric == "throughput":
        return np.log(np.asarray(samples_per_step, dtype=float))
    if metric == "flops":
        return np.log(np.asarray(model_flops_per_gpu, dtype=float))
    return np.full(np.shape(samples_per_step), -math.log(1e3))


def metric_of_goodness(metric: Metric, goodness: float) -> float:
    return math.exp(goodness) if MAXIMISED[metric] else math.exp(-goodness)


@dataclass(frozen=True)
class Candidates:
    """Every configuration the search may run, flattened, with the model's predictions."""

    families: tuple[FamilyKey, ...]
    family: np.ndarray
    """Index into `families`, per configuration."""
    micro_batch: np.ndarray
    step_s: np.ndarray
    """Predicted seconds per optimizer step."""
    memory_ratio: np.ndarray
    """Predicted peak over capacity (the device's or the node's host memory, whichever is tighter)."""
    gain: np.ndarray
    """metric_gain of each configuration."""
    cost_s: np.ndarray | None = None
    """Predicted wall seconds of running each as an experiment (start-up plus the timed steps); None: all alike."""
    samples_per_step: np.ndarray | None = None
    """Samples per optimizer step (micro-batch x accumulation x data-parallel ranks) of each configuration; None
    where unknown (the replay), which leaves Observation.max_samples_per_step unused."""
    larger_batch_better: bool = True
    """Whether a family's metric may be taken to grow with the micro-batch (_dominated's micro-batch bound):
    throughput and FLOP/s on a GPU. Not latency (a step's time grows with the micro-batch), and not on the CPU,
    where a larger micro-batch's working set outgrows the caches: DeepSpeed's autotuner measured a 4 x 384
    encoder's ZeRO-0 at 15.7, 15.2 and 14.8 samples/s at micro-batch 22, 27 and 32, and micro-batch 16 ran its
    forward at 38.6 ms a sample against 39.7 at 32 and its backward at 79 against 93 (2026-11-27, this
    machine's head to head)."""

    def __len__(self) -> int:
        return len(self.step_s)

    def with_cost(self, startup_s: float, steps: int) -> "Candidates":
        """These candidates with cost_s = startup_s + steps x the predicted step."""
        return replace(self, cost_s=startup_s + steps * self.step_s)


@dataclass(frozen=True)
class Observation:
    """A configuration that was run: an experiment of this search, or a measurement given beforehand."""

    family: FamilyKey
    micro_batch: int
    predicted_step_s: float
    memory_ratio: float
    status: Status
    step_s: float | None = None
    index: int | None = None
    """The candidate it ran, when it is one."""
    noise_std: float = NOISE_STD
    """Standard error of log(step_s): NOISE_STD, or more for a run whose few steps spread widely (the profiling run
    at the smallest micro-batch)."""
    measured_memory_ratio: float | None = None
    """The run's memory ratio with its measured peak in place of the predicted live bytes (measured_memory_ratio),
    where the run recorded one: it pins the memory model's scale (search.candidate_memory_bounds)."""
    max_samples_per_step: float | None = None
    """For a run that ended before DeepSpeed's engine reached the profile window (the script's data or its own step
    count ran out: validate.runs.ENDED_EARLY), the most samples per optimizer step a configuration may take and
    still reach it; the search runs nothing above it."""


# -- the space of `tune` as candidates ----------------------------------------------------------------------

@dataclass(frozen=True)
class SearchTable:
    """The space as the search sees it: Candidates and the configuration behind each index."""

    table: SpaceTable
    candidates: Candidates
    model_flops_per_gpu: np.ndarray

    def config(self, index: int) -> DSConfig:
        return self.table.config(*divmod(index, self.table.micro_batch.shape[0]))


def candidate_table(job: Job, space: SearchSpace, efficiency: Efficiency, metric: Metric,
                    table: SpaceTable | None = None) -> SearchTable:
    """Every configuration of the space with its prediction, flattened (variant-major, as rank orders ties);
    `table`: the space already evaluated (evaluate_space), with any correction the caller made."""
    table = evaluate_space(job, space, efficiency) if table is None else table
    hw = job.cluster.hardware
    ratio = np.maximum(table.memory_bytes / hw.memory_bytes, table.host_bytes_per_node / hw.host_memory_bytes)
    families = [family_of(v) for v in table.variants]
    keys = tuple(dict.fromkeys(families))
    family = np.repeat(np.array([keys.index(f) for f in families]), table.micro_batch.shape[0])
    flops = np.asarray(table.model_flops_per_gpu, dtype=float).ravel()
    samples = np.asarray(table.samples_per_step, dtype=float).ravel()
    cands = Candidates(keys, family, np.tile(table.micro_batch, len(table.variants)), table.step_s.ravel(),
                       ratio.ravel(), metric_gain(metric, samples, flops), samples_per_step=samples,
                       larger_batch_better=larger_batch_better(metric, hw.kind))
    return SearchTable(table, cands, flops)


def already_measured(table: SearchTable, measurements: Sequence[Measurement]) -> np.ndarray:
    """Per candidate: whether a given measurement ran its family at its micro-batch and accumulation (the profiling
    run: the user's ds_config at the smallest micro-batch; its buckets may differ from the candidate's, which the
    model does not tell apart at that size). Rerunning it would only measure it again: a script with checkpointing
    on the CPU had its first experiment spent on the profiling run's configuration, the cheapest to run."""
    cands = table.candidates
    accumulation = np.tile(table.table.grad_accum, len(table.table.variants))
    done = np.zeros(len(cands), dtype=bool)
    for m in measurements:
        family = family_of(m.config)
        if m.status in MEASURED and family in cands.families:
            done |= ((cands.family == cands.families.index(family))
                     & (cands.micro_batch == m.config.train_micro_batch_size_per_gpu)
                     & (accumulation == m.config.gradient_accumulation_steps))
    return done


def measured_job(job: Job, measurement: Measurement) -> Job:
    """The job as the measurement ran it: its own sequence length where that differs (a profiling run of a script
    that pads each batch to its longest sample ran at the mean length; the job is costed at the longest)."""
    if measurement.seq_len == job.seq_len:
        return job
    return replace(job, seq_len=measurement.seq_len)


def measured_memory_ratio(memory: MemoryEstimate, kind: str, peak_allocated_bytes: float | None) -> float | None:
    """The counterpart of a configuration's predicted memory ratio with the run's measured peak in it: the
    allocator's peak (torch.cuda.max_memory_allocated, Measurement.peak_memory_bytes) in place of the predicted
    live bytes (MemoryEstimate.live_bytes), the runtime's reserve and the allocator's slack as predicted, over the
    device's capacity. GPUs only: on the CPU the peak is the process's RSS, and the ranks of a node share its
    memory."""
    if kind != "gpu" or not peak_allocated_bytes or peak_allocated_bytes <= 0:
        return None
    return (peak_allocated_bytes + memory.total_bytes - memory.live_bytes) / memory.capacity_bytes


def observation_of(job: Job, efficiency: Efficiency, measurement: Measurement) -> Observation:
    """A measurement given to `tune` beforehand (`initial`), as the search's correction takes it."""
    from zerotune.predictor import estimate
    est = estimate(measured_job(job, measurement), measurement.config, efficiency)
    memory = est.memory
    ratio = max(memory.total_bytes / memory.capacity_bytes,
                memory.host_bytes_per_node / max(memory.host_capacity_bytes_per_node, 1.0))
    ok = measurement.status in ("ok", "stopped")
    return Observation(family_of(measurement.config), measurement.config.train_micro_batch_size_per_gpu,
                       est.time.step_s, ratio, measurement.status, measurement.measured_step_s if ok else None,
                       noise_std=max(NOISE_STD, measurement.step_s_rel_error or 0.0),
                       measured_memory_ratio=measured_memory_ratio(memory, job.cluster.hardware.kind,
                                                                   measurement.peak_memory_bytes) if ok else None)
