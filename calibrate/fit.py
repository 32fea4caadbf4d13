"""Fit the predictor's Efficiency parameters to measurements, and microbenchmarks to starting values.

`fit` minimises, with bounded robust least squares (scipy.optimize.least_squares, soft_l1 loss so one
bad run does not drag the fit), the residuals
  log(predicted / measured) step time          for every status-ok measurement
  log(predicted / measured) peak memory        where a measurement has it
  a hinge log(capacity / predicted) + margin   for an OOM run predicted to fit, and the converse
over the parameters the data can inform: a parameter whose finite-difference Jacobian column is ~0
(inter-node figures on single-node data, overlap without overlap_comm, ...) keeps its base value.
Failed and timed-out runs say nothing about the model and are left out.
Scale-free parameters (efficiencies, sizes, rates, latencies) are fitted in log space.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from datetime import date
from typing import Any, Iterable, Sequence

import numpy as np
from scipy.optimize import least_squares

from calibrate.measurement import Measurement, to_record
from calibrate.profile import CalibrationProfile, FitQuality, FitUncertainty, ResidualModel
from predictor import ClusterSpec, DSConfig, Efficiency, HardwareSpec, Job, ModelSpec, load_hardware, load_model
from predictor.memory import estimate_memory
from predictor.step_time import estimate_time

__all__ = ["fit", "FitResult", "FitRow", "ParamSpec", "PARAM_SPECS", "make_profile", "fit_microbenchmarks",
           "predicted_total_bytes"]


@dataclass(frozen=True)
class ParamSpec:
    lower: float
    upper: float
    log: bool
    """Fitted as log(value): the parameter is scale-free and positive."""
    scale: float = 1.0
    """Linear parameters are fitted as value / scale, so every internal coordinate is of order one."""


# Bounds are physical limits, not guesses of the answer: efficiencies in (0, 1] (bandwidth up to 1.5x
# the catalog in case its datasheet figure is conservative), latencies 0.1 us - 10 ms, Adam traffic
# between the 16 B it must read and ~10x the 30 B it does (Efficiency docstring).
PARAM_SPECS: dict[str, ParamSpec] = {
    "compute_efficiency_max": ParamSpec(1e-3, 1.0, log=True),
    "compute_half_size": ParamSpec(1.0, 1e12, log=True),
    "intra_node_bandwidth_efficiency": ParamSpec(1e-3, 1.5, log=True),
    "inter_node_bandwidth_efficiency": ParamSpec(1e-3, 1.5, log=True),
    "intra_node_latency_s": ParamSpec(1e-7, 1e-2, log=True),
    "inter_node_latency_s": ParamSpec(1e-7, 1e-2, log=True),
    "overlap_efficiency": ParamSpec(0.0, 1.0, log=False),
    "allocator_slack_fraction": ParamSpec(0.0, 1.0, log=False),
    "runtime_reserved_bytes": ParamSpec(0.0, 64 * 2**30, log=False, scale=2**30),
    "optimizer_bytes_per_param": ParamSpec(16.0, 300.0, log=True),
    "host_optimizer_params_per_s": ParamSpec(1e6, 1e11, log=True),
    "step_overhead_s": ParamSpec(0.0, 60.0, log=False, scale=0.1),
    "micro_step_overhead_s": ParamSpec(0.0, 60.0, log=False, scale=0.1),
    "zero3_tensor_overhead_s": ParamSpec(0.0, 0.1, log=False, scale=1e-3),
    "fp32_compute_scale": ParamSpec(1e-3, 10.0, log=True),
    "fp16_compute_scale": ParamSpec(1e-3, 10.0, log=True),
    "bf16_compute_scale": ParamSpec(1e-3, 10.0, log=True),
}
_SCALES = ("fp32_compute_scale", "fp16_compute_scale", "bf16_compute_scale")
MEMORY_PARAMS = frozenset({"allocator_slack_fraction", "runtime_reserved_bytes"})
# A parameter that moves no prediction by 0.1% when it changes by a factor e (or by one unit of scale)
# cannot be told apart from noise: it is left at its base value.
_SENSITIVITY_MIN = 1e-3
# Weak pull towards the base value (per internal unit): keeps directions the data barely informs
# (e.g. latency vs bandwidth on large messages only) where they started instead of wandering.
_PRIOR_WEIGHT = 0.01
_MAX_FOLDS = 5
_HINGE_MARGIN = 0.02


@dataclass(frozen=True)
class FitRow:
    """One measurement: measured against predicted before and after the fit."""

    source: str
    status: str
    measured_step_s: float | None
    predicted_step_s_before: float
    predicted_step_s_after: float
    measured_peak_memory_bytes: float | None
    predicted_peak_memory_bytes_before: float
    predicted_peak_memory_bytes_after: float
    fits_before: bool
    fits_after: bool


@dataclass(frozen=True)
class FitResult:
    efficiency: Efficiency
    fitted_params: tuple[str, ...]
    skipped_params: dict[str, str]
    """Parameter -> why it kept its base value."""
    table: tuple[FitRow, ...]
    quality: FitQuality
    uncertainty: FitUncertainty
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Case:
    m: Measurement
    job: Job
    live_bytes: float
    """Peak live bytes (no allocator slack, no runtime reserve): the only part of memory Efficiency leaves."""


def predicted_total_bytes(live_bytes: float, eff: Efficiency, hw: HardwareSpec) -> float:
    """Mirrors predictor.memory.estimate_memory: live x (1 + allocator slack) + runtime reserve (a test
    checks the two agree); lets the fit move the memory parameters without re-running the model."""
    reserved = hw.runtime_reserved_bytes if eff.runtime_reserved_bytes is None else eff.runtime_reserved_bytes
    return live_bytes * (1 + eff.allocator_slack_fraction) + reserved


def _predicted_peak(case: _Case, eff: Efficiency) -> float:
    """The predicted counterpart of Measurement.peak_memory_bytes: max_memory_allocated on accelerators is
    the live bytes alone; peak RSS on the CPU target holds everything."""
    hw = case.job.cluster.hardware
    return predicted_total_bytes(case.live_bytes, eff, hw) if hw.kind == "cpu" else case.live_bytes


def _cases(measurements: Iterable[Measurement]) -> list[_Case]:
    models: dict[str, ModelSpec] = {}
    out = []
    for m in measurements:
        if m.model not in models:
            models[m.model] = load_model(m.model)
        job = Job(models[m.model], ClusterSpec(load_hardware(m.hardware), m.num_nodes, m.num_gpus_per_node),
                  m.seq_len)
        live = estimate_memory(job, m.config, Efficiency(allocator_slack_fraction=0.0,
                                                          runtime_reserved_bytes=0.0)).total_bytes
        out.append(_Case(m, job, live))
    return out


# -- parameters as a vector -----------------------------------------------------------------------------

def _start_value(name: str, base: Efficiency, hw: HardwareSpec) -> float:
    value = getattr(base, name)
    if value is None:  # the override is unset: start from the catalog's figure
        value = {"intra_node_latency_s": hw.intra_node_latency_s, "inter_node_latency_s": hw.inter_node_latency_s,
                 "runtime_reserved_bytes": hw.runtime_reserved_bytes}[name]
    spec = PARAM_SPECS[name]
    return min(max(float(value), spec.lower), spec.upper)


def _to_x(name: str, value: float) -> float:
    spec = PARAM_SPECS[name]
    return math.log(value) if spec.log else value / spec.scale


def _from_x(name: str, x: float) -> float:
    spec = PARAM_SPECS[name]
    return math.exp(x) if spec.log else x * spec.scale


def _efficiency(base: Efficiency, names: Sequence[str], x: np.ndarray) -> Efficiency:
    return dataclasses.replace(base, **{n: _from_x(n, float(v)) for n, v in zip(names, x)})


# -- residuals ------------------------------------------------------------------------------------------

def _time_residuals(cases: list[_Case], eff: Efficiency) -> list[float]:
    return [math.log(estimate_time(c.job, c.m.config, eff).step_s / c.m.measured_step_s)
            for c in cases if c.m.status == "ok" and c.m.measured_step_s]


def _memory_residuals(cases: list[_Case], eff: Efficiency) -> list[float]:
    out = []
    for c in cases:
        hw = c.job.cluster.hardware
        if c.m.peak_memory_bytes:
            out.append(math.log(_predicted_peak(c, eff) / c.m.peak_memory_bytes))
        if c.m.reserved_memory_bytes and hw.kind != "cpu":
            out.append(math.log(c.live_bytes * (1 + eff.allocator_slack_fraction) / c.m.reserved_memory_bytes))
        # Hinge: an OOM predicted to fit, or a finished run predicted not to, costs its log distance to
        # capacity plus a margin, so the fit settles clearly on the right side rather than on the edge.
        ratio = math.log(hw.memory_bytes / predicted_total_bytes(c.live_bytes, eff, hw))
        if c.m.status == "oom":
            out.append(max(0.0, ratio + _HINGE_MARGIN))
        elif c.m.status == "ok":
            out.append(max(0.0, _HINGE_MARGIN - ratio))
    return out


def _residuals(cases: list[_Case], eff: Efficiency, names: Sequence[str]) -> np.ndarray:
    time = _time_residuals(cases, eff) if set(names) - MEMORY_PARAMS else []
    memory = _memory_residuals(cases, eff) if set(names) & MEMORY_PARAMS else []
    return np.array(time + memory, dtype=float)


def _sensitive(cases: list[_Case], base: Efficiency, names: list[str], x0: np.ndarray) -> tuple[list[str], dict]:
    """The parameters whose finite-difference Jacobian column is not ~0 at the start."""
    keep, skipped = [], {}
    r0 = np.concatenate([_time_residuals(cases, _efficiency(base, names, x0)),
                         _memory_residuals(cases, _efficiency(base, names, x0))])
    for i, name in enumerate(names):
        step = 0.05 if PARAM_SPECS[name].log else 0.05 * max(abs(x0[i]), 1.0)
        x = x0.copy()
        x[i] += step
        eff = _efficiency(base, names, x)
        r = np.concatenate([_time_residuals(cases, eff), _memory_residuals(cases, eff)])
        if r.size == 0 or np.max(np.abs(r - r0)) / step < _SENSITIVITY_MIN:
            skipped[name] = "no measurement is sensitive to it"
        else:
            keep.append(name)
    return keep, skipped


def _solve(cases: list[_Case], base: Efficiency, names: list[str], x0: np.ndarray) -> np.ndarray:
    if not names or not cases:
        return x0
    lower = np.array([_to_x(n, PARAM_SPECS[n].lower) for n in names])
    upper = np.array([_to_x(n, PARAM_SPECS[n].upper) for n in names])

    def objective(x: np.ndarray) -> np.ndarray:
        return np.concatenate([_residuals(cases, _efficiency(base, names, x), names), _PRIOR_WEIGHT * (x - x0)])

    result = least_squares(objective, np.clip(x0, lower, upper), bounds=(lower, upper), loss="soft_l1",
                           f_scale=0.1, diff_step=1e-3, max_nfev=200 * len(names))
    return result.x


def _fit_groups(cases: list[_Case], base: Efficiency, names: list[str], x0: np.ndarray) -> tuple[Efficiency, list]:
    """Time and memory parameters touch disjoint residuals, so they are solved apart; a group whose own
    in-sample error would get worse than at the start keeps its start values (a fit never makes things worse)."""
    eff, notes = _efficiency(base, names, x0), []
    for group, residuals in ((lambda n: n not in MEMORY_PARAMS, _time_residuals),
                             (lambda n: n in MEMORY_PARAMS, _memory_residuals)):
        idx = [i for i, n in enumerate(names) if group(n)]
        sub = [names[i] for i in idx]
        if not sub:
            continue
        x = _solve(cases, eff, sub, x0[idx])
        trial = _efficiency(eff, sub, x)
        # Judged by mean |predicted / measured - 1|: for step times that is exactly the reported MAPE.
        before, after = np.array(residuals(cases, eff)), np.array(residuals(cases, trial))
        if np.mean(np.abs(np.expm1(after))) <= np.mean(np.abs(np.expm1(before))) + 1e-12:
            eff = trial
        else:
            notes.append(f"fit of {', '.join(sub)} made the in-sample error worse; kept the start values")
    return eff, notes


# -- quality --------------------------------------------------------------------------------------------

def _mape(pairs: list[tuple[float, float]]) -> float | None:
    return float(np.mean([abs(p / m - 1) for p, m in pairs])) if pairs else None


def _rms_log(pairs: list[tuple[float, float]]) -> float | None:
    return float(math.sqrt(np.mean([math.log(p / m) ** 2 for p, m in pairs]))) if pairs else None


def _step_pairs(cases: list[_Case], effs: list[Efficiency]) -> list[tuple[float, float]]:
    return [(estimate_time(c.job, c.m.config, e).step_s, c.m.measured_step_s)
            for c, e in zip(cases, effs) if c.m.status == "ok" and c.m.measured_step_s]


def _memory_pairs(cases: list[_Case], effs: list[Efficiency]) -> list[tuple[float, float]]:
    return [(_predicted_peak(c, e), c.m.peak_memory_bytes) for c, e in zip(cases, effs) if c.m.peak_memory_bytes]


def _misclassified(cases: list[_Case], eff: Efficiency) -> int:
    wrong = 0
    for c in cases:
        hw = c.job.cluster.hardware
        fits = predicted_total_bytes(c.live_bytes, eff, hw) <= hw.memory_bytes
        wrong += (c.m.status == "oom" and fits) or (c.m.status == "ok" and not fits)
    return wrong


def _out_of_sample(cases: list[_Case], base: Efficiency, names: list[str], x0: np.ndarray) -> list[Efficiency]:
    """k-fold (leave-one-out up to _MAX_FOLDS cases): each case predicted by a fit that did not see it."""
    k = min(len(cases), _MAX_FOLDS)
    effs: list[Efficiency] = [base] * len(cases)
    for fold in range(k):
        train = [c for i, c in enumerate(cases) if i % k != fold]
        eff, _ = _fit_groups(train, base, names, x0)
        for i in range(fold, len(cases), k):
            effs[i] = eff
    return effs


def _row(c: _Case, before: Efficiency, after: Efficiency) -> FitRow:
    hw = c.job.cluster.hardware
    return FitRow(c.m.source, c.m.status, c.m.measured_step_s, estimate_time(c.job, c.m.config, before).step_s,
                  estimate_time(c.job, c.m.config, after).step_s, c.m.peak_memory_bytes,
                  _predicted_peak(c, before), _predicted_peak(c, after),
                  predicted_total_bytes(c.live_bytes, before, hw) <= hw.memory_bytes,
                  predicted_total_bytes(c.live_bytes, after, hw) <= hw.memory_bytes)


def _hardware_name(measurements: list[Measurement]) -> str:
    names = sorted({load_hardware(m.hardware).name for m in measurements})
    if len(names) != 1:
        raise ValueError(f"measurements come from {len(names)} hardware kinds ({', '.join(names)}); a profile "
                         f"describes one: fit each hardware's measurements separately")
    return names[0]


def _identifiable(names: list[str], measurements: Sequence[Measurement]) -> list[str]:
    """The compute curve and a per-precision scale move step time alike: the most measured precision is the
    reference (its scale stays as it is) and only the others' scales are fitted, relative to it."""
    counts: dict[str, int] = {}
    for m in measurements:
        if m.status == "ok":
            counts[m.config.precision] = counts.get(m.config.precision, 0) + 1
    reference = max(counts, key=lambda p: counts[p], default="fp32")
    return [n for n in names if n not in _SCALES or (n != f"{reference}_compute_scale"
                                                      and n.split("_")[0] in counts)]


