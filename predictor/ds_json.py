"""A ds_config as DeepSpeed reads it: `parse_ds_config` turns a ds_config dict (as json.load gives it) into a
zerotune.predictor.dsconfig.DSConfig, rejecting what DeepSpeed would reject (a misspelled key inside a section
DeepSpeed validates, a wrong type, an inconsistent batch triple, a key DeepSpeed 0.19 removed); `to_ds_config` is
the only way back to a dict, with every key zerotune does not tune carried through unchanged."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from typing import Any

from zerotune.predictor.catalog import nearest
from zerotune.predictor.dsconfig import (AUTO, ActivationCheckpointing, AutotuningConfig, DSConfig, OffloadConfig,
                                         OptimizerImpl, ZeroConfig, optimizer_state_names)
from zerotune.predictor.hardware import Precision
from zerotune.predictor.ds_keys import (ACTIVATION_CHECKPOINTING_KEYS, AUTOTUNING_KEYS, BF16_KEYS, FP16_KEYS,
                                        OFFLOAD_OPTIMIZER_KEYS, OFFLOAD_PARAM_KEYS, REMOVED_ISSUE,
                                        REMOVED_TOP_LEVEL_KEYS, REMOVED_ZERO_KEYS, TOP_LEVEL_KEYS, TUNED_ZERO_KEYS,
                                        ZERO_KEYS)
from zerotune.predictor.limits import DS_CONFIG_MAXIMA, DS_CONFIG_MINIMA

__all__ = ["parse_ds_config", "to_ds_config", "resolve_batch", "lax_number", "refuse_non_objects"]

def _refuse_removed(doc: dict[str, Any]) -> None:
    for key, reason in REMOVED_TOP_LEVEL_KEYS.items():
        if key in doc:
            raise ValueError(f"ds_config {key}: DeepSpeed 0.19 refuses it ({reason}; {REMOVED_ISSUE}); remove it")
    zero = doc.get("zero_optimization")
    for key, reason in (REMOVED_ZERO_KEYS.items() if isinstance(zero, dict) else ()):
        if key in zero:
            raise ValueError(f"ds_config zero_optimization.{key}: DeepSpeed 0.19 refuses it ({reason}; "
                             f"{REMOVED_ISSUE}); remove it")


_REWRITTEN = {"fp16": ("enabled",), "bf16": ("enabled",),
              "activation_checkpointing": ("partition_activations", "cpu_checkpointing")}
"""Keys of these sections that to_ds_config writes from the DSConfig (precision, checkpointing); a section's
other keys are the user's and pass through."""


def _untuned(doc: dict[str, Any]) -> dict[str, Any]:
    """The user's keys zerotune does not tune, sections kept as nested dicts: everything but the batch triple,
    autotuning, the tuned zero_optimization keys and the keys to_ds_config writes (_REWRITTEN). A section left
    empty is dropped, so that writing a DSConfig and reading it back gives it again."""
    out = {k: v for k, v in doc.items() if k not in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                     "gradient_accumulation_steps", "autotuning")}
    for section, written in _REWRITTEN.items():
        if isinstance(out.get(section), dict):
            # a precision the user switched off in so many words stays off in so many words ({"enabled": false})
            rest = {k: v for k, v in out.pop(section).items()
                    if k not in written or v == AUTO or (section in ("fp16", "bf16") and k == "enabled" and v is False)}
            out.update({section: rest} if rest else {})
    zero = out.pop("zero_optimization", None)
    if isinstance(zero, dict):
        rest = {k: v for k, v in zero.items() if k not in TUNED_ZERO_KEYS and k not in ("offload_optimizer",
                                                                                       "offload_param")}
        for key in ("offload_optimizer", "offload_param"):
            extra = {k: v for k, v in (zero.get(key) or {}).items() if k not in ("device", "pin_memory")}
            rest.update({key: extra} if extra else {})
        out.update({"zero_optimization": rest} if rest else {})
    return out


# -- reading a ds_config dict ----------------------------------------------------------------------------

