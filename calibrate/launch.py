"""Run one DeepSpeed job through the real `deepspeed` launcher and classify how it ended.

Used by calibration probes and by `zerotune tune`. Every run leaves a folder that reproduces it:
ds_config.json, cmd.txt (the exact argument list and the added environment), stdout.log, stderr.log,
environment.json and, when the job measured itself, metrics.json. The ds_config's
autotuning.metric_path is pointed at that metrics.json, so DeepSpeed's own autotuning metrics
(autotuning.enabled) and zerotune's workload script write to the same place.

The launcher runs in its own session, so a timeout or Ctrl-C kills it and every rank it started
(one process group) and nothing is left behind on this node. Ranks on other nodes started by pdsh
are stopped by pdsh's own SIGINT handling in DeepSpeed's runner, which zerotune cannot verify.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Mapping

from zerotune.calibrate.atomic import write_json_atomic, write_text_atomic
from zerotune.calibrate.engine_timers import step_times_s
from zerotune.calibrate.environment import collect_environment
from zerotune.predictor.catalog import read_user_text

__all__ = ["read_hostfile", "check_accelerator_here", "ACCELERATOR_TOOLS", "ACCELERATOR_NODES", "LaunchSpec",
           "RunResult", "deepspeed_command", "deepspeed_executable", "launch", "free_port", "classify",
           "release_shm_buffers", "failure_reason", "write_json_atomic", "StopRule", "POLL_S", "tail_text",
           "Terminated", "terminate_as_interrupt"]

TERMINATE_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL when a run is stopped: DeepSpeed's launcher forwards SIGTERM to
its ranks (launcher/launch.py sigkill_handler), which is the clean path; SIGKILL is the sure one."""
SIGKILL_EXIT = 256 - signal.SIGKILL
"""DeepSpeed's launcher exits with sys.exit(-9) when a rank is SIGKILLed; the shell sees 247."""
OOM_PATTERNS = re.compile(
    r"out of memory|OutOfMemoryError|\bMemoryError\b|Cannot allocate memory|can't allocate memory|"
    r"std::bad_alloc|RESOURCE_EXHAUSTED", re.IGNORECASE)
_NOISE = re.compile(r"^\s*$|\[launch\.py:|\[runner\.py:|sigkill_handler|^\s*[\^~]+\s*$|^Traceback|"
                    r"^\s*File \"|\[(INFO|WARNING|DEBUG)\]")
_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Interrupt|Exit)\b.*:|^[\w.]*Error$")
_SECONDARY = re.compile(r"Connection closed by peer|Connection reset by peer|remote worker crashing|Broken pipe|"
                        r"NCCL communicator was aborted|ProcessGroupNCCL.*(abort|[Ww]atchdog)")
"""Errors a rank raises because another rank crashed (gloo's 'Connection closed by peer ... caused by a remote worker
crashing', NCCL's aborted communicator): the other rank's error is the reason."""
_RANK_PREFIX = re.compile(r"^\[rank\d+\]:\s?")
POLL_S = 0.5
"""How often a run with a stop rule has its output read."""
StopRule = Callable[[tuple[float, ...]], "str | None"]
"""Given the step times seen so far (seconds per optimizer step, in order), why to stop the run now, or None."""


ACCELERATOR_TOOLS = ("nvidia-smi", "rocm-smi", "amd-smi", "hl-smi")
"""Each accelerator vendor's command-line tool (NVIDIA, AMD, Intel Gaudi): a machine with none of them has no device
DeepSpeed could train on but its CPU."""

ACCELERATOR_NODES = ("/dev/nvidia0", "/proc/driver/nvidia", "/dev/kfd", "/dev/accel")
"""Device nodes the vendors' drivers create (NVIDIA, AMD ROCm, Intel Gaudi's accel class): a container may hold the
devices without the vendor's tool."""


