"""What `zerotune tune` is asked to do: its settings, read from the command line as DeepSpeed's launcher and
autotuner read theirs (the script and its arguments, the ds_config, --num_gpus / --num_nodes / --hostfile and the
launcher's pass-through flags), validated before anything runs."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from zerotune.calibrate.launch import LaunchSpec, RunResult, check_accelerator_here
from zerotune.predictor import ClusterSpec, list_hardware, load_hardware, parse_ds_config
from zerotune.predictor.dsconfig import AutotuningConfig, OptimizerImpl
from zerotune.predictor.hardware import Precision
from zerotune.predictor.space import EXPLORABLE
from zerotune.predictor.units import GIB, MIB
from zerotune.validate.args import explore_items, float_at_least, positive_float, positive_int
from zerotune.validate.experiments import (BATCH_KEYS, TRAINER_FLAGS, UserCommand, check_arg_mappings,
                                           filtered_resources, read_ds_config, read_hostfile, split_user_command,
                                           trainer_arg_mappings)
from zerotune.validate.profiled import MatmulPace

__all__ = ["TuneSettings", "LauncherOptions", "Launcher", "autotuning_of", "add_tune_arguments",
           "add_launcher_arguments", "settings_from_args", "LAUNCHERS", "BUILTIN_SCRIPT", "BUILTIN_MODEL",
           "BUILTIN_SEQ_LEN", "NO_PROFILE", "DEFAULT_TOP_K"]


Launcher = Callable[[LaunchSpec], RunResult]
REPO = Path(__file__).resolve().parent.parent
BUILTIN_SCRIPT = REPO / "calibrate" / "workload.py"
BUILTIN_MODEL = "zt-gpt-small"
BUILTIN_SEQ_LEN = 128
NO_PROFILE = "none"
"""--profile's value that tunes uncalibrated even where a calibration profile exists."""
DEFAULT_TOP_K = 8
"""--top_k's default: a ceiling on experiments; the stopping rule usually ends the search well before it."""


