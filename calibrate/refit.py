"""Refit saved profiles from the measurements they carry, with the current model and parameter list.

    python -m calibrate.refit data/profiles/h100-80gb.json [more profiles ...]

A profile's fit depends on the predictor it was fitted against: when the model or calibrate/params.py changes,
the shipped profiles are refitted from their own `fitted_on` measurements (nothing is re-measured), starting
from their own microbenchmarks as `calibrate` does, and written back in place with the measurements beside them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

from calibrate.profile import load_profile, profile_measurements
from calibrate.run import Calibration, fit_and_save, format_fit, starting_efficiency

__all__ = ["refit", "main"]


def refit(path: Path) -> Calibration:
    profile = load_profile(path)
    measurements = profile_measurements(profile)
    base = starting_efficiency(profile.environment, profile.hardware)
    return fit_and_save(measurements, profile.environment, path, base=base)


def main(argv: Sequence[str] | None = None) -> int:
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python -m calibrate.refit PROFILE.json [...]", file=sys.stderr)
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
