"""`tune`'s profiling run of a user's script: what it read about the model (zerotune.validate.profiled), its
measurement, and how every configuration of that script is costed as the script runs it (its own optimizer,
its own checkpointing, the precision its engine held)."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

from zerotune.calibrate.engine_timers import (allreduce_times_s, backward_inner_times_s, forward_times_s,
                                             step_phase_times_s)
from zerotune.calibrate.launch import RunResult, launch, tail_text
from zerotune.calibrate.measurement import Measurement, append_jsonl
from zerotune.predictor import DSConfig
from zerotune.predictor.dsconfig import AUTO, OptimizerImpl
from zerotune.predictor.hardware import Precision
from zerotune.predictor.space import SearchSpace, space_from_ds_config
from zerotune.validate.experiments import experiment_ds_config, rewrite_args
from zerotune.validate.profiled import (MatmulPace, ProfiledRun, model_yaml, precision_of_dtype, read_profiled,
                                        step_rel_error)
from zerotune.validate.results import write_text_atomic
from zerotune.validate.runs import launch_spec, window_step_s
from zerotune.validate.settings import BUILTIN_SCRIPT, Launcher, TuneSettings, autotuning_of
from zerotune.validate.site_env import profiling_env

__all__ = ["ProfileOutcome", "profile_model", "trainable_space", "least_memory_variant", "as_the_script_runs",
           "with_script_optimizer", "moe_space"]


def as_the_script_runs(cfg: DSConfig, settings: TuneSettings) -> DSConfig:
    """A user script's configuration costed with the checkpointing its profiling run saw, its section kept as the user
    wrote it (ActivationCheckpointing.by_script); the built-in workload's as the ds_config switches it."""
    if settings.command.script == BUILTIN_SCRIPT:
        return cfg
    ckpt = cfg.activation_checkpointing
    section = ckpt.section if ckpt.by_script else ckpt.enabled  # parsed from the user's ds_config: its presence
    seen = section if settings.script_checkpointing is None else settings.script_checkpointing
    auto = any(isinstance(settings.doc.get(p), dict) and settings.doc[p].get("enabled") == AUTO for p in ("fp16", "bf16"))
    if auto and settings.script_precision is not None:  # the Trainer filled it: its engine's weights say how
        cfg = cfg.replace(precision=settings.script_precision)
    return cfg.replace(activation_checkpointing=replace(ckpt, enabled=seen, by_script=True, section=section))


def _script_optimizer(doc: dict[str, Any], impl: OptimizerImpl | None, cfg: DSConfig) -> DSConfig:
    """`cfg` costed with the script's own optimizer (as the profiling run read it) when the ds_config builds none."""
    return cfg if impl is None or "optimizer" in doc else cfg.replace(optimizer_impl=impl)


def with_script_optimizer(settings: TuneSettings, space: SearchSpace) -> SearchSpace:
    """Every variant of the space costed with the script's own optimizer (_script_optimizer)."""
    return replace(space, variants=tuple(_script_optimizer(settings.doc, settings.optimizer_impl, v)
                                        for v in space.variants))