def _section(parent: dict[str, Any], key: str, allowed: frozenset[str], strict: bool,
             path: str = "") -> dict[str, Any]:
    """parent[key] as a dict; unknown keys are an error where DeepSpeed rejects them, else a warning."""
    path = path or key
    sec = parent.get(key)
    if sec is None:
        return {}
    if not isinstance(sec, dict):
        raise ValueError(f"ds_config {path} must be an object, got {type(sec).__name__}")
    for key in sec:
        if key not in allowed:
            message = f"ds_config {path}.{key}: unknown key{nearest(key, sorted(allowed))}"
            if strict:
                raise ValueError(message + "; DeepSpeed rejects unknown keys in this section")
            warnings.warn(message + "; it has no effect", stacklevel=3)
    return sec


def _list_error(path: str) -> ValueError:
    return ValueError(f"ds_config {path} is a list (a tuning space); a single prediction needs one value: "
                      f"pick one, or set it with its command-line flag")


def _bool(sec: dict[str, Any], path: str, key: str, default: bool) -> bool:
    value = sec.get(key, default)
    if value == AUTO or value is None:
        return default
    if isinstance(value, list):
        raise _list_error(f"{path}.{key}")
    if not isinstance(value, bool):
        raise ValueError(f"ds_config {path}.{key} must be true or false, got {value!r}")
    return value


def lax_number(value: Any) -> Any:
    """A number written as text read as pydantic's lax mode reads it, for the sections DeepSpeed validates with
    pydantic (runtime/zero/config.py DeepSpeedZeroConfig): "stage": "2" and "2.0" run as stage 2. Anything else is
    returned as it is, for the caller's own check."""
    if not isinstance(value, str):
        return value
    try:
        return float(value)
    except ValueError:
        return value


def _int(sec: dict[str, Any], path: str, key: str, default: int | None, minimum: int = 0,
         auto: int | None = None) -> int | None:
    """An integer key; JSON writes 5e8 as a float, which is accepted when it is integral. Counts that size what
    zerotune enumerates have a maximum (limits.DS_CONFIG_MAXIMA); element counts (buckets) need only be finite."""
    name = f"{path}.{key}" if path else key
    value = sec.get(key, default)
    if value == AUTO:
        return auto if auto is not None else default
    if isinstance(value, list):
        raise _list_error(name)
    if value is None:  # JSON null: DeepSpeed's default
        return default
    if path.startswith("zero_optimization"):
        value = lax_number(value)
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or (isinstance(value, float) and not (math.isfinite(value) and value.is_integer()))):
        raise ValueError(f"ds_config {name} must be a whole number, got {value!r}")
    minimum = max(minimum, DS_CONFIG_MINIMA.get(key, minimum))
    if value < minimum:
        raise ValueError(f"ds_config {name} must be at least {minimum}, got {value!r}")
    maximum = DS_CONFIG_MAXIMA.get(key, 2**62)
    if value > maximum:
        raise ValueError(f"ds_config {name} {value:g} is above the {maximum:,} zerotune accepts; use a smaller "
                         f"value")
    return int(value)


def _offload(zero: dict[str, Any], key: str, allowed: frozenset[str], buffer_count: int) -> OffloadConfig:
    path = f"zero_optimization.{key}"
    sec = _section(zero, key, allowed, strict=True, path=path)
    device = sec.get("device")
    device = "none" if device is None else device  # JSON null: DeepSpeed's default; false or 0 is no device name
    if isinstance(device, bool) or device not in ("none", "cpu", "nvme"):
        raise ValueError(f"ds_config {path}.device must be none, cpu or nvme, got {device!r}")
    ratio = sec.get("ratio")  # DeepSpeed's DeepSpeedZeroOffloadOptimizerConfig: 0 <= ratio <= 1
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1):
        raise ValueError(f"ds_config {path}.ratio must be a share from 0 to 1 (DeepSpeed refuses others), got "
                         f"{ratio!r}")
    return OffloadConfig(device=device, pin_memory=_bool(sec, path, "pin_memory", True),
                         buffer_count=_int(sec, path, "buffer_count", buffer_count),
                         buffer_size_elems=_int(sec, path, "buffer_size", 100_000_000))


