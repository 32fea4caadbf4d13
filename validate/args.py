"""Command-line numbers, checked as argparse reads them: whole or finite, positive, and below a ceiling that
keeps what zerotune enumerates in memory. One table of ceilings serves predict, calibrate and tune."""

from __future__ import annotations

import argparse
import math
import re
from typing import Callable

from zerotune.predictor.space import EXPLORABLE
from zerotune.predictor.limits import (MAX_GPUS_PER_NODE, MAX_GRAD_ACCUM, MAX_MICRO_BATCH, MAX_NODES, MAX_PARALLEL,
                              MAX_SEQ_LEN)

__all__ = ["positive_int", "positive_int_list", "positive_float", "float_at_least", "non_negative_float",
           "explore_items", "FLAG_MAXIMA"]

FLAG_MAXIMA: dict[str, float] = {
    "--num_gpus": MAX_GPUS_PER_NODE, "--num_nodes": MAX_NODES, "--micro_batch": MAX_MICRO_BATCH,
    "--grad_accum": MAX_GRAD_ACCUM, "--seq_len": MAX_SEQ_LEN, "--mp_size": MAX_PARALLEL, "--pp_size": MAX_PARALLEL, "--top": 1_000_000,
    "--top_k": 10_000, "--max_probes": 1_000, "--timeout_s": 7 * 24 * 3600.0, "--memory_cap_gib": 1_048_576.0,
    "--headroom_gib": 16_384.0, "--master_port": 65_535,
}
"""The largest value each flag takes: far above any real run (16M tokens per sample, 4096 GPUs per node, a week
per experiment), so a value beyond it is a typo or the wrong unit."""


_ASCII_INTEGER = re.compile(r"[+-]?[0-9]+")


def positive_int(flag: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not _ASCII_INTEGER.fullmatch(text.strip()):  # int() also takes 1_0 and other scripts' digits
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number, got {text!r}")
        value = int(text)
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be at least 1, got {value}")
        if value > FLAG_MAXIMA[flag]:
            raise argparse.ArgumentTypeError(f"{flag} {text} is above the {FLAG_MAXIMA[flag]:,.0f} zerotune "
                                             f"accepts; give a smaller value")
        return value
    return parse


def positive_int_list(flag: str) -> Callable[[str], list[int]]:
    one = positive_int(flag)

    def parse(text: str) -> list[int]:
        return [one(part) for part in text.split(",")]
    return parse


def _float(flag: str, text: str, low: float, inclusive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{flag} must be a number, got {text!r}") from None
    above = value >= low if inclusive else value > low
    if not (math.isfinite(value) and above and value <= FLAG_MAXIMA[flag]):
        bound = f"at least {low:g}" if inclusive else f"above {low:g}"
        raise argparse.ArgumentTypeError(f"{flag} must be a finite number {bound} and at most "
                                         f"{FLAG_MAXIMA[flag]:,.0f}, got {text!r}")
    return value


def positive_float(flag: str) -> Callable[[str], float]:
    return lambda text: _float(flag, text, 0.0, inclusive=False)


def float_at_least(flag: str, low: float) -> Callable[[str], float]:
    return lambda text: _float(flag, text, low, inclusive=True)


def non_negative_float(flag: str) -> Callable[[str], float]:
    return lambda text: _float(flag, text, 0.0, inclusive=True)


def explore_items(text: str) -> tuple[str, ...]:
    """--explore's list (predict and tune): what the space may add, none of it for "none"; ValueError (one line)
    for an empty list, an unknown item or none beside something to explore."""
    given = [i.strip() for i in text.split(",") if i.strip()]
    if not given:
        raise ValueError("--explore is empty: use offload, checkpointing or none")
    if "none" in given and len(given) > 1:
        raise ValueError(f"--explore {text}: none with something to explore; give one or the other")
    for item in given:
        if item not in (*EXPLORABLE, "none"):
            raise ValueError(f"--explore {item!r}: use any of {', '.join(EXPLORABLE)} or none")
    return tuple(i for i in given if i != "none")
