"""Run each tuner on a job in its own folder and read back what it did, from DeepSpeed's results layout.

Both tools write results_dir/<experiment>/{ds_config.json, exp.json, metrics.json, stdout.log, ...} and
results_dir/ds_config_optimal.json (DeepSpeed: autotuning/autotuner.py write_optimal_config and
scheduler.py run_experiment; zerotune: validate/results.py), so one reader serves both. An experiment's
start is the oldest of the files written before its launch, its end the newest of those written after.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from benchmarks.jobs import BenchJob, script_args, user_ds_config, workload
from zerotune.calibrate.launch import deepspeed_executable

__all__ = ["Tool", "Experiment", "ToolRun", "cpu_env", "run_env", "deepspeed_tune_command",
           "zerotune_tune_command", "run_tool", "read_experiments", "metric_key", "extensions_dir", "build_ops",
           "with_root", "ROOT"]

ROOT = Path(__file__).resolve().parent.parent
Tool = Literal["deepspeed", "zerotune"]
_BEFORE_LAUNCH = ("exp.json", "ds_config.json", "cmd.txt")
_AFTER_RUN = ("metrics.json", "stdout.log", "stderr.log")
_METRIC_KEYS = {"throughput": "throughput", "latency": "latency", "flops": "FLOPS_per_gpu"}


@dataclass(frozen=True)
class Experiment:
    name: str
    start_s: float
    """Seconds after the tool was started."""
    end_s: float
    throughput_samples_per_s: float | None
    """From the run's metrics.json (DeepSpeed's engine and zerotune's workload both write samples/s);
    None for a failed run or a profiling run that measures no throughput."""
    metric_value: float | None
    """The job's metric as the run's metrics.json has it (DeepSpeed's units: latency in microseconds)."""
    samples_per_step: int | None = None
    """train_batch_size of the run's ds_config.json (both tools write it)."""

    @property
    def step_s(self) -> float | None:
        """Seconds per optimizer step, from the throughput: unit-safe across the two tools' metrics files."""
        if self.samples_per_step and self.throughput_samples_per_s:
            return self.samples_per_step / self.throughput_samples_per_s
        return None


@dataclass(frozen=True)
class ToolRun:
    tool: Tool
    folder: Path
    returncode: int | None
    """None when the tool was killed at its time limit."""
    wall_s: float
    experiments: tuple[Experiment, ...]
    optimal_ds_config: dict[str, Any] | None
    """results_dir/ds_config_optimal.json, or None when the tool chose nothing."""


def cpu_env(num_gpus: int) -> dict[str, str]:
    """What DeepSpeed needs to run on this CPU: its CPU accelerator, one thread per rank, LOCAL_SIZE (the CPU
    accelerator's device_count(), cpu_accelerator.py) and this Python's bin on PATH (the autotuner calls a
    bare `deepspeed`, scheduler.py run_experiment)."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "LOCAL_SIZE": str(num_gpus), "PATH": path,
            "TORCH_EXTENSIONS_DIR": extensions_dir()}


def run_env(job: BenchJob) -> dict[str, str]:
    """The environment of the job's runs: cpu_env on the CPU; on a GPU, DeepSpeed's own accelerator detection
    (no DS_ACCELERATOR), this Python's bin and the launcher's folder first on PATH (the autotuner calls a bare
    `deepspeed`) and the shared op build folder."""
    if job.hardware == "cpu":
        return cpu_env(job.num_gpus)
    launcher_dir = str(Path(deepspeed_executable()).parent)  # pip --target puts it in the target's bin
    folders = dict.fromkeys([str(Path(sys.executable).parent), launcher_dir, os.environ.get("PATH", "")])
    return {"PATH": os.pathsep.join(folders), "TORCH_EXTENSIONS_DIR": extensions_dir()}


def extensions_dir() -> str:
    """One absolute build folder for DeepSpeed's JIT ops: the caller's TORCH_EXTENSIONS_DIR, else torch's own
    default (~/.cache/torch_extensions/pyXY_cpu). An empty TORCH_EXTENSIONS_DIR makes torch build into each
    run's working folder, so every tool's first run would compile the shm op again (about 50 s here)."""
    given = os.environ.get("TORCH_EXTENSIONS_DIR")
    if given:
        return str(Path(given).resolve())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return str(cache / "torch_extensions" / f"py{sys.version_info.major}{sys.version_info.minor}_cpu")


def build_ops(num_gpus: int, timeout_s: float = 600.0) -> None:
    """Build (or load from the cache) the shm comm op every CPU DeepSpeed run loads, before any tool's clock
    starts, so neither tool's first experiment pays the compile. Raises RuntimeError if the build fails."""
    code = ("from deepspeed.accelerator import get_accelerator; "
            "get_accelerator().create_op_builder('ShareMemCommBuilder').load()")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **cpu_env(num_gpus)},
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"building DeepSpeed's CPU shm op failed: {last}")


def metric_key(job: BenchJob) -> str:
    return _METRIC_KEYS[job.metric]


