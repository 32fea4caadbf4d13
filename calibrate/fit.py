"""Fit the predictor's Efficiency parameters (declared in calibrate/params.py) to measurements.

1. Rows of the same configuration (same model, hardware, layout, sequence length and ds_config) collapse to
   one, with the median of their step times and memory figures: repeating a run is not new information, and
   counted twice it would shrink the out-of-sample error that `tune` stops on.
2. Identifiability: from the finite-difference Jacobian of the residuals at the start values, parameters are
   taken in priority order (calibrate/params.py) while the data are sensitive to them and they move the
   predictions in a direction the ones already taken do not (Gram-Schmidt; e.g. per-step and per-micro-step
   overheads are one direction until gradient accumulation varies). At most one parameter per
   CONFIGURATIONS_PER_PARAM distinct configurations is fitted, besides local ones (_local: a parameter at most a
   third of the runs depend on, such as ZeRO-3's hooks in calibrate's one ZeRO-3 probe); asked for named
   parameters, the fit takes up to one per configuration and refuses more.
3. Bounded robust least squares (scipy.optimize.least_squares, soft_l1 loss so one bad run does not drag the
   fit) of log(predicted / measured) step time for every finished run, log(predicted / measured) peak memory
   where measured, and a hinge log(capacity / predicted) + margin for an OOM predicted to fit (and the
   converse); time and memory parameters are solved apart. A fit never makes the in-sample error worse.
4. Out-of-sample error by leave-one-model-out when several models were measured (the transfer a profile
   claims), else leave-one-configuration-out (grouped into at most _MAX_FOLDS folds); each fold repeats steps
   2-3 on what it trains on. That error is the profile's uncertainty band.
Failed and timed-out runs say nothing about the model and are left out.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from datetime import date
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from scipy.optimize import least_squares

from zerotune.calibrate.measurement import Measurement, to_record
from zerotune.calibrate.params import PARAMS, PARAMS_BY_NAME, check_params, from_internal, to_internal
from zerotune.calibrate.profiles import CalibrationProfile, FitQuality, FitUncertainty
from zerotune.predictor import ClusterSpec, Efficiency, HardwareSpec, Job, ModelSpec, load_hardware, load_model, to_ds_config
from zerotune.predictor.memory import estimate_memory
from zerotune.predictor.step_time import estimate_time
from zerotune.predictor.units import GIB

__all__ = ["fit", "FitResult", "FitRow", "make_profile", "predicted_total_bytes", "collapse_duplicates",
           "MIN_CONFIGURATIONS"]

MIN_CONFIGURATIONS = 2
"""Distinct finished configurations a fit needs: one to fit, one to check it on."""
# A parameter that moves no prediction by 0.1% when it changes by a factor e (or by one unit of scale)
# cannot be told apart from noise: it is left at its base value.
_SENSITIVITY_MIN = 1e-3
# A parameter whose Jacobian column is less than this share outside the span of the columns already taken
# moves predictions as they do: the data cannot tell it from them.
_SEPARABLE_MIN = 0.05
# Unnamed, at most one parameter per this many distinct configurations: fitting as many parameters as the
# data can barely separate lets the weakly determined ones soak up model error (seen: from three rows of one
# model, a per-micro-step overhead took 0.28 s and wrecked the transfer to the other models).
CONFIGURATIONS_PER_PARAM = 2
# Fewer configurations than this have no neighbours to tell a local parameter (_local) by.
_LOCAL_MIN_CONFIGURATIONS = 4
# Weak pull towards the base value (per internal unit): keeps directions the data barely informs
# (e.g. latency vs bandwidth on large messages only) where they started instead of wandering.
_PRIOR_WEIGHT = 0.01
_MAX_FOLDS = 10
_HINGE_MARGIN = 0.02


@dataclass(frozen=True)
class FitRow:
    """One distinct configuration: measured against predicted before and after the fit."""

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
    """Mirrors zerotune.predictor.memory.estimate_memory: live x (1 + allocator slack) + runtime reserve (a test
    checks the two agree); lets the fit move the memory parameters without re-running the model."""
    reserved = hw.runtime_reserved_bytes if eff.runtime_reserved_bytes is None else eff.runtime_reserved_bytes
    return live_bytes * (1 + eff.allocator_slack_fraction) + reserved


def _predicted_peak(case: _Case, eff: Efficiency) -> float:
    """The predicted counterpart of Measurement.peak_memory_bytes: max_memory_allocated on accelerators is
    the live bytes alone; peak RSS on the CPU target holds everything."""
    hw = case.job.cluster.hardware
    return predicted_total_bytes(case.live_bytes, eff, hw) if hw.kind == "cpu" else case.live_bytes


# -- distinct configurations ----------------------------------------------------------------------------

def _configuration(m: Measurement) -> str:
    return json.dumps([m.model, m.hardware, m.num_nodes, m.num_gpus_per_node, m.seq_len,
                       to_ds_config(m.config, m.world_size)], sort_keys=True)


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v]
    return statistics.median(present) if present else None


def _merge(rows: list[Measurement]) -> Measurement:
    """One measurement of a configuration measured len(rows) times: a finished run wins over an OOM of the same
    configuration (it did fit), with the medians of the finished runs' figures."""
    if len(rows) == 1:
        return rows[0]
    ok = [m for m in rows if m.status == "ok" and m.measured_step_s]
    first = (ok or rows)[0]
    source = f"{first.source} (+{len(rows) - 1} rows of the same configuration)"
    if not ok:
        return dataclasses.replace(first, source=source)
    step = _median(m.measured_step_s for m in ok)
    assert step is not None
    return dataclasses.replace(first, step_s=step, throughput_samples_per_s=first.samples_per_step / step,
                               peak_memory_bytes=_median(m.peak_memory_bytes for m in ok),
                               reserved_memory_bytes=_median(m.reserved_memory_bytes for m in ok), source=source)