@dataclass(frozen=True)
class ProfileOutcome:
    """The profiling run: the model YAML it wrote, the sequence length it saw, and its measurement."""

    model_path: str
    seq_len: int | None
    measurement: Measurement | None
    """Its step time and peak memory, for the tuner's correction (None when it measured nothing)."""
    optimizer_impl: OptimizerImpl | None = None
    """The script's optimizer as the run read it (ProfiledRun.optimizer_impl)."""
    device_matmul: MatmulPace | None = None
    """The device's matmul pace the run timed (TuneSettings.device_matmul)."""
    device_copy_bytes_per_s: float | None = None
    """The device's copy pace the run timed (TuneSettings.device_copy_bytes_per_s)."""
    activation_checkpointing: bool = False
    """Whether the script recomputed its blocks in backward (TuneSettings.script_checkpointing)."""
    precision: Precision | None = None
    """The precision of the engine's weights (TuneSettings.script_precision)."""
    native_moe: bool = False
    """Whether the model has DeepSpeed's own MoE layers (TuneSettings.script_moe)."""
    step_phase_s: float | None = None
    """DeepSpeed's step timer, median over the run's window (TuneSettings.profiled_step_phase_s)."""
    update_s: float | None = None
    """ZeRO's optimizer_step timer, the same way (TuneSettings.profiled_update_s)."""
    allreduce_s: float | None = None
    """The engine's bwd_allreduce timer, the same way (TuneSettings.profiled_allreduce_s)."""
    device_copy_curve: tuple[tuple[float, float], ...] = ()
    """The copies from cache-sized to large the run timed (TuneSettings.device_copy_curve)."""
    out_of_memory: Measurement | None = None
    """The first try's configuration, out of memory, when the profiling run had to try again at a higher ZeRO stage
    (profile_model): an OOM the search starts from, as if an experiment had run it."""
    forward_s: float | None = None
    """The engine's fwd timer, the same way as step_phase_s (TuneSettings.profiled_forward_s)."""
    input_lengths: tuple[int, ...] = ()
    """Each forward's padded positions where they varied (TuneSettings.input_lengths)."""
    input_micro_batch: int = 1
    """Samples per forward of the run that saw them (TuneSettings.input_micro_batch)."""
    min_stage: int = 0
    """The lowest ZeRO stage the script trains at: the stage the profiling run trained at after failing (other than
    out of memory) at a lower one, else 0 (TuneSettings.script_min_stage)."""
    device_fresh_copy_bytes_per_s: float | None = None
    """The large copy into a fresh tensor the run timed (TuneSettings.device_fresh_copy_bytes_per_s)."""
    device_dropout_s_per_element: float | None = None
    """The dropout the run timed (TuneSettings.device_dropout_s_per_element)."""
    backward_s: float | None = None
    """The engine's bwd_inner timer (the backward less its gradient reduction), the same way as step_phase_s
    (TuneSettings.profiled_backward_s)."""


def _profile_measurement(settings: TuneSettings, profiled: ProfiledRun, cfg: DSConfig, run: RunResult,
                         model_path: str, seq_len: int) -> Measurement | None:
    """DeepSpeed's engine timing (autotuning metrics) when written, else the hook's median wall step over the steps
    past start_profile_step; None (and a warning) when the script ended before any: its first steps pay for warm-up
    (a script of 8 samples ran 4 steps and read 14.4 samples/s, 49.8 over 96 samples, 2026-11-28), and a
    measurement the search trusted within its steps' spread would pull every prediction down."""
    world = settings.num_nodes * settings.num_gpus
    samples = cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * world // cfg.mp_size
    at = autotuning_of(settings.doc, world)
    step_s = None
    if run.status == "ok" and run.metrics is not None:
        try:
            step_s = window_step_s(run, samples, at)
        except ValueError:
            pass
    if step_s is None:
        past_warm_up = profiled.step_s[at.start_profile_step:]
        if len(past_warm_up) < 2:
            warnings.warn(f"the profiling run of {settings.command.script.name} ended after {len(profiled.step_s)} "
                          f"optimizer steps, before DeepSpeed's engine reached autotuning.end_profile_step "
                          f"{at.end_profile_step}: its timing is not used (the steps before start_profile_step "
                          f"{at.start_profile_step} are warm-up); let the script run at least "
                          f"{at.end_profile_step + 1} steps (more steps or data)")
            return None
        step_s = statistics.median(past_warm_up)
    return Measurement(model=model_path, hardware=settings.hardware, num_nodes=settings.num_nodes,
                       num_gpus_per_node=settings.num_gpus, seq_len=seq_len, config=cfg, status="ok", step_s=step_s,
                       throughput_samples_per_s=samples / step_s, step_s_rel_error=step_rel_error(profiled),
                       peak_memory_bytes=profiled.peak_memory_bytes, source=str(run.run_dir),
                       reason="zerotune tune's profiling run")


