"""Refit saved profiles from the measurements they carry, with the current model and parameter list.

    python -m zerotune.calibrate.refit data/profiles/h100-80gb.json [more profiles ...]

A profile's fit depends on the predictor it was fitted against: when the model or calibrate/params.py changes,
the shipped profiles are refitted from their own `fitted_on` measurements (nothing is re-measured), starting
from their own microbenchmarks as `calibrate` does, and written back in place with the measurements beside them.
Only the measurements and the environment are read: the old efficiency block may name fields the model no
longer has, and it is what the refit replaces.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

from zerotune.calibrate.measurement import from_record
from zerotune.calibrate.run import Calibration, fit_and_save, format_fit, starting_efficiency
from zerotune.predictor import load_hardware

__all__ = ["refit", "main"]


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"profile {path}: malformed JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("fitted_on"), dict) or "hardware" not in doc:
        raise ValueError(f"profile {path}: no hardware or fitted_on measurements to refit from")
    return doc


def refit(path: Path) -> Calibration:
    doc = _read(path)
    records = doc["fitted_on"].get("measurements") or []
    measurements = [from_record(r, f"profile {path}: fitted_on.measurements[{i}]") for i, r in enumerate(records)]
    environment = doc.get("environment") or {}
    base = starting_efficiency(environment, load_hardware(str(doc["hardware"])).name)
    return fit_and_save(measurements, environment, path, base=base)


def main(argv: Sequence[str] | None = None) -> int:
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python -m zerotune.calibrate.refit PROFILE.json [...]", file=sys.stderr)
        return 2
    try:
        for path in paths:
            print(format_fit(refit(path)), end="\n\n")
    except (ValueError, OSError) as exc:
        print(f"refit: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
