"""The tuning space: every configuration `predict --rank` and `tune` weigh, read the way DeepSpeed's autotuner
reads a ds_config (deepspeed/autotuning/autotuner.py, constants.py, DeepSpeed 0.19):

- a list value is the values to try; `zero_optimization.stage` may be a list or "all";
  `train_micro_batch_size_per_gpu` a list (otherwise every size from the autotuning section's
  min_/max_train_micro_batch_size_per_gpu, 1 to 1024 by default, is weighed and the memory model prunes);
- each stage starts from DeepSpeed's default tuning space for it, and the user's own zero_optimization
  values replace the defaults key by key (a scalar pins a knob, a list replaces its values);
- `autotuning.max_train_batch_size` fixes the batch per GPU and derives gradient accumulation per
  micro-batch size (gas = batch per GPU // micro-batch), as DeepSpeed does; a fixed train_batch_size keeps
  the global batch exactly; otherwise gradient_accumulation_steps (an int, or a list: zerotune's extension)
  is used as given.

Departures, each because prediction costs nothing where DeepSpeed pays an experiment:
- `fast` defaults to false here (DeepSpeed: true): the bucket and overlap knobs are weighed unless the user
  sets `"fast": true`, which then leaves them at the user's values or DeepSpeed's runtime defaults
  (not the autotuner's templates, which silently switch contiguous_gradients off);
- a missing `zero_optimization.stage` means every stage (DeepSpeed: stage 0 only);
- stage 3 is tuned on the knobs stage 3 reads (prefetch bucket, persistence threshold) instead of
  allgather_bucket_size / allgather_partitions / reduce_scatter, which only stages 1-2 use, and
  allgather_bucket_size is not tuned at all (DeepSpeed 0.19 gathers in one all_gather_into_tensor);
- optimizer and parameter offload to the CPU, and activation checkpointing, are weighed too unless the user
  set them (their choice is kept) or `explore` leaves them out;
- without max_train_batch_size DeepSpeed fixes the batch per GPU at the largest micro-batch that fits times the
  user's accumulation and runs smaller micro-batches at gas = that batch // micro-batch (autotuner.py
  get_tuning_micro_batch_size_list, run_tuning_micro_batch_sizes); here the user's accumulation stays at every
  micro-batch unless max_train_batch_size or a list asks otherwise. At one batch per GPU the model predicts more,
  smaller micro-steps no faster: the CPU encoder fixture's micro-batch 16 x 2 and 32 x 1 both at 15.8 samples/s
  (measured 16.6-17.0 and 16.1 on 2026-11-29: a cache effect the model does not have).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from zerotune.predictor.ds_json import lax_number, parse_ds_config, resolve_batch
from zerotune.predictor.dsconfig import ActivationCheckpointing, DSConfig
from zerotune.predictor.limits import DS_CONFIG_MAXIMA, MAX_GRAD_ACCUM, MAX_MICRO_BATCH

__all__ = ["SearchSpace", "space_from_ds_config", "DEFAULT_STAGE_KNOBS", "EXPLORABLE", "explorable_on"]

_BUCKETS = (500_000_000, 50_000_000, 1_000_000_000)
# DeepSpeed's DEFAULT_TUNING_SPACE_ZERO_1/2 (autotuning/constants.py) less allgather_bucket_size, which
# DeepSpeed 0.19 ignores wherever the backend has all_gather_into_tensor (NCCL, gloo, HCCL): its 3 values
# would only repeat each experiment. DeepSpeed's runtime default is listed first so that among predictions
# that tie, the ranking keeps the setting a user would get without tuning.
DEFAULT_STAGE_KNOBS: dict[int, dict[str, tuple[Any, ...]]] = {
    0: {},
    1: {"reduce_bucket_size": _BUCKETS},
    2: {"overlap_comm": (False, True), "reduce_scatter": (True, False), "reduce_bucket_size": _BUCKETS,
        "contiguous_gradients": (True, False)},
    3: {"overlap_comm": (True, False), "reduce_bucket_size": _BUCKETS, "contiguous_gradients": (True, False),
        "stage3_prefetch_bucket_size": (50_000_000, 500_000_000),
        "stage3_param_persistence_threshold": (100_000, 1_000_000)},
}
EXPLORABLE = ("offload", "checkpointing")
_STAGE3_ONLY = ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_max_live_parameters",
                 "stage3_max_reuse_distance", "sub_group_size")
_IGNORED_BY_STAGE = {0: ("overlap_comm", "reduce_scatter", "reduce_bucket_size", "allgather_bucket_size",
                         "contiguous_gradients", "allgather_partitions") + _STAGE3_ONLY,
                     1: _STAGE3_ONLY, 2: _STAGE3_ONLY,
                     3: ("allgather_bucket_size", "allgather_partitions", "reduce_scatter")}
_STAGE3_ALIASES = {"prefetch_bucket_size": "stage3_prefetch_bucket_size",
                   "param_persistence_threshold": "stage3_param_persistence_threshold",
                   "max_live_parameters": "stage3_max_live_parameters",
                   "max_reuse_distance": "stage3_max_reuse_distance"}


@dataclass(frozen=True)
class SearchSpace:
    variants: tuple[DSConfig, ...]
    """Every ZeRO section x checkpointing choice, at micro-batch 1 and one accumulation step."""
    micro_batches: tuple[int, ...]
    grad_accums: tuple[int, ...]
    """Accumulation counts to try, when the batch per GPU is not fixed."""
    max_train_batch_size: int | None
    min_train_batch_size: int = 1

    def batch_grid(self, dp_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(micro-batch, accumulation) pairs as two int arrays, within the global batch limits."""
        mbs = np.array(self.micro_batches, dtype=np.int64)
        if self.max_train_batch_size is not None and self.grad_accums == ():
            per_gpu = self.max_train_batch_size // dp_size
            mbs = mbs[mbs <= per_gpu]
            gas = per_gpu // np.maximum(mbs, 1)
        else:
            mbs, gas = (a.ravel() for a in np.meshgrid(mbs, np.array(self.grad_accums, dtype=np.int64)))
        batch = mbs * gas * dp_size
        keep = batch >= self.min_train_batch_size
        if self.max_train_batch_size is not None:
            keep &= batch <= self.max_train_batch_size
        return mbs[keep], gas[keep]

    def num_configs(self, dp_size: int) -> int:
        return len(self.variants) * len(self.batch_grid(dp_size)[0])


