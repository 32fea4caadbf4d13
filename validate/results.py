"""The results folder of a `tune`, in DeepSpeed's autotuning layout so existing habits and scripts keep working:

    exps_dir/<name>.json                      the experiment as planned (name, ds_config, resources, prediction)
    results_dir/<name>/{cmd.txt, ds_config.json, exp.json, metrics.json, stdout.log, stderr.log, environment.json}
    results_dir/summary.txt                   DeepSpeed's table, plus predicted against measured per experiment
    results_dir/ds_config_optimal.json, cmd_optimal.txt, measurements.jsonl, *.png

Every file is written atomically (a temporary file, then rename), so an interrupted tune leaves each file
either whole or absent. An experiment counts as finished when its exp.json carries a `result` (any status:
failures are results); one interrupted before that is run again when the tune is rerun.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from zerotune.calibrate.atomic import write_json_atomic, write_text_atomic
from zerotune.calibrate.measurement import Status
from zerotune.predictor import DSConfig, parse_ds_config
from zerotune.predictor.ds_json import resolve_batch
from zerotune.predictor.rank import MAXIMISED, Metric

__all__ = ["near_ties", "NEAR_TIE_REL", "Layout", "Prediction", "ExperimentResult", "write_json_atomic",
           "write_text_atomic", "measured_from_metrics", "exp_document", "result_dict", "load_finished",
           "format_summary", "best_result", "lr_advice", "GLOBAL_TUNING_SPACE"]

GLOBAL_TUNING_SPACE = "global"
"""DeepSpeed's name for the row over all stages in summary.txt (autotuning/constants.py)."""
US_PER_S = 1e6
"""DeepSpeed's engine writes `latency` in microseconds per optimizer step: its timers' means are milliseconds
times 1000 (utils/timer.py get_mean), and throughput = batch * 1e6 / latency (runtime/engine.py)."""


@dataclass(frozen=True)
class Layout:
    results_dir: Path
    exps_dir: Path

    def run_dir(self, name: str) -> Path:
        return self.results_dir / name

    def exp_path(self, name: str) -> Path:
        return self.exps_dir / f"{name}.json"

    @property
    def summary(self) -> Path:
        return self.results_dir / "summary.txt"

    @property
    def optimal_config(self) -> Path:
        return self.results_dir / "ds_config_optimal.json"

    @property
    def optimal_cmd(self) -> Path:
        return self.results_dir / "cmd_optimal.txt"

    @property
    def measurements(self) -> Path:
        return self.results_dir / "measurements.jsonl"


@dataclass(frozen=True)
class Prediction:
    """What the model said before an experiment ran (after the corrections of earlier measurements)."""

    step_s: float
    metric_value: float
    metric_low: float
    metric_high: float
    memory_bytes: float


@dataclass(frozen=True)
class ExperimentResult:
    name: str
    config: DSConfig
    prediction: Prediction
    status: Status
    reason: str = ""
    metric_value: float | None = None
    """Measured, in the metric's unit: samples/s, ms per step (latency) or FLOP/s per GPU."""
    step_s: float | None = None
    throughput_samples_per_s: float | None = None
    wall_s: float = 0.0
    resumed: bool = False
    """Read back from an earlier, interrupted tune instead of run again."""
    step_times_s: tuple[float, ...] = ()
    """Seconds of each optimizer step the engine printed, in order from the first (warm-up included): a later
    experiment is compared with this one step for step (zerotune.validate.runs.paired_step_ratios)."""
    peak_memory_bytes: float | None = None
    """The largest peak memory of its ranks (validate.site_env.read_peak_bytes: max_memory_allocated on an
    accelerator, the RSS on the CPU), where the run finished and wrote it."""


def measured_from_metrics(metrics: Mapping[str, Any], samples_per_step: int, flops_per_step_per_gpu: float,
                          metric: Metric) -> tuple[float, float, float]:
    """(step_s, throughput samples/s, metric value) from a metrics.json: zerotune's workload writes step_s,
    DeepSpeed's engine writes throughput (samples/s) and latency in microseconds."""
    if isinstance(metrics.get("step_s"), (int, float)) and metrics["step_s"] > 0:
        step_s = float(metrics["step_s"])
    elif isinstance(metrics.get("throughput"), (int, float)) and metrics["throughput"] > 0:
        step_s = samples_per_step / float(metrics["throughput"])
    elif isinstance(metrics.get("latency"), (int, float)) and metrics["latency"] > 0:
        step_s = float(metrics["latency"]) / US_PER_S
    else:
        raise ValueError(f"metrics.json has no positive step_s, throughput or latency: {sorted(metrics)}")
    value = {"throughput": samples_per_step / step_s, "latency": step_s * 1e3,
             "flops": flops_per_step_per_gpu / step_s}[metric]
    return step_s, samples_per_step / step_s, value


