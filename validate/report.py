"""What `predict` prints: one prediction, a ranking, a scaling sweep, a hardware comparison; as text or JSON.

Dicts and human units appear only here, at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerotune.predictor import Estimate, experiment_name, to_ds_config
from zerotune.predictor.dsconfig import OffloadConfig
from zerotune.predictor.rank import Ranked, Ranking
from zerotune.predictor.units import GIB

__all__ = ["prediction_dict", "format_estimate", "ranking_dict", "format_ranking", "WhatIf", "whatif_dict",
           "format_whatif", "describe_knobs"]


def prediction_dict(est: Estimate, calibrated: bool = False) -> dict[str, Any]:
    """The JSON edge of a prediction: one object per configuration."""
    job, cfg, mem, time = est.job, est.config, est.memory, est.time
    cluster = job.cluster
    return {
        "name": experiment_name(cfg),
        "model": {"name": job.model.name, "num_params": job.model.num_params},
        "hardware": cluster.hardware.name, "num_nodes": cluster.num_nodes, "num_gpus": cluster.num_gpus_per_node,
        "seq_len": job.seq_len, "precision": cfg.precision,
        "config": to_ds_config(cfg, cluster.world_size),
        "memory": {
            "total_bytes": mem.total_bytes, "capacity_bytes": mem.capacity_bytes, "fits": mem.fits,
            "headroom_bytes": mem.headroom_bytes, "peak_phase": mem.peak_phase,
            "breakdown": {f"{term}_bytes": value for term, value in mem.breakdown_bytes.items()},
            "phase_totals": {f"{phase}_bytes": value for phase, value in mem.phase_totals_bytes.items()},
            "host_bytes_per_node": mem.host_bytes_per_node,
            "host_capacity_bytes_per_node": mem.host_capacity_bytes_per_node,
            "nvme_bytes_per_node": mem.nvme_bytes_per_node,
        },
        "time": {"step_s": time.step_s, "breakdown": {f"{term}_s": v for term, v in time.breakdown_s.items()},
                 "comm_total_s": time.comm_total_s},
        "throughput_samples_per_s": est.throughput_samples_per_s, "latency_ms": est.latency_ms,
        "tflops_per_gpu": est.flops_per_gpu / 1e12, "tokens_per_s": est.tokens_per_s, "mfu": est.mfu,
        "calibrated": calibrated,
    }


def _offload_text(off: OffloadConfig) -> str:
    return off.device if off.device != "none" else "-"


def format_estimate(est: Estimate, calibrated: bool = False) -> str:
    job, cfg, mem = est.job, est.config, est.memory
    c, z = job.cluster, cfg.zero
    lines = [
        f"{job.model.name} ({job.model.num_params / 1e6:,.1f}M parameters) on {c.world_size} x {c.hardware.name} "
        f"({c.num_nodes} node(s) x {c.num_gpus_per_node}), seq {job.seq_len}, {cfg.precision}",
        f"ZeRO {z.stage}, micro-batch {cfg.train_micro_batch_size_per_gpu}, grad-accum "
        f"{cfg.gradient_accumulation_steps}, mp {cfg.mp_size}, offload optimizer {_offload_text(z.offload_optimizer)}"
        f" / params {_offload_text(z.offload_param)}, activation checkpointing "
        f"{'on' if cfg.activation_checkpointing.enabled else 'off'}   [{experiment_name(cfg)}]",
        "",
        f"{'memory per GPU (' + mem.peak_phase + ' peak)':<44}{'GiB':>9}{'share':>8}",
    ]
    for term, value in mem.breakdown_bytes.items():
        lines.append(f"  {term:<42}{value / GIB:>9.2f}{value / mem.total_bytes:>8.1%}")
    lines += [f"  {'total':<42}{mem.total_bytes / GIB:>9.2f}",
              f"  {'capacity':<42}{mem.capacity_bytes / GIB:>9.2f}", ""]
    verdict = "FITS" if mem.fits else "DOES NOT FIT"
    host_bound = mem.host_bytes_per_node > mem.host_capacity_bytes_per_node
    lines.append(f"{verdict}: headroom {mem.headroom_bytes / GIB:+.2f} GiB per GPU "
                 f"({mem.headroom_bytes / mem.capacity_bytes:+.1%} of capacity)"
                 + ("; the node's host memory is exceeded" if host_bound else ""))
    if mem.host_bytes_per_node or mem.nvme_bytes_per_node:
        what = "every rank's memory (the CPU accelerator's device memory is host RAM)" if c.hardware.kind == "cpu" \
            else "offload"
        lines.append(f"host memory per node for {what}: {mem.host_bytes_per_node / GIB:.2f} GiB of "
                     f"{mem.host_capacity_bytes_per_node / GIB:.0f} GiB; NVMe {mem.nvme_bytes_per_node / GIB:.2f} GiB")
    label = f"time per optimizer step ({'calibrated' if calibrated else 'uncalibrated'})"
    lines += ["", f"{label:<44}{'ms':>9}{'share':>8}"]
    for term, value in est.time.breakdown_s.items():
        lines.append(f"  {term:<42}{value * 1e3:>9.1f}{value / est.time.step_s:>8.1%}")
    lines += [f"  {'step':<42}{est.time.step_s * 1e3:>9.1f}", "",
              f"throughput {est.throughput_samples_per_s:,.1f} samples/s ({est.tokens_per_s:,.0f} tokens/s), "
              f"{est.flops_per_gpu / 1e12:.1f} TFLOP/s per GPU, MFU {est.mfu:.1%}"]
    return "\n".join(lines)


def describe_knobs(est: Estimate) -> str:
    """The knobs a ranking row differs in, compactly: buckets in elements (5e8), flags as letters."""
    cfg, z = est.config, est.config.zero
    parts = [f"rbs {z.reduce_bucket_size_elems:.0e}"] if z.stage else []
    if z.stage:
        parts.append("overlap" if z.overlap_comm else "no-overlap")
    if z.stage in (1, 2) and not z.reduce_scatter:
        parts.append("all-reduce")
    if z.stage and not z.contiguous_gradients:
        parts.append("non-contig")
    if z.stage == 3:
        parts.append(f"pbs {z.stage3_prefetch_bucket_size_elems:.0e} ppt {z.stage3_param_persistence_threshold_elems:.0e}")
    if z.offload_optimizer.device != "none":
        parts.append(f"opt->{z.offload_optimizer.device}")
    if z.offload_param.device != "none":
        parts.append(f"param->{z.offload_param.device}")
    if cfg.activation_checkpointing.enabled:
        parts.append("ckpt")
    return ", ".join(parts).replace("e+0", "e")


def _ranked_dict(position: int, ranked: Ranked, calibrated: bool) -> dict[str, Any]:
    return {"rank": position, **prediction_dict(ranked.estimate, calibrated), "metric_value": ranked.metric_value,
            "metric_low": ranked.metric_low, "metric_high": ranked.metric_high,
            "close_to_best": ranked.close_to_best, "memory_at_risk": ranked.memory_at_risk}


def ranking_dict(ranking: Ranking, calibrated: bool = False) -> dict[str, Any]:
    return {"metric": ranking.metric, "num_configs": ranking.num_configs, "num_fit": ranking.num_fit,
            "ranking": [_ranked_dict(i, r, calibrated) for i, r in enumerate(ranking.entries, 1)]}


def _metric_text(ranked: Ranked, metric: str) -> str:
    scale, unit = {"throughput": (1, ""), "latency": (1, ""), "flops": (1e-12, "T")}[metric]
    return f"{ranked.metric_value * scale:,.1f}{unit} ({ranked.metric_low * scale:,.0f}-{ranked.metric_high * scale:,.0f})"


def format_ranking(ranking: Ranking, headroom_bytes: float = 0.0, calibrated: bool = False) -> str:
    if not ranking.entries:
        return "nothing fits"
    first = ranking.entries[0].estimate
    job = first.job
    c = job.cluster
    unit = {"throughput": "samples/s", "latency": "ms/step", "flops": "FLOP/s/GPU"}[ranking.metric]
    lines = [f"{job.model.name} on {c.world_size} x {c.hardware.name} ({c.num_nodes} node(s)), seq {job.seq_len}, "
             f"{first.config.precision}: {ranking.num_fit:,} of {ranking.num_configs:,} configurations fit"
             + (f" with {headroom_bytes / GIB:.1f} GiB headroom" if headroom_bytes else "")
             + f"; ranked by {ranking.metric} ({'calibrated' if calibrated else 'uncalibrated'})", "",
             f"{'#':>3} {'name':<44}{'ZeRO':>5}{'mbs':>5}{'gas':>5}{'mem GiB':>9}{'step ms':>10}"
             f"{'samples/s':>11}{'TFLOP/s':>9}  {unit + ' (band)':<24} knobs"]
    for i, ranked in enumerate(ranking.entries, 1):
        est = ranked.estimate
        cfg = est.config
        mark = "!" if ranked.memory_at_risk else " "
        lines.append(f"{i:>3} {experiment_name(cfg):<44}{cfg.zero.stage:>5}{cfg.train_micro_batch_size_per_gpu:>5}"
                     f"{cfg.gradient_accumulation_steps:>5}{est.memory.total_bytes / GIB:>8.2f}{mark}"
                     f"{est.time.step_s * 1e3:>10.1f}{est.throughput_samples_per_s:>11.1f}"
                     f"{est.flops_per_gpu / 1e12:>9.1f}  {_metric_text(ranked, ranking.metric):<24} {describe_knobs(est)}")
    close = sum(r.close_to_best for r in ranking.entries)
    lines += ["", f"{close} of the top {len(ranking.entries)} are within the prediction band of the best: "
              + ("a close race that only measurement (zerotune tune) settles." if close > 1 else "a clear winner.")]
    if any(r.memory_at_risk for r in ranking.entries):
        lines.append("! predicted to fit, but within the memory model's uncertainty of the capacity")
    return "\n".join(lines)


@dataclass(frozen=True)
class WhatIf:
    """One point of a what-if sweep: the best (or the given) configuration at a cluster size or on a GPU."""

    label: str
    estimate: Estimate | None
    """None when nothing fits there."""
    scaling_efficiency: float | None = None
    """Throughput per GPU relative to the sweep's first size."""
    note: str = "nothing fits"
    """Why there is no estimate."""


