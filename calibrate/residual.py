"""Optional learned residual: gradient-boosted trees on log(measured / predicted) step time.

The analytical model stays the prediction; the residual multiplies its step time by exp(tree output),
clipped to [1/2, 2] so a tree extrapolating outside what it saw cannot take over. It is trained only with at
least MIN_RESIDUAL_MEASUREMENTS finished runs: depth-3 trees with shrinkage need a few samples per leaf, and
below ~20 runs a fit of the ~10 Efficiency parameters already has most of what the data can say.
xgboost (package xgboost-cpu) is used when importable, else lightgbm; the model is kept in the library's
own JSON (xgboost) or text (lightgbm) format, never pickle. Without either library, or without a residual
in the profile, apply_residual returns 1.0 and the analytical model works alone.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import warnings
from typing import Any, Sequence

import numpy as np

from calibrate.measurement import Measurement
from calibrate.profile import CalibrationProfile, ResidualModel
from predictor import DSConfig, Efficiency, Job
from predictor.estimate import estimate
from predictor.memory import DTYPE_BYTES

__all__ = ["FEATURES", "MIN_RESIDUAL_MEASUREMENTS", "residual_features", "residual_library", "train_residual",
           "apply_residual"]

MIN_RESIDUAL_MEASUREMENTS = 20
FEATURES = ("zero_stage", "log_micro_batch", "log_grad_accum", "log_num_params", "log_seq_len", "log_world_size",
            "num_nodes", "precision_bytes", "overlap_comm", "offload_optimizer", "activation_checkpointing",
            "compute_share", "comm_share", "optimizer_share")
_CLIP = 2.0
_ROUNDS = 100
_XGB_PARAMS = {"objective": "reg:squarederror", "max_depth": 3, "eta": 0.1, "min_child_weight": 2, "lambda": 1.0,
               "seed": 0, "nthread": 1}
_LGB_PARAMS = {"objective": "regression", "max_depth": 3, "num_leaves": 7, "learning_rate": 0.1,
               "min_data_in_leaf": 3, "seed": 0, "num_threads": 1, "verbose": -1}


def residual_features(job: Job, cfg: DSConfig, eff: Efficiency) -> dict[str, float]:
    """The named features of one configuration; shares are of the predicted step time."""
    t = estimate(job, cfg, eff).time
    b, step = t.breakdown_s, t.step_s
    return {
        "zero_stage": float(cfg.zero.stage), "log_micro_batch": math.log(cfg.train_micro_batch_size_per_gpu),
        "log_grad_accum": math.log(cfg.gradient_accumulation_steps), "log_num_params": math.log(job.model.num_params),
        "log_seq_len": math.log(job.seq_len), "log_world_size": math.log(job.cluster.world_size),
        "num_nodes": float(job.cluster.num_nodes), "precision_bytes": float(DTYPE_BYTES[cfg.precision]),
        "overlap_comm": float(cfg.zero.overlap_comm),
        "offload_optimizer": float(cfg.zero.offload_optimizer.device != "none"),
        "activation_checkpointing": float(cfg.activation_checkpointing.enabled),
        "compute_share": (b["forward"] + b["backward"] + b["recompute"]) / step,
        "comm_share": (b["exposed_comm"] + b["tensor_parallel_comm"]) / step,
        "optimizer_share": (b["optimizer_step"] + b["offload"]) / step,
    }


def residual_library() -> str | None:
    """'xgboost' or 'lightgbm', whichever is importable first; None when neither is."""
    for name in ("xgboost", "lightgbm"):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


def _train(library: str, x: np.ndarray, y: np.ndarray) -> str:
    if library == "xgboost":
        import xgboost as xgb
        booster = xgb.train(_XGB_PARAMS, xgb.DMatrix(x, label=y, feature_names=list(FEATURES)), _ROUNDS)
        return bytes(booster.save_raw("json")).decode()
    import lightgbm as lgb
    return lgb.train(_LGB_PARAMS, lgb.Dataset(x, y, feature_name=list(FEATURES)), _ROUNDS).model_to_string()


@functools.lru_cache(maxsize=8)
def _booster(library: str, model_text: str) -> Any:
    if library == "xgboost":
        import xgboost as xgb
        booster = xgb.Booster()
        booster.load_model(bytearray(model_text.encode()))
        return booster
    import lightgbm as lgb
    return lgb.Booster(model_str=model_text)


def _predict_log(library: str, model_text: str, x: np.ndarray, names: Sequence[str] = FEATURES) -> np.ndarray:
    booster = _booster(library, model_text)
    if library == "xgboost":
        import xgboost as xgb
        return booster.predict(xgb.DMatrix(x, feature_names=list(names)))
    return booster.predict(x)


def train_residual(measurements: Sequence[Measurement], efficiency: Efficiency,
                   library: str | None = None) -> ResidualModel:
    """A residual fitted to the finished runs against the (already fitted) analytical model."""
    library = library or residual_library()
    if library not in ("xgboost", "lightgbm"):
        raise ValueError("a learned residual needs xgboost or lightgbm: pip install xgboost-cpu (or skip the residual)")
    ok = [m for m in measurements if m.status == "ok" and m.measured_step_s]
    if len(ok) < MIN_RESIDUAL_MEASUREMENTS:
        raise ValueError(f"a learned residual needs at least {MIN_RESIDUAL_MEASUREMENTS} finished runs, got {len(ok)}; "
                         f"measure more or skip the residual")
    rows, predicted = [], []
    for m in ok:
        job = m.job()
        rows.append([residual_features(job, m.config, efficiency)[f] for f in FEATURES])
        predicted.append(estimate(job, m.config, efficiency).time.step_s)
    x, measured = np.array(rows), np.array([m.measured_step_s for m in ok])
    y = np.log(measured / np.array(predicted))
    text = _train(library, x, y)
    corrected = np.array(predicted) * np.exp(np.clip(_predict_log(library, text, x), -math.log(_CLIP), math.log(_CLIP)))
    return ResidualModel(library=library, feature_names=FEATURES, model_text=text, num_measurements=len(ok),
                         step_time_mape_in_sample_before=float(np.mean(np.abs(np.array(predicted) / measured - 1))),
                         step_time_mape_in_sample_after=float(np.mean(np.abs(corrected / measured - 1))))


def apply_residual(profile: CalibrationProfile | None, features: dict[str, float]) -> float:
    """The factor to multiply a predicted step time by: 1.0 without a residual (or without its library)."""
    residual = profile.residual if profile is not None else None
    if residual is None:
        return 1.0
    missing = [f for f in residual.feature_names if f not in features]
    if missing:
        raise ValueError(f"residual features missing: {', '.join(missing)}; compute them with residual_features")
    if importlib.util.find_spec(residual.library) is None:
        warnings.warn(f"profile has a {residual.library} residual but {residual.library} is not installed; "
                      f"using the analytical model alone (pip install xgboost-cpu)", stacklevel=2)
        return 1.0
    x = np.array([[features[f] for f in residual.feature_names]])
    log_factor = float(_predict_log(residual.library, residual.model_text, x, residual.feature_names)[0])
    return math.exp(min(max(log_factor, -math.log(_CLIP)), math.log(_CLIP)))
