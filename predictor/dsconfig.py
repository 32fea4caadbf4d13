"""The DeepSpeed configuration keys zerotune reads and tunes, as one typed object (DSConfig), and the name an
experiment of it gets. Field defaults mirror deepspeed/runtime/zero/config.py and offload_config.py (DeepSpeed 0.19).
Reading a ds_config dict into one and writing one back: zerotune.predictor.ds_json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from zerotune.predictor.hardware import Precision

__all__ = ["DSConfig", "ZeroConfig", "OffloadConfig", "ActivationCheckpointing", "AutotuningConfig",
           "experiment_name", "ZeroStage", "OffloadDevice", "OptimizerImpl", "AUTO",
           "optimizer_state_bytes_per_param"]

ZeroStage = Literal[0, 1, 2, 3]
OffloadDevice = Literal["none", "cpu", "nvme"]
OptimizerImpl = Literal["fused", "torch"]
AUTO = "auto"

# Optimizer state bytes per parameter (fp32 states), by DeepSpeed optimizer type (lower-cased).
_ADAM_FAMILY = ("adam", "adamw", "fusedadam", "cpuadam", "onebitadam", "zerooneadam", "lamb", "onebitlamb",
                "fusedlamb", "muadam", "muadamw", "adagrad_adam")
_STATE_BYTES = {**{name: 8 for name in _ADAM_FAMILY}, "lion": 4, "adagrad": 4, "muon": 4}


@dataclass(frozen=True)
class OffloadConfig:
    """offload_optimizer / offload_param: where ZeRO keeps the state between uses."""

    device: OffloadDevice = "none"
    pin_memory: bool = True
    buffer_count: int = 4
    buffer_size_elems: int = 100_000_000
    """offload_param buffer_size (elements) for NVMe staging."""


@dataclass(frozen=True)
class ZeroConfig:
    """zero_optimization, with DeepSpeed's defaults (bucket sizes count elements, not bytes)."""

    stage: ZeroStage = 0
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    reduce_bucket_size_elems: int = 500_000_000
    allgather_partitions: bool = True
    allgather_bucket_size_elems: int = 500_000_000
    overlap_comm: bool = False
    """DeepSpeed's dynamic default: True for stage 3, False otherwise."""
    offload_optimizer: OffloadConfig = field(default_factory=OffloadConfig)
    offload_param: OffloadConfig = field(default_factory=lambda: OffloadConfig(buffer_count=5))
    sub_group_size_elems: int = 1_000_000_000
    stage3_prefetch_bucket_size_elems: int = 50_000_000
    stage3_param_persistence_threshold_elems: int = 100_000
    stage3_max_live_parameters_elems: int = 1_000_000_000
    stage3_max_reuse_distance_elems: int = 1_000_000_000


@dataclass(frozen=True)
class ActivationCheckpointing:
    """Whether the model recomputes each block's activations in backward (HF gradient checkpointing,
    Megatron --checkpoint-activations); the ds_config section only configures DeepSpeed's implementation."""

    enabled: bool = False
    partition_activations: bool = False
    cpu_checkpointing: bool = False
    by_script: bool = False
    """The script recomputes (or not) on its own, whatever the ds_config says: DeepSpeed 0.19 parses the section
    (runtime/config.py:503) but its engine never acts on it; only deepspeed.checkpointing.configure reads it
    (runtime/activation_checkpointing/checkpointing.py:1152), and blocks are recomputed where the script calls a
    checkpoint function. `enabled` is then what the script was seen to do (zerotune tune's profiling run), and the
    section is written back as the user had it (`section`), never switched."""
    section: bool = False
    """With by_script: the user's ds_config has an activation_checkpointing section."""


@dataclass(frozen=True)
class AutotuningConfig:
    """The ds_config `autotuning` section as DeepSpeed documents it (defaults from autotuning/constants.py)."""

    enabled: bool = False
    fast: bool = True
    results_dir: str = "autotuning_results"
    exps_dir: str = "autotuning_exps"
    overwrite: bool = True
    start_profile_step: int = 3
    end_profile_step: int = 5
    metric_path: str | None = None
    metric: Literal["throughput", "latency", "flops"] = "throughput"
    tuner_type: Literal["gridsearch", "random", "model_based"] = "gridsearch"
    tuner_early_stopping: int = 5
    tuner_num_trials: int = 50
    arg_mappings: dict[str, str] | None = None
    max_train_batch_size: int | None = None
    min_train_batch_size: int = 1
    max_train_micro_batch_size_per_gpu: int = 1024
    min_train_micro_batch_size_per_gpu: int = 1
    num_tuning_micro_batch_sizes: int = 3
    mp_size: int = 1
    model_info: dict[str, Any] | None = None
    model_info_path: str | None = None


