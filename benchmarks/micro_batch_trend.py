"""How the uncalibrated step model's error moves with the micro-batch, on the published data (issue 12's regime check).

    python -m benchmarks.micro_batch_trend [--half fit|test|all]

Two tables, each for one half of every data set's models (zerotune.validate.published.split_rows; the test half
unless told):

- Trend per family: rows that differ only in micro-batch and accumulation (same model, hardware, GPUs, layout,
  ZeRO stage, sequence, global batch, precision, recompute) form a family; the least-squares slope of
  log(predicted / measured step time) against log2(micro-batch) is its trend. Printed: the families, the RMS and
  the mean of their slopes per doubling. A positive mean says the model grows more pessimistic as the micro-batch
  grows. The search's prior takes no trend for the uncalibrated model (Uncertainty.slope_rel 0): this is what one
  would be measured as.
- vTrain's single-node runs at tp 1, pp 1, accumulation 2 (micro-batch 1, 2, 4, 8): per model, the measured time a
  micro-step adds per sample from micro-batch 4 to 8, where the device bounds the step, against the model's
  device time per sample with and without the recompute the rows record (full); and the intercept
  (measured micro-step at 8 less 8 x the slope) per block. vTrain's own simulator, which its authors validated on
  these runs, skips the recompute on the last pipeline stage (github VIA-Research/vTrain@f8dda84
  src/predictor.py, create_layer_graph: "Last rank worker dosen't perform recomputation"), and with pp 1 every
  block is on the last stage.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from typing import Any, Literal, Sequence

import numpy as np

from zerotune.predictor import Efficiency, estimate
from zerotune.predictor.step_time import _stage_op_times
from zerotune.validate.published import (DEFAULT_DATA_DIR, Half, Skip, framework_efficiency, read_rows,
                                         row_case, split_rows)

Which = Half | Literal["all"]

DATA_SETS = ("vtrain_single", "vtrain_multi", "bloom_tr11")
"""The data sets whose rows give a step time and a micro-batch, with families of two or more micro-batches."""


def _family_key(row: dict[str, Any]) -> tuple[Any, ...]:
    p, b = row["parallel"], row["batch"]
    return (row["model"]["name"], row["hardware"], row["num_gpus_total"], p.get("tp"), p.get("pp"), p.get("dp"),
            p.get("zero_stage"), b.get("seq_len"), b.get("global_batch"), row.get("precision"), row.get("recompute"))


def family_slopes(rows: Sequence[tuple[str, dict[str, Any]]]) -> np.ndarray:
    """Per family of two or more micro-batches: the slope of log(predicted / measured step time) per doubling."""
    families: dict[tuple[Any, ...], list[tuple[float, float]]] = defaultdict(list)
    for row_id, row in rows:
        case, measured = row_case(row, row_id), row["metrics"].get("step_time_s")
        micro_batch = row["batch"].get("micro_batch")
        if isinstance(case, Skip) or not measured or not micro_batch:
            continue
        try:
            eff = framework_efficiency(row, Efficiency(), case.config)
            predicted = estimate(case.job, case.config, eff).time.step_s
        except ValueError:
            continue
        families[_family_key(row)].append((math.log2(micro_batch), math.log(predicted / measured)))
    slopes = [np.polyfit(*np.array(points).T, 1)[0] for points in families.values()
              if len({x for x, _ in points}) >= 2]
    return np.array(slopes)


def trend_table(half: Which) -> list[str]:
    lines = ["| data set | families | RMS slope per doubling | mean slope per doubling |", "|---|---:|---:|---:|"]
    pooled: list[float] = []
    for name in DATA_SETS:
        slopes = family_slopes(split_rows(read_rows(DEFAULT_DATA_DIR / f"{name}.jsonl"), half))
        if not len(slopes):
            continue
        pooled += list(slopes)
        lines.append(f"| {name} | {len(slopes)} | {np.sqrt(np.mean(slopes ** 2)):.3f} | {slopes.mean():+.3f} |")
    every = np.array(pooled)
    lines.append(f"| all | {len(every)} | {np.sqrt(np.mean(every ** 2)):.3f} | {every.mean():+.3f} |")
    return lines


def _vtrain_tp1(half: Which) -> dict[tuple[int, int], dict[int, tuple[float, tuple[float, ...]]]]:
    """(layers, hidden) -> micro-batch -> (measured seconds a micro-step, the model's stage op times)."""
    out: dict[tuple[int, int], dict[int, tuple[float, tuple[float, ...]]]] = defaultdict(dict)
    for row_id, row in split_rows(read_rows(DEFAULT_DATA_DIR / "vtrain_single.jsonl"), half):
        p, b = row["parallel"], row["batch"]
        if (p["tp"], p["pp"], b["grad_accum"]) != (1, 1, 2) or b["micro_batch"] in out[_shape(row)]:
            continue
        case = row_case(row, row_id)
        if isinstance(case, Skip):
            continue
        eff = framework_efficiency(row, Efficiency(), case.config)
        times = tuple(float(t) for t in _stage_op_times(case.job, case.config, eff, b["micro_batch"]))
        out[_shape(row)][b["micro_batch"]] = (row["metrics"]["step_time_s"] / b["grad_accum"], times)
    return out


def _shape(row: dict[str, Any]) -> tuple[int, int]:
    return int(row["model"]["num_layers"]), int(row["model"]["hidden_size"])


def vtrain_table(half: Which) -> list[str]:
    lines = ["| layers x hidden | measured ms per sample (mb 4 -> 8) | model, with recompute | ratio | "
             "model, without | ratio | intercept ms per block |", "|---|---:|---:|---:|---:|---:|---:|"]
    for (layers, hidden), runs in sorted(_vtrain_tp1(half).items()):
        if 4 not in runs or 8 not in runs:
            continue
        (m4, t4), (m8, t8) = runs[4], runs[8]
        slope = (m8 - m4) / 4
        with_rec = (sum(t8[:3]) - sum(t4[:3])) / 4
        without = (t8[0] + t8[1] - t4[0] - t4[1]) / 4
        intercept = (m8 - 8 * slope) / layers
        lines.append(f"| {layers} x {hidden} | {slope * 1e3:.1f} | {with_rec * 1e3:.1f} | {slope / with_rec:.2f} | "
                     f"{without * 1e3:.1f} | {slope / without:.2f} | {intercept * 1e3:.2f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--half", choices=("fit", "test", "all"), default="test")
    args = parser.parse_args(argv)
    print(f"Models: {args.half} half\n")
    print("\n".join(trend_table(args.half)))
    print("\nvTrain single-node, tp 1, pp 1, accumulation 2: the device-bound regime\n")
    print("\n".join(vtrain_table(args.half)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
