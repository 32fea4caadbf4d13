"""Few-shot transfer, measured: calibrate on a few rows of ONE model of a published data set, predict its others.

    python -m zerotune.validate.fewshot [--data FILE.jsonl] [--fit_model NAME] [--rows N] [--json]

The fit rows go through the user's path: written as a `calibrate --from` CSV (calibrate/ingest.py's columns,
models by catalog name or as a model YAML beside it) and calibrated by `zerotune calibrate --hardware H --from
rows.csv --out profile.json`. Every row of the data set's other models is then predicted with that profile and
uncalibrated; the figure is the mean absolute error of throughput on those held-out models only (the split is
by model, never by row, and printed with the result).

Default data: data/measurements/published/ds_autotuning_hf_v100.jsonl (DeepSpeed autotuning's Hugging Face
examples on 16 V100-32GB; fit on GPT-2 large's per-stage bests) when present, else vtrain_single.jsonl (fit on
its first model). Rows with tensor or pipeline parallelism are left out: the CSV has no columns for them.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import io
import json
import math
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import yaml

from zerotune.calibrate.profiles import load_profile
from zerotune.predictor import Efficiency, ModelSpec, estimate, load_model
from zerotune.validate.published import DEFAULT_DATA_DIR, Case, Skip, read_rows, row_case

__all__ = ["FewShot", "Row", "fewshot", "published_rows", "main", "DEFAULT_FIT_MODEL"]

DATA_FILES = ("ds_autotuning_hf_v100.jsonl", "vtrain_single.jsonl")
"""Preferred first: the DeepSpeed autotuning table, else vTrain's single-node runs."""
DEFAULT_FIT_MODEL = {"ds_autotuning_hf_v100.jsonl": "gpt2-large"}
"""The model calibrated on, per data file; other files: their first model."""


@dataclass(frozen=True)
class Row:
    """A published row zerotune can fit and predict: tensor and pipeline parallel 1, a measured step time."""

    row_id: str
    model: str
    """The row's model name as published."""
    case: Case
    step_s: float
    quality: str
    """The row's value_quality: what kind of figure it is (e.g. DeepSpeed's autotuner metric or end-to-end)."""


@dataclass(frozen=True)
class FewShot:
    data: str
    quality: str
    """The one kind of figure fitted and tested (value_quality): timer sums and end-to-end runs never mix."""
    fit_model: str
    fit_rows: tuple[str, ...]
    test_models: tuple[str, ...]
    num_test_rows: int
    fitted_params: tuple[str, ...]
    mape_before: float
    """Throughput MAPE on the test models, uncalibrated (fractions: 0.1 = 10%)."""
    mape_after: float
    """The same with the profile calibrated on the fit rows."""
    per_model_after: dict[str, float]
    per_model_before: dict[str, float]
    shared_rms: float = 0.0
    """After calibration: RMS over the test models of each model's mean log error (predicted against measured step
    time), the part of the transfer error all of a model's configurations share."""
    within_rms: float = 0.0
    """After calibration: RMS of the log errors about their model's mean, the part that differs by configuration."""


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _step_s(row: dict[str, Any], case: Case) -> float | None:
    metrics = row["metrics"]
    if metrics.get("step_time_s"):
        return float(metrics["step_time_s"])
    if metrics.get("throughput_samples_per_s"):
        cfg = case.config
        samples = cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * \
            cfg.dp_size(case.job.cluster.world_size)
        return samples / float(metrics["throughput_samples_per_s"])
    return None


def published_rows(path: Path) -> list[Row]:
    """The rows of one published file that a calibration CSV can hold and that carry a time."""
    out = []
    for row_id, row in read_rows(path):
        case = row_case(row, row_id)
        if isinstance(case, Skip) or case.config.mp_size > 1 or case.config.pp_size > 1:
            continue
        step = _step_s(row, case)
        if step:
            out.append(Row(row_id, str(row["model"]["name"]), case, step, str(row["value_quality"])))
    return out


def _model_ref(spec: ModelSpec, folder: Path) -> str:
    """The catalog name when the catalog holds exactly this model, else a model YAML written to folder."""
    try:
        if load_model(spec.name) == spec:
            return spec.name
    except ValueError:
        pass
    path = folder / f"{_key(spec.name) or 'model'}.yaml"
    path.write_text(yaml.safe_dump(dataclasses.asdict(spec), sort_keys=False))
    return str(path)


def _write_csv(rows: Sequence[Row], folder: Path) -> Path:
    """The fit rows in calibrate --from's table format (calibrate/ingest.py TABLE_COLUMNS)."""
    path = folder / "fit_rows.csv"
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["model", "hardware", "num_nodes", "num_gpus", "zero_stage", "micro_batch", "grad_accum",
                         "seq_len", "precision", "status", "step_s", "activation_checkpointing"])
        for r in rows:
            job, cfg = r.case.job, r.case.config
            writer.writerow([_model_ref(job.model, folder), job.cluster.hardware.name, job.cluster.num_nodes,
                             job.cluster.num_gpus_per_node, cfg.zero.stage, cfg.train_micro_batch_size_per_gpu,
                             cfg.gradient_accumulation_steps, job.seq_len, cfg.precision, "ok", repr(r.step_s),
                             str(cfg.activation_checkpointing.enabled).lower()])
    return path


