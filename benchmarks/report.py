"""The head-to-head's verdict: one table (markdown) and one plot of experiments over time per job."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from benchmarks.jobs import BenchJob
from benchmarks.measure import Remeasured, config_name
from benchmarks.tools import Tool, ToolRun
from zerotune.calibrate.measurement import Measurement
from zerotune.predictor import experiment_name

__all__ = ["JobResult", "metric_ratio", "grid_best", "grid_score", "kept_user_zero", "format_markdown",
           "plot_timeline", "TOOLS"]

TOOLS: tuple[Tool, ...] = ("deepspeed", "zerotune")
_TITLES = {"deepspeed": "DeepSpeed autotuner", "zerotune": "zerotune"}


@dataclass(frozen=True)
class JobResult:
    job: BenchJob
    runs: dict[Tool, ToolRun]
    remeasured: dict[Tool, Remeasured]
    """Keyed by tool; absent when the tool chose no configuration."""
    grid: tuple[Measurement, ...]
    """The exhaustive grid plus any chosen configuration outside it, one run each; empty when skipped."""

    def chosen_name(self, tool: Tool) -> str | None:
        doc = self.runs[tool].optimal_ds_config
        return config_name(doc, self.job.num_gpus) if doc is not None else None


def _higher_is_better(job: BenchJob, samples_per_s: float | None, step_s: float | None) -> float | None:
    """The job's metric as a value to maximise: throughput (and FLOP/s, proportional to it for one model
    and sequence length) as it is, latency as its inverse."""
    if job.metric == "latency":
        return 1.0 / step_s if step_s else None
    return samples_per_s


def metric_ratio(job: BenchJob, zerotune: Remeasured | None, deepspeed: Remeasured | None) -> float | None:
    """zerotune's re-measured median over DeepSpeed's in the job's metric; above 1 means zerotune's is better."""
    if zerotune is None or deepspeed is None:
        return None
    zt = _higher_is_better(job, zerotune.median_samples_per_s, zerotune.median_step_s)
    ds = _higher_is_better(job, deepspeed.median_samples_per_s, deepspeed.median_step_s)
    return zt / ds if zt and ds else None


def _grid_value(job: BenchJob, m: Measurement) -> float | None:
    return _higher_is_better(job, m.throughput_samples_per_s, m.measured_step_s) if m.status == "ok" else None


def grid_best(job: BenchJob, grid: Sequence[Measurement]) -> tuple[str, float] | None:
    """(name, value) of the grid's best run in the job's metric (higher is better)."""
    scored = [(v, experiment_name(m.config)) for m in grid if (v := _grid_value(job, m)) is not None]
    if not scored:
        return None
    value, name = max(scored)
    return name, value


def grid_score(job: BenchJob, grid: Sequence[Measurement], name: str | None) -> float | None:
    """The chosen configuration's grid value over the grid's best (1.0 = the best of the grid)."""
    best = grid_best(job, grid)
    values = [v for m in grid if experiment_name(m.config) == name and (v := _grid_value(job, m)) is not None]
    if best is None or not values:
        return None
    return statistics.median(values) / best[1]


def kept_user_zero(job: BenchJob, chosen: dict[str, Any] | None) -> bool | None:
    """Whether the chosen ds_config keeps the user's own zero_optimization keys; None when there are none."""
    if not job.extra_zero or chosen is None:
        return None
    zero = chosen.get("zero_optimization") or {}
    return all(key in zero and zero[key] == value for key, value in job.extra_zero.items())