def exp_document(name: str, exp_id: int, ds_config: Mapping[str, Any], num_gpus: int, num_nodes: int,
                 run_dir: Path, prediction: Prediction) -> dict[str, Any]:
    """An experiment as DeepSpeed's exps_dir/<name>.json holds it, with zerotune's prediction added."""
    return {"name": name, "exp_id": exp_id, "ds_config": dict(ds_config), "num_gpus": num_gpus,
            "num_nodes": num_nodes, "result_dir": str(run_dir), "predicted": asdict(prediction)}


def result_dict(result: ExperimentResult) -> dict[str, Any]:
    return {"status": result.status, "reason": result.reason, "metric_val": result.metric_value,
            "step_s": result.step_s, "throughput_samples_per_s": result.throughput_samples_per_s,
            "wall_s": result.wall_s, "step_times_s": list(result.step_times_s),
            "peak_memory_bytes": result.peak_memory_bytes}


def load_finished(layout: Layout, name: str, world_size: int, same_run: Mapping[str, Any]) -> ExperimentResult | None:
    """The recorded result of an experiment an earlier tune finished, or None: never run, interrupted, or run
    differently (its exp.json disagrees with `same_run` on the config, script, arguments or job)."""
    path = layout.run_dir(name) / "exp.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    result = doc.get("result") if isinstance(doc, dict) else None
    if not isinstance(result, dict) or "status" not in result:
        return None
    if any(doc.get(key) != value for key, value in same_run.items()):
        return None
    ds_config = {k: v for k, v in doc["ds_config"].items() if k != "autotuning"}
    return ExperimentResult(name, parse_ds_config(ds_config, world_size=world_size),
                            Prediction(**doc["predicted"]), result["status"], result.get("reason", ""),
                            result.get("metric_val"), result.get("step_s"), result.get("throughput_samples_per_s"),
                            float(result.get("wall_s") or 0.0), resumed=True,
                            step_times_s=_step_times(result.get("step_times_s")),
                            peak_memory_bytes=_positive(result.get("peak_memory_bytes")))


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def _step_times(value: Any) -> tuple[float, ...]:
    """An exp.json's step times, or none where it has none (written before they were recorded) or they are garbled."""
    if not isinstance(value, list) or not all(isinstance(v, (int, float)) and v > 0 for v in value):
        return ()
    return tuple(float(v) for v in value)


def best_result(results: Sequence[ExperimentResult], metric: Metric) -> ExperimentResult | None:
    """The measured best of the experiments that ran to the end (latency minimised)."""
    ok = [r for r in results if r.status == "ok" and r.metric_value is not None]
    if not ok:
        return None
    sign = 1.0 if MAXIMISED[metric] else -1.0
    return max(ok, key=lambda r: sign * float(r.metric_value))  # type: ignore[arg-type]


NEAR_TIE_REL = 0.03
"""Measured results closer than this are a tie: the same configuration's throughput moves by a few percent from run
to run (DeepSpeed's engine timers, NOISE_STD in validate/candidates.py is 2% of a step), and on a shared machine
by more (three tunes of one Trainer script chose ZeRO-2 at micro-batch 14, ZeRO-2 at 32 and ZeRO-0 at 15, each
picked over the next on 0.4-1%)."""


def near_ties(results: Sequence[ExperimentResult], metric: Metric) -> str | None:
    """One line naming the other finished configurations within NEAR_TIE_REL of the measured best, or None: the
    choice between them is the machine's noise, and the user may take the simpler (a lower ZeRO stage, DeepSpeed's
    default buckets)."""
    best = best_result(results, metric)
    if best is None:
        return None
    value = float(best.metric_value)  # type: ignore[arg-type]
    close = [r for r in results if r is not best and r.status == "ok" and r.metric_value is not None
             and abs(float(r.metric_value) - value) <= NEAR_TIE_REL * abs(value)]
    if not close:
        return None
    others = ", ".join(f"{r.name} ({float(r.metric_value):.4g})" for r in close)
    return (f"{best.name} ({value:.4g}) is within {NEAR_TIE_REL:.0%} of {others}: a difference "
            f"run-to-run noise can make, so either will do; re-measure them side by side to tell them apart")


