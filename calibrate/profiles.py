"""A cluster's calibration profile: fitted Efficiency, how well it fits, and what it was fitted on.

`predict` and `tune` read a profile to replace the uncalibrated Efficiency defaults. It is written as
JSON (atomically, so a crash never leaves half a profile) and read strictly: an unknown key anywhere is
an error naming the key and the nearest known one, because a misspelled Efficiency field would
otherwise silently fall back to its default.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from zerotune.calibrate.atomic import write_json_atomic
from zerotune.calibrate.measurement import Measurement, from_record
from zerotune.predictor import Efficiency
from zerotune.predictor.rank import Uncertainty
from zerotune.predictor.catalog import data_dir, nearest, read_user_text, safe_name

__all__ = ["CalibrationProfile", "FitQuality", "FitUncertainty", "save_profile", "load_profile",
           "default_profile_path", "shipped_profile_path", "user_profiles_dir", "find_profile", "check_writable",
           "efficiency_from_dict", "EFFICIENCY_RANGES", "profile_measurements", "PROFILE_FORMAT"]

PROFILE_FORMAT = "zerotune-profile-1"


@dataclass(frozen=True)
class FitUncertainty:
    """How far a fitted profile's predictions fell from held-out measurements: relative 1-sigma errors, the RMS
    of log(predicted / measured) out of sample. Ranking turns them into bands (zerotune.predictor.rank.Uncertainty)."""

    step_time_rel: float
    peak_memory_rel: float | None = None
    """None when no measurement had a peak memory figure."""

    def bands(self) -> Uncertainty:
        """The ranking's error bands: these errors, the uncalibrated memory band where none was measured."""
        return Uncertainty(self.step_time_rel, self.peak_memory_rel or Uncertainty().memory_rel)


@dataclass(frozen=True)
class FitQuality:
    """Mean absolute percentage errors (0.1 = 10%) before the fit, in sample and out of sample."""

    step_time_mape_before: float | None
    step_time_mape_in_sample: float | None
    step_time_mape_out_of_sample: float | None
    peak_memory_mape_before: float | None
    peak_memory_mape_in_sample: float | None
    peak_memory_mape_out_of_sample: float | None
    num_step_time: int
    """Measurements with a step time (status ok)."""
    num_peak_memory: int
    num_oom: int
    num_folds: int
    """Folds of the out-of-sample estimate (leave-one-out when it equals the number of groups held out)."""
    oom_misclassified_before: int = 0
    """Measurements whose fit-or-OOM outcome the model got wrong (OOM predicted to fit, or vice versa)."""
    oom_misclassified_after: int = 0
    held_out_by: str = "configuration"
    """What each fold holds out: 'model' (several models measured: the transfer a profile claims) or
    'configuration' (repeats of one configuration are merged first, so a repeat never tests itself)."""


@dataclass(frozen=True)
class CalibrationProfile:
    hardware: str
    """Catalog name of the accelerator the measurements ran on."""
    efficiency: Efficiency
    uncertainty: FitUncertainty
    fit_quality: FitQuality
    fitted_on: dict[str, Any]
    """{'count': int, 'sources': [str], 'measurements': [records from zerotune.calibrate.measurement.to_record]}."""
    environment: dict[str, Any] = field(default_factory=dict)
    """torch / DeepSpeed / NCCL versions, device name and memory, date: as the caller measured them."""
    created: str = ""
    """ISO 8601 date the profile was made."""


TUNE_TIME_EFFICIENCY = ("memory_cache_gain", "fresh_page_s_per_byte", "dropout_rng_s_per_element")
"""Efficiency fields `tune` sets from its profiling run on the day (Efficiency.memory_cache_gain,
fresh_page_s_per_byte, dropout_rng_s_per_element), never saved."""


def profile_measurements(profile: CalibrationProfile) -> list[Measurement]:
    """The measurements a profile was fitted on, as Measurement records again."""
    return [from_record(r, f"profile {profile.hardware}: fitted_on") for r in profile.fitted_on["measurements"]]


def shipped_profile_path(hardware: str) -> Path:
    """The profile zerotune ships for a catalog accelerator (data/profiles/<hardware>.json); read-only."""
    return data_dir() / "profiles" / f"{safe_name(hardware, 'hardware name')}.json"


def user_profiles_dir() -> Path:
    """Where `zerotune calibrate` writes profiles when --out is not given: $ZEROTUNE_HOME/profiles, else
    $XDG_DATA_HOME/zerotune/profiles, else ~/.local/share/zerotune/profiles. Never inside data/."""
    home = os.environ.get("ZEROTUNE_HOME")
    if home:
        return Path(home).expanduser() / "profiles"
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg).expanduser() / "zerotune" / "profiles"


def default_profile_path(hardware: str) -> Path:
    """Where calibrate writes a profile for `hardware` by default: the user folder, not the shipped data."""
    return user_profiles_dir() / f"{safe_name(hardware, 'hardware name')}.json"


