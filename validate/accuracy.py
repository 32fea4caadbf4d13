"""How close zerotune's uncalibrated predictions come to published training measurements.

Reads data/measurements/published/*.jsonl (schema in that folder's README.md), turns each row into a
(Job, DSConfig) or a skip reason, predicts it with the default Efficiency, and reports per data set:
  speed      MAPE of throughput. Each row's first metric in SPEED_METRICS is compared in its own unit:
             step_time_s as samples/s (global batch / step time), tokens_per_s_per_gpu as tokens/s per GPU,
             tflops_per_gpu as FLOP/s per GPU counting the recompute forward pass only where the row's notes
             say the source counts it (hardware FLOPs), mfu as model FLOP/s over the dense peak.
  verdicts   a row with a measured run metric trained, so zerotune's memory.fits should say so; the ZeRO
             paper's largest trainable model (max_model_params, no architecture given) is checked by its
             model states alone, the only part the row determines.
  memory     MAPE of peak_memory_bytes against memory.total_bytes, and of Korthikanti's Fig. 1 parts
             (model_state_memory_bytes, activation_memory_bytes) against the matching breakdown terms.
  ranking    rows with the same model, hardware, GPU count, sequence length, precision and global batch
             but different configurations: does zerotune's fastest prediction pick the measured fastest?
Data discipline: each data set's models are split in two halves (zerotune.validate.published.model_half); the
report covers the test half unless --half says otherwise, and default constants are chosen on the fit half only.
How a row becomes a (Job, DSConfig), the gaps filled and the rows skipped: zerotune.validate.published.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from zerotune.predictor import DSConfig, Efficiency, Estimate, estimate
from zerotune.predictor.catalog import list_hardware
from zerotune.predictor.dsconfig import ZeroConfig
from zerotune.predictor.flops import micro_batch_flops
from zerotune.predictor.memory import model_states, state_bytes
from zerotune.predictor.units import TERA
from zerotune.validate.published import (DEFAULT_DATA_DIR, MEGATRON_WRAPPER_BYTES_PER_PARAM, MEMORY_PARTS, MODEL_DIMS,
                                         RUN_METRICS, SPEED_METRICS, Case, Half, Skip, framework_efficiency, hardware,
                                         model_half, model_spec, precision_of, read_rows, row_case, split_rows)

__all__ = ["Half", "model_half", "split_rows", "model_spec", "framework_efficiency", "MEGATRON_WRAPPER_BYTES_PER_PARAM", "Case", "Skip", "Comparison", "Verdict", "GroupRanking", "DataSetScore", "row_case", "read_rows",
           "score_rows", "score_dir", "format_markdown", "main", "SPEED_METRICS", "DEFAULT_DATA_DIR"]

_COUNTS_RECOMPUTE = re.compile(r"counts (the |activation )?recompute")
_EXCLUDES_RECOMPUTE = re.compile(r"excludes recompute")
_CAPACITY_DIFFERS = re.compile(r"memory capacity .*differ")



@dataclass(frozen=True)
class Comparison:
    row_id: str
    metric: str
    """What was compared, e.g. 'samples/s (step_time_s)'."""
    measured: float
    predicted: float

    @property
    def abs_pct_error(self) -> float:
        return abs(self.predicted - self.measured) / self.measured * 100.0


@dataclass(frozen=True)
class Verdict:
    row_id: str
    measured_fits: bool
    predicted_fits: bool
    basis: str
    """'full estimate' or 'model states only'."""

    @property
    def agrees(self) -> bool:
        return self.measured_fits == self.predicted_fits


@dataclass(frozen=True)
class GroupRanking:
    """Comparable rows: the measured fastest, zerotune's predicted fastest, and what its pick achieved."""

    row_ids: tuple[str, ...]
    best_measured: str
    best_predicted: str
    picked_best: bool
    """zerotune's first-ranked configuration is the measured best's configuration."""
    pick_share_of_best: float
    """Measured speed of zerotune's pick / the measured best (1.0 when it picked the best)."""


