"""zerotune's predictor: analytical memory and step-time model of DeepSpeed ZeRO 0-3. Pure Python, no torch."""

from zerotune.predictor.catalog import list_hardware, list_models, load_hardware, load_model
from zerotune.predictor.hf_config import model_from_hf_config
from zerotune.predictor.dsconfig import DSConfig, ZeroConfig, experiment_name
from zerotune.predictor.ds_json import parse_ds_config, to_ds_config
from zerotune.predictor.hardware import ClusterSpec, HardwareSpec
from zerotune.predictor.estimate import Estimate, estimate
from zerotune.predictor.job import Efficiency, Job
from zerotune.predictor.memory import MemoryEstimate, estimate_memory, model_states
from zerotune.predictor.model import ModelSpec
from zerotune.predictor.step_time import TimeEstimate, estimate_time

__all__ = ["ClusterSpec", "DSConfig", "Efficiency", "Estimate", "HardwareSpec", "TimeEstimate", "estimate", "estimate_time", "Job", "MemoryEstimate", "ModelSpec",
           "ZeroConfig", "estimate_memory", "experiment_name", "list_hardware", "list_models", "load_hardware",
           "load_model", "model_from_hf_config", "model_states", "parse_ds_config", "to_ds_config"]
