"""The largest values zerotune accepts for the sizes it enumerates or multiplies, one table for every boundary
(command-line flags, ds_config keys, measurement tables). Each is far above any real training run, so a value
beyond it is a typo or the wrong unit; below it, the arrays zerotune builds (one entry per micro-batch size,
per layer's tensors) stay within memory and int64 arithmetic does not overflow."""

__all__ = ["MAX_MICRO_BATCH", "MAX_GRAD_ACCUM", "MAX_PARALLEL", "MAX_GPUS_PER_NODE", "MAX_NODES", "MAX_SEQ_LEN",
           "DS_CONFIG_MAXIMA", "DS_CONFIG_MINIMA"]

MAX_MICRO_BATCH = 65_536
"""train_micro_batch_size_per_gpu: 64x DeepSpeed's autotuning default maximum (1024). The tuning space lists
every size up to the maximum, so 1e9 would take gigabytes before predicting anything."""
MAX_GRAD_ACCUM = 1_048_576
"""gradient_accumulation_steps (2^20)."""
MAX_PARALLEL = 4096
"""Tensor- or pipeline-parallel degree."""
MAX_GPUS_PER_NODE = 4096
MAX_NODES = 100_000
MAX_SEQ_LEN = 2**24
"""Tokens per sample: 16M, above the longest published context windows (10M)."""

_BATCH = MAX_MICRO_BATCH * MAX_GRAD_ACCUM
DS_CONFIG_MAXIMA: dict[str, int] = {
    "train_micro_batch_size_per_gpu": MAX_MICRO_BATCH, "max_train_micro_batch_size_per_gpu": MAX_MICRO_BATCH,
    "min_train_micro_batch_size_per_gpu": MAX_MICRO_BATCH, "num_tuning_micro_batch_sizes": MAX_MICRO_BATCH,
    "gradient_accumulation_steps": MAX_GRAD_ACCUM, "mp_size": MAX_PARALLEL, "stages": MAX_PARALLEL,
    "start_profile_step": 100_000, "end_profile_step": 100_000, "tuner_num_trials": 100_000,
    "tuner_early_stopping": 100_000, "train_batch_size": _BATCH, "min_train_batch_size": _BATCH,
    "max_train_batch_size": _BATCH,
}
"""Per ds_config key (the last part of its path): the largest value accepted. Profile steps and trials are run,
not enumerated, but 1e12 steps is a typo all the same."""
DS_CONFIG_MINIMA: dict[str, int] = {
    "mp_size": 1, "tuner_num_trials": 1, "max_train_micro_batch_size_per_gpu": 1,
    "min_train_micro_batch_size_per_gpu": 1, "num_tuning_micro_batch_sizes": 1, "max_train_batch_size": 1,
    "min_train_batch_size": 1,
}
"""Per ds_config key: the smallest value accepted where the reader's own minimum is lower (a count of 0 divides
by zero: mp_size 0 was a ZeroDivisionError)."""