def explorable_on(explore: Iterable[str], hardware_kind: str) -> tuple[str, ...]:
    """What of `explore` is worth exploring on this kind of device. Offload moves optimizer state (and parameters)
    from the device's memory to the host's (DeepSpeedZeroOptimizer's cpu_offload, stage_1_and_2.py; stage 3's
    offload_param): where the device is the host CPU both are the same RAM, so an offload variant frees nothing
    and only adds the copies and DeepSpeedCPUAdam's build; it is not explored there (a user's own offload section
    is kept)."""
    return tuple(e for e in explore if not (e == "offload" and hardware_kind == "cpu"))


_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _values(doc: dict[str, Any], key: str, path: str) -> list[Any] | None:
    """A key's values to try: a list as given, a scalar as a one-item list, None when absent or "auto"."""
    value = doc.get(key)
    if value is None or value == "auto":
        return None
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ValueError(f"ds_config {path} is an empty list; give at least one value or remove it")
    return values


def _stages(zero: dict[str, Any]) -> list[int]:
    if zero.get("stage") == "auto":  # _values reads "auto" as absent; a stage is not one of Hugging Face's "auto"s
        raise ValueError("ds_config zero_optimization.stage \"auto\" is not a stage DeepSpeed can run; give 0, 1, 2, "
                         "3, a list of them or \"all\"")
    values = _values(zero, "stage", "zero_optimization.stage") or ["all"]
    stages: set[int] = set()
    for value in values:
        if value == "all":
            stages |= {0, 1, 2, 3}
            continue
        value = lax_number(value)  # DeepSpeed's pydantic config runs "2" and "2.0" as stage 2
        if isinstance(value, bool) or value not in (0, 1, 2, 3):
            raise ValueError(f"ds_config zero_optimization.stage: {value!r} is not a ZeRO stage; use 0, 1, 2, 3, "
                             f"a list of them or \"all\"")
        stages.add(int(value))
    return sorted(stages)


def _positive_ints(values: list[Any], path: str, maximum: int) -> tuple[int, ...]:
    for value in values:
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (isinstance(value, float) and not value.is_integer()) or not 1 <= value <= maximum):
            raise ValueError(f"ds_config {path}: {value!r} is not a whole number from 1 to {maximum:,}; "
                             f"list such numbers")
    return tuple(sorted({int(v) for v in values}))


def _zero_sections(zero: dict[str, Any], stage: int, fast: bool, explore: Iterable[str]) -> list[dict[str, Any]]:
    """Every zero_optimization section to try for one stage: the defaults' lists, replaced by the user's values."""
    user = {_STAGE3_ALIASES.get(k, k): v for k, v in zero.items() if k != "stage"}
    knobs: dict[str, list[Any]] = {} if fast else {k: list(v) for k, v in DEFAULT_STAGE_KNOBS[stage].items()}
    for key, value in user.items():
        if value == []:  # the product of the knobs would be empty, and the space with it
            raise ValueError(f"ds_config zero_optimization.{key} is an empty list; give at least one value or "
                             f"remove it")
        knobs[key] = value if isinstance(value, list) else [value]
    if "offload" in explore and stage >= 1:
        knobs.setdefault("offload_optimizer", [{"device": "none"}, {"device": "cpu"}])
        if stage == 3:
            knobs.setdefault("offload_param", [{"device": "none"}, {"device": "cpu"}])
    for key in _IGNORED_BY_STAGE[stage]:
        if key in knobs:  # a knob this stage never reads: one value, not one variant per value
            knobs[key] = knobs[key][:1]
    if stage < 3:
        knobs.pop("offload_param", None)
    if stage == 0:
        knobs.pop("offload_optimizer", None)
    keys = list(knobs)
    return [{"stage": stage, **dict(zip(keys, combo))} for combo in itertools.product(*knobs.values())]