def _check_followed(settings: TuneSettings, profiled: ProfiledRun, cfg: DSConfig, run_dir: Path) -> None:
    """ValueError (one line) when the profiling run's engine did not run the ds_config it was given (its micro-batch,
    accumulation, ZeRO stage, the autotuning section that makes it write its metrics): the script builds its engine
    from a config of its own (a dict, or a path from its own flag), so no experiment would run what it is named for
    (a script that took the batch flags into its own dict ran ZeRO-1 as ZeRO-0, and every experiment then failed
    as ending before the engine's window, the engine never told to write its metrics)."""
    engine = dict(profiled.engine_config or {})
    asked = {"train_micro_batch_size_per_gpu": cfg.train_micro_batch_size_per_gpu,
             "gradient_accumulation_steps": cfg.gradient_accumulation_steps, "zero_optimization.stage": cfg.zero.stage,
             "autotuning.enabled": True}
    ran = {"train_micro_batch_size_per_gpu": profiled.engine_micro_batch,
           "gradient_accumulation_steps": engine.get("gradient_accumulation_steps"),
           "zero_optimization.stage": engine.get("zero_stage"), "autotuning.enabled": engine.get("autotuning")}
    differ = [f"{key} {ran[key]} (asked {asked[key]})" for key in asked if ran[key] is not None and ran[key] != asked[key]]
    if not differ:
        return
    flag = settings.command.ds_config_flag
    raise ValueError(f"the profiling run of {settings.command.script} was given its ds_config through {flag} but its "
                     f"DeepSpeed engine ran {', '.join(differ)} (see {run_dir}): the script builds the engine from a "
                     f"config of its own; make it pass the {flag} file to deepspeed.initialize (args=args or "
                     f"config=args.{flag.lstrip('-')}), as DeepSpeed's autotuner also requires")


def _warn_own_batch(settings: TuneSettings, profiled: ProfiledRun, cfg: DSConfig,
                    log: Callable[[str], None]) -> None:
    """A warning when the script's first training forward took another number of samples than its engine's
    micro-batch: the script batches its data itself, from a flag of its own, so the micro-batch each experiment
    sets changes nothing it runs unless autotuning.arg_mappings maps that flag (DeepSpeed's autotuner reads the
    same key). Seen on this project's CPU VM (2026-11-29): the decoder fixture, whose --batch_size defaults to 4,
    tuned without its mapping measured 8.4 samples/s at "micro-batch 1" against 18.6 predicted. A warning, not an
    error: a model whose token ids come sequence first would read so too."""
    engine = profiled.engine_micro_batch or cfg.train_micro_batch_size_per_gpu
    if profiled.micro_batch is None or profiled.micro_batch == engine:
        return
    mapped = (autotuning_of(settings.doc, settings.num_nodes * settings.num_gpus).arg_mappings or {})
    if "train_micro_batch_size_per_gpu" in mapped:
        return
    log(f"zerotune tune: warning: the script's first training forward took {profiled.micro_batch} samples where "
        f"its DeepSpeed engine's micro-batch is {engine}: if the script batches its data itself from a flag of its "
        f"own, map that flag in the ds_config's autotuning.arg_mappings (\"train_micro_batch_size_per_gpu\": "
        f"\"--batch_size\", say), or no experiment will change what it runs")


