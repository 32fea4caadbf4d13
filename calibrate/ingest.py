"""Measurements made elsewhere, for `zerotune calibrate --from PATH`.

PATH is one of
  * a DeepSpeed autotuning folder (the run directory holding autotuning_results/ and autotuning_exps/,
    or autotuning_results/ itself). DeepSpeed 0.19 writes, per experiment, results_dir/<name>/ with
    exp.json, ds_config.json, cmd.txt, stdout.log, stderr.log and, when the run reached its profiling
    steps, metrics.json (deepspeed/autotuning/scheduler.py run_experiment; runtime/engine.py
    _autotuning_exit). A run without metrics.json failed: its stderr.log says why (an out-of-memory
    message makes it status oom, anything else failed). The folder names neither the model, the
    hardware nor the sequence length: the caller passes them.
  * a CSV table, or a JSONL file of the same rows as objects, with these columns:

    | column                   | required | meaning                                                          |
    |--------------------------|----------|------------------------------------------------------------------|
    | model                    | yes (1)  | catalog name or path of a model YAML / Hugging Face config.json  |
    | hardware                 | yes (1)  | catalog name or path of a hardware YAML                          |
    | num_nodes                | yes      | nodes in the run                                                 |
    | num_gpus                 | yes      | GPUs per node                                                    |
    | zero_stage               | yes      | 0, 1, 2 or 3                                                     |
    | micro_batch              | yes      | train_micro_batch_size_per_gpu                                   |
    | grad_accum               | yes      | gradient_accumulation_steps                                      |
    | seq_len                  | yes (1)  | tokens per sample                                                |
    | precision                | yes      | fp32, fp16 or bf16                                               |
    | status                   | yes      | ok, oom, timeout or failed                                       |
    | throughput_samples_per_s | if ok    | samples per second over the whole job (all GPUs)                 |
    | peak_memory_bytes        | no       | peak device memory per rank (max_memory_allocated; RSS on CPU)   |
    | reduce_bucket_size       | no       | zero_optimization.reduce_bucket_size, elements                   |
    | allgather_bucket_size    | no       | zero_optimization.allgather_bucket_size, elements                |
    | overlap_comm             | no       | true / false (DeepSpeed's default when empty)                    |
    | offload_optimizer        | no       | none, cpu or nvme (true means cpu)                               |
    | activation_checkpointing | no       | true / false                                                     |
    | step_s                   | no       | seconds per optimizer step, if measured directly                 |
    | reason                   | no       | why a run that is not ok failed                                  |

    (1) may be left out (or empty) when the caller passes --model / --hardware / --seq_len.
    Booleans are true/false/1/0/yes/no. A bad row is a one-line error "file:line: column X ...; fix".
  * a JSONL file of Measurement records (zerotune.calibrate.measurement), recognised by their ds_config key.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from zerotune.calibrate.measurement import Measurement, read_jsonl
from zerotune.predictor import DSConfig, load_hardware, load_model, parse_ds_config
from zerotune.predictor.catalog import nearest, read_user_text
from zerotune.predictor.limits import MAX_GPUS_PER_NODE, MAX_GRAD_ACCUM, MAX_MICRO_BATCH, MAX_NODES, MAX_SEQ_LEN

__all__ = ["read_measurements", "read_autotuning", "read_table", "TABLE_COLUMNS", "REQUIRED_COLUMNS"]

TABLE_COLUMNS = ("model", "hardware", "num_nodes", "num_gpus", "zero_stage", "micro_batch", "grad_accum", "seq_len",
                 "precision", "status", "throughput_samples_per_s", "peak_memory_bytes", "reduce_bucket_size",
                 "allgather_bucket_size", "overlap_comm", "offload_optimizer", "activation_checkpointing", "step_s",
                 "reason")
REQUIRED_COLUMNS = ("model", "hardware", "num_nodes", "num_gpus", "zero_stage", "micro_batch", "grad_accum",
                    "seq_len", "precision", "status")
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}
_COLUMN_MAXIMA = {"num_nodes": MAX_NODES, "num_gpus": MAX_GPUS_PER_NODE, "micro_batch": MAX_MICRO_BATCH,
                  "grad_accum": MAX_GRAD_ACCUM, "seq_len": MAX_SEQ_LEN}
# Messages PyTorch, the CUDA/ROCm runtime, the HPU runtime and the host kernel use for running out of memory.
_OOM = re.compile(r"out of memory|OutOfMemoryError|Cannot allocate memory|\bOOM\b", re.IGNORECASE)
_ERROR = re.compile(r"error", re.IGNORECASE)


def read_measurements(path: str | Path, model: str | None = None, hardware: str | None = None,
                      seq_len: int | None = None) -> list[Measurement]:
    """Measurements from an autotuning folder, a CSV / JSONL table, or a JSONL of Measurement records."""
    path = Path(path)
    if path.is_dir():
        return read_autotuning(path, model, hardware, seq_len)
    if not path.is_file():
        raise ValueError(f"--from {path}: no such file or folder; give a DeepSpeed autotuning folder, a .csv or .jsonl")
    if path.suffix.lower() == ".csv":
        return read_table(path, model, hardware, seq_len)
    if path.suffix.lower() == ".jsonl":
        first = next((line for line in read_user_text(path).splitlines() if line.strip()), "")
        try:
            is_record = "ds_config" in json.loads(first)
        except (json.JSONDecodeError, TypeError):
            raise ValueError(f"{path}:1: malformed JSON; each line must be one JSON object") from None
        return read_jsonl(path) if is_record else read_table(path, model, hardware, seq_len)
    raise ValueError(f"--from {path}: unknown kind of file; give a DeepSpeed autotuning folder, a .csv or a .jsonl")


# -- tables ---------------------------------------------------------------------------------------------

def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) from a CSV with a header or a JSONL of objects."""
    if path.suffix.lower() == ".csv":
        # Excel's "CSV UTF-8" starts with a BOM (read_user_text drops it); newlines inside quoted fields are kept
        with io.StringIO(read_user_text(path), newline="") as f:
            reader = csv.DictReader(f)
            try:
                _check_columns(f"{path}:1", reader.fieldnames or [])
                for row in reader:
                    if None in row:
                        raise ValueError(f"{path}:{reader.line_num}: more values than columns; fix the row")
                    yield reader.line_num, row
            except csv.Error as exc:  # a field over the csv module's limit, a stray quote or NUL byte
                raise ValueError(f"{path}:{reader.line_num}: not readable as CSV ({exc}); fix the row") from None
        return
    for number, line in enumerate(read_user_text(path).splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: malformed JSON ({exc.msg}); fix or delete the line") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: a row must be a JSON object; fix the line")
            _check_columns(f"{path}:{number}", list(row))
            yield number, row