@dataclass(frozen=True)
class TuneSettings:
    command: UserCommand
    doc: dict[str, Any]
    """The user's ds_config as read."""
    model: str
    """Catalog name or model file, as Measurement.model records it."""
    hardware: str
    num_gpus: int
    num_nodes: int = 1
    hostfile: Path | None = None
    seq_len: int | None = None
    top_k: int = DEFAULT_TOP_K
    profile: Path | None = None
    timeout_s: float = 600.0
    env: Mapping[str, str] = field(default_factory=dict)
    memory_limit_bytes: int | None = None
    explore: tuple[str, ...] = EXPLORABLE
    run_after: bool = False
    launch_flags: LauncherOptions = field(default_factory=lambda: LauncherOptions())
    """DeepSpeed launcher flags passed through as the user gave them."""
    optimizer_impl: OptimizerImpl | None = None
    """How the script's own optimizer runs its update, as the profiling run read it; it stands for a ds_config
    without an optimizer section (None: DSConfig.optimizer_impl from the ds_config)."""
    script_checkpointing: bool | None = None
    """Whether the script recomputes its blocks in backward, as the profiling run saw it (ProfiledRun.
    activation_checkpointing); every configuration of a user's script is costed so
    (zerotune.validate.profiling_run.as_the_script_runs). None: no profiling run (--model given), and the ds_config's
    activation_checkpointing section says it, as for predict."""
    script_precision: Precision | None = None
    """The precision the profiling run's engine held its weights in (ProfiledRun.dtype); it stands for a precision
    section the Hugging Face Trainer fills ("enabled": "auto", set by its --fp16 / --bf16). None: no profiling run."""
    script_moe: bool = False
    """Whether the profiling run saw DeepSpeed's own MoE layers (ProfiledRun.native_moe): ZeRO-3 is then left out of
    the space (zerotune.validate.profiling_run.moe_space)."""
    script_min_stage: int = 0
    """The lowest ZeRO stage the script trained at (ProfileOutcome.min_stage): lower stages are not tried."""
    device_matmul: MatmulPace | None = None
    """The square matmul the profiling run timed on this device (ProfiledRun.matmul): the device's pace today,
    against the calibration profile's microbenchmark of the same shape (zerotune.validate.calibration.paced)."""
    device_copy_bytes_per_s: float | None = None
    """The tensor copy the profiling run timed (ProfiledRun.copy_bytes_per_s), against the calibration's memory
    microbenchmark (zerotune.validate.calibration.paced)."""
    device_copy_curve: tuple[tuple[float, float], ...] = ()
    """The copies from cache-sized to large the profiling run timed on a CPU (ProfiledRun.copy_curve): each
    memory-bound kernel is paced by its working set's bandwidth (zerotune.validate.calibration.paced)."""
    device_fresh_copy_bytes_per_s: float | None = None
    """The profiling run's large copy into a fresh tensor on a CPU (ProfiledRun.fresh_copy_bytes_per_s): against
    device_copy_bytes_per_s, the cost of a tensor's pages faulting in (zerotune.validate.calibration.paced)."""
    device_dropout_s_per_element: float | None = None
    """The profiling run's dropout beyond a clone on a CPU (ProfiledRun.dropout_s_per_element): the mask's draw, a
    element (zerotune.validate.calibration.paced)."""
    profiled_step_phase_s: float | None = None
    """DeepSpeed's step timer in the profiling run, median seconds per optimizer step over its window
    (zerotune.validate.calibration.update_paced)."""
    profiled_update_s: float | None = None
    """ZeRO 1-3's optimizer_step timer in the profiling run (the update alone), the same way; None at ZeRO-0."""
    profiled_allreduce_s: float | None = None
    """DeepSpeed's bwd_allreduce timer in the profiling run, the same way (zerotune.validate.calibration.
    allreduce_paced)."""
    profiled_forward_s: float | None = None
    """DeepSpeed's fwd timer in the profiling run, the same way (zerotune.validate.calibration.host_paced)."""
    profiled_backward_s: float | None = None
    """DeepSpeed's bwd_inner timer in the profiling run, the same way (zerotune.validate.calibration.micro_paced)."""
    input_lengths: tuple[int, ...] = ()
    """Positions of each padded batch the profiling run saw, where they varied (ProfiledRun.input_lengths; a collator
    that pads each batch to its longest sample): each configuration's time is costed at the expected longest of its
    batches, memory at the longest seen (the model's seq_len)."""
    input_micro_batch: int = 1
    """Samples in each of those batches (the profiling run's micro-batch)."""


@dataclass(frozen=True)
class LauncherOptions:
    """The deepspeed launcher's flags a user brings (launcher/runner.py), passed through unchanged."""

    include: str | None = None
    exclude: str | None = None
    launcher: str | None = None
    launcher_args: str | None = None
    no_ssh: bool = False
    master_addr: str | None = None
    master_port: int | None = None
    """None: a free port per run (zerotune's default, so a stale run cannot collide)."""
    runner_flags: tuple[str, ...] = ()
    """The runner's per-rank flags, as given: --no_local_rank (a script that takes no --local_rank argument),
    --bind_cores_to_rank and --bind_core_list (numactl core binding, DeepSpeed's advice for CPU training)."""


def autotuning_of(doc: Mapping[str, Any], world_size: int) -> AutotuningConfig:
    section = doc.get("autotuning") or {}
    at = parse_ds_config({"autotuning": section}, world_size=world_size).autotuning
    if "overwrite" not in section:  # zerotune resumes by default (module docstring)
        at = replace(at, overwrite=False)
    if at.end_profile_step <= at.start_profile_step:  # the engine times the steps between: none at all
        raise ValueError(f"ds_config autotuning.end_profile_step {at.end_profile_step} is not after start_profile_step "
                         f"{at.start_profile_step}; make it larger (DeepSpeed's defaults: 3 and 5)")
    for key in ("results_dir", "exps_dir"):  # folders tune writes: a file on the way is named before anything runs
        folder = Path(getattr(at, key))
        blocking = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        if blocking is not None:
            raise ValueError(f"ds_config autotuning.{key} {str(folder)!r}: {str(blocking)!r} is a file, not a "
                             f"folder; give another {key}")
    return at