def collapse_duplicates(measurements: Sequence[Measurement]) -> list[Measurement]:
    """One measurement per distinct configuration, in order of first appearance (see _merge)."""
    groups: dict[str, list[Measurement]] = {}
    for m in measurements:
        groups.setdefault(_configuration(m), []).append(m)
    return [_merge(rows) for rows in groups.values()]


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
    if value is None:  # an override left unset: start from the catalog's figure of the same name
        value = getattr(hw, name, None)
        if value is None:
            raise ValueError(f"Efficiency.{name} is None and hardware {hw.name} has no {name}; give the fit a "
                             f"base value for it")
    p = PARAMS_BY_NAME[name]
    return min(max(float(value), p.lower), p.upper)


def _x0(names: Sequence[str], base: Efficiency, hw: HardwareSpec) -> np.ndarray:
    return np.array([to_internal(PARAMS_BY_NAME[n], _start_value(n, base, hw)) for n in names], dtype=float)


def _efficiency(base: Efficiency, names: Sequence[str], x: np.ndarray) -> Efficiency:
    return dataclasses.replace(base, **{n: from_internal(PARAMS_BY_NAME[n], float(v)) for n, v in zip(names, x)})


# -- residuals ------------------------------------------------------------------------------------------

Residuals = Callable[[list[_Case], Efficiency], list[float]]


def _finished(cases: list[_Case]) -> list[_Case]:
    return [c for c in cases if c.m.status == "ok" and c.m.measured_step_s]


def _time_residuals(cases: list[_Case], eff: Efficiency) -> list[float]:
    return [math.log(estimate_time(c.job, c.m.config, eff).step_s / c.m.measured_step_s)  # type: ignore[operator]
            for c in _finished(cases)]


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


def _memory_informed(cases: list[_Case]) -> int:
    """Configurations that say something about memory: a measured figure or an out-of-memory run."""
    return sum(bool(c.m.peak_memory_bytes or c.m.reserved_memory_bytes or c.m.status == "oom") for c in cases)


_GROUPS: tuple[tuple[str, Residuals, Callable[[list[_Case]], int]], ...] = (
    ("time", _time_residuals, lambda cases: len(_finished(cases))),
    ("memory", _memory_residuals, _memory_informed))


# -- which parameters the data can tell apart -----------------------------------------------------------

def _jacobian(cases: list[_Case], base: Efficiency, names: list[str], x0: np.ndarray,
              residuals: Residuals) -> np.ndarray:
    r0 = np.array(residuals(cases, _efficiency(base, names, x0)))
    columns = []
    for i, name in enumerate(names):
        p = PARAMS_BY_NAME[name]
        step = 0.05 if p.transform == "log" else 0.05 * max(abs(x0[i]), 1.0)
        if from_internal(p, x0[i] + step) > p.upper:  # at the upper bound: probe downwards
            step = -step
        x = x0.copy()
        x[i] += step
        columns.append((np.array(residuals(cases, _efficiency(base, names, x))) - r0) / step)
    return np.column_stack(columns) if columns else np.zeros((r0.size, 0))