def fit(measurements: Sequence[Measurement], base: Efficiency = Efficiency(),
        params: Sequence[str] = tuple(PARAM_SPECS)) -> FitResult:
    """Fit `params` of `base` to measurements of one hardware kind; see the module docstring."""
    measurements = [m for m in measurements if m.status in ("ok", "oom")]
    if not any(m.status == "ok" for m in measurements):
        raise ValueError("no measurement with status ok to fit; measure at least one run that finished")
    for name in params:
        if name not in PARAM_SPECS:
            raise ValueError(f"cannot fit {name!r}; fittable parameters: {', '.join(PARAM_SPECS)}")
    _hardware_name(measurements)
    cases = _cases(measurements)
    hw = cases[0].job.cluster.hardware
    names = _identifiable(list(params), measurements)
    x0 = np.array([_to_x(n, _start_value(n, base, hw)) for n in names])
    names, skipped = _sensitive(cases, base, names, x0)
    x0 = np.array([_to_x(n, _start_value(n, base, hw)) for n in names])
    eff, notes = _fit_groups(cases, base, names, x0)
    held_out = _out_of_sample(cases, base, names, x0) if names else [base] * len(cases)
    same = [base] * len(cases)
    steps_oos, memory_oos = _step_pairs(cases, held_out), _memory_pairs(cases, held_out)
    quality = FitQuality(
        step_time_mape_before=_mape(_step_pairs(cases, same)),
        step_time_mape_in_sample=_mape(_step_pairs(cases, [eff] * len(cases))),
        step_time_mape_out_of_sample=_mape(steps_oos),
        peak_memory_mape_before=_mape(_memory_pairs(cases, same)),
        peak_memory_mape_in_sample=_mape(_memory_pairs(cases, [eff] * len(cases))),
        peak_memory_mape_out_of_sample=_mape(memory_oos),
        num_step_time=len(steps_oos), num_peak_memory=len(memory_oos),
        num_oom=sum(c.m.status == "oom" for c in cases), num_folds=min(len(cases), _MAX_FOLDS),
        oom_misclassified_before=_misclassified(cases, base), oom_misclassified_after=_misclassified(cases, eff))
    uncertainty = FitUncertainty(step_time_rel=_rms_log(steps_oos) or 0.0, peak_memory_rel=_rms_log(memory_oos))
    return FitResult(eff, tuple(names), skipped, tuple(_row(c, base, eff) for c in cases), quality, uncertainty,
                     tuple(notes))