def check_accelerator_here(kind: str, hardware: str, hostfile: Path | None) -> None:
    """A one-line error before anything runs when --hardware names an accelerator this machine cannot be running
    (experiments ran, each failing at start-up, instead): DS_ACCELERATOR=cpu, or no vendor tool on one node."""
    accelerator = os.environ.get("DS_ACCELERATOR")
    if hostfile is not None:  # with a hostfile the ranks run on the listed hosts, not here
        return
    present = any(shutil.which(tool) for tool in ACCELERATOR_TOOLS) or any(Path(n).exists() for n in ACCELERATOR_NODES)
    if kind == "cpu":
        if accelerator not in (None, "", "cpu"):  # DeepSpeed would train (or fail to start) on that accelerator
            raise ValueError(f"--hardware {hardware} is the CPU, but DS_ACCELERATOR={accelerator} makes DeepSpeed "
                             f"train on {accelerator}{'' if present else ', which this machine has not'}; set "
                             f"DS_ACCELERATOR=cpu, or give the --hardware of that device")
        return
    if accelerator not in (None, "", "cpu") and not present:
        raise ValueError(f"DS_ACCELERATOR={accelerator}, but this machine has no accelerator "
                         f"({', '.join(ACCELERATOR_TOOLS)} not found); run zerotune where the devices are, or set "
                         f"DS_ACCELERATOR=cpu and give --hardware cpu")
    if accelerator == "cpu":
        raise ValueError(f"--hardware {hardware} is a {kind.upper()}, but DS_ACCELERATOR=cpu makes DeepSpeed train "
                         f"on the CPU; unset DS_ACCELERATOR, or give --hardware cpu")
    if not accelerator and not present:
        raise ValueError(f"--hardware {hardware} is a {kind.upper()}, but this machine has none "
                         f"({', '.join(ACCELERATOR_TOOLS)} not found); run zerotune where the devices are, or give "
                         f"--hardware cpu")


def read_hostfile(path: Path) -> list[tuple[str, int]]:
    """(host, slots) per line of a DeepSpeed hostfile ('worker-0 slots=8'; '#' starts a comment)."""
    try:
        text = read_user_text(path)
    except OSError as exc:
        raise ValueError(f"--hostfile {path}: cannot read it ({exc.strerror}); give a readable DeepSpeed "
                         f"hostfile of 'host slots=N' lines") from None
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"(\S+)\s+slots\s*=\s*(\d+)", line)
        if match is None or int(match.group(2)) < 1:
            raise ValueError(f"--hostfile {path}:{number}: {line!r} is not 'host slots=N' with N >= 1; fix the line")
        if match.group(1) in dict(hosts):  # DeepSpeed's launcher refuses it too (launcher/runner.py _parse_hostfile)
            raise ValueError(f"--hostfile {path}:{number}: host {match.group(1)} is listed twice; keep one line "
                             f"per host")
        hosts.append((match.group(1), int(match.group(2))))
    if not hosts:
        raise ValueError(f"--hostfile {path}: no 'host slots=N' line; list at least one host")
    return hosts


@dataclass(frozen=True)
class LaunchSpec:
    script: Path
    ds_config: dict[str, Any]
    run_dir: Path
    master_port: int
    timeout_s: float
    script_args: tuple[str, ...] = ()
    num_gpus: int | None = None
    """Devices per node (the launcher's --num_gpus); None uses every device DeepSpeed finds."""
    num_nodes: int | None = None
    hostfile: Path | None = None
    """A DeepSpeed hostfile ('host slots=N' lines); with more than one node the launcher needs pdsh."""
    include: str | None = None
    """The launcher's --include filter, e.g. 'worker-0:0,1@worker-1'; DeepSpeed refuses it with num_gpus/nodes."""
    exclude: str | None = None
    """The launcher's --exclude filter, same format; exclusive with include (launcher/runner.py)."""
    launcher: str | None = None
    """The multi-node backend DeepSpeed's runner starts ranks with: pdsh (its default), openmpi, mpich, impi,
    slurm, mvapich (launcher/multinode_runner.py)."""
    launcher_args: str | None = None
    """Passed to that backend as one string (the runner's --launcher_args)."""
    no_ssh: bool = False
    """The runner's --no_ssh: each node runs the command itself (with --node_rank), no ssh between nodes."""
    master_addr: str | None = None
    runner_flags: tuple[str, ...] = ()
    """The runner's per-rank flags, before the script: --no_local_rank, --bind_cores_to_rank, --bind_core_list X."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Added to os.environ for the launcher and its ranks."""
    memory_limit_bytes: int | None = None
    """Per-process address-space cap (RLIMIT_AS, inherited by every rank); None for no cap."""
    ds_config_flag: str = "--deepspeed_config"
    """How the script receives the config path."""
    stop_rule: StopRule | None = None
    """Read the run's step times while it runs and stop it as soon as this gives a reason (status "stopped").
    The times come from the engine's timer lines, so the ds_config should set wall_clock_breakdown."""