def _alias(sec: dict[str, Any], name: str) -> str:
    return name if name in sec else f"stage3_{name}"


def _zero(doc: dict[str, Any], hidden_size: int | None) -> ZeroConfig:
    sec = _section(doc, "zero_optimization", ZERO_KEYS, strict=True)
    p = "zero_optimization"
    if sec.get("stage") == AUTO:
        raise ValueError("ds_config zero_optimization.stage \"auto\" is not a stage DeepSpeed can run (its config "
                         "wants a number); give 0, 1, 2 or 3 (zerotune predict --rank and tune also take a list or "
                         "\"all\")")
    stage = _int(sec, p, "stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ds_config zero_optimization.stage must be 0, 1, 2 or 3, got {stage}")
    hh = hidden_size * hidden_size if hidden_size else None  # Hugging Face's values for "auto"
    if sec.get("cpu_offload") is not None and not isinstance(sec["cpu_offload"], bool):
        raise ValueError(f"ds_config zero_optimization.cpu_offload must be true or false, got "
                         f"{json.dumps(sec['cpu_offload'])[:40]}; or give offload_optimizer {{\"device\": \"cpu\"}}")
    if sec.get("cpu_offload") is True:  # deprecated spelling of offload_optimizer.device = cpu
        sec = {**sec, "offload_optimizer": {"device": "cpu"}}
    overlap = sec.get("overlap_comm")
    return ZeroConfig(
        stage=stage,
        contiguous_gradients=_bool(sec, p, "contiguous_gradients", True),
        reduce_scatter=_bool(sec, p, "reduce_scatter", True),
        reduce_bucket_size_elems=_int(sec, p, "reduce_bucket_size", 500_000_000, 1, auto=hh),
        allgather_partitions=_bool(sec, p, "allgather_partitions", True),
        allgather_bucket_size_elems=_int(sec, p, "allgather_bucket_size", 500_000_000, 0, auto=hh),
        overlap_comm=_bool(sec, p, "overlap_comm", stage == 3) if overlap is not None else stage == 3,
        offload_optimizer=_offload(sec, "offload_optimizer", OFFLOAD_OPTIMIZER_KEYS, 4),
        offload_param=_offload(sec, "offload_param", OFFLOAD_PARAM_KEYS, 5),
        sub_group_size_elems=_int(sec, p, "sub_group_size", 1_000_000_000),
        stage3_prefetch_bucket_size_elems=_int(sec, p, _alias(sec, "prefetch_bucket_size"), 50_000_000,
                                               auto=int(0.9 * hh) if hh else None),
        stage3_param_persistence_threshold_elems=_int(sec, p, _alias(sec, "param_persistence_threshold"),
                                                      100_000, auto=10 * hidden_size if hidden_size else None),
        stage3_max_live_parameters_elems=_int(sec, p, _alias(sec, "max_live_parameters"), 1_000_000_000),
        stage3_max_reuse_distance_elems=_int(sec, p, _alias(sec, "max_reuse_distance"), 1_000_000_000),
    )


def _precision(doc: dict[str, Any]) -> Precision:
    fp16 = _section(doc, "fp16", FP16_KEYS, strict=True)
    bf16 = _section(doc, "bf16", BF16_KEYS, strict=True)
    fp16_on, bf16_on = _bool(fp16, "fp16", "enabled", False), _bool(bf16, "bf16", "enabled", False)
    for name, sec in (("fp16", fp16), ("bf16", bf16)):
        if sec.get("enabled") == AUTO:
            warnings.warn(f"ds_config {name}.enabled is \"auto\" (set by the Hugging Face Trainer); "
                          f"read as off, as the Trainer runs it without --{name}; zerotune tune costs it as its "
                          f"profiling run's engine ran, zerotune predict as --precision says", stacklevel=3)
    if fp16_on and bf16_on:
        raise ValueError("ds_config enables both fp16.enabled and bf16.enabled; DeepSpeed allows one: disable one")
    return "fp16" if fp16_on else "bf16" if bf16_on else "fp32"  # `amp` is refused (_refuse_removed)