def deepspeed_tune_command(job: BenchJob, ds_config: Path) -> list[str]:
    return [deepspeed_executable(), "--autotuning", "tune", "--num_gpus", str(job.num_gpus), str(workload(job)),
            "--deepspeed_config", str(ds_config), *script_args(job, for_tuner=True)]


def zerotune_tune_command(job: BenchJob, ds_config: Path) -> list[str]:
    # zerotune gets exactly what DeepSpeed's autotuner gets (no --model, no --seq_len): what it needs about the
    # model it learns from its own profiling run of the script, as DeepSpeed's autotuner does.
    profile = ("--profile", job.zerotune_profile) if job.zerotune_profile else ()
    return [sys.executable, "-m", "zerotune.cli", "tune", "--num_gpus", str(job.num_gpus), "--hardware",
            job.hardware, *profile, str(workload(job)), "--deepspeed_config", str(ds_config),
            *script_args(job, for_tuner=True)]


def _run(cmd: list[str], folder: Path, env: Mapping[str, str], timeout_s: float) -> tuple[int | None, float]:
    (folder / "cmd.txt").write_text(shlex.join(cmd) + "\n")
    start = time.monotonic()
    with (folder / "tool_stdout.log").open("wb") as out, (folder / "tool_stderr.log").open("wb") as err:
        proc = subprocess.Popen(cmd, cwd=folder, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                env={**os.environ, **env, "PYTHONPATH": with_root(os.environ.get("PYTHONPATH", ""))},
                                start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s), time.monotonic() - start
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the tool's launcher and every rank it started share its session
            proc.wait()
            return None, time.monotonic() - start


def with_root(pythonpath: str) -> str:
    """The repository first on the tools' PYTHONPATH (benchmarks.ds_workload), the caller's paths kept after it
    (a DeepSpeed installed with pip --target is found only through them)."""
    return os.pathsep.join(p for p in (str(ROOT), pythonpath) if p)


def _release_shm_since(started_at: float) -> None:
    """DeepSpeed's CPU shm all-reduce never unlinks its /dev/shm buffers (69 MB per rank per run) and its
    autotuner's experiments pick their own ports, so after a tool has finished (every rank gone) remove the
    buffers created since it started."""
    for path in Path("/dev/shm").glob("deepspeed_allreduce_buffer_*"):
        try:
            if path.stat().st_mtime >= started_at - 1:
                path.unlink()
        except OSError:
            pass


def run_tool(tool: Tool, job: BenchJob, folder: Path, timeout_s: float, reuse: bool = False) -> ToolRun:
    """Run one tuner on the job in folder/ (its cwd, so its relative results_dir lands there) and read it back.
    With reuse, a finished earlier run of the same command in folder/ (its tool_run.json) is read back instead."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg_path = folder / "ds_config.json"
    cmd = (deepspeed_tune_command if tool == "deepspeed" else zerotune_tune_command)(job, cfg_path)
    done = _json(folder / "tool_run.json") if reuse else {}
    if done.get("cmd") == cmd and _json(cfg_path) == user_ds_config(job):
        returncode, wall_s, started_at = done["returncode"], float(done["wall_s"]), float(done["started_at"])
    else:
        cfg_path.write_text(json.dumps(user_ds_config(job), indent=2) + "\n")
        started_at = time.time()
        returncode, wall_s = _run(cmd, folder, run_env(job), timeout_s)
        _release_shm_since(started_at)
        (folder / "tool_run.json").write_text(json.dumps({"cmd": cmd, "returncode": returncode, "wall_s": wall_s,
                                                          "started_at": started_at}) + "\n")
    results_dir = folder / user_ds_config(job)["autotuning"]["results_dir"]
    optimal = results_dir / "ds_config_optimal.json"
    chosen = json.loads(optimal.read_text()) if optimal.is_file() else None
    return ToolRun(tool, folder, returncode, wall_s, read_experiments(results_dir, started_at, metric_key(job)),
                   chosen)


def _mtimes(folder: Path, names: tuple[str, ...]) -> list[float]:
    return [(folder / n).stat().st_mtime for n in names if (folder / n).is_file()]


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def read_experiments(results_dir: Path, started_at: float, key: str) -> tuple[Experiment, ...]:
    """Every experiment folder under results_dir (profiling runs included: they cost time too), by start."""
    found = []
    for folder in sorted(p for p in results_dir.glob("*") if p.is_dir()):
        before, after = _mtimes(folder, _BEFORE_LAUNCH), _mtimes(folder, _AFTER_RUN)
        if not before:
            continue  # not an experiment folder (plots, copies)
        metrics, cfg = _json(folder / "metrics.json"), _json(folder / "ds_config.json")
        batch = cfg.get("train_batch_size")
        found.append(Experiment(folder.name, min(before) - started_at, max(after or before) - started_at,
                                _positive(metrics.get("throughput")), _positive(metrics.get(key)),
                                batch if isinstance(batch, int) and batch > 0 else None))
    return tuple(sorted(found, key=lambda e: e.start_s))