@dataclass(frozen=True)
class RunResult:
    status: Literal["ok", "oom", "timeout", "failed", "stopped"]
    """The same vocabulary as zerotune.calibrate.measurement.Status."""
    reason: str
    returncode: int | None
    """The launcher's exit status; None when it was killed on timeout or never started."""
    wall_s: float
    run_dir: Path
    metrics: dict[str, Any] | None
    """run_dir/metrics.json as the run wrote it, or None."""
    step_times_s: tuple[float, ...] = ()
    """Seconds per optimizer step the engine printed (wall_clock_breakdown), in order: those seen before a stop
    rule stopped the run, or every printed step of a finished run."""


def free_port() -> int:
    """A TCP port free right now on this host, for the launcher's --master_port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def deepspeed_executable() -> str:
    # The launcher beside this Python first: a `deepspeed` earlier on PATH may belong to another environment.
    beside = Path(sys.executable).parent / "deepspeed"
    if beside.is_file():
        return str(beside)
    found = shutil.which("deepspeed")
    if found is None:
        raise RuntimeError("the `deepspeed` launcher is not installed for this Python; pip install deepspeed")
    return found


def _needs_pdsh(spec: LaunchSpec) -> bool:
    """DeepSpeed's runner starts a multi-node job through pdsh unless another backend is named or --no_ssh given."""
    multi = spec.hostfile is not None or (spec.num_nodes or 1) > 1 or "@" in (spec.include or "")
    return multi and (spec.launcher or "pdsh").lower() == "pdsh" and not spec.no_ssh


def _resource_args(spec: LaunchSpec) -> list[str]:
    filtered = spec.include is not None or spec.exclude is not None
    if filtered and (spec.num_gpus is not None or spec.num_nodes is not None):
        raise ValueError("LaunchSpec.include / exclude cannot be combined with num_gpus or num_nodes (DeepSpeed's "
                         "launcher refuses it, launcher/runner.py); give one or the other")
    if spec.include is not None and spec.exclude is not None:
        raise ValueError("LaunchSpec.include and exclude are mutually exclusive (launcher/runner.py); give one")
    if (spec.num_nodes or 1) > 1 and spec.hostfile is None:
        raise ValueError(f"LaunchSpec.num_nodes {spec.num_nodes} needs a hostfile listing the nodes; set hostfile")
    args: list[str] = []
    if spec.hostfile is not None:
        args += ["--hostfile", str(spec.hostfile)]
    if spec.num_nodes is not None:
        args += ["--num_nodes", str(spec.num_nodes)]
    if spec.num_gpus is not None:
        args += ["--num_gpus", str(spec.num_gpus)]
    for flag, value in (("--include", spec.include), ("--exclude", spec.exclude), ("--launcher", spec.launcher),
                        ("--launcher_args", spec.launcher_args), ("--master_addr", spec.master_addr)):
        if value is not None:
            args += [flag, value]
    return args + (["--no_ssh"] if spec.no_ssh else []) + list(spec.runner_flags)


