"""`zerotune calibrate`: measure (microbenchmarks and probe runs) or read measurements, fit, write a profile.

The steps are separate functions so `tune` can refit from its own experiments with the same code.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from zerotune.calibrate.environment import collect_environment
from zerotune.calibrate.fit import FitResult, fit, make_profile
from zerotune.calibrate.launch import check_accelerator_here, read_hostfile
from zerotune.calibrate.measurement import Measurement, append_jsonl
from zerotune.calibrate.microbench import run_microbenchmarks
from zerotune.calibrate.probe import run_probes
from zerotune.calibrate.profiles import CalibrationProfile, save_profile
from zerotune.calibrate.starting import fit_microbenchmarks
from zerotune.predictor import ClusterSpec, DSConfig, Efficiency, HardwareSpec, Job, load_hardware, load_model
from zerotune.predictor.units import GIB

__all__ = ["Calibration", "Measured", "measure", "starting_efficiency", "fit_and_save", "format_fit", "plot_fit",
           "on_hardware", "DEFAULT_PROBE_MODEL", "DEFAULT_PROBE_SEQ_LEN"]

DEFAULT_PROBE_MODEL = "zt-gpt-small"
"""zerotune's built-in GPT-style workload (data/models/zt-gpt-small.yaml), run by calibrate/workload.py."""
DEFAULT_PROBE_SEQ_LEN = 128


@dataclass(frozen=True)
class Measured:
    measurements: tuple[Measurement, ...]
    environment: dict[str, Any]
    """Versions, device, date; the microbenchmark results under "microbenchmarks"."""


def measure(*, hardware: str, num_gpus: int | None, num_nodes: int | None, hostfile: str | None,
            model: str | None, seq_len: int | None, quick: bool, max_probes: int, timeout_s: float,
            progress: Callable[[str], None], run_root: Path | None = None) -> Measured:
    """Microbenchmarks, then at most `max_probes` real DeepSpeed probe runs, all through the launcher."""
    if max_probes > 6:
        raise ValueError(f"--max_probes {max_probes}: calibration uses at most 6 probe runs; pass 6 or fewer")
    hw = load_hardware(hardware)
    check_accelerator_here(hw.kind, hw.name, Path(hostfile) if hostfile else None)
    if (num_nodes or 1) > 1 and hostfile is None:
        raise ValueError(f"--num_nodes {num_nodes} needs --hostfile listing the nodes; give one")
    if hostfile is not None:  # read before anything runs, as tune does: the nodes and slots default to its own
        hosts = read_hostfile(Path(hostfile))
        if (num_nodes or 0) > len(hosts):
            raise ValueError(f"--num_nodes {num_nodes} but --hostfile {hostfile} lists {len(hosts)} host(s); add "
                             f"hosts or lower --num_nodes")
        num_nodes, num_gpus = num_nodes or len(hosts), num_gpus or min(slots for _, slots in hosts)
    cluster = ClusterSpec(hw, num_nodes or 1, num_gpus or hw.num_devices_per_node)
    job = Job(load_model(model or DEFAULT_PROBE_MODEL), cluster, seq_len or DEFAULT_PROBE_SEQ_LEN)  # checks early
    root = run_root or Path("zerotune_calibration") / hw.name
    host = Path(hostfile) if hostfile else None
    # DeepSpeed picks the CPU accelerator only when told (or when it finds no device); one thread per rank keeps
    # ranks from fighting over cores.
    env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"} if hw.kind == "cpu" else {}
    progress(f"microbenchmarks on {cluster.world_size} x {hw.name} -> {root / 'microbench'}")
    micro = run_microbenchmarks(root / "microbench", num_gpus=cluster.num_gpus_per_node, num_nodes=num_nodes,
                                hostfile=host, quick=quick, timeout_s=timeout_s, env=env)
    environment = {**collect_environment(), "microbenchmarks": micro}
    base = starting_efficiency(environment, hw.name)
    steps = {"steps": 3, "warmup": 1} if quick else {}
    measurements = run_probes(model or DEFAULT_PROBE_MODEL, hardware, root / "probes", num_gpus=cluster.num_gpus_per_node,
                              num_nodes=cluster.num_nodes, seq_len=job.seq_len, max_probes=max_probes,
                              timeout_s=timeout_s, hostfile=host, efficiency=base, progress=progress,
                              base=_probe_base(hw), env=env, **steps)
    return Measured(tuple(measurements), environment)


def _probe_base(hw: HardwareSpec) -> DSConfig:
    """Probes train in the precision a user of this device would: bf16 or fp16 on accelerators; fp32 on the CPU,
    where bf16 runs 5-15x slower than fp32 and fp16 does not run."""
    if hw.kind == "cpu" or not (hw.supports("bf16") or hw.supports("fp16")):
        return DSConfig(precision="fp32")
    return DSConfig(precision="bf16" if hw.supports("bf16") else "fp16")