def _check_columns(where: Path | str, columns: list[str]) -> None:
    for name in columns:
        if name not in TABLE_COLUMNS:
            raise ValueError(f"{where}: unknown column {name!r}{nearest(name, TABLE_COLUMNS)}; "
                             f"known columns: {', '.join(TABLE_COLUMNS)}")


class _Row:
    """One table row, read column by column; every problem becomes 'file:line: column X ...; fix'."""

    def __init__(self, where: str, row: dict[str, Any], defaults: dict[str, Any]):
        self.where = where
        self.values = {k: v for k, v in row.items() if v is not None and str(v).strip() != ""}
        for key, value in defaults.items():
            if value is None:
                continue
            if key != "hardware" and key in self.values and str(self.values[key]).strip() != str(value):
                # a flag given for the file that its own column contradicts: neither silently wins (--hardware picks
                # the rows of its device from a table of several: calibrate.run.on_hardware)
                raise self.error(key, f"{self.values[key]!r} differs from --{key} {value}; drop the flag or fix the "
                                      f"column")
            self.values.setdefault(key, value)

    def error(self, column: str, message: str) -> ValueError:
        return ValueError(f"{self.where}: column {column} {message}")

    def get(self, column: str, convert: Callable[[str], Any], expect: str, required: bool = False) -> Any:
        if column not in self.values:
            if required:
                raise self.error(column, "is missing; add a value")
            return None
        raw = self.values[column]
        try:
            return convert(str(raw).strip())
        except (ValueError, TypeError):
            raise self.error(column, f"{raw!r} is not {expect}; fix the value") from None

    def integer(self, column: str, minimum: int = 1, required: bool = True) -> int | None:
        value = self.get(column, lambda s: _as_int(s), "an integer", required)
        if value is not None and value < minimum:
            raise self.error(column, f"{value} is below {minimum}; fix the value")
        maximum = _COLUMN_MAXIMA.get(column, 2**62)
        if value is not None and value > maximum:
            raise self.error(column, f"{value:g} is above {maximum:,}; fix the value")
        return value

    def number(self, column: str) -> float | None:
        value = self.get(column, float, "a number")
        if value is not None and not (math.isfinite(value) and value > 0):
            raise self.error(column, f"{value!r} must be a positive number; fix the value")
        return value

    def boolean(self, column: str) -> bool | None:
        return self.get(column, _as_bool, "true or false")

    def choice(self, column: str, choices: tuple[str, ...], required: bool = True) -> str | None:
        value = self.get(column, str.lower, "text", required)
        if value is not None and value not in choices:
            raise self.error(column, f"{value!r} is not one of {', '.join(choices)}; fix the value")
        return value