def deepspeed_command(spec: LaunchSpec) -> list[str]:
    """The launcher's argument list (no shell is involved): resources, port, script, its arguments, config."""
    return [deepspeed_executable(), *_resource_args(spec), "--master_port", str(spec.master_port),
            str(spec.script), *spec.script_args, spec.ds_config_flag, str(spec.run_dir / "ds_config.json")]


def _prepare_run_dir(spec: LaunchSpec, cmd: list[str]) -> None:
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    metrics = spec.run_dir / "metrics.json"
    metrics.unlink(missing_ok=True)  # a metrics file from an earlier run in this folder must not count
    autotuning = {**(spec.ds_config.get("autotuning") or {}), "metric_path": str(metrics.resolve())}
    write_json_atomic(spec.run_dir / "ds_config.json", {**spec.ds_config, "autotuning": autotuning})
    env_lines = [f"{k}={shlex.quote(v)}" for k, v in sorted(spec.env.items())]
    write_text_atomic(spec.run_dir / "cmd.txt", " ".join(env_lines + [shlex.join(cmd)]) + "\n")
    write_json_atomic(spec.run_dir / "environment.json", collect_environment(query_device=False))


def _limit_memory(limit_bytes: int | None):  # type: ignore[no-untyped-def]
    if limit_bytes is None:
        return None

    def apply() -> None:  # runs in the child between fork and exec; every rank inherits the limit
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return apply


def _kill_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM the launcher's whole process group, give it grace_s, then SIGKILL whatever is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    _reap_group(proc.pid)
    proc.wait()