def _optimizer_impl(doc: dict[str, Any]) -> OptimizerImpl:
    opt = doc.get("optimizer")
    if not isinstance(opt, dict):
        return "torch"  # the script's own optimizer, most often torch.optim.AdamW as written (unfused)
    params = opt.get("params") if isinstance(opt.get("params"), dict) else {}
    return "torch" if params.get("torch_adam") is True else "fused"


KNOWN_OPTIMIZERS = frozenset(optimizer_state_names()) | {"sgd"}
"""Optimizer types whose state zerotune costs by name (dsconfig._STATE_BYTES, SGD by its momentum)."""


def _optimizer(doc: dict[str, Any]) -> tuple[str, float]:
    opt = doc.get("optimizer")
    if opt is None:
        return "adamw", 0.0  # a client optimizer: zerotune assumes the Adam family
    if not isinstance(opt, dict) or not isinstance(opt.get("type"), str):
        raise ValueError("ds_config optimizer must be an object with a string \"type\", e.g. {\"type\": \"AdamW\"}")
    params = opt.get("params")
    if params is None:
        params = {}
    elif not isinstance(params, dict):
        raise ValueError(f"ds_config optimizer.params must be an object, e.g. {{\"lr\": 0.0001}}, got {params!r}")
    momentum = params.get("momentum", 0.0)
    if momentum is not None and momentum != AUTO and (isinstance(momentum, bool)
                                                      or not isinstance(momentum, (int, float))
                                                      or not math.isfinite(momentum)):
        raise ValueError(f"ds_config optimizer.params.momentum must be a number, got {json.dumps(momentum)[:40]}")
    momentum = 0.0 if momentum is None or momentum == AUTO else float(momentum)
    name = opt["type"].lower().replace("_", "")
    if name not in KNOWN_OPTIMIZERS:
        warnings.warn(f"ds_config optimizer.type {opt['type']!r} is not one zerotune knows "
                      f"({', '.join(sorted(KNOWN_OPTIMIZERS))}); its states are costed as Adam's (8 bytes a "
                      f"parameter). DeepSpeed looks other names up in torch.optim and stops at start-up when there is "
                      f"none", stacklevel=3)
    return name, momentum


def _grad_accum_dtype(doc: dict[str, Any]) -> Precision | None:
    sec = doc.get("data_types") or {}
    if not isinstance(sec, dict):
        raise ValueError(f"ds_config data_types must be an object, e.g. {{\"grad_accum_dtype\": \"fp32\"}}, got {sec!r}")
    value = sec.get("grad_accum_dtype")
    names = {"fp32": "fp32", "float32": "fp32", "fp16": "fp16", "float16": "fp16", "bf16": "bf16",
             "bfloat16": "bf16"}
    if value is None:
        return None
    if not isinstance(value, str) or value not in names:
        raise ValueError(f"ds_config data_types.grad_accum_dtype must be fp32, fp16 or bf16, got {value!r}")
    return names[value]  # type: ignore[return-value]


