"""zerotune calibrate: measures a cluster (microbenchmarks, real DeepSpeed probe runs) or reads measurements made
elsewhere, and fits the predictor's efficiency parameters into a profile. Importing it needs no torch: the
measuring modules (launch, workload, microbench, probe) import torch and DeepSpeed only when they run."""

from zerotune.calibrate.fit import FitResult, fit, make_profile
from zerotune.calibrate.measurement import Measurement, append_jsonl, from_record, read_jsonl, to_record
from zerotune.calibrate.profiles import CalibrationProfile, default_profile_path, load_profile, save_profile

__all__ = ["CalibrationProfile", "FitResult", "Measurement", "append_jsonl", "default_profile_path", "fit",
           "from_record", "load_profile", "make_profile", "read_jsonl", "save_profile", "to_record"]