def _calibrate(rows: Sequence[Row], folder: Path) -> tuple[Efficiency, tuple[str, ...]]:
    """`zerotune calibrate --from` on the rows, as a user runs it; the profile's efficiency and fitted names."""
    from zerotune.cli import main as cli  # the CLI module names every package; imported only here
    profile_path, out, err = folder / "profile.json", io.StringIO(), io.StringIO()
    args = ["calibrate", "--hardware", rows[0].case.job.cluster.hardware.name, "--from",
            str(_write_csv(rows, folder)), "--out", str(profile_path)]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli(args)
    if code != 0:
        raise ValueError(f"zerotune {' '.join(args)} failed: {err.getvalue().strip()}")
    eff = load_profile(profile_path).efficiency
    default = Efficiency()
    return eff, tuple(f.name for f in dataclasses.fields(eff) if getattr(eff, f.name) != getattr(default, f.name))


def _errors(rows: Sequence[Row], eff: Efficiency) -> dict[str, list[float]]:
    """|predicted / measured throughput - 1| per row, by model."""
    return {m: [abs(math.exp(e) - 1) for e in errors] for m, errors in _log_errors(rows, eff).items()}


def _log_errors(rows: Sequence[Row], eff: Efficiency) -> dict[str, list[float]]:
    """log(measured / predicted step time) per row, by model."""
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r.model, []).append(math.log(r.step_s / estimate(r.case.job, r.case.config, eff).time.step_s))
    return out


def error_split(errors: dict[str, list[float]]) -> tuple[float, float]:
    """(RMS of the models' mean log errors, RMS of the log errors about their model's mean): how much of a
    transferred calibration's error one measurement of the model would remove."""
    means = [statistics.fmean(e) for e in errors.values()]
    about = [x - statistics.fmean(e) for e in errors.values() for x in e]
    return math.sqrt(statistics.fmean([m * m for m in means])), math.sqrt(statistics.fmean([d * d for d in about]))


def _spread(rows: list[Row], count: int) -> list[Row]:
    if len(rows) <= count:
        return rows
    return [rows[round(i * (len(rows) - 1) / max(count - 1, 1))] for i in range(count)]


def _same_kind(rows: list[Row], fit_key: str) -> list[Row]:
    """The rows of the kind of figure (value_quality) the fit model has most of: a table may hold timer sums
    and end-to-end throughput side by side, and a profile fitted on one does not predict the other."""
    kinds = [r.quality for r in rows if _key(r.model) == fit_key]
    if not kinds:
        return []
    kind = max(dict.fromkeys(kinds), key=kinds.count)
    return [r for r in rows if r.quality == kind]


def fewshot(path: Path, fit_model: str | None = None, num_rows: int = 3) -> FewShot:
    """Calibrate on `num_rows` rows of `fit_model` (spread over its rows), score every other model's rows."""
    rows = published_rows(path)
    models = list(dict.fromkeys(r.model for r in rows))
    wanted = _key(fit_model or DEFAULT_FIT_MODEL.get(path.name) or (models[0] if models else ""))
    rows = _same_kind(rows, wanted)
    fit_pool = [r for r in rows if _key(r.model) == wanted]
    test = [r for r in rows if _key(r.model) != wanted]
    if not fit_pool or not test:
        raise ValueError(f"{path}: need rows of the fit model {fit_model or wanted!r} and of others; models with "
                         f"usable rows: {', '.join(models) or 'none'}")
    fit_rows = _spread(fit_pool, num_rows)
    with tempfile.TemporaryDirectory(prefix="zerotune-fewshot-") as tmp:
        eff, fitted = _calibrate(fit_rows, Path(tmp))
    before, after = _errors(test, Efficiency()), _errors(test, eff)
    flat = lambda d: [e for errors in d.values() for e in errors]  # noqa: E731
    return FewShot(path.name, fit_rows[0].quality, fit_rows[0].model, tuple(r.row_id for r in fit_rows), tuple(after),
                   len(test), fitted, statistics.fmean(flat(before)), statistics.fmean(flat(after)),
                   {m: statistics.fmean(e) for m, e in after.items()},
                   {m: statistics.fmean(e) for m, e in before.items()}, *error_split(_log_errors(test, eff)))


def _default_data() -> Path:
    for name in DATA_FILES:
        if (DEFAULT_DATA_DIR / name).is_file():
            return DEFAULT_DATA_DIR / name
    raise ValueError(f"none of {', '.join(DATA_FILES)} in {DEFAULT_DATA_DIR}; pass --data")


def _format(r: FewShot) -> str:
    lines = [f"data: {r.data} (rows of kind: {r.quality[:90]})",
             f"fit:  {r.fit_model}, {len(r.fit_rows)} rows ({', '.join(r.fit_rows)}); fitted: "
             f"{', '.join(r.fitted_params) or 'nothing'}",
             f"test: {len(r.test_models)} other models, {r.num_test_rows} rows",
             f"{'model':<24}{'before':>10}{'after':>10}"]
    lines += [f"{m:<24}{r.per_model_before[m]:>10.1%}{r.per_model_after[m]:>10.1%}" for m in r.test_models]
    lines.append(f"throughput MAPE on the test models: {r.mape_before:.1%} uncalibrated, {r.mape_after:.1%} "
                 f"calibrated on {r.fit_model}")
    lines.append(f"calibrated, log error split: {r.shared_rms:.3f} RMS of each model's mean (shared by its "
                 f"configurations), {r.within_rms:.3f} RMS about it")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerotune.validate.fewshot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="a published *.jsonl (default: see the module docstring)")
    parser.add_argument("--fit_model", help="the model whose rows are fitted (default: per data file)")
    parser.add_argument("--rows", type=int, default=3, help="rows of the fit model to calibrate on (default 3)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = fewshot(args.data or _default_data(), args.fit_model, args.rows)
    except (ValueError, OSError) as exc:
        print(f"fewshot: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(dataclasses.asdict(result), indent=1) if args.json else _format(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
