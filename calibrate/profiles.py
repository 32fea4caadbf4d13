"""A cluster's calibration profile: fitted Efficiency, how well it fits, and what it was fitted on.

`predict` and `tune` read a profile to replace the uncalibrated Efficiency defaults. It is written as
JSON (atomically, so a crash never leaves half a profile) and read strictly: an unknown key anywhere is
an error naming the key and the nearest known one, because a misspelled Efficiency field would
otherwise silently fall back to its default.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from zerotune.calibrate.measurement import Measurement, from_record
from zerotune.predictor import Efficiency
from zerotune.predictor.catalog import data_dir, nearest

__all__ = ["CalibrationProfile", "FitQuality", "Uncertainty", "save_profile", "load_profile",
           "default_profile_path", "efficiency_from_dict", "profile_measurements", "PROFILE_FORMAT"]

PROFILE_FORMAT = "zerotune-profile-1"


@dataclass(frozen=True)
class Uncertainty:
    """Relative 1-sigma error bands, from out-of-sample fit error: RMS of log(predicted / measured)."""

    step_time_rel: float
    peak_memory_rel: float | None = None
    """None when no measurement had a peak memory figure."""


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
    uncertainty: Uncertainty
    fit_quality: FitQuality
    fitted_on: dict[str, Any]
    """{'count': int, 'sources': [str], 'measurements': [records from zerotune.calibrate.measurement.to_record]}."""
    environment: dict[str, Any] = field(default_factory=dict)
    """torch / DeepSpeed / NCCL versions, device name and memory, date: as the caller measured them."""
    created: str = ""
    """ISO 8601 date the profile was made."""


def profile_measurements(profile: CalibrationProfile) -> list[Measurement]:
    """The measurements a profile was fitted on, as Measurement records again."""
    return [from_record(r, f"profile {profile.hardware}: fitted_on") for r in profile.fitted_on["measurements"]]


def default_profile_path(hardware: str) -> Path:
    return data_dir() / "profiles" / f"{hardware}.json"


def _atomic_write(path: Path, text: str) -> None:
    """Write beside the target and rename over it: readers see the old file or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def save_profile(profile: CalibrationProfile, path: Path) -> None:
    doc: dict[str, Any] = {"format": PROFILE_FORMAT, "hardware": profile.hardware, "created": profile.created,
                           "efficiency": dataclasses.asdict(profile.efficiency),
                           "uncertainty": dataclasses.asdict(profile.uncertainty),
                           "fit_quality": dataclasses.asdict(profile.fit_quality),
                           "fitted_on": profile.fitted_on, "environment": profile.environment}
    _atomic_write(Path(path), json.dumps(doc, indent=1) + "\n")


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


def efficiency_from_dict(doc: Any, where: str = "efficiency") -> Efficiency:
    """An Efficiency from {field: number}; a misspelled field is an error, a missing one keeps its default."""
    _check_keys(where, doc, _names(Efficiency), [])
    for key, value in doc.items():
        optional = getattr(Efficiency(), key) is None
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}.{key} must be a number, got {value!r}")
    return Efficiency(**{k: (None if v is None else float(v)) for k, v in doc.items()})


def _no_residual(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Profiles written before the learned residual was removed carry "residual": null; that alone is accepted."""
    if doc.get("residual", None) is not None:
        raise ValueError(f"profile {path}: holds a learned residual, which zerotune no longer applies (it did not cut "
                         f"the error on held-out models); set \"residual\": null or re-create the profile")
    return {k: v for k, v in doc.items() if k != "residual"}


def load_profile(path: Path) -> CalibrationProfile:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
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
    unc = _check_keys(f"profile {path}: uncertainty", doc["uncertainty"], _names(Uncertainty),
                      _required(Uncertainty))
    quality = _check_keys(f"profile {path}: fit_quality", doc["fit_quality"], _names(FitQuality),
                          _required(FitQuality))
    fitted_on = _check_keys(f"profile {path}: fitted_on", doc["fitted_on"], ["count", "sources", "measurements"],
                            ["count", "sources", "measurements"])
    if not isinstance(doc.get("environment", {}), dict):
        raise ValueError(f"profile {path}: environment must be a JSON object of versions and device facts")
    for number, record in enumerate(fitted_on["measurements"]):
        from_record(record, f"profile {path}: fitted_on.measurements[{number}]")
    return CalibrationProfile(
        hardware=str(doc["hardware"]), efficiency=efficiency_from_dict(doc["efficiency"], f"profile {path}: efficiency"),
        uncertainty=Uncertainty(**unc), fit_quality=FitQuality(**quality), fitted_on=fitted_on,
        environment=dict(doc.get("environment") or {}), created=str(doc.get("created", "")))