def make_profile(result: FitResult, measurements: Sequence[Measurement], environment: dict[str, Any],
                 created: str | None = None, residual: ResidualModel | None = None) -> CalibrationProfile:
    """The profile `predict` and `tune` read, from a fit and the measurements it was fitted on."""
    used = [m for m in measurements if m.status in ("ok", "oom")]
    return CalibrationProfile(
        hardware=_hardware_name(used), efficiency=result.efficiency, uncertainty=result.uncertainty,
        fit_quality=result.quality,
        fitted_on={"count": len(used), "sources": sorted({m.source for m in used}),
                   "measurements": [to_record(m) for m in used]},
        environment=dict(environment), created=created or date.today().isoformat(), residual=residual)


# -- microbenchmarks -> starting values -----------------------------------------------------------------

_DTYPES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "fp16": "fp16", "float16": "fp16", "half": "fp16",
           "bf16": "bf16", "bfloat16": "bf16"}


def _compute_curve(matmuls: list[dict[str, Any]], hw: HardwareSpec) -> dict[str, float]:
    """compute_efficiency_max and compute_half_size from matmul FLOP/s against size.

    The model's curve runs over x = micro-batch tokens x hidden / tp, the output size of a transformer's
    (tokens x hidden) x (hidden x hidden / tp) projection; a benchmarked (m x k) x (k x n) matmul maps to
    x = m * n, its output elements. Fitted in log space to efficiency = FLOP/s / the dtype's catalog peak."""
    points = [(float(r["m"]) * float(r["n"]), float(r["flops_per_s"]) / hw.peak_flops[_DTYPES[str(r["dtype"])]])
              for r in matmuls
              if _DTYPES.get(str(r["dtype"])) in hw.peak_flops and float(r.get("flops_per_s", 0)) > 0]
    if len(points) < 2:
        return {}
    size, measured = np.array([p[0] for p in points]), np.array([p[1] for p in points])

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(math.exp(x[0]) * size / (size + math.exp(x[1]))) - np.log(measured)

    x0 = [math.log(min(measured.max(), 1.0)), math.log(float(np.median(size)))]
    r = least_squares(residuals, x0, bounds=([math.log(1e-3), 0.0], [0.0, math.log(1e12)]), loss="soft_l1",
                      f_scale=0.1)
    return {"compute_efficiency_max": math.exp(r.x[0]), "compute_half_size": math.exp(r.x[1])}