def _autotuning(doc: dict[str, Any]) -> AutotuningConfig:
    sec = dict(_section(doc, "autotuning", AUTOTUNING_KEYS, strict=False))
    sec = {k: v for k, v in sec.items() if k in AUTOTUNING_KEYS}
    if "metric" in sec:
        metric = str(sec["metric"]).lower()
        if metric not in ("throughput", "latency", "flops"):
            raise ValueError(f"ds_config autotuning.metric must be throughput, latency or FLOPS, got {sec['metric']!r}")
        sec["metric"] = metric
    defaults = AutotuningConfig()
    for key in ("results_dir", "exps_dir", "metric_path", "model_info_path"):
        value = sec.get(key)
        if key in sec and value is not None and not (isinstance(value, str) and value.strip()):
            raise ValueError(f"ds_config autotuning.{key} must be a folder or file path, got {value!r}; give a "
                             f"path, or remove the key for DeepSpeed's default")
    if sec.get("tuner_type") is not None and str(sec["tuner_type"]) not in ("gridsearch", "random", "model_based"):
        raise ValueError(f"ds_config autotuning.tuner_type must be gridsearch, random or model_based (DeepSpeed's "
                         f"tuners; zerotune's search replaces them), got {sec['tuner_type']!r}")
    mappings = sec.get("arg_mappings")
    if mappings is not None and not (isinstance(mappings, dict) and all(
            isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in mappings.items())):
        raise ValueError(f"ds_config autotuning.arg_mappings must map ds_config keys to the script's flags, e.g. "
                         f"{{\"train_micro_batch_size_per_gpu\": \"--batch_size\"}}, got {mappings!r}")
    for key, value in sec.items():
        default = getattr(defaults, key)
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"ds_config autotuning.{key} must be true or false, got {value!r}")
        if (isinstance(default, int) and not isinstance(default, bool)) or key == "max_train_batch_size":
            sec[key] = _int(sec, "autotuning", key, default)
    if sec.get("min_train_micro_batch_size_per_gpu", 1) > sec.get("max_train_micro_batch_size_per_gpu", 1024):
        raise ValueError(f"ds_config autotuning.min_train_micro_batch_size_per_gpu "
                         f"{sec['min_train_micro_batch_size_per_gpu']} is above max_train_micro_batch_size_per_gpu "
                         f"{sec.get('max_train_micro_batch_size_per_gpu', 1024)}; make min <= max")
    return dataclasses.replace(defaults, **sec)


def resolve_batch(doc: dict[str, Any], dp_world_size: int) -> tuple[int, int]:
    """(micro_batch, grad_accum) from the batch triple, as DeepSpeed's config checks it:
    train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * data-parallel size."""
    micro, gas = _resolve_batch(doc, dp_world_size)
    _int({"train_micro_batch_size_per_gpu": micro}, "", "train_micro_batch_size_per_gpu", None, 1)
    _int({"gradient_accumulation_steps": gas}, "", "gradient_accumulation_steps", None, 1)
    return micro, gas


def _resolve_batch(doc: dict[str, Any], dp_world_size: int) -> tuple[int, int]:
    train = _int(doc, "", "train_batch_size", None, 1)
    micro = _int(doc, "", "train_micro_batch_size_per_gpu", None, 1)
    gas = _int(doc, "", "gradient_accumulation_steps", None, 1)
    if train is not None and micro is not None and gas is not None:
        if train != micro * gas * dp_world_size:
            raise ValueError(f"ds_config train_batch_size {train} != train_micro_batch_size_per_gpu {micro} x "
                             f"gradient_accumulation_steps {gas} x data-parallel GPUs {dp_world_size}; "
                             f"fix one or drop train_batch_size")
        return micro, gas
    if train is not None:
        per_gpu = micro * (gas or 1) if micro is not None else (gas or 1)
        if train % (per_gpu * dp_world_size):
            raise ValueError(f"ds_config train_batch_size {train} is not divisible by "
                             f"{'train_micro_batch_size_per_gpu' if micro else 'gradient_accumulation_steps'} "
                             f"x data-parallel GPUs ({per_gpu} x {dp_world_size}); pick a multiple")
        if micro is not None:
            return micro, train // (micro * dp_world_size)
        return train // ((gas or 1) * dp_world_size), gas or 1
    return (micro or 1), (gas or 1)


def _tensor_parallel(doc: dict[str, Any], mp_size: int) -> int:
    """The tensor-parallel degree: autotuning.mp_size, or DeepSpeed's AutoTP training degree
    (tensor_parallel.autotp_size, runtime/tensor_parallel/config.py TPTrainingConfig; 0 or 1: none)."""
    autotp = _int(doc.get("tensor_parallel") or {}, "tensor_parallel", "autotp_size", 0, 0)  # an object: checked
    if autotp > 1 and mp_size > 1 and autotp != mp_size:
        raise ValueError(f"ds_config tensor_parallel.autotp_size {autotp} and autotuning.mp_size {mp_size} differ; "
                         f"give the tensor-parallel degree once")
    return autotp if autotp > 1 else mp_size