def space_from_ds_config(doc: dict[str, Any], *, world_size: int, hidden_size: int | None = None,
                         explore: Iterable[str] = EXPLORABLE) -> SearchSpace:
    """The space a ds_config describes (see the module docstring for how it is read)."""
    if not isinstance(doc, dict):
        raise ValueError(f"ds_config must be a JSON object, got {type(doc).__name__}")
    explore = tuple(explore)
    for item in explore:
        if item not in EXPLORABLE:
            raise ValueError(f"unknown exploration {item!r}; use any of {', '.join(EXPLORABLE)} or none")
    zero = doc.get("zero_optimization") or {}
    if not isinstance(zero, dict):
        raise ValueError("ds_config zero_optimization must be an object")
    autotuning = doc.get("autotuning") or {}
    if not isinstance(autotuning, dict):
        raise ValueError(f"ds_config autotuning must be an object, e.g. {{\"metric\": \"throughput\"}}, got "
                         f"{autotuning!r}")
    fast = autotuning.get("fast") is True
    scalar = {k: v for k, v in doc.items() if k not in ("zero_optimization", *_BATCH_KEYS)}
    base = parse_ds_config(scalar, world_size=world_size, hidden_size=hidden_size)
    dp = base.dp_size(world_size)
    given = {k: doc[k] for k in _BATCH_KEYS if doc.get(k) not in (None, "auto") and not isinstance(doc[k], list)}
    for key in given:  # the user's own batch keys are whole numbers, as DeepSpeed's config wants them
        resolve_batch({key: given[key]}, 1)
    if len(given) == len(_BATCH_KEYS):  # and the triple agrees (the space then varies the pair)
        resolve_batch(given, dp)
    checkpointing = [ActivationCheckpointing(enabled=False), ActivationCheckpointing(enabled=True)]
    if "activation_checkpointing" in doc:
        checkpointing = [base.activation_checkpointing]
    elif "checkpointing" not in explore:
        checkpointing = checkpointing[:1]
    variants: dict[tuple[Any, ...], DSConfig] = {}
    stages = _stages(zero)
    if base.pp_size > 1:  # DeepSpeed's pipeline engine supports ZeRO stages 0 and 1 only
        stages = [stage for stage in stages if stage <= 1]
        if not stages:
            raise ValueError("ds_config pipeline.stages > 1 runs ZeRO stage 0 or 1 only; add 0 or 1 to "
                             "zero_optimization.stage")
    for stage in stages:
        for section in _zero_sections(zero, stage, fast, explore):
            cfg = parse_ds_config({**scalar, "zero_optimization": section}, world_size=world_size,
                                  hidden_size=hidden_size)
            for ckpt in checkpointing:
                variants.setdefault((cfg.zero, ckpt), cfg.replace(activation_checkpointing=ckpt))
    at = base.autotuning
    if at.max_train_batch_size is not None and at.min_train_batch_size > at.max_train_batch_size:
        raise ValueError(f"ds_config autotuning.min_train_batch_size {at.min_train_batch_size} is above "
                         f"max_train_batch_size {at.max_train_batch_size}; lower the one or raise the other")
    micro = _values(doc, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu")
    micro_batches = (_positive_ints(micro, "train_micro_batch_size_per_gpu", MAX_MICRO_BATCH) if isinstance(
        doc.get("train_micro_batch_size_per_gpu"), list) else
        tuple(range(at.min_train_micro_batch_size_per_gpu, at.max_train_micro_batch_size_per_gpu + 1)))
    space = SearchSpace(tuple(variants.values()), micro_batches, *_batch_limits(doc, at.max_train_batch_size,
                                                                      at.min_train_batch_size, dp))
    train = doc.get("train_batch_size")
    if isinstance(train, int) and not isinstance(train, bool) and train > 0 and not len(space.batch_grid(dp)[0]):
        raise ValueError(f"ds_config train_batch_size {train} is not micro-batch x accumulation x {dp} data-parallel "
                         f"GPUs for any micro-batch of the space ({micro_batches[0]}-{micro_batches[-1]}); make it a "
                         f"multiple of {dp} or widen train_micro_batch_size_per_gpu")
    return space


def _batch_limits(doc: dict[str, Any], max_train: int | None, min_train: int,
                  dp: int) -> tuple[tuple[int, ...], int | None, int]:
    """(accumulation counts, max and min global batch): a fixed train_batch_size pins the global batch."""
    train = doc.get("train_batch_size")
    if isinstance(train, int) and not isinstance(train, bool) and train > 0:
        if train > DS_CONFIG_MAXIMA["train_batch_size"]:  # the space's int64 arithmetic would overflow
            raise ValueError(f"ds_config train_batch_size {train:g} is above the "
                             f"{DS_CONFIG_MAXIMA['train_batch_size']:,} zerotune accepts; use a smaller value")
        return (), train, train
    if max_train:
        return (), int(max_train), min_train
    gas = _values(doc, "gradient_accumulation_steps", "gradient_accumulation_steps") or [1]
    return _positive_ints(gas, "gradient_accumulation_steps", MAX_GRAD_ACCUM), None, min_train
