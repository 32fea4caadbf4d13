"""One measured training run (or a failed attempt), as calibration, tuning and reports exchange it.

A Measurement is what a probe run, a `tune` experiment, a DeepSpeed autotuning results folder or a
user's CSV row becomes. Stored one JSON object per line (append-only JSONL); `to_record` / `from_record`
are the only translation to and from that form, and reading rejects unknown keys with the field named.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterable, Literal, get_args

from zerotune.predictor import ClusterSpec, DSConfig, Job, load_hardware, load_model, parse_ds_config, to_ds_config
from zerotune.predictor.catalog import read_user_text

__all__ = ["Measurement", "Status", "to_record", "from_record", "append_jsonl", "read_jsonl"]

Status = Literal["ok", "oom", "timeout", "failed", "stopped"]
"""ok: the run finished and was measured; oom: it ran out of device (or host) memory; timeout: killed after
its time limit; failed: any other crash or launcher error (the reason says which); stopped: `tune` stopped it
early because its measured steps showed it could not beat the best (step_s is then the partial measurement)."""


@dataclass(frozen=True)
class Measurement:
    model: str
    """Catalog name or path (a zerotune model YAML or a Hugging Face config.json), as `--model` takes."""
    hardware: str
    """Catalog name or YAML path, as `--hardware` takes."""
    num_nodes: int
    num_gpus_per_node: int
    seq_len: int
    config: DSConfig
    status: Status
    step_s: float | None = None
    """Median seconds per optimizer step over the measured steps."""
    throughput_samples_per_s: float | None = None
    step_s_rel_error: float | None = None
    """Standard error of step_s relative to it (0.1: 10%), from the spread of the steps it is the median of;
    None where unknown (then zerotune.validate.search takes its run-to-run NOISE_STD)."""
    peak_memory_bytes: float | None = None
    """Peak device memory per rank: max_memory_allocated on GPUs, peak resident set size on the CPU target."""
    reserved_memory_bytes: float | None = None
    """max_memory_reserved on GPUs (the caching allocator's peak); None where it does not apply."""
    forward_s: float | None = None
    """DeepSpeed's forward / backward / step timers, mean seconds per micro-step (step: per optimizer step)."""
    backward_s: float | None = None
    optimizer_s: float | None = None
    source: str = ""
    """Where it came from: a run folder, a results file and line, a paper table."""
    reason: str = ""
    """Why a run that is not ok failed, in one line."""

    def __post_init__(self) -> None:
        where = f"measurement from {self.source if isinstance(self.source, str) and self.source else 'unknown source'}"
        for name in ("model", "hardware", "source", "reason"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{where}: {name} must be a string, got {getattr(self, name)!r}")
        for name in ("num_nodes", "num_gpus_per_node", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: {name} must be a whole number of at least 1, got {value!r}")
        for name in ("step_s", "throughput_samples_per_s", "step_s_rel_error", "peak_memory_bytes",
                     "reserved_memory_bytes", "forward_s", "backward_s", "optimizer_s"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{where}: {name} must be a number, got {value!r}")
        for name in ("forward_s", "backward_s", "optimizer_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{where}: {name} must be a number >= 0, got {value!r}")
        if self.status not in get_args(Status):
            raise ValueError(f"measurement status must be one of {', '.join(get_args(Status))}, got {self.status!r}")
        if self.status == "ok" and self.step_s is None and self.throughput_samples_per_s is None:
            raise ValueError(f"measurement from {self.source or 'unknown source'}: status ok needs step_s or "
                             f"throughput_samples_per_s")
        for name in ("step_s", "throughput_samples_per_s", "peak_memory_bytes", "reserved_memory_bytes"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"measurement from {self.source or 'unknown source'}: {name} must be a positive "
                                 f"number, got {value!r}")
        if self.step_s_rel_error is not None and not (math.isfinite(self.step_s_rel_error)
                                                      and self.step_s_rel_error >= 0):
            raise ValueError(f"measurement from {self.source or 'unknown source'}: step_s_rel_error must be a "
                             f"number >= 0, got {self.step_s_rel_error!r}")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_gpus_per_node

    @property
    def samples_per_step(self) -> int:
        return self.config.samples_per_step(self.world_size)

    @property
    def measured_step_s(self) -> float | None:
        """Seconds per optimizer step, from step_s or else from the throughput."""
        if self.step_s is not None:
            return self.step_s
        if self.throughput_samples_per_s:
            return self.samples_per_step / self.throughput_samples_per_s
        return None

    def job(self) -> Job:
        cluster = ClusterSpec(load_hardware(self.hardware), self.num_nodes, self.num_gpus_per_node)
        return Job(load_model(self.model), cluster, self.seq_len)


_FIELDS = tuple(f.name for f in fields(Measurement))


def to_record(m: Measurement) -> dict[str, Any]:
    """A JSON-ready dict; the configuration as the ds_config DeepSpeed ran."""
    record = {name: getattr(m, name) for name in _FIELDS if name != "config"}
    record["ds_config"] = to_ds_config(m.config, m.world_size)
    record["optimizer_impl"] = m.config.optimizer_impl  # the ds_config alone cannot say it (DSConfig.optimizer_impl)
    return record


def from_record(record: Any, where: str = "measurement") -> Measurement:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: a measurement must be a JSON object, got {type(record).__name__}")
    known = set(_FIELDS) - {"config"} | {"ds_config", "optimizer_impl"}
    for key in record:
        if key not in known:
            raise ValueError(f"{where}: unknown key {key!r}; known keys: {', '.join(sorted(known))}")
    for key in ("model", "hardware", "num_nodes", "num_gpus_per_node", "seq_len", "ds_config", "status"):
        if key not in record:
            raise ValueError(f"{where}: missing key {key!r}")
    values = {k: v for k, v in record.items() if k not in ("ds_config", "optimizer_impl")}
    impl = record.get("optimizer_impl")
    if impl not in (None, "fused", "torch"):
        raise ValueError(f"{where}: optimizer_impl {impl!r} is not fused or torch; fix the value")
    try:
        world = int(record["num_nodes"]) * int(record["num_gpus_per_node"])
        config = parse_ds_config(record["ds_config"], world_size=world)
        return Measurement(config=config.replace(optimizer_impl=impl) if impl else config, **values)
    except (TypeError, ValueError, OverflowError) as exc:  # the file and line first, whatever the record says
        text = str(exc)
        raise ValueError(text if text.startswith(where) else f"{where}: {text}") from None


def append_jsonl(path: Path, measurements: Iterable[Measurement]) -> None:
    """Append and flush to disk: a measurement once written survives a crash of whatever wrote it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        for m in measurements:
            out.write(json.dumps(to_record(m), allow_nan=False) + "\n")
        out.flush()
        os.fsync(out.fileno())


def read_jsonl(path: Path) -> list[Measurement]:
    out = []
    for number, line in enumerate(read_user_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: malformed JSON ({exc.msg}); fix or delete the line") from None
        out.append(from_record(record, f"{path}:{number}"))
    return out