def _fmt(value: float | None, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _tool_row(result: JobResult, tool: Tool) -> list[str]:
    job, run, again = result.job, result.runs[tool], result.remeasured.get(tool)
    status = "" if run.returncode == 0 else f" (exit {run.returncode if run.returncode is not None else 'timeout'})"
    measured = "-"
    if again is not None and again.median_samples_per_s is not None:
        measured = (f"{again.median_samples_per_s:.2f} (±{100 * (again.spread_rel or 0) / 2:.0f}%, "
                    f"n={len(again.throughput_samples_per_s)}); {again.median_step_s:.3f} s/step")
    ratio = metric_ratio(job, result.remeasured.get("zerotune"), result.remeasured.get("deepspeed"))
    return [job.name if tool == TOOLS[0] else "", _TITLES[tool] + status, str(len(run.experiments)),
            f"{run.wall_s:.0f}", result.chosen_name(tool) or "none", measured,
            _fmt(ratio, ".2f") if tool == "zerotune" else "",
            _fmt(grid_score(job, result.grid, result.chosen_name(tool)), ".2f"),
            {None: "-", True: "yes", False: "no"}[kept_user_zero(job, run.optimal_ds_config)]]


HEADER = ["job", "tool", "experiments", "tuning wall s", "chosen", "re-measured samples/s median (±half range, n); "
          "step", "zerotune / DeepSpeed (job metric)", "grid score (chosen / grid best)",
          "user's zero keys kept"]


def format_markdown(results: Sequence[JobResult], date: str, command: str) -> str:
    """The table, one row per tool and job, then one line per job on the grid and what the job shows."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for result in results:
        for tool in TOOLS:
            lines.append("| " + " | ".join(_tool_row(result, tool)) + " |")
    lines.append("")
    for result in results:
        best = grid_best(result.job, result.grid)
        grid = (f"grid best {best[0]} of {len(result.grid)} runs" if best else "no grid")
        lines.append(f"- **{result.job.name}** (metric {result.job.metric}; {grid}): {result.job.shows}.")
    lines += ["", f"Measured {date} on this machine with `{command}`. Experiments: every run each tool launched "
              "(DeepSpeed's model-info profiling run included); re-measured: independent runs alternated "
              "DeepSpeed, zerotune, DeepSpeed, ...; ratio above 1 means zerotune's choice is better "
              "(latency: DeepSpeed's step time over zerotune's)."]
    return "\n".join(lines) + "\n"


def _pyplot() -> Any:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _draw_tool(ax: Any, run: ToolRun, job: BenchJob, color: str) -> None:
    latency = job.metric == "latency"
    values = [(e.end_s / 60, e.step_s if latency else e.throughput_samples_per_s) for e in run.experiments]
    measured = [(t, v) for t, v in values if v]
    ax.scatter([t for t, _ in measured], [v for _, v in measured], color=color, s=18,
               label=f"{_TITLES[run.tool]}: {len(run.experiments)} runs")
    ax.scatter([t for t, v in values if not v], [0.0] * (len(values) - len(measured)), color=color, marker="x", s=24)
    xs, ys, best = [], [], None
    for t, v in measured:
        best = v if best is None else (min(best, v) if latency else max(best, v))
        xs.append(t)
        ys.append(best)
    if xs:
        ax.step([*xs, run.wall_s / 60], [*ys, ys[-1]], where="post", color=color,
                label=f"{_TITLES[run.tool]}: running best")
    ax.axvline(run.wall_s / 60, color=color, linestyle=":", linewidth=1)
    chosen = config_name(run.optimal_ds_config, job.num_gpus) if run.optimal_ds_config else None
    picked = [(t, v) for (t, v), e in zip(values, run.experiments) if v and e.name == chosen]
    ax.scatter([t for t, _ in picked], [v for _, v in picked], s=140, facecolors="none", edgecolors=color,
               label=f"{_TITLES[run.tool]}: its choice")


def plot_timeline(results: Sequence[JobResult], path: Path) -> None:
    """Per job: each tool's experiments against minutes since the tool started, at the samples/s (latency
    jobs: seconds per step, lower is better) the tool itself measured (x at 0: a profiling or failed run), the
    running best as a step line, a dotted line where the tool finished. The tools time differently (DeepSpeed's engine sums its fwd/bwd/step timers), so
    heights compare within a tool; the re-measured table compares the tools."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
    for ax, result in zip(axes[0], results):
        for tool, color in zip(TOOLS, ("tab:red", "tab:blue")):
            _draw_tool(ax, result.runs[tool], result.job, color)
        ax.set_title(f"{result.job.name} (metric {result.job.metric})")
        ax.set_xlabel("minutes since the tuner started")
        unit = "s/step" if result.job.metric == "latency" else "samples/s"
        ax.set_ylabel(f"{unit} as the tuner measured it")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