@dataclass(frozen=True)
class DataSetScore:
    name: str
    num_rows: int
    speed: tuple[Comparison, ...]
    memory: tuple[Comparison, ...]
    verdicts: tuple[Verdict, ...]
    rankings: tuple[GroupRanking, ...]
    skipped: tuple[Skip, ...]
    """Rows with nothing scored, with the reason; every other row has a comparison or a verdict."""
    metric_skips: tuple[Skip, ...]
    """Metrics of scored rows that could not be compared, with the reason."""

    @property
    def num_scored(self) -> int:
        return self.num_rows - len(self.skipped)

    @property
    def speed_mape_pct(self) -> float | None:
        return _mape(self.speed)

    def memory_mape_pct(self, metric: str) -> float | None:
        return _mape([c for c in self.memory if c.metric == metric])

    @property
    def verdict_agreement(self) -> float | None:
        return sum(v.agrees for v in self.verdicts) / len(self.verdicts) if self.verdicts else None

    @property
    def ranked_first_share(self) -> float | None:
        return sum(g.picked_best for g in self.rankings) / len(self.rankings) if self.rankings else None


def _mape(comparisons: Sequence[Comparison]) -> float | None:
    return statistics.fmean(c.abs_pct_error for c in comparisons) if comparisons else None


# -- comparisons -----------------------------------------------------------------------------------------

def _hardware_flops_per_gpu(case: Case, est: Estimate) -> float:
    """Model FLOP/s per GPU scaled up by the recompute forward pass, as Megatron's TFLOPs counts it."""
    flops = micro_batch_flops(case.job.model, case.config.train_micro_batch_size_per_gpu, case.job.seq_len,
                              case.config.activation_checkpointing.enabled)
    return est.flops_per_gpu * flops.total_flops / flops.model_flops


def _speed(case: Case, est: Estimate) -> Comparison | Skip:
    """The row's first SPEED_METRICS entry against the prediction in the same unit."""
    metrics, world = case.row["metrics"], case.job.cluster.world_size
    name = next((m for m in SPEED_METRICS if m in metrics), None)
    if name is None:
        return Skip(case.row_id, "no time metric")
    value = metrics[name]
    if name == "step_time_s":
        return Comparison(case.row_id, "samples/s (step_time_s)", est.samples_per_step / value,
                          est.throughput_samples_per_s)
    if name == "throughput_samples_per_s":
        return Comparison(case.row_id, "samples/s", value, est.throughput_samples_per_s)
    if name == "tokens_per_s_per_gpu":
        return Comparison(case.row_id, "tokens/s per GPU", value, est.tokens_per_s / world)
    if name == "mfu":
        return Comparison(case.row_id, "MFU", value, est.mfu)
    if _COUNTS_RECOMPUTE.search(case.row["notes"]):
        return Comparison(case.row_id, "FLOP/s per GPU (hardware, with recompute)", value * TERA,
                          _hardware_flops_per_gpu(case, est))
    if _EXCLUDES_RECOMPUTE.search(case.row["notes"]):
        return Comparison(case.row_id, "FLOP/s per GPU (model)", value * TERA, est.flops_per_gpu)
    return Skip(case.row_id, "tflops_per_gpu: the notes do not say whether it counts recompute")


def _memory(case: Case, est: Estimate) -> list[Comparison]:
    """Peak memory, and Korthikanti's parts: the activations of the peak's breakdown, and the model states as
    the model holds them (the peak phase may hold less of them: gradients are not alive yet at the forward /
    backward turn, predictor/memory.py _gradients_at_turn)."""
    metrics = case.row["metrics"]
    states = model_states(case.job, case.config)
    parts = {**est.memory.breakdown_bytes, "parameters": states.parameters, "gradients": states.gradients,
             "optimizer_states": states.optimizer_states}
    found = []
    if "peak_memory_bytes" in metrics:
        found.append(Comparison(case.row_id, "peak memory", metrics["peak_memory_bytes"], est.memory.total_bytes))
    for name, terms in MEMORY_PARTS.items():
        if name in metrics:
            found.append(Comparison(case.row_id, name, metrics[name], sum(parts.get(t, 0.0) for t in terms)))
    return found


def _verdict(case: Case, est: Estimate) -> Verdict | Skip | None:
    if not set(case.row["metrics"]) & RUN_METRICS:
        return None  # e.g. Korthikanti Fig. 1: memory a configuration needs, not a run that trained
    if _CAPACITY_DIFFERS.search(case.row["notes"]):
        return Skip(case.row_id, "fit verdict: the GPU's memory capacity differs from its catalog entry")
    return Verdict(case.row_id, True, est.memory.fits, "full estimate")