def starting_efficiency(environment: dict[str, Any], hardware: str) -> Efficiency:
    """The fit starts from what the microbenchmarks say about this cluster, else from the defaults."""
    micro = environment.get("microbenchmarks")
    return fit_microbenchmarks(micro, load_hardware(hardware)) if micro else Efficiency()


@dataclass(frozen=True)
class Calibration:
    profile: CalibrationProfile
    result: FitResult
    path: Path
    measurements: tuple[Measurement, ...]


def on_hardware(measurements: Sequence[Measurement], hardware: str) -> list[Measurement]:
    """The measurements that ran on `hardware` (--hardware): the profile is named and used for that device only,
    so rows of another device are left out, with a warning; none left is an error."""
    names: dict[str, str] = {}
    for m in measurements:
        if m.hardware not in names:
            names[m.hardware] = load_hardware(m.hardware).name
    kept = [m for m in measurements if names[m.hardware] == hardware]
    others = sorted({names[m.hardware] for m in measurements} - {hardware})
    if not kept:
        raise ValueError(f"no measurement ran on --hardware {hardware} (they ran on {', '.join(others)}); "
                         f"pass the --hardware the measurements ran on")
    if others:
        warnings.warn(f"{len(measurements) - len(kept)} measurement(s) on {', '.join(others)} left out: the profile "
                      f"is for --hardware {hardware}")
    return kept


def fit_and_save(measurements: Sequence[Measurement], environment: dict[str, Any], path: Path,
                 base: Efficiency = Efficiency()) -> Calibration:
    """Fit the measurements, write the profile to `path` (the caller has checked it may be written) and,
    beside it, the measurements as JSONL so the profile can be refitted or audited."""
    result = fit(measurements, base)
    profile = make_profile(result, measurements, environment)
    save_profile(profile, path)
    log = path.with_suffix(".measurements.jsonl")
    log.unlink(missing_ok=True)
    append_jsonl(log, measurements)
    return Calibration(profile, result, path, tuple(measurements))


def _ms(value: float | None) -> str:
    return f"{value * 1e3:10.1f}" if value else f"{'-':>10}"


def _gib(value: float | None) -> str:
    return f"{value / GIB:8.2f}" if value else f"{'-':>8}"


def _pct(value: float | None) -> str:
    return f"{value:.1%}" if value is not None else "-"  # FitQuality holds fractions


def format_fit(cal: Calibration) -> str:
    """Predicted against measured, before and after the fit, the fitted parameters and the fit quality."""
    r, q = cal.result, cal.result.quality
    lines = [f"{'run':<44}{'status':>8}{'step ms':>10}{'before':>10}{'after':>10}"
             f"{'mem GiB':>8}{'before':>8}{'after':>8}"]
    for row in r.table:
        lines.append(f"{Path(row.source).name[:43]:<44}{row.status:>8}{_ms(row.measured_step_s)}"
                     f"{_ms(row.predicted_step_s_before)}{_ms(row.predicted_step_s_after)}"
                     f"{_gib(row.measured_peak_memory_bytes)}{_gib(row.predicted_peak_memory_bytes_before)}"
                     f"{_gib(row.predicted_peak_memory_bytes_after)}")
    lines += ["", "fitted parameters:"]
    for name in r.fitted_params:
        lines.append(f"  {name:<36} {getattr(r.efficiency, name)!r}")
    for name, why in r.skipped_params.items():
        lines.append(f"  {name:<36} kept ({why})")
    lines += ["", f"step time MAPE: before {_pct(q.step_time_mape_before)}, fitted in sample "
                  f"{_pct(q.step_time_mape_in_sample)}, out of sample {_pct(q.step_time_mape_out_of_sample)} "
                  f"({q.num_step_time} distinct configurations, {q.num_folds} folds, each holding out whole "
                  f"{q.held_out_by}s)",
              f"peak memory MAPE: before {_pct(q.peak_memory_mape_before)}, in sample "
              f"{_pct(q.peak_memory_mape_in_sample)}, out of sample {_pct(q.peak_memory_mape_out_of_sample)}",
              f"profile written: {cal.path}"]
    lines += [f"note: {note}" for note in r.notes]
    return "\n".join(lines)


def plot_fit(cal: Calibration, path: Path, plot: Callable[..., None]) -> None:
    """Step time predicted against measured, before and after calibration (`plot` is validate's plotter,
    passed in so calibrate stays below validate)."""
    rows = [row for row in cal.result.table if row.measured_step_s]
    plot([row.predicted_step_s_after for row in rows], [row.measured_step_s for row in rows], path,
         labels=[Path(row.source).name for row in rows], before=[row.predicted_step_s_before for row in rows],
         title=f"calibration of {cal.profile.hardware}")