def _reap_group(pgid: int) -> None:
    """Ranks can outlive the launcher (it exits when one rank fails): SIGKILL the rest of its group."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def tail_text(path: Path, num_bytes: int = 200_000) -> str:
    """The last num_bytes of a log file as text (empty when it does not exist)."""
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - num_bytes))
        return f.read().decode(errors="replace")


_UNSHUFFLE_STEPS = 200_000
"""Backtracking steps one line may cost before it is left as it is: about 50 ms. Of 500 random 9-chunk merges of a
94-character CUDA out-of-memory line, 20,000 steps left 90 unread, 100,000 left 10, 300,000 left 1; 35 were read as
the other copy order of two neighbouring chunks, which reads the same."""


def _one_of_two_copies(line: str) -> str | None:
    """The line two ranks wrote at once, each the same text, when `line` is such a merge, else None.

    Every rank inherits the launcher's stderr, and Python writes an exception's type, ": " and message as separate
    writes (Python/pythonrun.c print_exception), so two ranks that fail alike can leave "ValueErrorValueError: :
    msgmsg". Found by walking the line with the copy ahead (`lead`, the text so far) and the copy behind (`behind`
    characters of it): each character either repeats the next one the copy behind owes or extends the copy ahead.
    Trying the repeat first follows chunked writes directly; a line whose characters do not all come in pairs is no
    such merge and costs nothing."""
    if len(line) < 8 or any(line.count(c) % 2 for c in set(line)):
        return None
    budget = _UNSHUFFLE_STEPS

    def walk(i: int, lead: str, behind: int) -> str | None:
        nonlocal budget
        while True:
            budget -= 1
            if budget < 0 or len(lead) > len(line) // 2:
                return None
            if i == len(line):
                return lead if behind == len(lead) else None
            char = line[i]
            if behind < len(lead) and lead[behind] == char:
                found = walk(i + 1, lead, behind + 1)
                if found is not None:
                    return found
            lead, i = lead + char, i + 1
    return walk(0, "", 0)


def failure_reason(text: str) -> str:
    """The last line that says what went wrong: the last exception line that is not a rank's echo of another's crash
    (_SECONDARY), else the last exception line, else the last non-noise line. A line two ranks wrote into each other
    at once is read as one copy (_one_of_two_copies)."""
    lines = [_RANK_PREFIX.sub("", line).strip() for line in text.splitlines()]
    lines = [_one_of_two_copies(line) or line for line in lines]
    meaningful = [line for line in lines if not _NOISE.search(line)]
    exceptions = [i for i, line in enumerate(meaningful) if _EXCEPTION_LINE.search(line)]
    primary = [i for i in exceptions if not _SECONDARY.search(meaningful[i])]
    for found in (primary, exceptions):
        if found:
            return _with_continuation(meaningful, found[-1])[:500]
    return meaningful[-1][:500] if meaningful else ""


def _with_continuation(lines: list[str], at: int) -> str:
    """An exception line that ends with ':' and the lines its message goes on with (the Hugging Face Trainer's
    "... mismatch TrainingArguments values:" lists the values on the next lines), up to the next exception line,
    a repeat of it (another rank's copy) or 3 lines."""
    line = lines[at]
    if not line.endswith(":"):
        return line
    more = []
    for follow in lines[at + 1:at + 4]:
        if _EXCEPTION_LINE.search(follow) or follow == line:
            break
        more.append(follow)
    return " ".join([line, *more])


def _read_metrics(path: Path) -> tuple[dict[str, Any] | None, str]:
    if not path.exists():
        return None, "no metrics written"
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        return None, f"metrics.json is not valid JSON ({exc.msg})"
    return (doc, "") if isinstance(doc, dict) else (None, "metrics.json is not a JSON object")


def classify(returncode: int | None, timed_out: bool, stdout: str, stderr: str, capped: bool,
             metrics_path: Path) -> tuple[str, str, dict[str, Any] | None]:
    """(status, reason, metrics) of a finished or killed run."""
    if timed_out:
        return "timeout", "", None
    if returncode != 0:
        # A rank that dies in interpreter teardown after rank 0 wrote the metrics ("terminate called without
        # an active exception" from a communication thread) leaves a complete measurement: keep it, say so.
        metrics, _ = _read_metrics(metrics_path)
        if metrics is not None:
            why = failure_reason(stderr) or failure_reason(stdout) or "no reason printed"
            return "ok", f"measured, then the launcher exited with status {returncode} ({why})"[:500], metrics
    text = stderr + "\n" + stdout
    oom = OOM_PATTERNS.search(text)
    if returncode != 0 and oom:
        line = next((ln for ln in reversed(text.splitlines()) if OOM_PATTERNS.search(ln)), oom.group(0))
        return "oom", _RANK_PREFIX.sub("", line).strip()[:500], None
    killed = returncode in (-signal.SIGKILL, SIGKILL_EXIT) or "return code = -9" in text
    if returncode != 0 and killed and capped:
        return "oom", "a rank was killed (SIGKILL) under the memory cap", None
    if returncode != 0 and killed:
        # Without a cap, what SIGKILLs a rank mid-run is the kernel's OOM killer (mm/oom_kill.c sends SIGKILL):
        # host memory ran out (the CPU accelerator's device memory, or offload's pinned buffers on a GPU node).
        # Recorded as a failure, the search learns nothing about memory and runs the same size again.
        return "oom", "a rank was killed (SIGKILL) with no memory cap set: host memory ran out (the kernel's OOM " \
                      "killer), most likely", None
    if returncode != 0:
        reason = failure_reason(stderr) or failure_reason(stdout) or f"launcher exited with status {returncode}"
        return "failed", reason, None
    metrics, problem = _read_metrics(metrics_path)
    return ("ok", "", metrics) if metrics is not None else ("failed", problem, None)


def _start(spec: LaunchSpec, cmd: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, **spec.env}
    with (spec.run_dir / "stdout.log").open("wb") as out, (spec.run_dir / "stderr.log").open("wb") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True, preexec_fn=_limit_memory(spec.memory_limit_bytes))


SHM_DIR = Path("/dev/shm")