def _refuse_pipeline(settings: TuneSettings, prefix: Path, run_dir: Path) -> None:
    """ValueError (one line) when the script handed deepspeed.initialize a PipelineModule (the site records it
    before the engine starts): DeepSpeed's pipeline engine trains through train_batch(), where the engine's
    wall_clock_breakdown timers, which every experiment's step timing reads, fail ('bwd_microstep timer has already
    been started', DeepSpeed 0.19.8), and its stages divide the ranks the space counts as data-parallel. DeepSpeed's
    autotuner has no pipeline support either."""
    marker = Path(f"{prefix}.pipeline.json")
    if not marker.is_file():
        return
    stages = json.loads(marker.read_text()).get("num_stages") or "its"
    raise ValueError(f"the script {settings.command.script} trains a pipeline-parallel model (deepspeed.pipe."
                     f"PipelineModule, {stages} stages; see {run_dir}): zerotune tune does not run DeepSpeed's "
                     f"pipeline engine, as DeepSpeed's autotuner does not; rank its layouts with `zerotune predict "
                     f"--model NAME|config.json --pp_size {stages if isinstance(stages, int) else 'N'} --rank` "
                     f"instead")


def _refuse_unaccepted_mapping(reason: str, arg_mappings: Mapping[str, str] | None, settings: TuneSettings,
                               run_dir: Path) -> None:
    """The one-line error for a script whose argparse refused a flag autotuning.arg_mappings sets ("unrecognized
    arguments: --batch_size 1"): the mapping names a flag the script does not take."""
    refused = reason.partition("unrecognized arguments:")[2].split()
    for key, flag in (arg_mappings or {}).items():
        if flag in refused:
            raise ValueError(f"autotuning.arg_mappings maps {key.strip()} to {flag}, which "
                             f"{settings.command.script.name} does not accept (its profiling run: unrecognized "
                             f"arguments: {' '.join(refused)}; see {run_dir}): map it to the flag the script takes")


_TRAINER_BATCH = re.compile(r"ds train_batch_size=(\d+) vs hf train_batch_size \(calculated\)=(\d+)")


def _refuse_trainer_world(reason: str, world: int, settings: TuneSettings, run_dir: Path) -> None:
    """The one-line error for a Hugging Face Trainer that counted one process where DeepSpeed's launcher started
    `world`: it multiplies its per-device batch by its own world size (transformers integrations/deepspeed.py
    trainer_config_process, "ds train_batch_size=2 vs hf train_batch_size (calculated)=1"), and without CUDA its
    TrainingArguments join the launcher's ranks only with --use_cpu (seen with transformers 5 on this project's
    CPU machine: the same script trains with it)."""
    found = _TRAINER_BATCH.search(reason)
    if found is None or world < 2 or int(found.group(1)) != world * int(found.group(2)):
        return
    raise ValueError(f"the Hugging Face Trainer in {settings.command.script.name} counted 1 process where "
                     f"DeepSpeed's launcher started {world} (its profiling run: ds train_batch_size={found.group(1)} "
                     f"vs hf train_batch_size (calculated)={found.group(2)}; see {run_dir}): on a machine without "
                     f"CUDA add --use_cpu to the script's arguments so that the Trainer joins the launcher's ranks")


def least_memory_variant(space: SearchSpace, cfg: DSConfig) -> DSConfig | None:
    """The profiling run's second try after its first ran out of memory: the space's configuration of the highest
    ZeRO stage at the same micro-batch and accumulation, as DeepSpeed's autotuner profiles every model (autotuning/
    constants.py DEFAULT_MIN_MEM_CONFIG: stage 3 at micro-batch 1, autotuner.py model_info_profile_run); None when
    the space holds no stage above `cfg`'s (nothing that needs less memory to try)."""
    higher = [v for v in space.variants if v.zero.stage > cfg.zero.stage]
    if not higher:
        return None
    top = max(v.zero.stage for v in higher)
    first = next(v for v in higher if v.zero.stage == top)
    return first.replace(train_micro_batch_size_per_gpu=cfg.train_micro_batch_size_per_gpu,
                         gradient_accumulation_steps=cfg.gradient_accumulation_steps)