# -- the command line --------------------------------------------------------------------------------------

def add_tune_arguments(parser: argparse.ArgumentParser) -> None:
    """The `tune` verb's arguments; everything after the script belongs to the script."""
    p = parser
    p.add_argument("--run", action="store_true", help="then train with the optimal configuration")
    p.add_argument("--num_gpus", type=positive_int("--num_gpus"), help="devices per node, as deepspeed's (default: the hostfile's "
                                                "slots, else the hardware catalog's devices per node)")
    p.add_argument("--num_nodes", type=positive_int("--num_nodes"), help="nodes (default: the hostfile's hosts, else 1)")
    p.add_argument("--hostfile", type=Path, help="DeepSpeed hostfile ('host slots=N' lines); one node needs none")
    p.add_argument("--top_k", type=positive_int("--top_k"), default=DEFAULT_TOP_K,
                   help=f"most experiments to run, a ceiling: the search stops sooner once no configuration can "
                        f"beat the measured best (default {DEFAULT_TOP_K}; autotuning.tuner_num_trials caps it too)")
    p.add_argument("--profile", type=Path, help="calibration profile (default: the user's calibration of the "
                                                "hardware, else the shipped data/profiles/<hardware>.json; the one "
                                                "used is printed; 'none': uncalibrated)")
    p.add_argument("--model", help="catalog name, model YAML or config.json (default: one profiling run of "
                                   f"the script; {BUILTIN_MODEL} for the built-in workload)")
    p.add_argument("--hardware", help="catalog name or YAML (default: cpu when DS_ACCELERATOR=cpu or no "
                                      "nvidia-smi is on PATH)")
    p.add_argument("--seq_len", type=positive_int("--seq_len"), help=f"tokens per sample the script trains on (built-in: {BUILTIN_SEQ_LEN})")
    p.add_argument("--timeout_s", type=positive_float("--timeout_s"), default=600.0, help="seconds before an experiment counts as hung")
    p.add_argument("--memory_cap_gib", type=float_at_least("--memory_cap_gib", MIN_MEMORY_CAP_GIB),
                   help="per-process address-space cap for experiments (RLIMIT_AS; at least "
                        f"{MIN_MEMORY_CAP_GIB:g}: importing torch and DeepSpeed needs about 1 GiB)")
    p.add_argument("--explore", default=",".join(EXPLORABLE),
                   help="what the space may add that the ds_config does not set: offload,checkpointing or none")
    p.add_argument("--deepspeed", dest="tune_ds_config", metavar="DS_CONFIG",
                   help="the ds_config, when no script is given (the built-in workload, calibrate/workload.py)")
    add_launcher_arguments(p)
    p.add_argument("script", nargs="?", help="the training script (default: the built-in workload)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="the script's arguments, --deepspeed ds.json among them")


LAUNCHERS = ("pdsh", "openmpi", "mpich", "impi", "slurm", "mvapich")
"""DeepSpeed's multi-node backends (launcher/constants.py)."""


def add_launcher_arguments(p: argparse.ArgumentParser) -> None:
    """deepspeed's own launcher flags, passed through to every run as the user gives them."""
    p.add_argument("--include", help="deepspeed --include: hosts and slots to use, e.g. 'worker-0:0,1@worker-1'")
    p.add_argument("--exclude", help="deepspeed --exclude: hosts and slots to leave out, same format")
    p.add_argument("--launcher", type=str.lower, choices=LAUNCHERS, help="deepspeed --launcher: the multi-node "
                   "backend (default pdsh)")
    p.add_argument("--launcher_args", help="deepspeed --launcher_args: passed to the backend as one string")
    p.add_argument("--no_ssh", action="store_true", help="deepspeed --no_ssh: each node runs the command itself")
    p.add_argument("--master_addr", help="deepspeed --master_addr (default: the runner's)")
    p.add_argument("--master_port", type=positive_int("--master_port"),
                   help="deepspeed --master_port (default: a free port per run)")
    p.add_argument("--no_local_rank", action="store_true", help="deepspeed --no_local_rank: the script is not "
                   "given --local_rank")
    p.add_argument("--bind_cores_to_rank", action="store_true", help="deepspeed --bind_cores_to_rank: numactl "
                   "binds each rank to its share of the cores")
    p.add_argument("--bind_core_list", help="deepspeed --bind_core_list: the cores to bind, e.g. '0-7,16-23'")


def _launcher_options(args: argparse.Namespace) -> LauncherOptions:
    return LauncherOptions(getattr(args, "include", None), getattr(args, "exclude", None),
                           getattr(args, "launcher", None), getattr(args, "launcher_args", None),
                           bool(getattr(args, "no_ssh", False)), getattr(args, "master_addr", None),
                           getattr(args, "master_port", None), _runner_flags(args))


def _runner_flags(args: argparse.Namespace) -> tuple[str, ...]:
    flags = tuple(f"--{name}" for name in ("no_local_rank", "bind_cores_to_rank") if getattr(args, name, False))
    core_list = getattr(args, "bind_core_list", None)
    return flags + (("--bind_core_list", core_list) if core_list else ())


def _resources(args: argparse.Namespace, devices_per_node: int) -> tuple[int, int]:
    """(nodes, devices per node): the flags, else the hostfile (and --include / --exclude), else one node."""
    hosts = read_hostfile(args.hostfile) if args.hostfile else None
    if getattr(args, "include", None) or getattr(args, "exclude", None):
        if args.num_gpus or args.num_nodes:
            raise ValueError("--include / --exclude cannot be combined with --num_gpus / --num_nodes (as for "
                             "deepspeed); give one or the other")
        pool = hosts or [("localhost", devices_per_node)]
        hosts = filtered_resources(pool, args.include, args.exclude)
        if not hosts or len({n for _, n in hosts}) != 1:
            raise ValueError(f"--include/--exclude leave {hosts or 'no devices'}: zerotune models the same number "
                             f"of devices on every node; choose an even selection")
        return len(hosts), hosts[0][1]
    if hosts is None and (args.num_nodes or 1) > 1:
        raise ValueError(f"--num_nodes {args.num_nodes} needs --hostfile listing the nodes; give one")
    num_nodes = args.num_nodes or (len(hosts) if hosts else 1)
    return num_nodes, args.num_gpus or (min(s for _, s in hosts) if hosts else devices_per_node)


def _command(args: argparse.Namespace) -> tuple[UserCommand, str | None, int | None]:
    """(the command, the model, the sequence length): the user's, or the built-in workload's."""
    if args.script is None:
        if not args.tune_ds_config:
            raise ValueError("give a training script and its --deepspeed ds_config.json, or --deepspeed "
                             "ds_config.json alone to tune the built-in workload")
        path = Path(args.tune_ds_config)
        at = autotuning_of(read_ds_config(path), 1)
        model, seq_len = args.model or BUILTIN_MODEL, args.seq_len or BUILTIN_SEQ_LEN
        script_args = ("--model", model, "--seq_len", str(seq_len), "--steps", str(at.end_profile_step + 1),
                       "--warmup", "0")
        return UserCommand(BUILTIN_SCRIPT, script_args, "--deepspeed_config", path), model, seq_len
    if not Path(args.script).is_file():
        what = "a folder" if Path(args.script).is_dir() else "not a regular file" if Path(args.script).exists() \
            else "no such file"
        raise ValueError(f"training script {args.script}: {what}; give the path of the script to tune")
    try:
        command = split_user_command(args.script, args.script_args)
    except ValueError:
        if not args.tune_ds_config:
            raise
        raise _config_before_the_script(args) from None
    if args.tune_ds_config and command.ds_config_path.resolve() != Path(args.tune_ds_config).resolve():
        raise _config_before_the_script(args)
    return command, args.model, args.seq_len


def _config_before_the_script(args: argparse.Namespace) -> ValueError:
    """--deepspeed before the script is the built-in workload's flag: the script would never see that config."""
    name = Path(args.script).name
    return ValueError(f"--deepspeed {args.tune_ds_config} before the script configures the built-in workload; pass "
                      f"the ds_config among {name}'s arguments, as the script reads it (e.g. {name} --deepspeed_config "
                      f"{args.tune_ds_config})")


def _default_hardware() -> str:
    if os.environ.get("DS_ACCELERATOR") == "cpu" or shutil.which("nvidia-smi") is None:
        return "cpu"
    return detected_gpu(_nvidia_smi_gpus())


MIN_MEMORY_CAP_GIB = 1.5
"""The smallest --memory_cap_gib accepted: `import torch, deepspeed` under RLIMIT_AS passed at 1 GiB of address
space and failed at 0.5 (torch 2.13 CPU, DeepSpeed 0.19.8, this project's VM, 2026-11-28); a smaller cap killed
every rank at start-up and the failure was blamed on the script."""


def _nvidia_smi_gpus() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"nvidia-smi did not answer ({exc}); give --hardware (a data/hardware name or YAML)") from None
    return done.stdout if done.returncode == 0 else ""


