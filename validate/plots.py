"""Plots on request: predicted throughput against micro-batch per ZeRO stage with the memory limit marked, and
the memory breakdown of each stage's best configuration as stacked bars. Also measured against predicted, for
calibration and tuning reports. matplotlib is imported only when a plot is asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from zerotune.predictor import Efficiency, Estimate, Job, estimate
from zerotune.predictor.memory import TERMS
from zerotune.predictor.rank import SpaceTable
from zerotune.predictor.units import GIB

__all__ = ["plot_space", "plot_predicted_vs_measured"]


def _pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _stage_curve(table: SpaceTable, rows: np.ndarray, fits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(micro-batch sizes, best throughput at each over the stage's variants, whether any of them fits)."""
    throughput = table.samples_per_step / table.step_s
    sizes = np.unique(table.micro_batch)
    best, any_fit = np.zeros(len(sizes)), np.zeros(len(sizes), dtype=bool)
    for i, size in enumerate(sizes):
        cols = table.micro_batch == size
        cell_fits = fits[np.ix_(rows, cols)]
        cells = throughput[np.ix_(rows, cols)]
        any_fit[i] = cell_fits.any()
        best[i] = cells[cell_fits].max() if any_fit[i] else cells.max()
    return sizes, best, any_fit


def _stage_best(job: Job, table: SpaceTable, rows: np.ndarray, fits: np.ndarray, eff: Efficiency) -> Estimate:
    throughput = np.where(fits, table.samples_per_step / table.step_s, -np.inf)[rows]
    if np.isfinite(throughput).any():
        row, col = np.unravel_index(int(np.argmax(throughput)), throughput.shape)
    else:
        row, col = np.unravel_index(int(np.argmin(table.memory_bytes[rows])), throughput.shape)
    return estimate(job, table.config(int(rows[row]), int(col)), eff)


def plot_space(job: Job, table: SpaceTable, path: Path, eff: Efficiency = Efficiency(), title: str = "") -> None:
    plt = _pyplot()
    fits = table.fits(job)
    stages = np.array([v.zero.stage for v in table.variants])
    fig, (curve_ax, bar_ax) = plt.subplots(1, 2, figsize=(13, 5))
    bests: list[tuple[int, Estimate]] = []
    for stage in sorted(set(stages.tolist())):
        rows = np.flatnonzero(stages == stage)
        sizes, best, ok = _stage_curve(table, rows, fits)
        line, = curve_ax.plot(sizes[ok], best[ok], "-", label=f"ZeRO {stage}")
        curve_ax.plot(sizes[~ok], best[~ok], ":", color=line.get_color(), alpha=0.5)
        if ok.any() and not ok.all():
            curve_ax.axvline(sizes[ok].max(), color=line.get_color(), linestyle="--", alpha=0.6)
        bests.append((stage, _stage_best(job, table, rows, fits, eff)))
    curve_ax.set_xscale("log", base=2)
    curve_ax.set_xlabel("micro-batch per GPU")
    curve_ax.set_ylabel("predicted samples/s")
    curve_ax.set_title("throughput (dotted: does not fit; dashed: largest that fits)")
    curve_ax.legend()
    bottom = np.zeros(len(bests))
    for term in TERMS:
        values = np.array([est.memory.breakdown_bytes[term] / GIB for _, est in bests])
        if values.any():
            bar_ax.bar([f"ZeRO {s}\nmbs {e.config.train_micro_batch_size_per_gpu}" for s, e in bests], values,
                       bottom=bottom, label=term)
            bottom += values
    bar_ax.axhline(job.cluster.hardware.memory_bytes / GIB, color="black", linestyle="--", label="capacity")
    bar_ax.set_ylabel("GiB per GPU")
    bar_ax.set_title("memory of each stage's best configuration")
    bar_ax.legend(fontsize=7)
    fig.suptitle(title or f"{job.model.name}, {job.cluster.world_size} x {job.cluster.hardware.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_predicted_vs_measured(predicted: Sequence[float], measured: Sequence[float], path: Path, *,
                               labels: Sequence[str] = (), quantity: str = "step time (s)",
                               before: Sequence[float] | None = None, title: str = "") -> None:
    """Scatter of predicted against measured with the identity line; `before` adds the uncalibrated points."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 6))
    if before is not None:
        ax.scatter(measured, before, marker="x", color="grey", label="before calibration")
    ax.scatter(measured, predicted, label="predicted" if before is None else "after calibration")
    for x, y, text in zip(measured, predicted, labels):
        ax.annotate(text, (x, y), fontsize=6)
    values = [v for v in [*predicted, *measured, *(before or [])] if v > 0]
    low, high = min(values) * 0.8, max(values) * 1.25
    ax.plot([low, high], [low, high], "k--", linewidth=0.8, label="exact")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"measured {quantity}")
    ax.set_ylabel(f"predicted {quantity}")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