def _launch_profiling(settings: TuneSettings, launcher: Launcher, cfg: DSConfig, run_dir: Path) -> RunResult:
    world = settings.num_nodes * settings.num_gpus
    at = autotuning_of(settings.doc, world)
    prefix = (run_dir / "profiled").resolve()
    for old in run_dir.glob("profiled.*.json"):
        old.unlink()
    doc = experiment_ds_config(cfg, world, at)
    spec = launch_spec(settings, doc, run_dir, rewrite_args(settings.command.args, at.arg_mappings, doc))
    return launcher(replace(spec, env=profiling_env(spec.env, prefix)))


def _profile_with_fallback(settings: TuneSettings, launcher: Launcher, space: SearchSpace, cfg: DSConfig,
                           run_dir: Path, log: Callable[[str], None]
                           ) -> tuple[RunResult, DSConfig, DSConfig | None, Path, RunResult | None]:
    """The profiling run, and once more at the highest stage when it ran out of memory or failed otherwise
    (least_memory_variant): (the run, its configuration, the configuration of the first try when there was a
    second or None, that try's folder, the first try when it failed other than out of memory or None). DeepSpeed's
    autotuner profiles at stage 3 (autotuning/constants.py DEFAULT_MIN_MEM_CONFIG); a script that trains only
    there (its model built under deepspeed.zero.Init without `enabled=`: below stage 3 the engine runs the
    partitioned, empty weights, "'weight' must be 2-D") had stopped the tune at a stage-0 profiling run."""
    run = _launch_profiling(settings, launcher, cfg, run_dir)
    if run.status == "failed":  # a pipeline-parallel script fails at every stage: say so before trying another
        _refuse_pipeline(settings, (run_dir / "profiled").resolve(), run_dir)
    fallback = least_memory_variant(space, cfg) if run.status in ("oom", "failed") else None
    if fallback is None:
        return run, cfg, None, run_dir, None
    kind = "oom" if run.status == "oom" else "failed"
    first_dir = run_dir.with_name(f"profile_{kind}_z{cfg.zero.stage}")
    if first_dir.exists():
        shutil.rmtree(first_dir)
    if run_dir.exists():
        run_dir.rename(first_dir)
    what = ("ran out of memory" if kind == "oom"
            else f"failed ({run.reason.splitlines()[0][:200] if run.reason else 'no reason given'})")
    log(f"zerotune tune: the profiling run {what} at ZeRO stage {cfg.zero.stage}, micro-batch "
        f"{cfg.train_micro_batch_size_per_gpu} (see {first_dir}); profiling again at stage "
        f"{fallback.zero.stage}, as DeepSpeed's autotuner profiles every model")
    second = _launch_profiling(settings, launcher, fallback, run_dir)
    return second, fallback, cfg, first_dir, run if kind == "failed" else None


def _unreadable(settings: TuneSettings, run: RunResult, exc: ValueError | None, prefix: Path, run_dir: Path,
                out_of_memory: DSConfig | None, crashed: RunResult | None = None) -> ValueError:
    """The one-line error for a profiling run whose files hold no model (failed, or not readable), or (exc None)
    that crashed after its model was read."""
    why = f"{run.status}{': ' + run.reason[:300] if run.reason else ''}"
    if run.status == "ok":
        return ValueError(f"the profiling run of {settings.command.script} could not read the model: {exc} ({why}; "
                          f"see {run_dir}); give --model (catalog name, model YAML or config.json) and --seq_len")
    # --model would not help: the experiments would run the script the same way
    world = settings.num_nodes * settings.num_gpus
    _refuse_unaccepted_mapping(run.reason, autotuning_of(settings.doc, world).arg_mappings, settings, run_dir)
    _refuse_trainer_world(run.reason, world, settings, run_dir)
    started = Path(f"{prefix}.model.json").is_file()
    tried = "" if out_of_memory is None else (
        f" (and at ZeRO stage {out_of_memory.zero.stage} before it, out of memory too)" if crashed is None
        else f" (and at ZeRO stage {out_of_memory.zero.stage} before it: "
             f"{'the same way' if crashed.reason == run.reason else (crashed.reason or crashed.status)[:200]})")
    return ValueError(f"the profiling run of {settings.command.script} failed "
                      f"{'after its DeepSpeed engine started' if started else 'before zerotune read its model'}"
                      f" ({why}; see {run_dir}){tried}: the experiments would fail the same way; make the script "
                      f"train under deepspeed with this ds_config first"
                      + (f" (its model could not be read either, {exc}: then give --model and --seq_len)"
                         if started and exc is not None else "")
                      # zerotune's own instrumentation runs in the profiling run (calibrate/profiling_site): a
                      # failure of its own had been blamed on the script (non-reentrant checkpointing, 2026-11-29)
                      + f"; if the script trains with {run_dir / 'ds_config.json'}, the profiling run's "
                        f"instrumentation is at fault: give --model and --seq_len to tune without it")