def _separable(jacobian: np.ndarray, names: list[str], cap: int, num_configs: int) -> tuple[list[str], dict]:
    """Parameters in priority order while sensitive, not in the span of those taken, and fewer than `cap`."""
    kept: list[str] = []
    basis: list[np.ndarray] = []
    skipped: dict[str, str] = {}
    local = 0  # local parameters (_local) taken: they do not count against the cap
    for i, name in enumerate(names):
        column, varied_by = jacobian[:, i], PARAMS_BY_NAME[name].varied_by
        is_local = _local(column)
        if column.size == 0 or np.max(np.abs(column)) < _SENSITIVITY_MIN:
            skipped[name] = f"no measurement is sensitive to it; it needs {varied_by}"
            continue
        rest = column.copy()
        for q in basis:
            rest -= (q @ rest) * q
        if np.linalg.norm(rest) < _SEPARABLE_MIN * np.linalg.norm(column):
            skipped[name] = f"moves every prediction as {', '.join(kept)} do; telling them apart needs {varied_by}"
        elif len(kept) - local >= cap and not is_local:
            skipped[name] = (f"{num_configs} distinct configurations support {cap} parameter(s); measure more "
                             f"configurations")
        else:
            basis.append(rest / np.linalg.norm(rest))
            kept.append(name)
            local += is_local
    return kept, skipped


def _local(column: np.ndarray) -> bool:
    """A parameter only a few runs depend on (ZeRO-3's hooks: the ZeRO-3 run; ZeRO-2's: the ZeRO-2 and -3 runs)
    is told by those runs against their neighbours, whatever the parameters every run depends on take: it does
    not count against the cap. calibrate's probes hold one ZeRO-3 run beside ZeRO-0 to -2 so that it is fitted
    on the GPU the profile is for: ZeRO-3's hook time is host time, and two GPU machines' hosts differed 1.6x
    (data/measurements/gpu_grid: 240 us a module on the H200 grid's fit half, 400 on the H100's)."""
    sensitive = int(np.sum(np.abs(column) >= _SENSITIVITY_MIN))
    return column.size >= _LOCAL_MIN_CONFIGURATIONS and sensitive <= column.size // 3


def _solve(cases: list[_Case], base: Efficiency, names: list[str], x0: np.ndarray, residuals: Residuals
           ) -> np.ndarray:
    lower = np.array([to_internal(PARAMS_BY_NAME[n], PARAMS_BY_NAME[n].lower) for n in names])
    upper = np.array([to_internal(PARAMS_BY_NAME[n], PARAMS_BY_NAME[n].upper) for n in names])

    def objective(x: np.ndarray) -> np.ndarray:
        return np.concatenate([residuals(cases, _efficiency(base, names, x)), _PRIOR_WEIGHT * (x - x0)])

    # dogbox: an overhead starts at its lower bound 0, where the default trust-region method's scaling
    # takes near-zero steps and stops at once (seen: no movement from 3 rows 40% off).
    result = least_squares(objective, np.clip(x0, lower, upper), bounds=(lower, upper), loss="soft_l1",
                           f_scale=0.1, diff_step=1e-3, max_nfev=200 * len(names), method="dogbox")
    return result.x


@dataclass(frozen=True)
class _Fitted:
    efficiency: Efficiency
    names: tuple[str, ...]
    skipped: dict[str, str]
    notes: tuple[str, ...]