@dataclass(frozen=True)
class DSConfig:
    """One DeepSpeed training configuration: what zerotune predicts and what tune runs."""

    train_micro_batch_size_per_gpu: int = 1
    gradient_accumulation_steps: int = 1
    precision: Precision = "fp32"
    grad_accum_dtype: Precision | None = None
    """data_types.grad_accum_dtype; None means the model's dtype (DeepSpeed's default)."""
    optimizer: str = "adamw"
    optimizer_momentum: float = 0.0
    """SGD momentum: SGD keeps a momentum buffer only when it is non-zero."""
    optimizer_impl: OptimizerImpl = "fused"
    """How the Adam update runs on the device: 'fused', one kernel reading and writing each state once
    (DeepSpeed's FusedAdam, what an Adam/AdamW optimizer section builds: runtime/engine.py
    get_optimizer_configuration; torch's AdamW(fused=True), the Hugging Face Trainer's default adamw_torch_fused
    with torch >= 2.8), or 'torch', torch's unfused AdamW (for-each or per-tensor, torch/optim/adam.py
    _multi_tensor_adam / _single_tensor_adam: one pass over the tensors per elementwise op), which a section with
    "torch_adam": true builds and a script's own torch.optim.AdamW(model.parameters()) is. A ds_config without an
    optimizer section means the script's optimizer: 'torch' until tune's profiling run reads which it is."""
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    activation_checkpointing: ActivationCheckpointing = field(default_factory=ActivationCheckpointing)
    mp_size: int = 1
    """Model (tensor) parallel degree, as the autotuning section's mp_size."""
    pp_size: int = 1
    """Pipeline stages (the ds_config's pipeline.stages, as Megatron-DeepSpeed's PipelineModule uses them);
    data parallel = world / (mp x pp)."""
    autotuning: AutotuningConfig = field(default_factory=AutotuningConfig)
    passthrough: dict[str, Any] = field(default_factory=dict)
    """Every key of the user's ds_config that zerotune does not tune (scheduler, fp16 loss scaling, the zero keys
    outside ZeroConfig, offload paths, activation_checkpointing.number_checkpoints, ...), nested as the user
    wrote them; to_ds_config writes them back unchanged under the tuned keys."""

    def replace(self, **changes: Any) -> "DSConfig":
        return dataclasses.replace(self, **changes)

    def replace_zero(self, **changes: Any) -> "DSConfig":
        return dataclasses.replace(self, zero=dataclasses.replace(self.zero, **changes))

    @property
    def model_parallel_size(self) -> int:
        return self.mp_size * self.pp_size

    def stage_layers(self, num_layers: int) -> int:
        """Blocks on the busiest pipeline stage (DeepSpeed's PipelineModule splits layers as evenly as it can)."""
        return -(-num_layers // self.pp_size)

    def dp_size(self, world_size: int) -> int:
        """Data-parallel ranks: the GPUs over tensor and pipeline parallelism."""
        return world_size // self.model_parallel_size

    def samples_per_step(self, world_size: int) -> int:
        """Samples per optimizer step, DeepSpeed's train_batch_size: micro-batch x accumulation x data-parallel
        ranks (deepspeed/runtime/config.py _batch_assertion). Tensor- and pipeline-parallel ranks share samples."""
        return self.train_micro_batch_size_per_gpu * self.gradient_accumulation_steps * self.dp_size(world_size)

    @property
    def grad_precision(self) -> Precision:
        return self.grad_accum_dtype or self.precision


def optimizer_state_names() -> tuple[str, ...]:
    """The optimizer types (lower-cased, no underscores) whose state bytes are known by name."""
    return tuple(_STATE_BYTES)


def optimizer_state_bytes_per_param(cfg: DSConfig) -> int:
    """fp32 optimizer state per parameter, master copy excluded: Adam m and v = 8 (ZeRO paper sec. 3.1)."""
    if cfg.optimizer == "sgd":
        return 4 if cfg.optimizer_momentum else 0
    return _STATE_BYTES.get(cfg.optimizer, 8)


def _short(value: int) -> str:
    return f"{value:.0e}".replace("e+0", "e").replace("e+", "e")


def experiment_name(cfg: DSConfig) -> str:
    """An experiment name in the style of DeepSpeed's autotuner (z1_gas1_tmbspg3, autotuning/utils.py
    canonical_name): the stage, then acronyms of the knobs that differ from DeepSpeed's defaults, then
    accumulation and micro-batch, so that two configurations of one space never share a name."""
    z, default = cfg.zero, ZeroConfig(stage=cfg.zero.stage, overlap_comm=cfg.zero.stage == 3)
    parts = [f"z{z.stage}"]
    if z.offload_optimizer.device != "none":
        parts.append(f"oo{z.offload_optimizer.device}")
    if z.offload_param.device != "none":
        parts.append(f"op{z.offload_param.device}")
    if cfg.activation_checkpointing.enabled:
        parts.append("ac")
    flags = (("oc", "overlap_comm"), ("rs", "reduce_scatter"), ("cg", "contiguous_gradients"),
             ("ap", "allgather_partitions"))
    parts += [f"{short}{'T' if getattr(z, name) else 'F'}" for short, name in flags
              if getattr(z, name) != getattr(default, name)]
    sizes = (("rbs", "reduce_bucket_size_elems"), ("agbs", "allgather_bucket_size_elems"),
             ("pbs", "stage3_prefetch_bucket_size_elems"), ("ppt", "stage3_param_persistence_threshold_elems"),
             ("mlp", "stage3_max_live_parameters_elems"))
    parts += [f"{short}{_short(getattr(z, name))}" for short, name in sizes
              if getattr(z, name) != getattr(default, name)]
    return "_".join(parts + [f"gas{cfg.gradient_accumulation_steps}", f"tmbspg{cfg.train_micro_batch_size_per_gpu}"])
