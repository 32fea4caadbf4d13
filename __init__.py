"""zerotune: predict the best DeepSpeed training configuration before spending GPU-hours on it.

The notebook API: what a user planning a run calls first.

    import zerotune
    est = zerotune.predict("gpt2-large", "v100-32gb", num_gpus=16,
                           ds_config={"train_micro_batch_size_per_gpu": 3, "fp16": {"enabled": True},
                                      "zero_optimization": {"stage": 1}})
    est.memory.fits, est.time.step_s
    best = zerotune.rank("gpt2-large", "v100-32gb", num_gpus=16, ds_config={"fp16": {"enabled": True}})
    best.entries[0].estimate.config

The command line (`zerotune predict | calibrate | tune`) is zerotune.cli; the packages are zerotune.predictor
(the model, pure Python), zerotune.calibrate (measuring and fitting) and zerotune.validate (real experiments).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from zerotune.predictor import (ClusterSpec, DSConfig, Efficiency, Estimate, HardwareSpec, Job, ModelSpec,
                                list_hardware, list_models, load_hardware, load_model, parse_ds_config)
from zerotune.predictor.rank import Metric, Ranking
from zerotune.validate import plan as _plan

__all__ = ["job", "predict", "rank", "load_profile_efficiency", "list_models", "list_hardware", "load_model",
           "load_hardware", "parse_ds_config", "ClusterSpec", "DSConfig", "Efficiency", "Estimate", "HardwareSpec",
           "Job", "ModelSpec", "Ranking", "__version__"]

__version__ = "0.1.0"


def job(model: str, hardware: str, num_gpus: int, num_nodes: int = 1, seq_len: int | None = None) -> Job:
    """A training job from catalog names (or a Hugging Face config.json / hardware YAML path); the sequence
    length defaults to the model's positions, at most 2048, as `zerotune predict` does."""
    return _plan.build_job(model, hardware, num_nodes, num_gpus, seq_len)


def load_profile_efficiency(path: str | Path) -> Efficiency:
    """The fitted model parameters of a calibration profile written by `zerotune calibrate`."""
    from zerotune.calibrate.profiles import load_profile  # calibrate is not needed for uncalibrated predictions
    return load_profile(Path(path)).efficiency


def predict(model: str, hardware: str, num_gpus: int, ds_config: Mapping[str, Any] | None = None, *,
            num_nodes: int = 1, seq_len: int | None = None, efficiency: Efficiency = Efficiency()) -> Estimate:
    """Memory and step time of one configuration (a ds_config dict, DeepSpeed's keys)."""
    plan = _plan.Plan(efficiency=efficiency)
    return _plan.single(job(model, hardware, num_gpus, num_nodes, seq_len), dict(ds_config or {}), plan)


def rank(model: str, hardware: str, num_gpus: int, ds_config: Mapping[str, Any] | None = None, *,
         num_nodes: int = 1, seq_len: int | None = None, metric: Metric = "throughput", top: int = 10,
         efficiency: Efficiency = Efficiency()) -> Ranking:
    """The whole tuning space the ds_config describes (as `deepspeed --autotuning` reads it), best first."""
    plan = _plan.Plan(efficiency=efficiency, metric=metric, top=top)
    return _plan.ranking(job(model, hardware, num_gpus, num_nodes, seq_len), dict(ds_config or {}), plan)
