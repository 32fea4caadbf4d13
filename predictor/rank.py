"""Rank a whole tuning space by a metric, vectorised: every configuration's peak memory and step time at once.

For each variant of the space (ZeRO section x checkpointing) the memory and time formulas are evaluated
once over the array of (micro-batch, accumulation) pairs (memory.memory_columns, step_time.step_time_columns:
the same code a single prediction runs), so ranking 10^5-10^6 configurations costs a few hundred numpy
passes. Only the top entries are expanded into full Estimates with their breakdowns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from zerotune.predictor.dsconfig import DSConfig
from zerotune.predictor.estimate import Estimate, estimate
from zerotune.predictor.job import Efficiency, Job
from zerotune.predictor.memory import memory_columns
from zerotune.predictor.space import SearchSpace
from zerotune.predictor.step_time import step_time_columns

__all__ = ["Metric", "Uncertainty", "SpaceTable", "Ranked", "Ranking", "evaluate_space", "rank", "metric_value",
           "MAXIMISED"]

Metric = Literal["throughput", "latency", "flops"]
MAXIMISED = {"throughput": True, "flops": True, "latency": False}


@dataclass(frozen=True)
class Uncertainty:
    """Relative error bands of predictions; a calibration profile replaces these with its out-of-sample errors."""

    step_time_rel: float = 0.3
    """Uncalibrated default: the analytical model against published end-to-end measurements is off by tens of
    percent (see `python -m zerotune.validate.accuracy`); predictions of one cluster err together, so the band is wide
    for absolute figures and conservative for comparisons."""
    memory_rel: float = 0.1
    """Uncalibrated default: the memory model against DeepSpeed's own estimators and Korthikanti et al.'s
    activation figures agrees within a few percent; allocator behaviour adds the rest."""
    shared_rel: float = 0.0
    """The part of step_time_rel (added to it in quadrature) that every configuration of the job shares: a model the
    calibration was not fitted on runs its kernels at its own efficiency, which moves all its configurations
    together (zerotune.validate.calibration.MODEL_TRANSFER_REL). One measurement of the job removes it; the search's
    prior gives it to the shared term alone (zerotune.validate.errors._variances)."""
    slope_rel: float = 0.0
    """A priori standard deviation of the log step-time error's trend per doubling of the micro-batch (the
    search's slope term, zerotune.validate.search): a calibrated model may split a job's time between per-sample and
    per-step work otherwise than the job does, its own probes' model included, so a measurement at one micro-batch
    (the profiling run's, at 1) leaves the others a band that grows with their distance from it
    (zerotune.validate.calibration.CALIBRATED_SLOPE_REL). 0: the trend is learned from measurements alone, as for
    the uncalibrated model. That model does have one on the published data (benchmarks.micro_batch_trend: RMS 0.083
    per doubling over 238 families of the fit half, mean +0.047), but taken as this prior it costs the replay
    (seed 13, real model, searches started from the profiling run where the group has its row) experiments without a
    better choice: vTrain 2.11 -> 2.36 a group (max 5 -> 7), choices within 3% 100% -> 99.3%; BLOOM 2.67 -> 3.33
    (max 5 -> 8), 93.3% either way; at 0.042, BLOOM 3.27. The uncalibrated prior keeps 0."""
    num_stages_measured: int = 0
    """How many ZeRO stages the calibration's own runs measured on this cluster (0 uncalibrated): where two or more
    were, the band above is an out-of-sample error that covers what one stage costs against another, so the search
    need not run a second stage to learn it while its measurements stay inside that band (validate.search
    _stage_in_doubt)."""


@dataclass(frozen=True)
class SpaceTable:
    """Every configuration of a space: rows are variants, columns (micro-batch, accumulation) pairs."""

    variants: tuple[DSConfig, ...]
    micro_batch: np.ndarray
    grad_accum: np.ndarray
    memory_bytes: np.ndarray
    host_bytes_per_node: np.ndarray
    step_s: np.ndarray
    model_flops_per_gpu: np.ndarray
    samples_per_step: np.ndarray

    def config(self, row: int, col: int) -> DSConfig:
        return self.variants[row].replace(train_micro_batch_size_per_gpu=int(self.micro_batch[col]),
                                          gradient_accumulation_steps=int(self.grad_accum[col]))

    def fits(self, job: Job, headroom_bytes: float = 0.0) -> np.ndarray:
        hw = job.cluster.hardware
        return ((self.memory_bytes + headroom_bytes <= hw.memory_bytes)
                & (self.host_bytes_per_node <= hw.host_memory_bytes))


def metric_value(metric: Metric, samples_per_step: np.ndarray, step_s: np.ndarray,
                 model_flops_per_gpu: np.ndarray) -> np.ndarray:
    """DeepSpeed autotuner's metrics: throughput samples/s, latency ms per step, FLOPS per GPU."""
    if metric == "throughput":
        return samples_per_step / step_s
    if metric == "latency":
        return step_s * 1e3
    if metric == "flops":
        return model_flops_per_gpu / step_s
    raise ValueError(f"unknown metric {metric!r}; use throughput, latency or flops")


def evaluate_space(job: Job, space: SearchSpace, eff: Efficiency = Efficiency()) -> SpaceTable:
    dp = space.variants[0].dp_size(job.cluster.world_size) if space.variants else job.cluster.world_size
    mbs, gas = space.batch_grid(dp)
    if not space.variants or not len(mbs):
        raise ValueError("the tuning space is empty: no micro-batch / accumulation pair is within the batch "
                         "limits; widen train_micro_batch_size_per_gpu or autotuning.max_train_batch_size")
    shape = (len(space.variants), len(mbs))
    memory, host, step, flops = (np.empty(shape) for _ in range(4))
    mbs_f, gas_f = mbs.astype(float), gas.astype(float)
    for row, variant in enumerate(space.variants):
        memory[row], host[row] = memory_columns(job, variant, eff, mbs_f, gas_f)
        breakdown, _, flops[row] = step_time_columns(job, variant, eff, mbs_f, gas_f)
        step[row] = sum(breakdown.values())
    return SpaceTable(space.variants, mbs, gas, memory, host, step, flops, np.broadcast_to(mbs * gas * dp, shape))


@dataclass(frozen=True)
class Ranked:
    estimate: Estimate
    metric_value: float
    metric_low: float
    metric_high: float
    """The band the prediction's uncertainty allows."""
    close_to_best: bool
    """Its band overlaps the best's: only a measurement can tell them apart."""
    memory_at_risk: bool
    """Predicted to fit, but not with the memory uncertainty added."""
    num_equivalent: int = 0
    """Other configurations of the space with the same predicted speed and memory (knobs the model does not
    tell apart); this entry stands for them."""


@dataclass(frozen=True)
class Ranking:
    metric: Metric
    entries: tuple[Ranked, ...]
    """The top configurations that fit, best first."""
    num_configs: int
    num_fit: int
    least_memory: Estimate
    """The configuration with the smallest predicted peak: what comes closest when nothing fits."""


def _band(value: np.ndarray | float, metric: Metric, rel: float) -> tuple[float, float]:
    if metric == "latency":
        return float(value) * (1 - rel), float(value) * (1 + rel)
    return float(value) / (1 + rel), float(value) / max(1 - rel, 1e-9)


def rank(job: Job, space: SearchSpace, eff: Efficiency = Efficiency(), metric: Metric = "throughput",
         top: int | None = 10, headroom_bytes: float = 0.0, uncertainty: Uncertainty = Uncertainty()) -> Ranking:
    """The space's configurations that fit, ordered by the metric (maximised, or minimised for latency)."""
    table = evaluate_space(job, space, eff)
    value = metric_value(metric, table.samples_per_step, table.step_s, table.model_flops_per_gpu)
    fits = table.fits(job, headroom_bytes).ravel()
    candidates = np.flatnonzero(fits)
    score = (-value if MAXIMISED[metric] else value).ravel()
    # Equal speed: less memory first; equal in both: one entry standing for its equivalents (knobs the model
    # sees no difference in), the first in space order, where DeepSpeed's defaults come first.
    memory = table.memory_bytes.ravel()
    order = candidates[np.lexsort((memory[candidates], score[candidates]))]
    cols = table.micro_batch.shape[0]
    least = int(np.argmin(table.memory_bytes))
    kept: list[int] = []
    equivalents: dict[tuple[float, float], int] = {}
    for index in order:
        key = (float(score[index]), float(memory[index]))
        if key in equivalents:
            equivalents[key] += 1
        elif top is None or len(kept) < top:
            equivalents[key] = 0
            kept.append(int(index))
        elif key[0] > float(score[kept[-1]]):
            break
    # The kept configurations are predicted one by one (estimate: the simulated schedule) and ordered by
    # that prediction; the closed form above only chose them (tests/test_simulate.py holds the two together).
    found = []
    for index in kept:
        est = estimate(job, table.config(*divmod(index, cols)), eff)
        found.append((float(metric_value(metric, np.array(est.samples_per_step), np.array(est.time.step_s),
                                         np.array(est.time.model_flops_per_gpu))), est, index))
    found.sort(key=lambda item: -item[0] if MAXIMISED[metric] else item[0])
    entries, best_band = [], None
    for predicted, est, index in found:
        low, high = _band(predicted, metric, uncertainty.step_time_rel)
        best_band = best_band or (low, high)
        close = high >= best_band[0] if MAXIMISED[metric] else low <= best_band[1]
        at_risk = est.memory.total_bytes * (1 + uncertainty.memory_rel) > est.memory.capacity_bytes
        entries.append(Ranked(est, predicted, low, high, close, at_risk,
                              equivalents[(float(score[index]), float(memory[index]))]))
    return Ranking(metric, tuple(entries), int(fits.size), int(fits.sum()),
                   estimate(job, table.config(*divmod(least, cols)), eff))