def _pipeline_stages(doc: dict[str, Any]) -> int:
    """pipeline.stages: an int, or "auto" / absent for no pipeline parallelism as far as memory and time go."""
    sec = doc.get("pipeline") or {}
    if not isinstance(sec, dict):
        raise ValueError("ds_config pipeline must be an object, e.g. {\"stages\": 4}")
    stages = sec.get("stages", 1)
    return 1 if stages == AUTO else int(_int(sec, "pipeline", "stages", 1, 1))


OBJECT_SECTIONS = frozenset({
    "optimizer", "scheduler", "fp16", "bf16", "zero_optimization", "activation_checkpointing", "autotuning",
    "pipeline", "data_types", "flops_profiler", "comms_logger", "tensorboard", "wandb", "csv_monitor", "comet",
    "checkpoint", "aio", "compile", "tensor_parallel", "torch_autocast", "timers", "monitor_config",
    "data_efficiency", "compression_training", "nebula", "eigenvalue", "progressive_layer_drop",
    "quantize_training", "hybrid_engine", "weight_quantization", "expert_parallel"})
"""Top-level keys DeepSpeed 0.19 reads as a section (runtime/config.py unpacks or indexes them): null or a list
there stops its engine (DeepSpeedZeroConfig(**null) raises a TypeError), so zerotune refuses it up front."""


def refuse_non_objects(doc: dict[str, Any]) -> None:
    """ValueError (one line) when a top-level key DeepSpeed reads as a section (OBJECT_SECTIONS) is not an object."""
    for key in sorted(OBJECT_SECTIONS & set(doc)):
        value = doc[key]
        if not isinstance(value, dict):
            shown = json.dumps(value, default=lambda v: type(v).__name__)
            raise ValueError(f"ds_config {key} must be an object (DeepSpeed reads it as a section), got {shown[:40]}; "
                             f"give {{...}} or remove the key")


