"""Peak memory per device of one DeepSpeed training configuration, with a breakdown that sums to it.

A step passes through three phases and the peak is the largest of them (every term is bytes per device):
  forward_backward    states + activations + logits + buckets that reduce during backward (ZeRO 1-3)
                      + ZeRO-3 gathered parameters
  gradient_reduction  states + the flat buffers that all-reduce gradients after backward (ZeRO 0)
  optimizer_step      states + the fp32 gradients the optimizer consumes
Model states follow the ZeRO paper (Rajbhandari et al. 2020, sec. 3 and 5): 2 + 2 + K bytes per
parameter in mixed precision, partitioned over data-parallel ranks by stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from zerotune.predictor.activations import (checkpoint_bytes_per_layer, embedding_activation_bytes, layer_activation_bytes,
                                   logits_bytes)
from zerotune.predictor.dsconfig import DSConfig, optimizer_state_bytes_per_param
from zerotune.predictor.job import Efficiency, Job
from zerotune.predictor.model import ModelSpec, busiest_stage_params
from zerotune.predictor.zero_mechanics import (optimizer_wrapper, STAGE0_ALLREDUCE_BUCKET_ELEMS, grad_bytes_per_param,
                                      transient_fp32_grad_bytes_per_param, zero3_working_set_elems)

__all__ = ["MemoryEstimate", "ModelStates", "estimate_memory", "memory_columns", "model_states", "state_bytes", "TERMS", "PHASES",
           "DTYPE_BYTES", "STAGE0_ALLREDUCE_BUCKET_ELEMS"]

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
FP32_BYTES = 4

TERMS = ("parameters", "gradients", "optimizer_states", "master_gradients", "optimizer_temporaries", "activations",
         "logits", "heap_retained", "comm_buckets", "zero3_gathered", "runtime_reserved", "allocator_slack")
PHASES = ("forward_backward", "gradient_reduction", "optimizer_step")


@dataclass(frozen=True)
class ModelStates:
    """Bytes per device of the model states, and what offload moved to the host (per device)."""

    parameters: float
    gradients: float
    optimizer_states: float
    master_gradients: float
    host_bytes: float
    nvme_bytes: float


@dataclass(frozen=True)
class MemoryEstimate:
    breakdown_bytes: dict[str, float]
    """One entry per TERMS at the peak phase; they sum to total_bytes."""
    peak_phase: str
    phase_totals_bytes: dict[str, float]
    capacity_bytes: float
    host_bytes_per_node: float
    host_capacity_bytes_per_node: float
    nvme_bytes_per_node: float

    @property
    def total_bytes(self) -> float:
        return sum(self.breakdown_bytes.values())

    @property
    def live_bytes(self) -> float:
        """What torch.cuda.max_memory_allocated measures: the peak less the runtime's reserve and the allocator's
        slack (the caching allocator's reserve above allocation is not allocated memory)."""
        b = self.breakdown_bytes
        return self.total_bytes - b["runtime_reserved"] - b["allocator_slack"]

    @property
    def headroom_bytes(self) -> float:
        return self.capacity_bytes - self.total_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes and self.host_bytes_per_node <= self.host_capacity_bytes_per_node


def _check(job: Job, cfg: DSConfig) -> None:
    z = cfg.zero
    if z.offload_optimizer.device != "none" and z.stage == 0:
        raise ValueError("zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3; raise zero_optimization.stage")
    if z.offload_param.device != "none" and z.stage != 3:
        raise ValueError("zero_optimization.offload_param needs ZeRO stage 3; set zero_optimization.stage to 3 "
                         "or remove offload_param")
    hw = job.cluster.hardware
    if not hw.supports(cfg.precision):
        supported = ", ".join(p for p in ("fp16", "bf16", "fp32") if hw.supports(p))  # type: ignore[arg-type]
        raise ValueError(f"{hw.name} has no {cfg.precision} support; use --precision one of {supported}")
    if job.cluster.world_size % cfg.model_parallel_size:
        raise ValueError(f"mp_size {cfg.mp_size} x pp_size {cfg.pp_size} does not divide the "
                         f"{job.cluster.world_size} GPUs")
    if cfg.pp_size > 1 and cfg.zero.stage > 1:
        raise ValueError(f"DeepSpeed's pipeline engine runs ZeRO stage 0 or 1, not {cfg.zero.stage}; "
                         f"set zero_optimization.stage to 0 or 1, or drop pipeline.stages")
    if job.model.num_layers < cfg.pp_size:
        raise ValueError(f"pipeline stages {cfg.pp_size} exceed {job.model.name}'s {job.model.num_layers} layers; "
                         f"use at most one stage per layer")
    if job.model.distinct_layers and cfg.pp_size > 1:
        raise ValueError(f"{job.model.name}'s {job.model.num_layers} blocks share the weights of "
                         f"{job.model.distinct_layers}, which pipeline stages cannot split; drop pipeline.stages")
    if cfg.train_micro_batch_size_per_gpu < 1 or cfg.gradient_accumulation_steps < 1:
        raise ValueError("train_micro_batch_size_per_gpu and gradient_accumulation_steps must be at least 1")


def _persistent_elems(job: Job, cfg: DSConfig) -> int:
    """ZeRO-3 keeps tensors at or below stage3_param_persistence_threshold whole on every rank."""
    return _small_tensor_elems(job.model, cfg.zero.stage3_param_persistence_threshold_elems)


@lru_cache(maxsize=256)
def _small_tensor_elems(model: ModelSpec, threshold: int) -> int:
    return sum(t.num_elems for t in model.tensors() if t.num_elems <= threshold)


def model_states(job: Job, cfg: DSConfig) -> ModelStates:
    """Model states of a job's model on its busiest pipeline stage (busiest_stage_params): see state_bytes."""
    persistent = _persistent_elems(job, cfg) if cfg.zero.stage == 3 else 0
    params, trained = busiest_stage_params(job.model, cfg.pp_size)
    return state_bytes(params, job.cluster.world_size, cfg, persistent, trained)


def state_bytes(num_params: float, world_size: int, cfg: DSConfig, persistent_elems: float = 0,
                num_trainable_params: float | None = None) -> ModelStates:
    """Parameters, gradients and optimizer states per device (ZeRO paper sec. 5.1, eqs. for P_os, P_g, P_p).

    DeepSpeed's ZeRO optimizers keep an fp32 partition of the parameters even in fp32 training
    (stage_1_and_2.py clones single_partition_of_fp32_groups), so the master copy exists whenever ZeRO
    is on or the model is 16-bit. master_gradients are the fp32 gradients alive at the optimizer step
    (zero_mechanics.transient_fp32_grad_bytes_per_param): 4 per partitioned parameter under ZeRO, the 4 of
    DeepSpeed's 18 bytes in estimate_zero2_model_states_mem_needs (2 + 4 + 4 + 8), but 8 per parameter under
    FP16_Optimizer (16-bit without ZeRO), which casts every gradient and flattens the casts. BF16_Optimizer
    keeps an fp32 gradient buffer of the whole model beside the bf16 gradients (grad_bytes_per_param).
    Gradients, master copies and optimizer states exist for trainable parameters only (ModelSpec.frozen_layer_params);
    every parameter holds its weight.
    """
    z, p = cfg.zero, DTYPE_BYTES[cfg.precision]
    n_dp = cfg.dp_size(world_size)
    psi = num_params / cfg.model_parallel_size  # a pipeline stage holds its share of the layers
    trained = (num_params if num_trainable_params is None else num_trainable_params) / cfg.model_parallel_size
    shard_os = n_dp if z.stage >= 1 else 1
    shard_g = n_dp if z.stage >= 2 else 1
    master = FP32_BYTES if (cfg.precision != "fp32" or z.stage >= 1) else 0
    optimizer = (optimizer_state_bytes_per_param(cfg) + master) * trained / shard_os
    master_grads = transient_fp32_grad_bytes_per_param(cfg) * trained / shard_os
    grads = grad_bytes_per_param(cfg) * trained / shard_g
    params = p * psi
    host = nvme = 0.0
    if z.stage == 3:
        persistent = persistent_elems / cfg.model_parallel_size
        partition = p * (psi - persistent) / n_dp
        params = p * persistent + (0.0 if z.offload_param.device != "none" else partition)
        if z.offload_param.device == "cpu":
            host += partition
        elif z.offload_param.device == "nvme":
            nvme += partition
    if z.offload_optimizer.device != "none":
        # The optimizer and its fp32 gradients live on the host; with partitioned gradients (stage >= 2)
        # each reduced bucket goes straight to the host's fp32 gradient buffer (DeepSpeed's estimator:
        # 2 bytes per parameter on the device, 16 per partitioned parameter on the host).
        moved = optimizer + FP32_BYTES * trained / shard_os  # the fp32 gradient partition on the host
        grads = grads if z.stage < 2 else 0.0
        if z.offload_optimizer.device == "cpu":
            host += moved
        else:
            nvme += moved
        optimizer = master_grads = 0.0
    return ModelStates(params, grads, optimizer, master_grads, host, nvme)


def _activations(job: Job, cfg: DSConfig) -> tuple[float, float]:
    """(activations, logits) bytes per device for one micro-batch at the start of backward."""
    m, b, s = job.model, cfg.train_micro_batch_size_per_gpu, job.seq_len
    d, tp = DTYPE_BYTES[cfg.precision], cfg.mp_size
    ckpt = cfg.activation_checkpointing
    one_layer = layer_activation_bytes(m, b, s, d, tp)
    # A pipeline stage holds num_layers / pp blocks, and under 1F1B the first stage keeps pp micro-batches in
    # flight (Narayanan et al. 2021, sec. 2.2.1), so it stores the whole model's worth (Korthikanti et al. 2022,
    # sec. 4.2.3). Charged as if gradient accumulation had at least pp steps, as 1F1B needs to fill the pipe.
    layers = cfg.stage_layers(m.num_layers) * cfg.pp_size
    if ckpt.enabled:
        # Checkpoints of every block, plus one block recomputed in full during its backward.
        checkpoints = layers * checkpoint_bytes_per_layer(m, b, s, d)
        if ckpt.partition_activations:
            checkpoints /= tp
        if ckpt.cpu_checkpointing:
            checkpoints = 0.0
        blocks = checkpoints + one_layer
    else:
        blocks = layers * one_layer
    acts = blocks + embedding_activation_bytes(m, b, s, d)
    return acts, logits_bytes(m, b, s, d, tp) if m.head == "lm" else 0.0  # a pooler or no head: no vocabulary logits


def _stage3_gathered(job: Job, cfg: DSConfig) -> float:
    """ZeRO-3's gathered parameters at the forward / backward turn (zero_mechanics.zero3_working_set_elems: what
    stage3_max_reuse_distance keeps gathered, at least the module computing plus the prefetch in flight), and
    the largest module's full gradient before it is reduced. With one data-parallel rank nothing is gathered:
    the partition is the whole tensor (partition_parameters.py:1559-1560, _no_gather_coalesced).
    DeepSpeed's own estimator charges 4 bytes x largest layer for the same thing."""
    m = job.model
    largest = max([m.largest_layer_params] + [t.num_elems for t in m.embedding_tensors() + m.head_tensors()])
    largest /= cfg.mp_size
    gradient = largest * DTYPE_BYTES[cfg.grad_precision]
    if cfg.dp_size(job.cluster.world_size) == 1:
        return gradient
    return zero3_working_set_elems(m, cfg) / cfg.mp_size * DTYPE_BYTES[cfg.precision] + gradient


def _buckets(job: Job, cfg: DSConfig) -> tuple[float, float]:
    """(during backward, after backward) bytes of gradient-reduction buffers.

    ZeRO 1-3 reduce during backward. With contiguous_gradients DeepSpeed preallocates whole
    reduce_bucket_size-element buffers whatever the model size, two with overlap_comm in stages 1-2
    (stage_1_and_2.py setup_buckets, stage3.py ipg_buckets); without it each bucket is flattened on the fly
    (at most the model). Stage 0 flattens gradients in 5e8-element buckets after backward
    (engine.allreduce_gradients). allgather_bucket_size costs no memory: the updated partitions are
    gathered in place (runtime/utils.py all_gather_dp_groups); it only sets how many calls are made.
    """
    z, g = cfg.zero, DTYPE_BYTES[cfg.grad_precision]
    psi = busiest_stage_params(job.model, cfg.pp_size)[1] / cfg.model_parallel_size  # frozen: no gradient
    if cfg.dp_size(job.cluster.world_size) == 1 and z.stage == 0:
        return 0.0, 0.0  # one rank: nothing to reduce
    if z.stage == 0:
        return 0.0, min(psi, STAGE0_ALLREDUCE_BUCKET_ELEMS) * g
    # A CPU rank's peak resident memory counts only pages written: a preallocated bucket costs what fills it.
    preallocated = z.contiguous_gradients and job.cluster.hardware.kind != "cpu"
    elems = z.reduce_bucket_size_elems if preallocated else min(psi, z.reduce_bucket_size_elems)
    copies = 2 if z.overlap_comm and z.stage < 3 and z.contiguous_gradients else 1
    return elems * g * copies, 0.0


def _buckets_beyond_logits(logits: Any, buckets: float, cfg: DSConfig) -> Any:
    """The part of the backward buckets that adds to the forward / backward peak. Stages 1-2 allocate their IPG
    buckets at the first gradient hook of every backward and drop them after the step (stage_1_and_2.py:2287
    process_gradients -> setup_buckets:3256-3280), once the loss's backward has freed the logits: only what
    they exceed the logits by adds. Stage 3 allocates its bucket once, at start-up (stage3.py:780-784)."""
    if cfg.zero.stage in (1, 2):
        return np.maximum(buckets - logits, 0.0)
    return buckets + 0 * logits


def _phases(job: Job, cfg: DSConfig) -> tuple[dict[str, dict[str, float]], ModelStates]:
    """The live terms of each phase (before allocator slack and runtime reserve), and the model states."""
    _check(job, cfg)
    states = model_states(job, cfg)
    acts, logits = _activations(job, cfg)
    during_bwd, after_bwd = _buckets(job, cfg)
    gathered = _stage3_gathered(job, cfg) if cfg.zero.stage == 3 else 0.0
    base = {"parameters": states.parameters, "gradients": states.gradients,
            "optimizer_states": states.optimizer_states}
    retained = acts * job.cluster.hardware.heap_retained_activation_fraction
    phases = {
        "forward_backward": {**base, "gradients": _gradients_at_turn(cfg, states), "activations": acts,
                             "logits": logits, "heap_retained": retained,
                             "comm_buckets": float(_buckets_beyond_logits(logits, during_bwd, cfg)),
                             "zero3_gathered": gathered},
        "gradient_reduction": {**base, "comm_buckets": after_bwd},
        "optimizer_step": {**base, "gradients": _gradients_in_step(cfg, states),
                           "master_gradients": states.master_gradients,
                           "optimizer_temporaries": _foreach_adam_bytes(job, cfg)},
    }
    return phases, states


def _gradients_at_turn(cfg: DSConfig, states: ModelStates) -> float:
    """Gradient bytes alive where forward turns into backward (the activations' and logits' peak). Below stage 3,
    with one micro-step per step, none yet: autograd creates each .grad as backward reaches it, and the step
    before dropped them (the engine's zero_grad sets them to None, FP16_UnfusedOptimizer / ZeRO-1/2 zero_grad with
    set_to_none, fp16/unfused_optimizer.py:110-119, stage_1_and_2.py:2613-2622; ZeRO-2's gradient partition is
    released after the step, _release_ipg_buffers :922-930). With accumulation the previous micro-steps' gradients
    are there; BF16_Optimizer's fp32 accumulation buffer lives from start-up (bf16_optimizer.py:191); ZeRO-3
    partitions are kept. Measured on one H200 (data/measurements/gpu_grid): stages 0-2 peak at the same bytes."""
    if cfg.zero.stage == 3 or cfg.gradient_accumulation_steps > 1 or optimizer_wrapper(cfg) == "bf16":
        return states.gradients
    return 0.0


def _gradients_in_step(cfg: DSConfig, states: ModelStates) -> float:
    """Gradient bytes alive beside the fp32 master gradients in the optimizer step. ZeRO-1/2 flattens its
    partition's 16-bit gradients, casts them to the fp32 master gradient and frees the 16-bit ones before Adam
    runs (stage_1_and_2.py:3114-3128, then _optimizer_step at :3138), so only the master gradients remain (the
    cast's moment holds the 16-bit flat copy, the gradients and the fp32 copy: 8 bytes a parameter, what the
    master gradients and Adam's temporaries take after it). Measured on one H200: GPT-2 XL and Llama-3.2-1B at
    micro-batch 1, where the step is the peak, 2.9 and 2.2 GiB (their bf16 gradients) below a count with them."""
    z = cfg.zero
    if z.stage in (1, 2) and z.offload_optimizer.device == "none" and optimizer_wrapper(cfg) == "zero" \
            and cfg.precision != "fp32":
        return 0.0
    return states.gradients


def _foreach_adam_bytes(job: Job, cfg: DSConfig) -> float:
    """torch's unfused AdamW on an accelerator runs for-each (torch/optim/optimizer.py _default_to_fused_or_foreach)
    and _multi_tensor_adam's exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs) is a new fp32 copy of every second
    moment it updates, alive until the step's addcdiv (torch/optim/adam.py); on the CPU it runs per tensor and the
    temporary is one tensor's. DeepSpeed's FusedAdam and torch's fused AdamW allocate none."""
    offloaded = cfg.zero.offload_optimizer.device != "none"  # the host's CPU Adam steps it
    if cfg.optimizer_impl != "torch" or job.cluster.hardware.kind == "cpu" or offloaded:
        return 0.0
    shard = cfg.dp_size(job.cluster.world_size) if cfg.zero.stage >= 1 else 1
    return FP32_BYTES * busiest_stage_params(job.model, cfg.pp_size)[1] / cfg.model_parallel_size / shard


def _reserved_bytes(job: Job, eff: Efficiency) -> float:
    hw = job.cluster.hardware
    return hw.runtime_reserved_bytes if eff.runtime_reserved_bytes is None else eff.runtime_reserved_bytes


def _host_checkpoint_bytes(job: Job, cfg: DSConfig, micro_batch: Any) -> Any:
    """cpu_checkpointing moves every block's checkpoint to host memory."""
    ckpt = cfg.activation_checkpointing
    if not (ckpt.cpu_checkpointing and ckpt.enabled):
        return 0.0
    return micro_batch * job.model.num_layers * checkpoint_bytes_per_layer(job.model, 1, job.seq_len,
                                                                           DTYPE_BYTES[cfg.precision])


def _node_host_bytes(job: Job, device_bytes: Any, host_bytes: Any) -> Any:
    """Host memory of one node: every rank's offloaded states and CPU checkpoints, plus, on the CPU accelerator,
    every rank's "device" memory, which is the same RAM (DeepSpeed 0.19 accelerator/cpu_accelerator.py
    total_memory() is psutil.virtual_memory().total, the whole host, for each rank): two ranks of 20 GiB each do
    not fit in 24 GiB (seen: the kernel's OOM killer took a rank at 11.8 GiB resident, the other as large)."""
    per_node = job.cluster.num_gpus_per_node
    shared = device_bytes if job.cluster.hardware.kind == "cpu" else 0.0
    return (host_bytes + shared) * per_node


def estimate_memory(job: Job, cfg: DSConfig, eff: Efficiency = Efficiency()) -> MemoryEstimate:
    """Peak bytes per device for one configuration, with the breakdown at the peak phase."""
    phases, states = _phases(job, cfg)
    peak_phase = max(PHASES, key=lambda name: sum(phases[name].values()))
    reserved = _reserved_bytes(job, eff)
    totals = {name: sum(terms.values()) * (1 + eff.allocator_slack_fraction) + reserved
              for name, terms in phases.items()}
    breakdown = {term: 0.0 for term in TERMS}
    breakdown.update(phases[peak_phase])
    breakdown["runtime_reserved"] = reserved
    breakdown["allocator_slack"] = sum(phases[peak_phase].values()) * eff.allocator_slack_fraction
    host = states.host_bytes + _host_checkpoint_bytes(job, cfg, cfg.train_micro_batch_size_per_gpu)
    per_node = job.cluster.num_gpus_per_node
    hw = job.cluster.hardware
    host_node = _node_host_bytes(job, max(totals.values()), host)
    return MemoryEstimate(breakdown_bytes=breakdown, peak_phase=peak_phase, phase_totals_bytes=totals,
                          capacity_bytes=hw.memory_bytes, host_bytes_per_node=host_node,
                          host_capacity_bytes_per_node=hw.host_memory_bytes,
                          nvme_bytes_per_node=states.nvme_bytes * per_node)


def memory_columns(job: Job, cfg: DSConfig, eff: Efficiency, micro_batch: np.ndarray,
                   grad_accum: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(peak device bytes, host bytes per node) of `cfg` at each micro-batch size in an array (and accumulation,
    `grad_accum`, else cfg's): the terms of estimate_memory, with activations and logits scaled from one sample
    (both are linear in the micro-batch), the buckets that wait for the logits to go (_buckets_beyond_logits)
    recomputed from them, and the gradients alive at the forward / backward turn as accumulation sets them."""
    phases, states = _phases(job, cfg.replace(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1))
    fb = phases["forward_backward"]
    per_sample = fb["activations"] + fb["heap_retained"]
    accumulating = cfg.replace(gradient_accumulation_steps=2)
    gas = np.full_like(micro_batch, cfg.gradient_accumulation_steps) if grad_accum is None else grad_accum
    fixed = (sum(fb.values()) - per_sample - fb["logits"] - fb["comm_buckets"]
             + np.where(gas > 1, _gradients_at_turn(accumulating, states) - fb["gradients"], 0.0))
    logits = micro_batch * fb["logits"]
    forward_backward = (fixed + micro_batch * per_sample + logits
                        + _buckets_beyond_logits(logits, _buckets(job, cfg)[0], cfg))
    others = max(sum(phases[name].values()) for name in PHASES if name != "forward_backward")
    live = np.maximum(forward_backward, others)
    total = live * (1 + eff.allocator_slack_fraction) + _reserved_bytes(job, eff)
    host = _node_host_bytes(job, total, states.host_bytes + _host_checkpoint_bytes(job, cfg, micro_batch))
    return total, host + 0 * micro_batch
