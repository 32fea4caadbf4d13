"""A training job: what is trained (model, sequence length) on what (cluster)."""

from __future__ import annotations

from dataclasses import dataclass

from predictor.hardware import ClusterSpec
from predictor.model import ModelSpec

__all__ = ["Job", "Efficiency"]


@dataclass(frozen=True)
class Job:
    model: ModelSpec
    cluster: ClusterSpec
    seq_len: int

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"--seq_len must be at least 1, got {self.seq_len}")
        if self.model.position_embedding == "learned" and self.seq_len > self.model.max_position_embeddings:
            raise ValueError(f"--seq_len {self.seq_len} exceeds {self.model.name}'s "
                             f"max_position_embeddings {self.model.max_position_embeddings}; use at most that")


@dataclass(frozen=True)
class Efficiency:
    """Model parameters that a calibration profile fits to a cluster; these defaults are uncalibrated."""

    allocator_slack_fraction: float = 0.05
    """PyTorch caching-allocator fragmentation on top of live tensors. Uncalibrated default: peak reserved
    runs a few percent above peak allocated in steady-state training (PyTorch CUDA memory notes)."""
    runtime_reserved_bytes: float | None = None
    """Memory outside the allocator (CUDA context, NCCL); None takes the hardware catalog's figure."""