def release_shm_buffers(master_port: int) -> int:
    """Remove the shared-memory all-reduce buffers DeepSpeed's CPU accelerator leaves behind.

    Its shm comm op (csrc/cpu/comm/shm.cpp) creates deepspeed_allreduce_buffer_<...>_<addr>_<port>_<rank>, about
    69 MB per rank, and never unlinks them: a few hundred runs filled 19 GB of this machine's RAM-backed /dev/shm.
    The master port names the run, so only its own buffers go. Returns how many were removed."""
    removed = 0
    for path in SHM_DIR.glob(f"deepspeed_allreduce_buffer_*_{master_port}_*"):
        try:
            path.unlink()
            removed += 1
        except OSError:  # already gone, or another user's: not ours to fail on
            pass
    return removed


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl-C's KeyboardInterrupt would be, so that the same clean-up runs: launch
    kills the run's process group (its own session, which the signal sent to zerotune does not reach), the tune
    leaves a consistent folder to resume from."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise Terminated (from the main thread only, where Python delivers
    signals). `timeout`, a batch scheduler's time limit and a closed terminal send these: without it the launcher
    and its ranks, started in their own session, outlived zerotune (seen 2026-11-28: `timeout -s TERM 30 zerotune
    tune ...` left the deepspeed launcher and both ranks running under init)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, _frame: object) -> None:
        raise Terminated(signum)
    previous = {s: signal.signal(s, _raise) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def launch(spec: LaunchSpec) -> RunResult:
    """Run the job to completion, its time limit or Ctrl-C (which stops every rank, then re-raises)."""
    if spec.timeout_s <= 0:
        raise ValueError(f"LaunchSpec.timeout_s must be positive, got {spec.timeout_s}")
    cmd = deepspeed_command(spec)
    if _needs_pdsh(spec) and shutil.which("pdsh") is None:
        raise RuntimeError("a multi-node launch needs pdsh, which DeepSpeed's launcher runs on every node; "
                           "install pdsh (e.g. apt-get install pdsh) or run on one node with num_gpus")
    _prepare_run_dir(spec, cmd)
    start = time.monotonic()
    proc = _start(spec, cmd)
    timed_out, stop_reason, steps = False, None, ()
    try:
        timed_out, stop_reason, steps = _wait(proc, spec)
        if timed_out or stop_reason:
            _kill_group(proc, TERMINATE_GRACE_S)
    except KeyboardInterrupt:
        _kill_group(proc, TERMINATE_GRACE_S)
        raise
    finally:
        _reap_group(proc.pid)
        release_shm_buffers(spec.master_port)
    wall_s = time.monotonic() - start
    returncode = None if timed_out else proc.returncode
    status, reason, metrics = classify(returncode, timed_out, tail_text(spec.run_dir / "stdout.log"),
                                       tail_text(spec.run_dir / "stderr.log"), spec.memory_limit_bytes is not None,
                                       spec.run_dir / "metrics.json")
    if timed_out:
        reason = f"no result within {spec.timeout_s:g} s; the launcher and its ranks were killed"
    if stop_reason:
        return RunResult("stopped", stop_reason, None, wall_s, spec.run_dir, None, steps)
    batch = spec.ds_config.get("train_batch_size")
    printed = step_times_s(tail_text(spec.run_dir / "stdout.log"), batch) if isinstance(batch, int) else ()
    return RunResult(status, reason, returncode, wall_s, spec.run_dir, metrics, printed)  # type: ignore[arg-type]


def _wait(proc: subprocess.Popen[bytes], spec: LaunchSpec) -> tuple[bool, str | None, tuple[float, ...]]:
    """Wait for the run: (timed out, the stop rule's reason or None, the step times it was given)."""
    deadline = time.monotonic() + spec.timeout_s
    batch = spec.ds_config.get("train_batch_size")
    while True:
        poll = spec.timeout_s if spec.stop_rule is None else POLL_S
        try:
            proc.wait(timeout=max(0.0, min(poll, deadline - time.monotonic())))
            return False, None, ()
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                return True, None, ()
        if spec.stop_rule is not None and isinstance(batch, int):
            steps = step_times_s(tail_text(spec.run_dir / "stdout.log"), batch)
            reason = spec.stop_rule(steps) if steps else None
            if reason:
                return False, reason, steps