def whatif_dict(points: list[WhatIf], kind: str, calibrated: bool = False) -> dict[str, Any]:
    return {kind: [{"label": p.label, "fits": p.estimate is not None, "scaling_efficiency": p.scaling_efficiency,
                    **(prediction_dict(p.estimate, calibrated) if p.estimate else {"note": p.note})}
                   for p in points]}


def format_whatif(points: list[WhatIf], title: str) -> str:
    lines = [title, "", f"{'':<16}{'GPUs':>6}{'name':>42}{'mem GiB':>9}{'step ms':>10}{'samples/s':>12}"
             f"{'per GPU':>9}{'scaling':>9}{'MFU':>7}"]
    for p in points:
        est = p.estimate
        if est is None:
            lines.append(f"{p.label:<16}{'':>6}  {p.note}")
            continue
        per_gpu = est.throughput_samples_per_s / est.job.cluster.world_size
        scaling = f"{p.scaling_efficiency:.1%}" if p.scaling_efficiency is not None else "-"
        lines.append(f"{p.label:<16}{est.job.cluster.world_size:>6}{experiment_name(est.config):>42}"
                     f"{est.memory.total_bytes / GIB:>9.2f}{est.time.step_s * 1e3:>10.1f}"
                     f"{est.throughput_samples_per_s:>12.1f}{per_gpu:>9.2f}{scaling:>9}{est.mfu:>7.1%}")
    return "\n".join(lines)
