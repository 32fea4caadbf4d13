"""Probe runs: a few real DeepSpeed trainings of the built-in workload whose measurements a profile is fitted to.

`select_probes` picks at most six configurations so that the fit can tell its parameters apart
(calibrate/params.py says what varies each): at the lowest ZeRO stage that fits, the smallest and the largest
micro-batch (compute rate against fixed per-micro-step cost), then ZeRO-3 at a middle micro-batch (its hooks
and gathers), the middle micro-batch with gradient accumulation ACCUMULATION (per-step against per-micro-step
costs: with accumulation 1 everywhere they are one number), the middle micro-batch at half the sequence
length (a second problem shape at the same micro-batch), and a middle ZeRO stage. Only configurations the
predictor says fit in memory and finish a step within `max_step_s` are considered. `run_probes` runs them
one after another through zerotune.calibrate.launch and calibrate/workload.py and returns one Measurement per probe;
a probe that crashes, runs out of memory or times out is a Measurement with that status and its reason,
never an exception.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from zerotune.calibrate.launch import LaunchSpec, RunResult, free_port, launch
from zerotune.calibrate.measurement import Measurement
from zerotune.predictor import ClusterSpec, DSConfig, Efficiency, Job, estimate, experiment_name, load_hardware, load_model
from zerotune.predictor import to_ds_config

__all__ = ["Probe", "select_probes", "run_probes", "probe_ds_config", "to_measurement", "WORKLOAD"]

WORKLOAD = Path(__file__).resolve().parent / "workload.py"
MAX_PROBES = 6
MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
STAGES = (0, 1, 2, 3)
ACCUMULATION = 4
"""Gradient accumulation of the accumulation probe (2 if 4 would run past max_step_s)."""
MIN_PROBE_SEQ_LEN = 8


@dataclass(frozen=True)
class Probe:
    name: str
    """DeepSpeed autotuner-style experiment name, e.g. z1_gas1_tmbspg4 (_seq64 when the sequence length is not
    the job's); also the run folder's name."""
    config: DSConfig
    predicted_step_s: float
    predicted_memory_bytes: float
    seq_len: int | None = None
    """Tokens per sample of this probe; None: run_probes' seq_len."""


def _probe(job: Job, cfg: DSConfig, eff: Efficiency, max_step_s: float) -> Probe | None:
    """The probe, or None when the predictor says it does not fit or runs past max_step_s."""
    est = estimate(job, cfg, eff)
    if not est.memory.fits or est.time.step_s > max_step_s:
        return None
    return Probe(experiment_name(cfg), cfg, est.time.step_s, est.memory.total_bytes)


def _candidates(job: Job, base: DSConfig, eff: Efficiency, max_step_s: float) -> dict[int, list[Probe]]:
    """Per ZeRO stage, the micro-batches (accumulation 1) predicted to fit and to run within max_step_s."""
    out: dict[int, list[Probe]] = {}
    for stage in STAGES:
        for micro in MICRO_BATCHES:
            cfg = base.replace(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=1)
            probe = _probe(job, cfg.replace_zero(stage=stage, overlap_comm=stage == 3), eff, max_step_s)
            if probe is None:
                break  # larger micro-batches need more memory and time still
            out.setdefault(stage, []).append(probe)
    return out


def _accumulating(job: Job, at: list[Probe], eff: Efficiency, max_step_s: float) -> Probe | None:
    """The first of `at` with accumulation ACCUMULATION, else 2, that runs within max_step_s."""
    for probe in at:
        for gas in (ACCUMULATION, 2):
            found = _probe(job, probe.config.replace(gradient_accumulation_steps=gas), eff, max_step_s)
            if found is not None:
                return found
    return None


def _shorter(job: Job, at: Probe, eff: Efficiency, max_step_s: float) -> Probe | None:
    """The same configuration at half the sequence length: another problem shape, same micro-batch."""
    seq = job.seq_len // 2
    if seq < MIN_PROBE_SEQ_LEN:
        return None
    probe = _probe(dataclasses.replace(job, seq_len=seq), at.config, eff, max_step_s)
    return None if probe is None else dataclasses.replace(probe, name=f"{probe.name}_seq{seq}", seq_len=seq)


def _with_checkpointing(job: Job, base: DSConfig, eff: Efficiency, max_step_s: float
                        ) -> tuple[DSConfig, dict[int, list[Probe]]]:
    by_stage = _candidates(job, base, eff, max_step_s)
    if not by_stage and not base.activation_checkpointing.enabled:  # recomputation trades time for memory
        base = base.replace(activation_checkpointing=dataclasses.replace(base.activation_checkpointing, enabled=True))
        by_stage = _candidates(job, base, eff, max_step_s)
    if not by_stage:
        raise ValueError(f"no ZeRO stage runs {job.model.name} at micro-batch 1, sequence {job.seq_len}, on "
                         f"{job.cluster.world_size} x {job.cluster.hardware.name} within memory and {max_step_s:g} "
                         f"s per step (per the predictor); use a smaller model or sequence, or more devices")
    return base, by_stage


def _at_most(probes: list[Probe], micro: int) -> Probe:
    """The largest micro-batch up to `micro` (the smallest if none is)."""
    return ([p for p in probes if p.config.train_micro_batch_size_per_gpu <= micro] or probes[:1])[-1]


def select_probes(job: Job, base: DSConfig = DSConfig(), eff: Efficiency = Efficiency(),
                  max_probes: int = MAX_PROBES, max_step_s: float = 10.0) -> list[Probe]:
    """At most max_probes distinct configurations in priority order (see the module docstring); when nothing
    fits, the same with activation checkpointing on."""
    if max_probes < 1:
        raise ValueError(f"max_probes must be at least 1, got {max_probes}")
    base, by_stage = _with_checkpointing(job, base, eff, max_step_s)
    first = min(by_stage)
    sweep = by_stage[first]
    middle = sweep[(len(sweep) - 1) // 2]
    micro = middle.config.train_micro_batch_size_per_gpu
    others = [s for s in (2, 1) if s in by_stage and s != first][:1]
    ordered = [sweep[0], sweep[-1],
               _at_most(by_stage[3], micro) if 3 in by_stage and first != 3 else None,
               _accumulating(job, [middle, sweep[0]], eff, max_step_s),
               _shorter(job, middle, eff, max_step_s),
               *(_at_most(by_stage[s], micro) for s in others)]
    chosen: list[Probe] = []
    for probe in ordered:
        if probe is not None and probe.name not in {p.name for p in chosen}:
            chosen.append(probe)
    return chosen[:max_probes]


def probe_ds_config(cfg: DSConfig, world_size: int) -> dict[str, Any]:
    """The ds_config a probe runs: the configuration, DeepSpeed's timers on, its step log quiet."""
    return {**to_ds_config(cfg, world_size), "wall_clock_breakdown": True, "steps_per_print": 1_000_000}


def _number(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def to_measurement(result: RunResult, probe: Probe, model: str, hardware: str, cluster: ClusterSpec,
                   seq_len: int) -> Measurement:
    """A launch result as the shared Measurement record (source: the run folder); seq_len: unless the probe
    has its own."""
    common = dict(model=model, hardware=hardware, num_nodes=cluster.num_nodes,
                  num_gpus_per_node=cluster.num_gpus_per_node, seq_len=probe.seq_len or seq_len, config=probe.config,
                  source=str(result.run_dir))
    m = result.metrics or {}
    if result.status != "ok":
        return Measurement(status=result.status, reason=result.reason, **common)  # type: ignore[arg-type]
    try:
        return Measurement(status="ok", step_s=_number(m, "step_s"),
                           throughput_samples_per_s=_number(m, "throughput_samples_per_s") or _number(m, "throughput"),
                           peak_memory_bytes=_number(m, "peak_memory_bytes"),
                           reserved_memory_bytes=_number(m, "reserved_memory_bytes"),
                           forward_s=_number(m, "forward_s"), backward_s=_number(m, "backward_s"),
                           optimizer_s=_number(m, "optimizer_s"), **common)  # type: ignore[arg-type]
    except ValueError as exc:  # metrics without a usable time: the run is recorded, as a failure
        return Measurement(status="failed", reason=f"metrics.json unusable: {exc}", **common)  # type: ignore[arg-type]


def _model_arg(model: str) -> str:
    """Catalog names pass through; a relative model path is made absolute for the ranks."""
    path = Path(model)
    return str(path.resolve()) if path.is_file() else model


def _progress_line(probe: Probe, m: Measurement, wall_s: float) -> str:
    if m.status == "ok" and m.measured_step_s is not None:
        peak = f", peak {m.peak_memory_bytes / 2**20:.0f} MiB" if m.peak_memory_bytes else ""
        return f"probe {probe.name}: ok, step {m.measured_step_s:.3f} s{peak} ({wall_s:.0f} s)"
    return f"probe {probe.name}: {m.status} ({wall_s:.0f} s) {m.reason}".rstrip()


def run_probes(model: str, hardware: str, out_dir: Path, *, num_gpus: int, num_nodes: int = 1, seq_len: int = 128,
               base: DSConfig = DSConfig(), probes: list[Probe] | None = None, max_probes: int = MAX_PROBES,
               steps: int = 4, warmup: int = 2, timeout_s: float = 600.0, env: Mapping[str, str] | None = None,
               hostfile: Path | None = None, memory_limit_bytes: int | None = None,
               efficiency: Efficiency = Efficiency(), progress: Callable[[str], None] | None = None,
               ) -> list[Measurement]:
    """Run each probe (select_probes' unless given) in out_dir/<probe name>/ and measure it."""
    cluster = ClusterSpec(load_hardware(hardware), num_nodes, num_gpus)
    job = Job(load_model(model), cluster, seq_len)
    chosen = probes if probes is not None else select_probes(job, base, efficiency, max_probes)
    out = []
    for probe in chosen:
        run_dir = out_dir / probe.name
        spec = LaunchSpec(script=WORKLOAD, ds_config=probe_ds_config(probe.config, cluster.world_size),
                          run_dir=run_dir, master_port=free_port(), timeout_s=timeout_s,
                          script_args=("--model", _model_arg(model), "--seq_len", str(probe.seq_len or seq_len),
                                       "--steps", str(steps),
                                       "--warmup", str(warmup)),
                          num_gpus=num_gpus, num_nodes=num_nodes if num_nodes > 1 else None, hostfile=hostfile,
                          env=dict(env or {}), memory_limit_bytes=memory_limit_bytes)
        result = launch(spec)
        m = to_measurement(result, probe, model, hardware, cluster, seq_len)
        out.append(m)
        if progress is not None:
            progress(_progress_line(probe, m, result.wall_s))
    return out