def _ring_steps(op: str, num_ranks: int) -> int:
    """Ring steps of a collective, as predictor.step_time.collective_s counts them."""
    return 2 * (num_ranks - 1) if op.replace("_", "").lower() == "allreduce" else num_ranks - 1


def _link(collectives: list[dict[str, Any]], link: str, catalog_bandwidth: float) -> dict[str, float]:
    """Bandwidth efficiency from the larger half of the messages (bus bandwidth / catalog link bandwidth);
    latency per ring step from the smallest messages once their bandwidth term is taken off."""
    rows = sorted((r for r in collectives if r.get("link") == link and int(r.get("num_ranks", 1)) > 1),
                  key=lambda r: float(r["bytes"]))
    if not rows:
        return {}
    large = rows[len(rows) // 2:]
    bus = float(np.median([float(r["bus_bandwidth_bytes_per_s"]) for r in large]))
    out = {f"{link}_bandwidth_efficiency": min(bus / catalog_bandwidth, PARAM_SPECS[f"{link}_bandwidth_efficiency"].upper)}
    smallest = [r for r in rows if float(r["bytes"]) == float(rows[0]["bytes"])]
    latencies = []
    for r in smallest:
        steps = _ring_steps(str(r["op"]), int(r["num_ranks"]))
        volume = float(r["bytes"]) * steps / int(r["num_ranks"])
        latencies.append((float(r["seconds"]) - volume / bus) / steps)
    spec = PARAM_SPECS[f"{link}_latency_s"]
    out[f"{link}_latency_s"] = min(max(float(np.median(latencies)), spec.lower), spec.upper)
    return out


def fit_microbenchmarks(results: dict[str, Any], hardware: HardwareSpec, base: Efficiency = Efficiency()) -> Efficiency:
    """Starting values for `fit` from microbenchmarks (calibrate.microbench's results dict).

    Matmuls give the compute curve (see _compute_curve); collectives give each link's bandwidth efficiency
    and latency; measured memory bandwidth rescales optimizer_bytes_per_param, because the predictor times
    the optimizer step as bytes moved / the catalog's memory bandwidth. Host-to-device bandwidth has no
    Efficiency parameter (offload uses the catalog figure) and is not used."""
    if not isinstance(results, dict):
        raise ValueError(f"microbenchmark results must be a JSON object, got {type(results).__name__}")
    values: dict[str, float] = {}
    try:
        values.update(_compute_curve(list(results.get("matmul") or []), hardware))
        collectives = list(results.get("collectives") or [])
        values.update(_link(collectives, "intra_node", hardware.intra_node_bandwidth_bytes_per_s))
        values.update(_link(collectives, "inter_node", hardware.inter_node_bandwidth_bytes_per_s))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"microbenchmark results: malformed entry ({exc!r}); re-run the microbenchmarks") from None
    measured_bw = results.get("memory_bandwidth_bytes_per_s")
    if isinstance(measured_bw, (int, float)) and measured_bw > 0:
        spec = PARAM_SPECS["optimizer_bytes_per_param"]
        scaled = base.optimizer_bytes_per_param * hardware.memory_bandwidth_bytes_per_s / float(measured_bw)
        values["optimizer_bytes_per_param"] = min(max(scaled, spec.lower), spec.upper)
    return dataclasses.replace(base, **values)