def _fit_cases(cases: list[_Case], base: Efficiency, names: Sequence[str], named: bool, strict: bool) -> _Fitted:
    """Select (see _separable) and solve each group; `named`: the caller chose the parameters, so up to one
    per configuration may be fitted (else one per CONFIGURATIONS_PER_PARAM); `strict`: naming more than there
    are configurations is an error."""
    hw = cases[0].job.cluster.hardware
    eff, fitted, skipped, notes = base, [], {}, []
    for target, residuals, count in _GROUPS:
        group = [n for n in names if PARAMS_BY_NAME[n].target == target]
        if not group:
            continue
        num = count(cases)
        if strict and len(group) > num:
            raise ValueError(f"cannot fit {len(group)} {target} parameters ({', '.join(group)}) from {num} distinct "
                             f"configurations; measure more configurations (more probes or rows) or fit fewer "
                             f"parameters")
        cap = num if named else num // CONFIGURATIONS_PER_PARAM
        x0 = _x0(group, eff, hw)
        kept, why = _separable(_jacobian(cases, eff, group, x0, residuals), group, cap, num)
        skipped.update(why)
        if not kept:
            continue
        x0 = _x0(kept, eff, hw)
        trial = _efficiency(eff, kept, _solve(cases, eff, kept, x0, residuals))
        # Judged by mean |predicted / measured - 1|: for step times that is exactly the reported MAPE.
        before, after = np.array(residuals(cases, eff)), np.array(residuals(cases, trial))
        if np.mean(np.abs(np.expm1(after))) <= np.mean(np.abs(np.expm1(before))) + 1e-12:
            eff, fitted = trial, fitted + kept
        else:
            notes.append(f"fit of {', '.join(kept)} made the in-sample error worse; kept the start values")
    return _Fitted(eff, tuple(fitted), skipped, tuple(notes))


# -- quality --------------------------------------------------------------------------------------------

def _mape(pairs: list[tuple[float, float]]) -> float | None:
    return float(np.mean([abs(p / m - 1) for p, m in pairs])) if pairs else None


def _rms_log(pairs: list[tuple[float, float]]) -> float | None:
    return float(math.sqrt(np.mean([math.log(p / m) ** 2 for p, m in pairs]))) if pairs else None


