"""zerotune's predictor: analytical memory and step-time model of DeepSpeed ZeRO 0-3. Pure Python, no torch."""

from predictor.catalog import list_hardware, list_models, load_hardware, load_model, model_from_hf_config
from predictor.dsconfig import DSConfig, ZeroConfig, experiment_name, parse_ds_config, to_ds_config
from predictor.hardware import ClusterSpec, HardwareSpec
from predictor.estimate import Estimate, estimate
from predictor.job import Efficiency, Job
from predictor.memory import MemoryEstimate, estimate_memory, model_states
from predictor.model import ModelSpec
from predictor.step_time import TimeEstimate, estimate_time

__all__ = ["ClusterSpec", "DSConfig", "Efficiency", "Estimate", "HardwareSpec", "TimeEstimate", "estimate", "estimate_time", "Job", "MemoryEstimate", "ModelSpec",
           "ZeroConfig", "estimate_memory", "experiment_name", "list_hardware", "list_models", "load_hardware",
           "load_model", "model_from_hf_config", "model_states", "parse_ds_config", "to_ds_config"]
