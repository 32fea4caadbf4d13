"""The `predict` verb's planning: one configuration, the ranked space, and what-if sweeps over cluster sizes
and GPUs. Pure prediction: nothing here runs anything."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable

from zerotune.predictor import ClusterSpec, Efficiency, Estimate, Job, estimate, load_hardware, load_model, parse_ds_config
from zerotune.predictor.rank import Metric, Ranking, Uncertainty, rank
from zerotune.predictor.space import explorable_on, space_from_ds_config
from zerotune.validate.report import WhatIf

__all__ = ["Plan", "build_job", "check_parallelism", "single", "ranking", "best", "scaling_sweep", "hardware_sweep", "DEFAULT_MAX_SEQ_LEN"]

DEFAULT_MAX_SEQ_LEN = 2048


@dataclass(frozen=True)
class Plan:
    """How to predict: the model parameters (a profile's or the defaults) and how to rank."""

    efficiency: Efficiency = Efficiency()
    uncertainty: Uncertainty = Uncertainty()
    metric: Metric = "throughput"
    headroom_bytes: float = 0.0
    explore: tuple[str, ...] = ("offload", "checkpointing")
    top: int = 10


def build_job(model: str, hardware: str, num_nodes: int, num_gpus: int, seq_len: int | None,
              attention: str | None = None) -> Job:
    spec = load_model(model)
    if attention is not None:
        spec = dataclasses.replace(spec, attention=attention)
    cluster = ClusterSpec(load_hardware(hardware), num_nodes, num_gpus)
    return Job(spec, cluster, seq_len or min(spec.max_position_embeddings, DEFAULT_MAX_SEQ_LEN))


def check_parallelism(job: Job, doc: dict[str, Any]) -> None:
    """Tensor parallelism splits attention heads (and key/value heads) across ranks, so mp_size must divide them
    (Megatron-LM's TP checks num_attention_heads % tensor_model_parallel_size == 0)."""
    parallel = {k: doc[k] for k in ("autotuning", "pipeline") if isinstance(doc.get(k), dict)}
    cfg = parse_ds_config(parallel, world_size=job.cluster.world_size)
    model = job.model
    for heads, what in ((model.num_heads, "attention heads"), (model.num_kv_heads, "key/value heads")):
        if heads % cfg.mp_size:
            divisors = [d for d in range(1, heads + 1) if heads % d == 0 and d <= job.cluster.world_size]
            raise ValueError(f"--mp_size (autotuning.mp_size) {cfg.mp_size} does not divide {model.name}'s {heads} "
                             f"{what}; use one of {', '.join(map(str, divisors))}")


def single(job: Job, doc: dict[str, Any], plan: Plan) -> Estimate:
    cfg = parse_ds_config(doc, world_size=job.cluster.world_size, hidden_size=job.model.hidden_size)
    return estimate(job, cfg, plan.efficiency)


def ranking(job: Job, doc: dict[str, Any], plan: Plan, top: int | None = None) -> Ranking:
    space = space_from_ds_config(doc, world_size=job.cluster.world_size, hidden_size=job.model.hidden_size,
                                 explore=explorable_on(plan.explore, job.cluster.hardware.kind))
    return rank(job, space, plan.efficiency, plan.metric, plan.top if top is None else top, plan.headroom_bytes,
                plan.uncertainty)


def best(job: Job, doc: dict[str, Any], plan: Plan, ranked: bool) -> Estimate | None:
    """The ranked space's best configuration, or the given one; None when it does not fit."""
    if ranked:
        entries = ranking(job, doc, plan, top=1).entries
        return entries[0].estimate if entries else None
    est = single(job, doc, plan)
    return est if est.memory.fits else None


def scaling_sweep(jobs: Iterable[tuple[str, Job]], doc: dict[str, Any], plan: Plan, ranked: bool) -> list[WhatIf]:
    """Throughput and scaling efficiency (throughput per GPU over the first size's) at each cluster size."""
    points: list[WhatIf] = []
    base: float | None = None
    for label, job in jobs:
        est = best(job, doc, plan, ranked)
        efficiency = None
        if est is not None:
            per_gpu = est.throughput_samples_per_s / job.cluster.world_size
            base = base if base is not None else per_gpu
            efficiency = per_gpu / base
        points.append(WhatIf(label, est, efficiency))
    return points


def hardware_sweep(jobs: Iterable[tuple[str, Job, Plan]], doc: dict[str, Any], ranked: bool) -> list[WhatIf]:
    """The same job on each GPU; a GPU that cannot run it at all (no such precision) says why in its row."""
    points = []
    for label, job, plan in jobs:
        try:
            points.append(WhatIf(label, best(job, doc, plan, ranked)))
        except ValueError as exc:
            points.append(WhatIf(label, None, note=str(exc)))
    return points