def find_profile(hardware: str) -> Path | None:
    """The profile predict and tune use for `hardware` when none is named: the user's own calibration first,
    then the shipped one; None when neither exists."""
    for path in (default_profile_path(hardware), shipped_profile_path(hardware)):
        if path.is_file():
            return path
    return None


def check_writable(path: Path, force: bool) -> None:
    """Refuse to write a profile into the shipped data/ folder, or over an existing file without --force."""
    shipped = (data_dir() / "profiles").resolve()
    if Path(path).resolve().is_relative_to(shipped):
        raise ValueError(f"--out {path}: data/profiles holds zerotune's shipped profiles and is never overwritten; "
                         f"leave --out out (it writes to {user_profiles_dir()}) or give another path")
    if Path(path).is_dir():
        raise ValueError(f"--out {path}: a folder; give the profile's file name, e.g. {Path(path) / 'profile.json'}")
    parent = Path(path).resolve().parent
    if parent.exists() and not parent.is_dir():
        raise ValueError(f"--out {path}: {parent} is a file, not a folder; give another --out")
    if Path(path).exists() and not force:
        raise ValueError(f"--out {path} exists; add --force to replace it, or give another --out")


def _not_computed_as_null(quality: dict[str, Any]) -> dict[str, Any]:
    """A MAPE over no measurement comes out of numpy as NaN; in the profile it is null ("not computed"), so the
    file stays JSON and reads back."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in quality.items()}


def save_profile(profile: CalibrationProfile, path: Path) -> None:
    doc: dict[str, Any] = {"format": PROFILE_FORMAT, "hardware": profile.hardware, "created": profile.created,
                           "efficiency": {k: v for k, v in dataclasses.asdict(profile.efficiency).items()
                                          if k not in TUNE_TIME_EFFICIENCY},
                           "uncertainty": dataclasses.asdict(profile.uncertainty),
                           "fit_quality": _not_computed_as_null(dataclasses.asdict(profile.fit_quality)),
                           "fitted_on": profile.fitted_on, "environment": profile.environment}
    write_json_atomic(path, doc, indent=1)


# -- strict reading -------------------------------------------------------------------------------------

def _check_keys(where: str, doc: Any, known: list[str], required: list[str]) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(doc).__name__}")
    for key in doc:
        if key not in known:
            raise ValueError(f"{where}: unknown key {key!r}{nearest(key, known)}; known keys: {', '.join(known)}")
    for key in required:
        if key not in doc:
            raise ValueError(f"{where}: missing key {key!r}; re-create the profile with zerotune calibrate")
    return doc


def _names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def _required(cls: type) -> list[str]:
    return [f.name for f in fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


EFFICIENCY_RANGES: dict[str, tuple[float, float]] = {
    "allocator_slack_fraction": (0.0, 1.0), "gemm_efficiency_scale": (1e-6, 1.5),
    "memory_bandwidth_efficiency": (1e-6, 1.5), "kernel_launch_s": (0.0, 1.0),
    "fp32_compute_scale": (1e-6, 100.0), "fp16_compute_scale": (1e-6, 100.0),
    "bf16_compute_scale": (1e-6, 100.0), "intra_node_bandwidth_efficiency": (1e-6, 1.5),
    "inter_node_bandwidth_efficiency": (1e-6, 1.5), "overlap_efficiency": (0.0, 1.0),
    "all_gather_bandwidth_ratio": (1e-3, 10.0), "reduce_scatter_bandwidth_ratio": (1e-3, 10.0),
    "optimizer_bytes_per_param": (1e-3, 1000.0), "host_optimizer_params_per_s": (1.0, 1e15),
    "intra_node_latency_s": (0.0, 1.0), "inter_node_latency_s": (0.0, 1.0), "runtime_reserved_bytes": (0.0, 1e14),
    "step_overhead_s": (0.0, 3600.0), "micro_step_overhead_s": (0.0, 3600.0), "grad_hook_s": (0.0, 1.0),
    "zero3_module_hook_s": (0.0, 1.0), "zero3_param_fetch_s": (0.0, 1.0), "zero3_gather_s": (0.0, 1.0), "collective_launch_s": (0.0, 1.0),
    "zero3_gathers_per_block": (0.0, 1000.0),
    "tensor_sync_check_s": (0.0, 1.0), "optimizer_tensor_s": (0.0, 1.0),
}
"""Inclusive (low, high) of each Efficiency field a profile may hold: fractions of a peak lie in (0, 1] (bandwidth
up to 1.5x a conservative datasheet figure), seconds and bytes are non-negative and below what one step could take.
Each contains the fitter's bounds (zerotune.calibrate.params.PARAMS, a test checks it), so every fitted profile reads
back. A field not listed must be finite and >= 0."""


def efficiency_from_dict(doc: Any, where: str = "efficiency") -> Efficiency:
    """An Efficiency from {field: number}; a misspelled field is an error, a missing one keeps its default,
    a value outside its range (EFFICIENCY_RANGES; -1, 50 or NaN as an efficiency) is an error."""
    _check_keys(where, doc, [n for n in _names(Efficiency) if n not in TUNE_TIME_EFFICIENCY], [])
    for key, value in doc.items():
        optional = getattr(Efficiency(), key) is None
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}.{key} must be a number, got {value!r}")
        low, high = EFFICIENCY_RANGES.get(key, (0.0, math.inf))
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"{where}.{key} {value!r} is outside {low:g}..{high:g}; re-create the profile with "
                             f"zerotune calibrate or fix the value")
    return Efficiency(**{k: (None if v is None else float(v)) for k, v in doc.items()})


def _no_residual(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Profiles written before the learned residual was removed carry "residual": null; that alone is accepted."""
    if doc.get("residual", None) is not None:
        raise ValueError(f"profile {path}: holds a learned residual, which zerotune no longer applies (it did not cut "
                         f"the error on held-out models); set \"residual\": null or re-create the profile")
    return {k: v for k, v in doc.items() if k != "residual"}


