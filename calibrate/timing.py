"""Seconds per call of a device operation, one way for every timing zerotune makes: the calibration's
microbenchmarks (calibrate/microbench.py) and the profiling run's pace checks (calibrate/profiling_site), which
compare against them and so must time alike. Imports nothing: the profiling site loads this file by path inside
the user's process, where no zerotune package name may enter.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

__all__ = ["per_call_s", "MIN_BATCH_S", "MAX_REPS", "NUM_BATCHES"]

MIN_BATCH_S = 0.02
"""A timed batch repeats the operation until it lasts this long, so timer, launch and synchronisation overheads stay
small (a 2048^3 bf16 matmul on an H100 takes about 25 us, about what one synchronisation costs)."""
MAX_REPS = 1024
NUM_BATCHES = 5
"""Batches per measurement; the median is kept (other jobs share the machine)."""


def per_call_s(fn: Callable[[], Any], sync: Callable[[], None]) -> float:
    """Seconds per call: batches of repeated calls between synchronisations, the median of NUM_BATCHES."""
    fn()
    sync()  # warm-up: kernel selection, allocator
    reps = 1
    while True:
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        if time.perf_counter() - start >= MIN_BATCH_S or reps >= MAX_REPS:
            break
        reps *= 2
    batches = []
    for _ in range(NUM_BATCHES):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        batches.append((time.perf_counter() - start) / reps)
    return statistics.median(batches)