def _as_int(text: str) -> int:
    value = float(text)  # accepts 5e8 as CSV writers often print bucket sizes
    if not value.is_integer():  # also NaN and infinities
        raise ValueError(text)
    return int(value)


def _as_bool(text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(text)


def _catalog(row: _Row, column: str, load: Callable[[str], Any]) -> str:
    name = row.get(column, str, "text", required=True)
    try:
        load(name)
    except ValueError as exc:
        raise row.error(column, f"{name!r}: {exc}") from None
    return name


def _ds_config(row: _Row, world_size: int) -> DSConfig:
    zero: dict[str, Any] = {"stage": int(row.choice("zero_stage", ("0", "1", "2", "3")))}
    for column in ("reduce_bucket_size", "allgather_bucket_size"):
        if (value := row.integer(column, required=False)) is not None:
            zero[column] = value
    if (overlap := row.boolean("overlap_comm")) is not None:
        zero["overlap_comm"] = overlap
    offload = row.get("offload_optimizer", lambda s: {"true": "cpu", "false": "none"}.get(s.lower(), s.lower()),
                      "text")
    if offload not in (None, "none", "cpu", "nvme"):
        raise row.error("offload_optimizer", f"{offload!r} is not one of none, cpu, nvme; fix the value")
    if offload in ("cpu", "nvme"):
        zero["offload_optimizer"] = {"device": offload}
    doc: dict[str, Any] = {"train_micro_batch_size_per_gpu": row.integer("micro_batch"),
                           "gradient_accumulation_steps": row.integer("grad_accum"), "zero_optimization": zero}
    precision = row.choice("precision", ("fp32", "fp16", "bf16"))
    if precision != "fp32":
        doc[precision] = {"enabled": True}
    if row.boolean("activation_checkpointing"):
        doc["activation_checkpointing"] = {}
    try:
        # a table row says nothing of the optimizer's implementation: the fused Adam DeepSpeed builds from an
        # optimizer section (DSConfig's default), not the script's own a ds_config without one implies
        return parse_ds_config(doc, world_size=world_size).replace(optimizer_impl="fused")
    except ValueError as exc:
        raise ValueError(f"{row.where}: {exc}") from None


def _table_row(where: str, raw: dict[str, Any], defaults: dict[str, Any]) -> Measurement:
    row = _Row(where, raw, defaults)
    model, hardware = _catalog(row, "model", load_model), _catalog(row, "hardware", load_hardware)
    nodes, gpus = row.integer("num_nodes"), row.integer("num_gpus")
    node_size = load_hardware(hardware).num_devices_per_node
    if gpus > node_size:
        raise row.error("num_gpus", f"{gpus} exceeds the {node_size} devices per node of {hardware}; num_gpus counts "
                                    f"GPUs per node: split them over num_nodes")
    status = row.choice("status", ("ok", "oom", "timeout", "failed"))
    throughput, step_s = row.number("throughput_samples_per_s"), row.number("step_s")
    if status == "ok" and throughput is None and step_s is None:
        raise row.error("throughput_samples_per_s", "is missing for a run with status ok; add the measured value")
    return Measurement(model=model, hardware=hardware, num_nodes=nodes, num_gpus_per_node=gpus,
                       seq_len=row.integer("seq_len"), config=_ds_config(row, nodes * gpus), status=status,
                       step_s=step_s, throughput_samples_per_s=throughput,
                       peak_memory_bytes=row.number("peak_memory_bytes"), source=where,
                       reason=str(row.values.get("reason", "")))


def read_table(path: Path, model: str | None = None, hardware: str | None = None,
               seq_len: int | None = None) -> list[Measurement]:
    """Rows of a CSV (or JSONL of row objects) with the columns in the module docstring."""
    defaults = {"model": model, "hardware": hardware, "seq_len": seq_len}
    rows = [_table_row(f"{path}:{number}", row, defaults) for number, row in _rows(Path(path))]
    if not rows:
        raise ValueError(f"--from {path}: no rows; give a header line ({', '.join(REQUIRED_COLUMNS)}, ...) and one "
                         f"row per measured run")
    return rows


# -- DeepSpeed autotuning folders -----------------------------------------------------------------------

_PROFILE_RUN = "profile_model_info"  # the autotuner's model-profiling run: no timing, only model_info.json


def _json(path: Path) -> Any:
    try:
        return json.loads(read_user_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: malformed JSON ({exc.msg}); the autotuning folder is damaged") from None


def _results_dir(path: Path) -> Path:
    """autotuning_results/ inside a run directory (DeepSpeed's default results_dir), or the folder itself."""
    inner = path / "autotuning_results"
    return inner if inner.is_dir() else path


def _check_model_info(results: Path, model: str) -> None:
    """The profiling run counts the model's parameters; a count far from --model's means the wrong model."""
    info_path = results / _PROFILE_RUN / "model_info.json"
    if not info_path.is_file():
        return
    measured = _json(info_path).get("num_params")
    expected = load_model(model).num_params
    if isinstance(measured, (int, float)) and abs(measured / expected - 1) > 0.1:
        raise ValueError(f"{info_path}: the autotuned model has {measured:,.0f} parameters but --model {model} has "
                         f"{expected:,}; pass the model the autotuning ran")


def _stderr_status(exp_dir: Path) -> tuple[str, str]:
    """(status, reason) of an experiment that left no metrics.json, from its stderr.log."""
    lines = (exp_dir / "stderr.log").read_text(errors="replace").splitlines()
    if any("KeyboardInterrupt" in line for line in lines):
        return "failed", "interrupted (KeyboardInterrupt in stderr.log)"
    for line in lines:
        if _OOM.search(line):
            return "oom", line.strip()[:200]
    first = next((line.strip() for line in lines if _ERROR.search(line)), "")
    return "failed", (first or "no metrics.json and no error in stderr.log")[:200]


def _round_buckets(ds_config: dict[str, Any]) -> dict[str, Any]:
    """The autotuner's ZeRO-3 template sets stage3_prefetch_bucket_size = 0.9 * hidden^2, often not an integer
    (DeepSpeed itself then rejects the config); rounded here so the failed run can still be recorded."""
    zero = {k: (round(v) if isinstance(v, float) else v) for k, v in ds_config.get("zero_optimization", {}).items()}
    return {**ds_config, "zero_optimization": zero}


def _experiment_config(exp_dir: Path, exp: dict[str, Any], world_size: int, hidden_size: int) -> DSConfig:
    ds_path = exp_dir / "ds_config.json"
    ds_config = _json(ds_path) if ds_path.is_file() else exp.get("ds_config")
    if not isinstance(ds_config, dict):
        raise ValueError(f"{exp_dir}: neither ds_config.json nor exp.json's ds_config; the folder is damaged")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the autotuning section's bookkeeping keys are not ours to judge
        try:
            return parse_ds_config(ds_config, world_size=world_size, hidden_size=hidden_size)
        except ValueError:
            try:
                return parse_ds_config(_round_buckets(ds_config), world_size=world_size, hidden_size=hidden_size)
            except ValueError as exc:
                raise ValueError(f"{ds_path}: {exc}") from None


def _timings(metrics: dict[str, Any], samples_per_step: int, gas: int, where: Path) -> dict[str, float]:
    """Seconds from metrics.json. DeepSpeed writes throughput = train_batch_size * 1e6 / latency and
    latency = (fwd + bwd + step) * gas, its timer means scaled by 1000 from milliseconds (utils/timer.py
    get_mean), i.e. microseconds. The step time comes from the throughput, and the timers are converted with
    the same ratio, so the result does not hang on that unit."""
    throughput = metrics.get("throughput")
    if not isinstance(throughput, (int, float)) or throughput <= 0:
        raise ValueError(f"{where}: throughput must be a positive number, got {throughput!r}")
    step_s = samples_per_step / throughput
    out = {"throughput_samples_per_s": float(throughput), "step_s": step_s}
    latency = metrics.get("latency")
    if isinstance(latency, (int, float)) and latency > 0:
        to_s = step_s / latency
        for key, name, scale in (("fwd", "forward_s", 1), ("bwd", "backward_s", 1), ("step", "optimizer_s", gas)):
            if isinstance(metrics.get(key), (int, float)):
                out[name] = metrics[key] * to_s * scale
    return out


def _count(exp: dict[str, Any], key: str, default: int, maximum: int, exp_dir: Path) -> int:
    value = exp.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise ValueError(f"{exp_dir / 'exp.json'}: {key} must be a whole number from 1 to {maximum}, got {value!r}; "
                         f"the autotuning folder is damaged")
    return value


def _experiment(exp_dir: Path, model: str, hardware: str, seq_len: int) -> Measurement:
    exp = _json(exp_dir / "exp.json") if (exp_dir / "exp.json").is_file() else {}
    if not isinstance(exp, dict):
        raise ValueError(f"{exp_dir / 'exp.json'}: expected a JSON object; the autotuning folder is damaged")
    nodes = _count(exp, "num_nodes", 1, MAX_NODES, exp_dir)
    gpus = _count(exp, "num_gpus", load_hardware(hardware).num_devices_per_node, MAX_GPUS_PER_NODE, exp_dir)
    cfg = _experiment_config(exp_dir, exp, nodes * gpus, load_model(model).hidden_size)
    common = dict(model=model, hardware=hardware, num_nodes=nodes, num_gpus_per_node=gpus, seq_len=seq_len,
                  config=cfg, source=str(exp_dir))
    metrics_path = exp_dir / "metrics.json"
    if metrics_path.is_file():
        return Measurement(status="ok", **common, **_timings(_json(metrics_path), cfg.samples_per_step(nodes * gpus),
                                                             cfg.gradient_accumulation_steps, metrics_path))
    status, reason = _stderr_status(exp_dir)
    return Measurement(status=status, reason=reason, **common)  # type: ignore[arg-type]


def read_autotuning(path: Path, model: str | None, hardware: str | None, seq_len: int | None) -> list[Measurement]:
    """One Measurement per experiment folder that ran (has stderr.log); experiments that never started are
    left out with a warning. model, hardware and seq_len are required: the folder does not record them."""
    for flag, value in (("--model", model), ("--hardware", hardware), ("--seq_len", seq_len)):
        if value is None:
            raise ValueError(f"--from {path} is a DeepSpeed autotuning folder, which does not record the "
                             f"{flag[2:]}; pass {flag}")
    assert model is not None and hardware is not None and seq_len is not None
    results = _results_dir(Path(path))
    _check_model_info(results, model)
    out, never_ran = [], []
    for exp_dir in sorted(p for p in results.iterdir() if p.is_dir() and p.name != _PROFILE_RUN):
        if not ((exp_dir / "exp.json").is_file() or (exp_dir / "ds_config.json").is_file()):
            continue
        if not (exp_dir / "stderr.log").is_file() and not (exp_dir / "metrics.json").is_file():
            never_ran.append(exp_dir.name)
            continue
        out.append(_experiment(exp_dir, model, hardware, seq_len))
    if never_ran:
        warnings.warn(f"{results}: experiments without stderr.log never ran and are left out: {', '.join(never_ran)}",
                      stacklevel=2)
    if not out:
        raise ValueError(f"--from {path}: no experiment folders (with exp.json and stderr.log) found; give "
                         f"DeepSpeed's autotuning_results folder or the directory that holds it")
    return out