def max_size_verdict(row: dict[str, Any], row_id: str) -> Verdict | Skip:
    """ZeRO Table 2's largest trained model fitted, so its model states (all the row determines) must fit."""
    if row["hardware"] not in list_hardware():
        return Skip(row_id, f"hardware {row['hardware']!r} not in the catalog")
    hw, par = hardware(row["hardware"]), row["parallel"]
    precision = precision_of(row, hw)
    if precision is None or par["tp"] is None or par["zero_stage"] is None:
        return Skip(row_id, "max_model_params: precision, tp or zero_stage not given")
    cfg = DSConfig(precision=precision, zero=ZeroConfig(stage=par["zero_stage"]), mp_size=par["tp"])
    states = state_bytes(row["metrics"]["max_model_params"], row["num_gpus_total"], cfg)
    total = (states.parameters + states.gradients + states.optimizer_states + states.master_gradients
             + hw.runtime_reserved_bytes)
    return Verdict(row_id, True, total <= hw.memory_bytes, "model states only")


# -- data sets -------------------------------------------------------------------------------------------

def _group_key(case: Case, metric: str) -> tuple[Any, ...]:
    """Rows whose measured best can be told: one model, cluster, sequence length, precision and global batch, and one
    kind of figure (`value_quality`): the Hugging Face autotuning README's table holds DeepSpeed's autotuner metric
    (the forward, backward and step timers) beside end-to-end throughput of 200-step runs, which it warns run
    lower, and its GPT-2 large ZeRO-0 autotuner figure (59.0) "beat" a ZeRO-1 end-to-end one (56.8) that way."""
    m, b = case.job.model, case.row["batch"]
    return (tuple(getattr(m, d) for d in MODEL_DIMS), case.row["hardware"], case.job.cluster.world_size,
            case.job.seq_len, case.config.precision, b["global_batch"], metric, case.row.get("value_quality"))


def rank_groups(cases: Sequence[Case], speeds: Sequence[Comparison]) -> tuple[GroupRanking, ...]:
    """Groups of comparable rows with at least two distinct configurations: predicted vs measured best."""
    groups: dict[tuple[Any, ...], list[tuple[Case, Comparison]]] = {}
    for case, speed in zip(cases, speeds):
        groups.setdefault(_group_key(case, speed.metric), []).append((case, speed))
    rankings = []
    for members in groups.values():
        if len({repr(case.config) for case, _ in members}) < 2:  # DSConfig holds a dict: unhashable
            continue
        best = max(members, key=lambda cs: cs[1].measured)
        pick = max(members, key=lambda cs: cs[1].predicted)
        hit = pick[0].config == best[0].config
        rankings.append(GroupRanking(tuple(c.row_id for c, _ in members), best[0].row_id, pick[0].row_id, hit,
                                     1.0 if hit else pick[1].measured / best[1].measured))
    return tuple(rankings)


@dataclass(frozen=True)
class _RowScore:
    speed: Comparison | None
    memory: tuple[Comparison, ...]
    verdict: Verdict | None
    metric_skips: tuple[Skip, ...]


def _score_row(row_id: str, row: dict[str, Any], eff: Efficiency) -> tuple[Case | None, _RowScore] | Skip:
    """Everything one row can be scored on, or why nothing can."""
    if "max_model_params" in row["metrics"]:
        verdict = max_size_verdict(row, row_id)
        return verdict if isinstance(verdict, Skip) else (None, _RowScore(None, (), verdict, ()))
    case = row_case(row, row_id)
    if isinstance(case, Skip):
        return case
    try:
        est = estimate(case.job, case.config, framework_efficiency(row, eff, case.config))
    except ValueError as exc:
        return Skip(row_id, str(exc))
    ran = bool(set(row["metrics"]) & RUN_METRICS)
    speed, verdict = (_speed(case, est), _verdict(case, est)) if ran else (None, None)
    skips = tuple(item for item in (speed, verdict) if isinstance(item, Skip))
    speed = speed if isinstance(speed, Comparison) else None
    verdict = verdict if isinstance(verdict, Verdict) else None
    memory = tuple(_memory(case, est))
    if speed is None and verdict is None and not memory:
        return Skip(row_id, "; ".join(s.reason for s in skips) or "no comparable metric")
    return case, _RowScore(speed, memory, verdict, skips)