def detected_gpu(nvidia_smi: str) -> str:
    """The catalog GPU that nvidia-smi's first `name, memory.total [MiB]` line describes: every part of the catalog
    name but its memory (h100 and pcie of h100-pcie, a100 of a100-80gb) in the device's name, the entry naming the
    most of them, and its memory within 15% of the catalog's (an H100 NVL's 94 GB is not the catalog's 80 GB
    H100). Raises ValueError naming the device when no catalog entry matches."""
    first = next((line for line in nvidia_smi.splitlines() if line.strip()), "")
    name, _, mib = first.rpartition(",")
    try:
        memory = float(mib) * MIB
    except ValueError:
        raise ValueError("which GPU is this? nvidia-smi listed none; give --hardware (a data/hardware name or "
                         "YAML)") from None
    matches = []
    for entry in list_hardware():
        hw = load_hardware(entry)
        parts = [p for p in entry.upper().split("-") if not re.fullmatch(r"\d+GB", p)]
        if hw.kind == "gpu" and all(p in name.upper() for p in parts) \
                and abs(memory - hw.memory_bytes) <= 0.15 * hw.memory_bytes:
            matches.append((len(parts), entry))
    if matches:  # the most specific entry: an "NVIDIA H100 PCIe" is h100-pcie, not the SXM card's h100-80gb
        return max(matches, key=lambda m: m[0])[1]
    raise ValueError(f"which GPU is this? the catalog has no {name.strip()} with {memory / GIB:.0f} GiB; give "
                     f"--hardware (a data/hardware YAML for it, or the nearest of {', '.join(list_hardware())})")