def _uncertainty(where: str, doc: Any) -> FitUncertainty:
    unc = _check_keys(where, doc, _names(FitUncertainty), _required(FitUncertainty))
    for key, value in unc.items():
        if value is None and key == "peak_memory_rel":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                math.isfinite(value) and 0 <= value <= 10):
            raise ValueError(f"{where}.{key} must be a relative error from 0 to 10, got {value!r}; re-create the "
                             f"profile with zerotune calibrate")
    return FitUncertainty(**unc)


def _check_types(where: str, doc: dict[str, Any], quality: dict[str, Any], fitted_on: dict[str, Any]) -> None:
    """ValueError (one line) naming a profile field of the wrong type: the hardware a catalog name, the fit's errors
    numbers (or null, not computed), its counts whole numbers from 0, what it was fitted on a count and a list."""
    if not isinstance(doc["hardware"], str) or not doc["hardware"]:
        raise ValueError(f"{where}: hardware must be the catalog name it was fitted on, got {doc['hardware']!r}; "
                         f"re-create it with zerotune calibrate")
    for name, value in quality.items():
        if name == "held_out_by":
            ok = value in ("configuration", "model")
        elif name.startswith(("step_time_mape", "peak_memory_mape")):
            ok = value is None or (not isinstance(value, bool) and isinstance(value, (int, float))
                                   and math.isfinite(value) and value >= 0)
        else:
            ok = not isinstance(value, bool) and isinstance(value, int) and value >= 0
        if not ok:
            raise ValueError(f"{where}: fit_quality.{name} {value!r} is not what zerotune calibrate writes there; "
                             f"re-create the profile")
    count, sources, measurements = fitted_on["count"], fitted_on["sources"], fitted_on["measurements"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 0 or not isinstance(sources, list) \
            or not isinstance(measurements, list):
        raise ValueError(f"{where}: fitted_on must hold a count, a list of sources and a list of measurements; "
                         f"re-create the profile")


def load_profile(path: Path) -> CalibrationProfile:
    path = Path(path)
    try:
        doc = json.loads(read_user_text(path))
    except FileNotFoundError:
        raise ValueError(f"profile {path}: no such file; run zerotune calibrate or give an existing path") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"profile {path}: malformed JSON ({exc.msg}, line {exc.lineno}); fix or re-create it") \
            from None
    top = ["format"] + [n for n in _names(CalibrationProfile)]
    doc = _check_keys(f"profile {path}", _no_residual(doc, path) if isinstance(doc, dict) else doc, top,
                      ["format"] + _required(CalibrationProfile))
    if doc["format"] != PROFILE_FORMAT:
        raise ValueError(f"profile {path}: format {doc['format']!r} is not {PROFILE_FORMAT!r}; re-create it")
    unc = _uncertainty(f"profile {path}: uncertainty", doc["uncertainty"])
    quality = _check_keys(f"profile {path}: fit_quality", doc["fit_quality"], _names(FitQuality),
                          _required(FitQuality))
    fitted_on = _check_keys(f"profile {path}: fitted_on", doc["fitted_on"], ["count", "sources", "measurements"],
                            ["count", "sources", "measurements"])
    if not isinstance(doc.get("environment", {}), dict):
        raise ValueError(f"profile {path}: environment must be a JSON object of versions and device facts")
    _check_types(f"profile {path}", doc, quality, fitted_on)
    for number, record in enumerate(fitted_on["measurements"]):
        from_record(record, f"profile {path}: fitted_on.measurements[{number}]")
    return CalibrationProfile(
        hardware=str(doc["hardware"]), efficiency=efficiency_from_dict(doc["efficiency"], f"profile {path}: efficiency"),
        uncertainty=unc, fit_quality=FitQuality(**quality), fitted_on=fitted_on,
        environment=dict(doc.get("environment") or {}), created=str(doc.get("created", "")))
