"""The environment an experiment or a profiling run is launched with: the profiling site (calibrate/profiling_site)
first on PYTHONPATH, and where its ranks write what they read (the model and timings of a profiling run, each rank's
peak memory at exit)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

__all__ = ["PROFILING_SITE", "peak_env", "read_peak_bytes", "profiling_env"]

PROFILING_SITE = Path(__file__).resolve().parent.parent / "calibrate" / "profiling_site"


def peak_env(env: Mapping[str, str], prefix: Path) -> dict[str, str]:
    """An experiment's added environment: the profiling site first on PYTHONPATH, writing only each rank's peak
    memory at exit to <prefix>.rank<R>.json (read_peak_bytes)."""
    return {**env, "PYTHONPATH": _site_first(env), "ZEROTUNE_PEAK_OUT": str(prefix)}


def read_peak_bytes(prefix: Path) -> float | None:
    """The largest peak memory any rank of an experiment wrote (peak_env), or None where none did."""
    peaks = []
    for path in prefix.parent.glob(f"{prefix.name}.rank*.json"):
        try:
            value = json.loads(path.read_text()).get("peak_memory_bytes")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, (int, float)) and value > 0:
            peaks.append(float(value))
    return max(peaks) if peaks else None


def profiling_env(env: Mapping[str, str], prefix: Path) -> dict[str, str]:
    """The run's added environment: the profiling site first on PYTHONPATH, the output prefix."""
    return {**env, "PYTHONPATH": _site_first(env), "ZEROTUNE_PROFILE_OUT": str(prefix)}


def _site_first(env: Mapping[str, str]) -> str:
    """PYTHONPATH with the profiling site first, then the user's (the run's added one, else the inherited one)."""
    return os.pathsep.join(p for p in (str(PROFILING_SITE), env.get("PYTHONPATH", os.environ.get("PYTHONPATH", "")))
                           if p)