def settings_from_args(args: argparse.Namespace) -> TuneSettings:
    """Validated settings (argparse has range-checked the numbers); the model stays empty when it must come from a
    profiling run."""
    explore = explore_items(args.explore)
    command, model, seq_len = _command(args)
    doc, mapped = trainer_arg_mappings(read_ds_config(command.ds_config_path, command.ds_config_flag), command.args,
                                       command.script)
    for key in mapped:
        print(f"zerotune tune: ds_config {key} is \"auto\" and the script is a Hugging Face Trainer's: each "
              f"experiment sets it through {dict(zip(BATCH_KEYS, TRAINER_FLAGS))[key]} (autotuning.arg_mappings)")
    hardware = args.hardware or _default_hardware()
    hw = load_hardware(hardware)
    check_accelerator_here(hw.kind, hardware, args.hostfile)
    num_nodes, num_gpus = _resources(args, hw.num_devices_per_node)
    ClusterSpec(hw, num_nodes, num_gpus)  # --num_gpus within the node, before anything runs
    at = autotuning_of(doc, num_nodes * num_gpus)  # the autotuning section's numbers, before anything runs
    check_arg_mappings(doc, command.args, at.arg_mappings)  # and its batch flags, before the profiling run
    env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")} if hw.kind == "cpu" else {}
    return TuneSettings(command, doc, model or "", hardware, num_gpus, num_nodes, args.hostfile, seq_len,
                        args.top_k, args.profile, args.timeout_s, env,
                        int(args.memory_cap_gib * GIB) if args.memory_cap_gib else None, explore, args.run,
                        _launcher_options(args))
