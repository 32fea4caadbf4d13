"""The Efficiency parameters a calibration may fit: one declaration per parameter, in priority order.

Each entry names a field of zerotune.predictor.job.Efficiency, says what the measured configurations must vary for
the fit to tell it apart from the others (shown when it cannot), its physical bounds and how it is fitted.
Adding or removing a fitted parameter is one line here; `check_params` fails with the field named when a
declared name is not (or no longer) a field of Efficiency.

Order is priority: when the measurements cannot separate every parameter (fewer distinct configurations than
parameters, or two parameters that move every prediction alike), zerotune.calibrate.fit keeps the earlier ones.
The leading ones are those every step has (compute rate, fixed costs); the later ones need runs that
exercise them (ZeRO-3, several nodes, offload, memory figures). The compute rate comes first per precision:
runs in fp16 say how fp16 kernels run (tensor cores), not how fp32 ones do, so a calibration moves the scale
of the precisions it measured and leaves the others uncalibrated rather than carrying one precision's rate
to another; the shared compute efficiency is then the same direction and stays at its (microbenchmarked)
value.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, Sequence

from zerotune.predictor import Efficiency

__all__ = ["Param", "PARAMS", "PARAMS_BY_NAME", "check_params", "to_internal", "from_internal"]


@dataclass(frozen=True)
class Param:
    name: str
    """A field of zerotune.predictor.job.Efficiency."""
    varied_by: str
    """What measurements the fit needs to inform this parameter, said when it cannot ("... needs <varied_by>")."""
    lower: float
    upper: float
    transform: Literal["log", "linear"]
    """log: positive and scale-free, fitted as log(value); linear: fitted as value / scale."""
    scale: float = 1.0
    """Linear parameters are fitted as value / scale, so every internal coordinate is of order one."""
    target: Literal["time", "memory"] = "time"
    """Which prediction it moves: step time or peak memory (the two are fitted apart)."""


# Bounds are physical limits, not guesses of the answer: efficiencies in (0, 1] (bandwidth up to 1.5x the
# catalog in case its datasheet figure is conservative), latencies 0.1 us - 10 ms, Adam traffic between the
# 16 B it must read and ~10x the 30 B it does (Efficiency docstring), overheads 0 - 60 s.
PARAMS: tuple[Param, ...] = (
    Param("fp32_compute_scale", "runs in fp32 and in another precision", 1e-3, 10.0, "log"),
    Param("fp16_compute_scale", "runs in fp16 and in another precision", 1e-3, 10.0, "log"),
    Param("bf16_compute_scale", "runs in bf16 and in another precision", 1e-3, 10.0, "log"),
    Param("gemm_efficiency_scale", "any finished run", 1e-3, 1.5, "log"),
    Param("memory_bandwidth_efficiency", "runs differing in memory-bound share (sequence, width)", 1e-3, 1.5, "log"),
    Param("kernel_launch_s", "runs differing in kernels per second of work (micro-batch, width)", 1e-7, 1e-2, "log"),
    Param("micro_step_overhead_s", "runs differing in micro-batch, sequence or width", 0.0, 60.0, "linear", 0.1),
    Param("step_overhead_s", "runs differing in gradient accumulation steps", 0.0, 60.0, "linear", 0.1),
    Param("zero3_module_hook_s", "a ZeRO-3 run beside a lower stage", 0.0, 1e-2, "linear", 1e-4),
    Param("zero3_param_fetch_s", "ZeRO-3 runs differing in parameter tensors per module", 0.0, 1e-2, "linear", 1e-4),
    Param("zero3_gather_s", "ZeRO-3 runs on several GPUs differing in parameter tensors per module", 0.0, 1e-2,
          "linear", 1e-4),
    Param("grad_hook_s", "ZeRO-2 or 3 runs beside ZeRO-0 or 1", 0.0, 1e-2, "linear", 1e-4),
    Param("tensor_sync_check_s", "16-bit ZeRO-0 runs beside ZeRO-1 or 2", 0.0, 1e-2, "linear", 1e-4),
    Param("optimizer_tensor_s", "16-bit runs of models differing in parameter tensors per parameter", 0.0, 1e-2,
          "linear", 1e-4),
    Param("collective_launch_s", "runs differing in collective calls (buckets, ZeRO-3)", 0.0, 1e-2, "linear", 1e-4),
    Param("intra_node_bandwidth_efficiency", "runs on several GPUs differing in communication", 1e-3, 1.5, "log"),
    Param("optimizer_bytes_per_param", "runs differing in the optimizer's share of a step", 16.0, 300.0, "log"),
    Param("intra_node_latency_s", "runs differing in the number of collective calls", 1e-7, 1e-2, "log"),
    Param("overlap_efficiency", "runs with overlap_comm on and off", 0.0, 1.0, "linear"),
    Param("inter_node_bandwidth_efficiency", "runs on several nodes", 1e-3, 1.5, "log"),
    Param("inter_node_latency_s", "runs on several nodes differing in collective calls", 1e-7, 1e-2, "log"),
    Param("host_optimizer_params_per_s", "runs with the optimizer offloaded to the CPU", 1e6, 1e11, "log"),
    Param("allocator_slack_fraction", "peak memory measured at several sizes", 0.0, 1.0, "linear", target="memory"),
    Param("runtime_reserved_bytes", "a measured peak memory or an OOM run", 0.0, 64 * 2**30, "linear", 2**30, "memory"),
)
PARAMS_BY_NAME = {p.name: p for p in PARAMS}


def check_params(params: Sequence[Param] = PARAMS) -> None:
    """Every declared name must be an Efficiency field holding a number (or None: take the catalog's figure)."""
    fields = {f.name for f in dataclasses.fields(Efficiency)}
    for p in params:
        if p.name not in fields:
            raise ValueError(f"calibrate/params.py declares {p.name!r}, which is not a field of "
                             f"zerotune.predictor.job.Efficiency; fix or remove that line (fields: {', '.join(sorted(fields))})")
        if not p.lower < p.upper or (p.transform == "log" and p.lower <= 0):
            raise ValueError(f"calibrate/params.py: {p.name} bounds [{p.lower}, {p.upper}] are not a "
                             f"{'positive ' if p.transform == 'log' else ''}interval")


def to_internal(p: Param, value: float) -> float:
    return math.log(value) if p.transform == "log" else value / p.scale


def from_internal(p: Param, x: float) -> float:
    return math.exp(x) if p.transform == "log" else x * p.scale