def _pipe_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown pipe table as DeepSpeed's summary.txt prints it (tabulate's "pipe" format)."""
    def cell(value: Any) -> str:
        return f"{value:.6g}" if isinstance(value, float) else str(value)
    cells = [[cell(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows if row[i] != "-") for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(values, widths, numeric)) + " |"
    rule = "|" + "|".join((("-" * (w + 1)) + ":") if n else (":" + "-" * (w + 1)) for w, n in zip(widths, numeric)) + "|"
    return "\n".join([line(headers), rule] + [line(r) for r in cells])


def _space_rows(results: Sequence[ExperimentResult], metric: Metric) -> list[list[Any]]:
    rows = []
    spaces = sorted({f"z{r.config.zero.stage}" for r in results}) + [GLOBAL_TUNING_SPACE]
    for space in spaces:
        members = [r for r in results if space == GLOBAL_TUNING_SPACE or f"z{r.config.zero.stage}" == space]
        best = best_result(members, metric)
        rows.append([space, len(members), best.metric_value if best else "-",
                     best.prediction.metric_value if best else "-", best.name if best else "-"])
    return rows


def format_summary(results: Sequence[ExperimentResult], metric: Metric, duration_s: float,
                   stop_reason: str) -> str:
    """DeepSpeed's summary table (with the best's predicted value beside its measured one), then every
    experiment predicted against measured, then DeepSpeed's closing line."""
    table = _pipe_table(["tuning_space", "num_experiments", "best_metric_val", "predicted_metric_val",
                         "best_exp_name"], _space_rows(results, metric))
    rows = [[r.name, r.status, r.prediction.metric_value, f"{r.prediction.metric_low:.4g}-"
             f"{r.prediction.metric_high:.4g}", r.metric_value if r.metric_value is not None else "-",
             r.metric_value / r.prediction.metric_value if r.metric_value else "-", r.wall_s,
             "resumed" if r.resumed else "", r.reason or ""] for r in results]
    detail = _pipe_table(["exp_name", "status", "predicted_metric_val", "predicted_band", "measured_metric_val",
                          "measured/predicted", "wall_s", "note", "reason"], rows)
    # a resumed tune counts the experiments an earlier run measured at their own wall time (it had read 0:00:00)
    resumed = [r for r in results if r.resumed]
    total_s = duration_s + sum(r.wall_s or 0.0 for r in resumed)
    minutes, seconds = divmod(int(round(total_s)), 60)
    hours, minutes = divmod(minutes, 60)
    earlier = f" ({len(resumed)} of them measured by an earlier run and resumed)" if resumed else ""
    return (f"{table}\n\nmetric: {metric}{' (minimised)' if not MAXIMISED[metric] else ''}\n\n{detail}\n\n"
            f"{stop_reason}\n\nTuning completed in {hours}:{minutes:02d}:{seconds:02d}. "
            f"Total number of experiments: {len(results)}{earlier}.\n")


def lr_advice(doc: Mapping[str, Any], best: DSConfig, world_size: int) -> str | None:
    """What to do with the learning rate when the tuned global batch differs from the user's: Adam-family
    optimizers scale it with the square root of the batch ratio, SGD linearly (Goyal et al. 2017; Malladi
    et al. 2022), as DeepSpeed's autotuning documentation advises."""
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    if any(k in doc and not isinstance(doc[k], int) for k in keys):
        return None  # a list or "auto": the user had no batch of their own to compare with
    try:
        micro, gas = resolve_batch({k: doc[k] for k in keys if k in doc}, best.dp_size(world_size))
    except ValueError:
        return None
    old = best.replace(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas).samples_per_step(world_size)
    new = best.samples_per_step(world_size)
    if old == new:
        return None
    sgd = best.optimizer == "sgd"
    factor = new / old if sgd else math.sqrt(new / old)
    lr = ((doc.get("optimizer") or {}).get("params") or {}).get("lr")
    target = f" ({lr:g} -> {lr * factor:.3g})" if isinstance(lr, (int, float)) else ""
    rule = "linearly (SGD)" if sgd else "with the square root of the batch ratio (Adam-family optimizers)"
    return (f"the tuned global batch is {new} samples, yours was {old}: scale the learning rate {rule}, "
            f"x{factor:.3g}{target}, and re-check warm-up; convergence is yours to verify")