def profile_model(settings: TuneSettings, launcher: Launcher = launch,
                  log: Callable[[str], None] = print) -> ProfileOutcome:
    """One run of the script at the space's smallest micro-batch and accumulation, measured by DeepSpeed's engine
    like an experiment, with calibrate/profiling_site reading the model inside the user's process
    (zerotune.validate.profiled). When that run is out of memory (a model whose ZeRO-0 or -1 states exceed the
    device), it runs once more at the space's highest stage (least_memory_variant), and the first run's
    configuration is recorded as out of memory (ProfileOutcome.out_of_memory) for the search.
    Writes model_profiled.yaml in the results folder; ValueError (one line) when the model cannot be read."""
    world = settings.num_nodes * settings.num_gpus
    at = autotuning_of(settings.doc, world)
    space = space_from_ds_config(settings.doc, world_size=world, explore=())
    # the user's gradient accumulation where the ds_config fixes it (DeepSpeed's autotuner keeps it too:
    # autotuning/autotuner.py:987 get_gas_from_user_config), so the run is one of the space's configurations
    cfg = space.variants[0].replace(train_micro_batch_size_per_gpu=min(space.micro_batches),
                                    gradient_accumulation_steps=min(space.grad_accums, default=1))
    run_dir = Path(at.results_dir) / "profile"
    prefix = (run_dir / "profiled").resolve()
    run, cfg, first_try, first_dir, crashed = _profile_with_fallback(settings, launcher, space, cfg, run_dir, log)
    _refuse_pipeline(settings, prefix, run_dir)
    try:
        profiled = read_profiled(prefix, f"profiled-{settings.command.script.stem}", world)
    except ValueError as exc:
        raise _unreadable(settings, run, exc, prefix, run_dir, first_try, crashed) from None
    if run.status == "failed" and run.returncode:
        # read, then crashed: the fallback's stage failed too (a bf16 script whose buffers stay fp32: "expected m1
        # and m2 to have the same dtype" at stages 0 and 3, 2026-11-29), which had been taken for a run that trained
        raise _unreadable(settings, run, None, prefix, run_dir, first_try, crashed)
    out_of_memory = first_try if crashed is None else None
    if crashed is not None and first_try is not None:
        log(f"zerotune tune: the script trained at ZeRO stage {cfg.zero.stage} after failing at stage "
            f"{first_try.zero.stage}: stages below {cfg.zero.stage} are left out (list only them in "
            f"zero_optimization.stage to tune them anyway)")
    _check_followed(settings, profiled, cfg, run_dir)
    _warn_own_batch(settings, profiled, cfg, log)
    seq_len, precision = settings.seq_len or profiled.seq_len, precision_of_dtype(profiled.dtype)
    as_run = replace(settings, script_checkpointing=profiled.activation_checkpointing, script_precision=precision)
    cfg = as_the_script_runs(_script_optimizer(settings.doc, profiled.optimizer_impl, cfg), as_run)
    if seq_len is None:
        raise ValueError(f"the profiling run of {settings.command.script} saw no token input (micro-batch x sequence);"
                         f" give --seq_len")
    path = Path(at.results_dir) / "model_profiled.yaml"
    write_text_atomic(path, model_yaml(profiled, f"read by zerotune tune's profiling run of "
                                                f"{settings.command.script} ({run_dir})"))
    measured_seq_len = profiled.measured_seq_len or seq_len
    measurement = _profile_measurement(settings, profiled, cfg, run, str(path), measured_seq_len)
    if measurement is not None:
        (run_dir / "measurement.jsonl").unlink(missing_ok=True)
        append_jsonl(run_dir / "measurement.jsonl", [measurement])
    step_phase, update, reduced, forward, backward = _step_phase_s(run, at.end_profile_step - at.start_profile_step)
    oom = None if out_of_memory is None else Measurement(
        model=str(path), hardware=settings.hardware, num_nodes=settings.num_nodes, num_gpus_per_node=settings.num_gpus,
        seq_len=measured_seq_len, status="oom", source=str(first_dir),
        reason="zerotune tune's profiling run, out of memory", config=as_the_script_runs(_script_optimizer(settings.doc, profiled.optimizer_impl, out_of_memory), as_run))
    return ProfileOutcome(str(path), seq_len, measurement, profiled.optimizer_impl, profiled.matmul,
                          profiled.copy_bytes_per_s, profiled.activation_checkpointing, precision, profiled.native_moe,
                          step_phase, update, reduced, profiled.copy_curve, oom, forward, profiled.input_lengths,
                          cfg.train_micro_batch_size_per_gpu,
                          cfg.zero.stage if crashed is not None and first_try is not None else 0,
                          profiled.fresh_copy_bytes_per_s, profiled.dropout_s_per_element, backward)


