"""Starting values for zerotune.calibrate.fit from microbenchmarks (zerotune.calibrate.microbench's results dict).

Matmuls give the GEMM efficiency scale, collectives each link's bandwidth efficiency and latency, measured memory
bandwidth the optimizer's bytes per parameter. The fit then moves these where the probe runs say so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from zerotune.calibrate.params import PARAMS_BY_NAME
from zerotune.predictor import Efficiency, HardwareSpec
from zerotune.predictor.ops import device_rates, gemm_s

__all__ = ["fit_microbenchmarks"]

_DTYPES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "fp16": "fp16", "float16": "fp16", "half": "fp16",
           "bf16": "bf16", "bfloat16": "bf16"}


def _compute_curve(matmuls: list[dict[str, Any]], hw: HardwareSpec) -> dict[str, float]:
    """gemm_efficiency_scale from matmul FLOP/s: the median, over the larger half of the benchmarked shapes
    (the small ones time the host, not the GEMM), of measured / ops.gemm_s's prediction at scale 1."""
    ratios = []
    for r in matmuls:
        precision = _DTYPES.get(str(r["dtype"]))
        if precision not in hw.matmul_flops or float(r.get("seconds", 0)) <= 0:
            continue
        rates = device_rates(hw, precision, Efficiency(gemm_efficiency_scale=1.0, memory_bandwidth_efficiency=1.0))
        m, n, k = float(r["m"]), float(r["n"]), float(r["k"])
        ratios.append((m * n * k, float(gemm_s(m, n, k, 1, rates)) / float(r["seconds"])))
    if len(ratios) < 2:
        return {}
    large = sorted(ratios)[len(ratios) // 2:]
    return {"gemm_efficiency_scale": _clip("gemm_efficiency_scale", float(np.median([x for _, x in large])))}


def _clip(name: str, value: float) -> float:
    """Inside the fit's bounds for the parameter (calibrate/params.py), so the fit starts where it may move."""
    p = PARAMS_BY_NAME.get(name)
    return value if p is None else min(max(value, p.lower), p.upper)


def _ring_steps(op: str, num_ranks: int) -> int:
    """Ring steps of a collective, as zerotune.predictor.step_time.collective_s counts them."""
    return 2 * (num_ranks - 1) if op.replace("_", "").lower() == "allreduce" else num_ranks - 1


NUM_LARGEST_SIZES = 2
"""Message sizes (the largest measured) that set a link's per-operation bandwidths: data parallelism sends whole
gradients and parameter partitions, tens of MB and more, and gloo's ratios between operations change below 16 MiB
(all-gather 1.25x an all-reduce's bus bandwidth at 16 MiB, 0.33x at 64 and 256 MiB, data/profiles/cpu.json)."""


def _op(row: dict[str, Any]) -> str:
    return {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter"}.get(
        str(row["op"]).replace("_", "").lower(), str(row["op"]))


def _op_ratios(large: list[dict[str, Any]]) -> dict[str, float]:
    """Each operation's bus bandwidth over the all-reduce's at the same message size (median over the sizes both
    ran): Efficiency.all_gather_bandwidth_ratio and reduce_scatter_bandwidth_ratio. NCCL reads about 1 for both;
    gloo's all-gather and reduce-scatter are slower than its all-reduce (zerotune.predictor.job)."""
    by_size: dict[tuple[str, float], float] = {(_op(r), float(r["bytes"])): float(r["bus_bandwidth_bytes_per_s"])
                                                for r in large}
    out = {}
    for op in ("all_gather", "reduce_scatter"):
        ratios = [bw / by_size[("all_reduce", size)] for (kind, size), bw in by_size.items()
                  if kind == op and by_size.get(("all_reduce", size))]
        if ratios:
            out[f"{op}_bandwidth_ratio"] = float(np.median(ratios))
    return out


def _link(collectives: list[dict[str, Any]], link: str, catalog_bandwidth: float) -> dict[str, float]:
    """Bandwidth efficiency from the larger half of the messages (bus bandwidth / catalog link bandwidth), or,
    where the operations' bandwidths differ, from the all-reduce at the largest sizes with the others as ratios
    to it (_op_ratios); latency per ring step from the smallest messages once their bandwidth term is taken off."""
    rows = sorted((r for r in collectives if r.get("link") == link and int(r.get("num_ranks", 1)) > 1),
                  key=lambda r: float(r["bytes"]))
    if not rows:
        return {}
    large = rows[len(rows) // 2:]
    bus = float(np.median([float(r["bus_bandwidth_bytes_per_s"]) for r in large]))
    # across nodes a ring with r ranks a node runs over r NICs at once (links.data_parallel_link): the
    # catalog's figure is one NIC's, so each record is set against r of them
    per_link = lambda r: float(r["bus_bandwidth_bytes_per_s"]) / (  # noqa: E731
        max(1, int(r.get("num_ranks_per_node", 1))) if link == "inter_node" else 1)
    out = {f"{link}_bandwidth_efficiency": _clip(f"{link}_bandwidth_efficiency",
                                                 float(np.median([per_link(r) for r in large])) / catalog_bandwidth)}
    largest = sorted({float(r["bytes"]) for r in large})[-NUM_LARGEST_SIZES:]
    top = [r for r in large if float(r["bytes"]) in largest]
    all_reduce = [per_link(r) for r in top if _op(r) == "all_reduce"]
    if all_reduce and any(_op(r) != "all_reduce" for r in top):
        # per operation: the all-reduce sets the link, the others their ratio to it (gloo's differ 3-4x)
        out[f"{link}_bandwidth_efficiency"] = _clip(f"{link}_bandwidth_efficiency",
                                                    float(np.median(all_reduce)) / catalog_bandwidth)
        if link == "intra_node":
            out.update(_op_ratios(top))
    smallest = [r for r in rows if float(r["bytes"]) == float(rows[0]["bytes"])]
    latencies = []
    for r in smallest:
        steps = _ring_steps(str(r["op"]), int(r["num_ranks"]))
        volume = float(r["bytes"]) * steps / int(r["num_ranks"])
        latencies.append((float(r["seconds"]) - volume / bus) / steps)
    out[f"{link}_latency_s"] = _clip(f"{link}_latency_s", float(np.median(latencies)))
    return out


def fit_microbenchmarks(results: dict[str, Any], hardware: HardwareSpec, base: Efficiency = Efficiency()) -> Efficiency:
    """Starting values for `fit` from microbenchmarks (zerotune.calibrate.microbench's results dict).

    Matmuls give the GEMM efficiency scale (see _compute_curve); collectives give each link's bandwidth efficiency
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
        scaled = base.optimizer_bytes_per_param * hardware.memory_bandwidth_bytes_per_s / float(measured_bw)
        values["optimizer_bytes_per_param"] = _clip("optimizer_bytes_per_param", scaled)
    return dataclasses.replace(base, **values)