def score_rows(name: str, rows: Sequence[tuple[str, dict[str, Any]]], eff: Efficiency = Efficiency()
               ) -> DataSetScore:
    """Score (row_id, row) pairs of one data set."""
    results = [_score_row(row_id, row, eff) for row_id, row in rows]
    scored = [r for r in results if not isinstance(r, Skip)]
    timed = [(case, score.speed) for case, score in scored if case is not None and score.speed is not None]
    return DataSetScore(
        name, len(rows), speed=tuple(speed for _, speed in timed),
        memory=tuple(c for _, score in scored for c in score.memory),
        verdicts=tuple(score.verdict for _, score in scored if score.verdict is not None),
        rankings=rank_groups([case for case, _ in timed], [speed for _, speed in timed]),
        skipped=tuple(r for r in results if isinstance(r, Skip)),
        metric_skips=tuple(s for _, score in scored for s in score.metric_skips))



def score_dir(directory: Path = DEFAULT_DATA_DIR, eff: Efficiency = Efficiency(),
              half: Half | Literal["all"] = "test") -> tuple[DataSetScore, ...]:
    """Score every data set of a folder on one half of its models (the test half unless told)."""
    paths = sorted(Path(directory).glob("*.jsonl"))
    if not paths:
        raise ValueError(f"--data {directory}: no *.jsonl files; point it at data/measurements/published")
    return tuple(score_rows(p.stem, split_rows(read_rows(p), half), eff) for p in paths)


# -- report ----------------------------------------------------------------------------------------------

def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _mape_cell(comparisons: Sequence[Comparison]) -> str:
    mape = _mape(comparisons)
    return "-" if mape is None else f"{mape:.1f}% (n={len(comparisons)})"


def _summary_row(s: DataSetScore) -> str:
    metrics = sorted({c.metric for c in s.speed})
    memory = "; ".join(f"{m}: {_mape_cell([c for c in s.memory if c.metric == m])}"
                       for m in sorted({c.metric for c in s.memory})) or "-"
    verdicts = f"{sum(v.agrees for v in s.verdicts)}/{len(s.verdicts)}" if s.verdicts else "-"
    partial = sorted({v.basis for v in s.verdicts} - {"full estimate"})
    verdicts += f" ({', '.join(partial)})" if partial else ""
    ranked = f"{sum(g.picked_best for g in s.rankings)}/{len(s.rankings)}" if s.rankings else "-"
    pick = statistics.fmean(g.pick_share_of_best for g in s.rankings) if s.rankings else None
    return (f"| {s.name} | {s.num_rows} | {s.num_scored} | {len(s.skipped)} | {', '.join(metrics) or '-'} | "
            f"{_mape_cell(s.speed)} | {verdicts} | {memory} | {ranked} | {_pct(pick)} |")


def _skip_lines(scores: Sequence[DataSetScore]) -> list[str]:
    lines = ["", "| data set | skipped rows | reason |", "|---|---:|---|"]
    for s in scores:
        counts: dict[str, int] = {}
        for skip in s.skipped:
            counts[skip.reason] = counts.get(skip.reason, 0) + 1
        for skip in s.metric_skips:
            counts[f"(metric only) {skip.reason}"] = counts.get(f"(metric only) {skip.reason}", 0) + 1
        lines += [f"| {s.name} | {n} | {reason} |" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return lines


def format_markdown(scores: Sequence[DataSetScore]) -> str:
    """Per data set: the summary table, then the skip reasons with their counts."""
    lines = ["| data set | rows | scored | skipped | speed metric | speed MAPE | fits verdicts agree | "
             "memory MAPE | best ranked first | pick / best measured |",
             "|---|---:|---:|---:|---|---:|---:|---|---:|---:|"]
    lines += [_summary_row(s) for s in scores]
    return "\n".join(lines + _skip_lines(scores)) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerotune.validate.accuracy",
                                     description="Score zerotune's uncalibrated predictions against published "
                                                 "training measurements.")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR, help="folder of published *.jsonl files")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--half", choices=("test", "fit", "all"), default="test",
                        help="which models of each data set to score: the held-out test half (default), the "
                             "half defaults may be chosen on (fit), or all")
    args = parser.parse_args(argv)
    try:
        text = f"Models scored: {args.half} half\n\n" + format_markdown(score_dir(args.data, half=args.half))
        if args.markdown:
            args.markdown.write_text(text)
    except (ValueError, OSError) as exc:
        print(f"accuracy: error: {exc}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