def _step_phase_s(run: RunResult, window: int) -> tuple[float | None, ...]:
    """(DeepSpeed's step timer, ZeRO's optimizer_step timer, the engine's bwd_allreduce timer, its fwd timer, its
    bwd_inner timer): medians of the last `window` printed values (the measuring window, as window_step_s takes the
    step times), None where the engine printed none."""
    stdout = tail_text(run.run_dir / "stdout.log")
    printed = (*step_phase_times_s(stdout), allreduce_times_s(stdout), forward_times_s(stdout),
               backward_inner_times_s(stdout))
    return tuple(statistics.median(v[-max(window, 1):]) if v else None for v in printed)  # type: ignore[return-value]


def trainable_space(settings: TuneSettings, space: SearchSpace) -> SearchSpace:
    """The space without the stages below the one the script trained at when its profiling run failed at a lower
    one (ProfileOutcome.min_stage): each such experiment could only fail the same way."""
    if not settings.script_min_stage:
        return space
    kept = tuple(v for v in space.variants if v.zero.stage >= settings.script_min_stage)
    return replace(space, variants=kept) if kept else space


def moe_space(settings: TuneSettings, space: SearchSpace, log: Callable[[str], None]) -> SearchSpace:
    """The space without ZeRO-3 for a model with DeepSpeed's own MoE layers: its engine refuses them at start-up
    (runtime/engine.py:2197-2216 _validate_zero3_moe_compatibility, 'Native DeepSpeed MoE is not supported with ZeRO
    Stage 3'), so such an experiment could only fail. ValueError (one line) when stage 3 is all the ds_config lists."""
    if not settings.script_moe:
        return space
    kept = tuple(v for v in space.variants if v.zero.stage != 3)
    if not kept:
        raise ValueError("ds_config zero_optimization.stage: the script's model has DeepSpeed MoE layers "
                         "(deepspeed.moe.layer.MoE), which ZeRO stage 3 refuses; list stage 0, 1 or 2")
    if len(kept) < len(space.variants):
        log("zerotune tune: ZeRO stage 3 left out: the script's model has DeepSpeed MoE layers, which its engine "
            "refuses at stage 3 (runtime/engine.py _validate_zero3_moe_compatibility)")
    return replace(space, variants=kept)
