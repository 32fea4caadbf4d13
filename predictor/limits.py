"""The largest values zerotune accepts for the sizes it enumerates or multiplies, one table for every boundary
(command-line flags, ds_config keys, measurement tables). Each is far above any real training run, so a value
beyond it is a typo or the wrong unit; below it, the arrays zerotune builds (one entry per micro-batch size,
per layer's tensors) stay within memory and int64 arithmetic does not overflow."""

__all__ = ["MAX_MICRO_BATCH", "MAX_GRAD_ACCUM", "MAX_PARALLEL", "MAX_GPUS_PER_NODE", "MAX_NODES", "MAX_SEQ_LEN"]

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
