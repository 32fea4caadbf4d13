"""DeepSpeed 0.19's ds_config key names as zerotune.predictor.ds_json reads them: the keys of the sections DeepSpeed
validates strictly, the keys it refuses at start-up with its reason, and the zero_optimization keys zerotune tunes."""

from __future__ import annotations

__all__ = ["ZERO_KEYS", "OFFLOAD_PARAM_KEYS", "OFFLOAD_OPTIMIZER_KEYS", "FP16_KEYS", "BF16_KEYS",
           "ACTIVATION_CHECKPOINTING_KEYS", "AUTOTUNING_KEYS", "TOP_LEVEL_KEYS", "REMOVED_TOP_LEVEL_KEYS",
           "REMOVED_ZERO_KEYS", "REMOVED_ISSUE", "TUNED_ZERO_KEYS"]

# Sections DeepSpeed validates with pydantic models that forbid unknown keys: their keys, aliases included.
ZERO_KEYS = frozenset({
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "use_multi_rank_bucket_allreduce",
    "allgather_partitions", "allgather_bucket_size", "overlap_comm", "compute_grad_norm", "load_from_fp32_weights",
    "elastic_checkpoint", "offload_param", "offload_optimizer", "zenflow", "sub_group_size", "cpu_offload_param",
    "cpu_offload_use_pin_memory", "cpu_offload", "prefetch_bucket_size", "stage3_prefetch_bucket_size",
    "param_persistence_threshold", "stage3_param_persistence_threshold", "model_persistence_threshold",
    "stage3_model_persistence_threshold", "max_live_parameters", "stage3_max_live_parameters",
    "max_reuse_distance", "stage3_max_reuse_distance", "gather_16bit_weights_on_model_save",
    "stage3_gather_16bit_weights_on_model_save", "module_granularity_threshold",
    "stage3_module_granularity_threshold", "use_all_reduce_for_fetch_params",
    "stage3_use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_allgather_sequential",
    "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1",
    "round_robin_gradients", "parameter_alignment", "zero_hpz_partition_size", "zero_quantized_weights",
    "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "memory_efficient_linear",
    "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
    "save_muon_momentum_buffer_in_memory", "leaf_module", "mics_shard_size", "mics_hierarchical_params_gather",
})
OFFLOAD_PARAM_KEYS = frozenset({"device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory"})
OFFLOAD_OPTIMIZER_KEYS = frozenset({"device", "nvme_path", "buffer_count", "pin_memory", "pipeline",
                                    "pipeline_read", "pipeline_write", "fast_init", "ratio", "super_offload",
                                    "cpuadam_cores_perc"})
FP16_KEYS = frozenset({"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
                       "hysteresis", "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads"})
BF16_KEYS = frozenset({"enabled", "immediate_grad_update", "check_grad_overflow", "bf16_master_weights_and_grads",
                       "bf16_optimizer_states"})
ACTIVATION_CHECKPOINTING_KEYS = frozenset({"partition_activations", "number_checkpoints",
                                           "contiguous_memory_optimization", "synchronize_checkpoint_boundary",
                                           "profile", "cpu_checkpointing"})
AUTOTUNING_KEYS = frozenset({"enabled", "fast", "results_dir", "exps_dir", "overwrite", "start_profile_step",
                             "end_profile_step", "metric_path", "metric", "tuner_type", "tuner_early_stopping",
                             "tuner_num_trials", "arg_mappings", "max_train_batch_size", "min_train_batch_size",
                             "max_train_micro_batch_size_per_gpu", "min_train_micro_batch_size_per_gpu",
                             "num_tuning_micro_batch_sizes", "mp_size", "model_info", "model_info_path"})
TOP_LEVEL_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
    "fp16", "bf16", "amp", "zero_optimization", "activation_checkpointing", "autotuning", "gradient_clipping",
    "prescale_gradients", "gradient_predivide_factor", "steps_per_print", "wall_clock_breakdown",
    "memory_breakdown", "dump_state", "flops_profiler", "comms_logger", "tensorboard", "wandb", "csv_monitor",
    "comet", "elasticity", "data_efficiency", "curriculum_learning", "compression_training", "checkpoint",
    "data_types", "communication_data_type", "seq_parallel_communication_data_type",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "sparse_attention", "sparse_gradients",
    "pipeline", "aio", "nebula", "eigenvalue", "progressive_layer_drop", "quantize_training", "torch_autocast",
    "disable_allgather", "dataloader_drop_last", "use_data_before_expert_parallelism", "load_universal",
    "use_node_local_storage", "hybrid_engine", "compile", "weight_quantization", "timers", "graph_harvesting",
    "tensor_parallel", "gradient_allreduce_op", "disable_python_gc", "log_level", "expert_parallel",
    "zero_force_ds_cpu_optimizer", "monitor_config", "mp_size",
})

# Keys DeepSpeed 0.19 refuses at start-up, with its reason (runtime/config.py:81-131,
# _REMOVED_TOP_LEVEL_CONFIG_KEYS and _REMOVED_ZERO_CONFIG_KEYS, checked by _reject_removed_config_keys):
# zerotune refuses them before any experiment instead of letting every experiment fail.
REMOVED_ISSUE = "https://github.com/deepspeedai/DeepSpeed/issues/8489"
REMOVED_TOP_LEVEL_KEYS = {
    "nebula": "Nebula checkpointing was removed (checkpoints would silently fall back to torch.save)",
    "compression_training": "the compression library was removed (the model would train unquantized)",
    "amp": "the NVIDIA Apex AMP integration was removed; use fp16, bf16 or torch_autocast",
    "quantize_training": "Mixture-of-Quantization (quantize_training) was removed",
    "sparse_gradients": "sparse embedding-gradient compression was removed (sparse=True embeddings need no flag)",
    "eigenvalue": "eigenvalue-based Mixture-of-Quantization was removed",
    "sparse_attention": "DeepSpeed Sparse Attention was removed",
    "elasticity": "elastic training was removed; set train_batch_size / train_micro_batch_size_per_gpu / "
                  "gradient_accumulation_steps directly",
    "graph_harvesting": "graph harvesting was removed",
    "curriculum_learning": "top-level curriculum_learning was removed; use "
                           "data_efficiency.data_sampling.curriculum_learning",
    "progressive_layer_drop": "Progressive Layer Dropping was removed",
}
REMOVED_ZERO_KEYS = {
    "mics_shard_size": "MiCS ZeRO-3 sharding was removed",
    "mics_hierarchical_params_gather": "MiCS ZeRO-3 sharding was removed",
    "zeropp_loco_param": "LoCo-ZeRO++ was removed; drop the key to keep ZeRO++ quantized gradients",
}
TUNED_ZERO_KEYS = frozenset({
    "stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size", "allgather_partitions",
    "allgather_bucket_size", "overlap_comm", "sub_group_size", "cpu_offload", "prefetch_bucket_size",
    "stage3_prefetch_bucket_size", "param_persistence_threshold", "stage3_param_persistence_threshold",
    "max_live_parameters", "stage3_max_live_parameters", "max_reuse_distance", "stage3_max_reuse_distance"})
"""zero_optimization keys ZeroConfig models and to_ds_config writes (aliases included); the user's other zero
keys, and every offload key but device and pin_memory, are carried in DSConfig.passthrough unchanged."""