def parse_ds_config(doc: Any, *, world_size: int = 1, hidden_size: int | None = None) -> DSConfig:
    """A DSConfig from a ds_config dict; `hidden_size` resolves Hugging Face "auto" bucket sizes."""
    if not isinstance(doc, dict):
        raise ValueError(f"ds_config must be a JSON object, got {type(doc).__name__}")
    refuse_non_objects(doc)
    clip = doc.get("gradient_clipping")
    if clip is not None and clip != AUTO and (isinstance(clip, bool) or not isinstance(clip, (int, float))
                                              or not math.isfinite(clip) or clip < 0):
        raise ValueError(f"ds_config gradient_clipping must be a number of at least 0 (0: none), got {clip!r}")
    for key in doc:
        if key not in TOP_LEVEL_KEYS:
            warnings.warn(f"ds_config: unknown top-level key {key!r}{nearest(key, sorted(TOP_LEVEL_KEYS))}; "
                          f"DeepSpeed ignores it", stacklevel=2)
    _refuse_removed(doc)
    autotuning = _autotuning(doc)
    mp_size, pp_size = _tensor_parallel(doc, autotuning.mp_size), _pipeline_stages(doc)
    if world_size % (mp_size * pp_size):
        raise ValueError(f"ds_config tensor-parallel degree {mp_size} (autotuning.mp_size or tensor_parallel."
                         f"autotp_size) x pipeline.stages {pp_size} does not divide the {world_size} GPUs; use "
                         f"divisors of the GPU count")
    micro, gas = resolve_batch(doc, world_size // (mp_size * pp_size))
    ckpt = doc.get("activation_checkpointing")
    ckpt_sec = _section(doc, "activation_checkpointing", ACTIVATION_CHECKPOINTING_KEYS, strict=False)
    optimizer, momentum = _optimizer(doc)
    return DSConfig(
        train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas, precision=_precision(doc),
        grad_accum_dtype=_grad_accum_dtype(doc), optimizer=optimizer, optimizer_momentum=momentum,
        optimizer_impl=_optimizer_impl(doc), zero=_zero(doc, hidden_size),
        activation_checkpointing=ActivationCheckpointing(
            enabled=ckpt is not None,
            partition_activations=_bool(ckpt_sec, "activation_checkpointing", "partition_activations", False),
            cpu_checkpointing=_bool(ckpt_sec, "activation_checkpointing", "cpu_checkpointing", False)),
        mp_size=mp_size, pp_size=pp_size, autotuning=autotuning,
        passthrough=_untuned(doc),
    )


# -- writing one back ---------------------------------------------------------------------------------------

def _offload_dict(off: OffloadConfig, untuned: Any) -> dict[str, Any]:
    return {**(untuned if isinstance(untuned, dict) else {}), "device": off.device, "pin_memory": off.pin_memory}


def _zero_dict(cfg: DSConfig) -> dict[str, Any]:
    """zero_optimization: the user's untuned keys, the tuned ones set on top."""
    z = cfg.zero
    user = cfg.passthrough.get("zero_optimization")
    zero: dict[str, Any] = dict(user) if isinstance(user, dict) else {}
    zero.update({"stage": z.stage, "contiguous_gradients": z.contiguous_gradients, "overlap_comm": z.overlap_comm,
                 "reduce_scatter": z.reduce_scatter, "reduce_bucket_size": z.reduce_bucket_size_elems,
                 "allgather_partitions": z.allgather_partitions,
                 "allgather_bucket_size": z.allgather_bucket_size_elems})
    if z.offload_optimizer.device != "none" or "offload_optimizer" in zero:
        zero["offload_optimizer"] = _offload_dict(z.offload_optimizer, zero.get("offload_optimizer"))
    if z.stage == 3:
        zero.update({"stage3_prefetch_bucket_size": z.stage3_prefetch_bucket_size_elems,
                     "stage3_param_persistence_threshold": z.stage3_param_persistence_threshold_elems,
                     "stage3_max_live_parameters": z.stage3_max_live_parameters_elems,
                     "stage3_max_reuse_distance": z.stage3_max_reuse_distance_elems,
                     "sub_group_size": z.sub_group_size_elems})
    if z.stage == 3 and (z.offload_param.device != "none" or "offload_param" in zero):
        zero["offload_param"] = _offload_dict(z.offload_param, zero.get("offload_param"))
    elif z.stage < 3:
        zero.pop("offload_param", None)  # only stage 3 offloads parameters
    return zero


def to_ds_config(cfg: DSConfig, world_size: int) -> dict[str, Any]:
    """The ds_config dict DeepSpeed runs: the user's untuned keys unchanged (DSConfig.passthrough), the tuned
    keys set."""
    out = dict(cfg.passthrough)
    out.update({
        "train_batch_size": cfg.samples_per_step(world_size),
        "train_micro_batch_size_per_gpu": cfg.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "zero_optimization": _zero_dict(cfg),
    })
    if cfg.pp_size > 1:
        out["pipeline"] = {**(out.get("pipeline") or {}), "stages": cfg.pp_size}
    for precision in ("fp16", "bf16"):
        user = out.get(precision)
        if (user or cfg.precision == precision) and (user or {}).get("enabled") != AUTO:
            out[precision] = {**(user or {}), "enabled": cfg.precision == precision}
    ckpt = cfg.activation_checkpointing
    if ckpt.section if ckpt.by_script else ckpt.enabled:
        out["activation_checkpointing"] = {**(out.get("activation_checkpointing") or {}),
                                           "partition_activations": ckpt.partition_activations,
                                           "cpu_checkpointing": ckpt.cpu_checkpointing}
    else:
        out.pop("activation_checkpointing", None)  # the section's presence switches checkpointing on
    return out