def _step_pairs(cases: list[_Case], effs: list[Efficiency]) -> list[tuple[float, float]]:
    return [(estimate_time(c.job, c.m.config, e).step_s, c.m.measured_step_s)  # type: ignore[misc]
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


def _folds(cases: list[_Case]) -> tuple[list[list[int]], str]:
    """Leave-one-model-out when several models were measured, else leave-one-configuration-out, whole groups
    dealt round-robin into at most _MAX_FOLDS folds."""
    models = list(dict.fromkeys(c.m.model for c in cases))
    by = "model" if len(models) > 1 else "configuration"
    groups = [[i for i, c in enumerate(cases) if c.m.model == model] for model in models] if by == "model" \
        else [[i] for i in range(len(cases))]
    k = min(len(groups), _MAX_FOLDS)
    return [[i for g in groups[fold::k] for i in g] for fold in range(k)], by


def _out_of_sample(cases: list[_Case], base: Efficiency, names: Sequence[str], named: bool
                   ) -> tuple[list[Efficiency], int, str]:
    """Each case predicted by a fit (selection included) that did not see its fold."""
    folds, by = _folds(cases)
    effs: list[Efficiency] = [base] * len(cases)
    for held in folds:
        train = [c for i, c in enumerate(cases) if i not in held]
        eff = _fit_cases(train, base, names, named, strict=False).efficiency if _finished(train) else base
        for i in held:
            effs[i] = eff
    return effs, len(folds), by


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


def _checked(measurements: Sequence[Measurement], params: Sequence[str] | None) -> tuple[list[Measurement], list]:
    """The distinct configurations to fit and the parameter names, or a one-line error saying what is missing."""
    check_params()
    for name in params or ():
        if name not in PARAMS_BY_NAME:
            raise ValueError(f"cannot fit {name!r}; fittable parameters: {', '.join(PARAMS_BY_NAME)}")
    usable = [m for m in measurements if m.status in ("ok", "oom")]
    if not any(m.status == "ok" for m in usable):
        raise ValueError("no measurement with status ok to fit; measure at least one run that finished")
    _hardware_name(usable)
    distinct = collapse_duplicates(usable)
    finished = sum(m.status == "ok" for m in distinct)
    if finished < MIN_CONFIGURATIONS:
        raise ValueError(f"{finished} distinct finished configuration(s) in {len(usable)} rows; a fit needs at least "
                         f"{MIN_CONFIGURATIONS} (one to fit, one to check): measure more configurations (more probes "
                         f"or rows differing in stage, micro-batch or accumulation)")
    return distinct, [p.name for p in PARAMS] if params is None else list(params)


IMPLAUSIBLE_RATIO = 100.0
"""A measurement this many times above or below the uncalibrated prediction is a unit or typing error, not a cluster
the fit can describe: the largest uncalibrated errors this project has measured are 2-4x (ZeRO-3 on 16 V100s,
issue 12; the CPU's subnormal gradients, 3x), and a row off by 1e9 otherwise comes out as a profile whose own
measurements it misses by 1e10 %."""


def _refuse_implausible(cases: Sequence[_Case], base: Efficiency) -> None:
    """A one-line error naming the row no efficiency could explain (a peak above the GPU's memory, a step
    IMPLAUSIBLE_RATIO off its uncalibrated prediction), before anything is fitted or written. Peak memory has no
    such ratio: a CPU rank's resident set holds torch itself (about 0.4 GiB), 141x a tiny probe's tensors."""
    for c in cases:
        hw, where = c.job.cluster.hardware, c.m.source or "a measurement"
        peak = c.m.peak_memory_bytes
        if peak and hw.kind != "cpu" and peak > hw.memory_bytes * 1.02:
            raise ValueError(f"{where}: peak_memory_bytes {peak:.4g} is above the {hw.name}'s "
                             f"{hw.memory_bytes / GIB:.4g} GiB; give the peak per GPU in bytes, or remove the row")
        if c.m.status != "ok" or not c.m.measured_step_s:
            continue
        predicted = estimate_time(c.job, c.m.config, base).step_s
        ratio = c.m.measured_step_s / predicted
        if not 1 / IMPLAUSIBLE_RATIO <= ratio <= IMPLAUSIBLE_RATIO:
            raise ValueError(f"{where}: a step of {c.m.measured_step_s:.4g} s is {max(ratio, 1 / ratio):.3g}x "
                             f"{'above' if ratio > 1 else 'below'} the uncalibrated prediction ({predicted:.4g} s); "
                             f"check its unit (throughput in samples/s, step time in s) or remove the row")


def fit(measurements: Sequence[Measurement], base: Efficiency = Efficiency(),
        params: Sequence[str] | None = None) -> FitResult:
    """Fit `params` (default: every declared parameter the data can separate) of `base` to measurements of one
    hardware kind; see the module docstring."""
    distinct, names = _checked(measurements, params)
    named = params is not None
    cases = _cases(distinct)
    _refuse_implausible(cases, base)
    fitted = _fit_cases(cases, base, names, named, strict=named)
    eff, same = fitted.efficiency, [base] * len(cases)
    held_out, num_folds, by = _out_of_sample(cases, base, names, named)
    steps_oos, memory_oos = _step_pairs(cases, held_out), _memory_pairs(cases, held_out)
    quality = FitQuality(
        step_time_mape_before=_mape(_step_pairs(cases, same)),
        step_time_mape_in_sample=_mape(_step_pairs(cases, [eff] * len(cases))),
        step_time_mape_out_of_sample=_mape(steps_oos),
        peak_memory_mape_before=_mape(_memory_pairs(cases, same)),
        peak_memory_mape_in_sample=_mape(_memory_pairs(cases, [eff] * len(cases))),
        peak_memory_mape_out_of_sample=_mape(memory_oos),
        num_step_time=len(steps_oos), num_peak_memory=len(memory_oos),
        num_oom=sum(c.m.status == "oom" for c in cases), num_folds=num_folds,
        oom_misclassified_before=_misclassified(cases, base), oom_misclassified_after=_misclassified(cases, eff),
        held_out_by=by)
    uncertainty = FitUncertainty(step_time_rel=_rms_log(steps_oos) or 0.0, peak_memory_rel=_rms_log(memory_oos))
    usable = sum(m.status in ("ok", "oom") for m in measurements)
    notes = fitted.notes + ((f"{usable} rows are {len(distinct)} distinct configurations; repeats were merged "
                             f"(median) before fitting and before estimating the out-of-sample error",)
                            if usable > len(distinct) else ())
    return FitResult(eff, fitted.names, fitted.skipped, tuple(_row(c, base, eff) for c in cases), quality,
                     uncertainty, notes)


def make_profile(result: FitResult, measurements: Sequence[Measurement], environment: dict[str, Any],
                 created: str | None = None) -> CalibrationProfile:
    """The profile `predict` and `tune` read, from a fit and the measurements it was fitted on."""
    used = [m for m in measurements if m.status in ("ok", "oom")]
    return CalibrationProfile(
        hardware=_hardware_name(used), efficiency=result.efficiency, uncertainty=result.uncertainty,
        fit_quality=result.quality,
        fitted_on={"count": len(used), "sources": sorted({m.source for m in used}),
                   "measurements": [to_record(m) for m in used]},
        environment=dict(environment), created=created or date.today().isoformat())
