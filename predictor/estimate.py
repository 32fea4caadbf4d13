"""One configuration's prediction: memory and time together, and the metrics DeepSpeed's autotuner ranks by."""

from __future__ import annotations

from dataclasses import dataclass

from zerotune.predictor.dsconfig import DSConfig
from zerotune.predictor.job import Efficiency, Job
from zerotune.predictor.memory import MemoryEstimate, estimate_memory
from zerotune.predictor.simulate import simulated_time
from zerotune.predictor.step_time import TimeEstimate

__all__ = ["Estimate", "estimate"]


@dataclass(frozen=True)
class Estimate:
    job: Job
    config: DSConfig
    memory: MemoryEstimate
    time: TimeEstimate

    @property
    def samples_per_step(self) -> int:
        """DeepSpeed's train_batch_size: micro-batch x accumulation x data-parallel ranks."""
        cfg = self.config
        return (cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps
                * cfg.dp_size(self.job.cluster.world_size))

    @property
    def throughput_samples_per_s(self) -> float:
        """The autotuner's `throughput` metric."""
        return self.samples_per_step / self.time.step_s

    @property
    def latency_ms(self) -> float:
        """The autotuner's `latency` metric: milliseconds per optimizer step (lower is better)."""
        return self.time.step_s * 1e3

    @property
    def flops_per_gpu(self) -> float:
        """The autotuner's `FLOPS` metric: model FLOP/s achieved per GPU."""
        return self.time.model_flops_per_gpu / self.time.step_s

    @property
    def tokens_per_s(self) -> float:
        return self.throughput_samples_per_s * self.job.seq_len

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: achieved model FLOP/s over the precision's dense peak."""
        return self.flops_per_gpu / self.job.cluster.hardware.peak_flops[self.config.precision]


def estimate(job: Job, cfg: DSConfig, eff: Efficiency = Efficiency()) -> Estimate:
    """One configuration: memory, and time with its communication scheduled by the simulation (simulate.py)."""
    return Estimate(job, cfg, estimate_memory(job, cfg, eff), simulated_time(job, cfg, eff))
