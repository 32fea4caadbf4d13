"""Time of one optimizer step (gradient_accumulation_steps micro-batches), with a breakdown that sums to it.

Communication follows how DeepSpeed schedules each ZeRO stage, per optimizer step with G micro-steps,
N data-parallel ranks, Psi parameters, p / g bytes per parameter and gradient:
  stage 0  all-reduce of Psi*g once, after the last backward, in 5e8-element buckets (not overlapped)
  stage 1  all-reduce of Psi*g per bucket in the last micro-step's backward (DeepSpeed 0.19 all-reduces even
           with reduce_scatter: true), all-gather of Psi*p after the step
  stage 2  the same all-reduce in every micro-step's backward, all-gather of Psi*p after the step
  stage 3  every micro-step: all-gather of the non-persistent parameters in forward, again in backward for
           those forward released, one call per module; reduce-scatter of Psi*g per bucket
(zero_mechanics.py counts the calls and bytes.) DeepSpeed's host overheads per hook, tensor and call
(zero_mechanics.runtime_overhead_s) add to the "overhead" term.
Ring collectives cost (N-1)/N of the bytes per rank (twice for all-reduce) at the ring's bus bandwidth, plus
a latency per ring step per bucket (Thakur et al. 2005; NCCL's bus-bandwidth convention; the links a ring
crosses: links.py).
"""

from __future__ import annotations

from functools import lru_cache
from dataclasses import dataclass
from typing import Union

import numpy as np

from zerotune.predictor.dsconfig import DSConfig
from zerotune.predictor.flops import micro_batch_flops
from zerotune.predictor.job import Efficiency, Job
from zerotune.predictor.links import (Collective, collective_s, data_parallel_link, intra_node_link,
                                      ring_across_nodes)
from zerotune.predictor.memory import DTYPE_BYTES
from zerotune.predictor.model import ModelSpec
from zerotune.predictor.ops import (BACKWARD_OPS_PER_FORWARD, DeviceRates, device_rates, fresh_write_s, layer_times,
                                    outer_times)
from zerotune.predictor.zero_mechanics import (adam_traffic_ratio, backward_hook_host_s, fsdp_units, grad_reduction,
                                              runtime_overhead_s, wrapper_bytes_per_param, zero3_trace)

__all__ = ["TimeEstimate", "Collective", "estimate_time", "step_time_columns", "Batch", "collective_s", "data_parallel_collectives",
           "compute_times", "stage_parts", "StageParts", "data_parallel_link", "intra_node_link", "last_micro_step_exposed",
           "TIME_TERMS", "tensor_parallel_allreduce_s", "CROSS_ENTROPY_ALLREDUCES", "pipeline_stages",
           "optimizer_update_s", "forward_device_host_s"]

TIME_TERMS = ("forward", "backward", "recompute", "pipeline_bubble", "pipeline_p2p", "exposed_comm", "tensor_parallel_comm",
              "optimizer_step", "offload", "overhead")
Batch = Union[int, float, np.ndarray]
"""A micro-batch size or accumulation count: one value, or an array of them evaluated at once (ranking)."""
@dataclass(frozen=True)
class TimeEstimate:
    breakdown_s: dict[str, float]
    """One entry per TIME_TERMS; they sum to step_s."""
    comm_total_s: float
    """All data-parallel communication, hidden or not."""
    model_flops_per_gpu: float
    """Forward + backward FLOPs per GPU per step (what MFU and DeepSpeed's FLOPS metric count)."""

    @property
    def step_s(self) -> float:
        return sum(self.breakdown_s.values())


def data_parallel_collectives(job: Job, cfg: DSConfig, eff: Efficiency | None = None) -> list[Collective]:
    """The collectives each stage issues (zero_mechanics.grad_reduction, zero3_trace), one bucket per call."""
    z, m = cfg.zero, job.model
    psi = m.num_trainable_params / cfg.model_parallel_size  # frozen parameters are neither reduced nor updated
    p, g = DTYPE_BYTES[cfg.precision], DTYPE_BYTES[cfg.grad_precision]
    red = grad_reduction(m, cfg)
    if z.stage == 0:
        return [Collective("all_reduce", psi * g, red.num_calls, "after_backward", False)]
    if z.stage < 3:
        # Averaged by an all-reduce per IPG bucket whatever reduce_scatter says (grad_reduction); the updated
        # partitions of the trainable groups come back in one all_gather_into_tensor wherever the backend has it
        # (runtime/utils.py all_gather_dp_groups), so allgather_bucket_size changes nothing there.
        return [Collective(red.kind, psi * g, red.num_calls, "backward", z.stage == 2),
                Collective("all_gather", psi * p, 1, "after_step", False)]
    # ZeRO-3 gathers what is not persistent, one call per module, in forward, and again in backward only what
    # forward released (stage3_max_reuse_distance).
    trace, tp = zero3_trace(m, cfg), cfg.mp_size
    units = fsdp_units(m, cfg, eff)
    calls_f, calls_b = units or (max(1, trace.num_gather_calls_forward), trace.num_gather_calls_backward)
    collectives = [Collective(red.kind, psi * g, units[0] if units else red.num_calls, "backward", True),
                   Collective("all_gather", trace.fetched_elems_forward / tp * p, calls_f, "forward", True)]
    if trace.num_gather_calls_backward:
        collectives.append(Collective("all_gather", trace.fetched_elems_backward / tp * p, calls_b, "backward",
                                      True))
    return collectives


def compute_times(job: Job, cfg: DSConfig, eff: Efficiency, micro_batch: Batch | None = None
                  ) -> tuple[Batch, Batch, Batch, Batch]:
    """(forward, backward, recompute seconds per micro-step, model FLOPs per micro-step) per GPU.

    Times come from the operator-level model (ops.py) of the busiest pipeline stage: its blocks, and the
    logits and loss, which the last stage runs (with one stage, the embedding too). Each phase takes the
    longer of its kernels' device time and the host's launches of them, except that forward's tail (the
    final norm, logits and loss, after the blocks) cannot start before the blocks end (_forward_s). Model FLOPs are flops.py's count
    spread evenly over the model-parallel ranks (what MFU and DeepSpeed's FLOPS metric count)."""
    m = job.model
    b = cfg.train_micro_batch_size_per_gpu if micro_batch is None else micro_batch
    layers = cfg.stage_layers(m.num_layers)
    dev_f, dev_b, dev_r, host_f, host_b, host_r, dev_tail, host_tail = _stage_op_times(job, cfg, eff, b)
    fwd = _forward_s(dev_f, host_f, dev_tail, host_tail)
    bwd, rec = np.maximum(dev_b, host_b), np.maximum(dev_r, host_r)
    one = micro_batch_flops(m, 1, job.seq_len, cfg.activation_checkpointing.enabled)
    share = cfg.mp_size * m.num_layers / layers
    return fwd, bwd, rec, b * one.model_flops / share


def _forward_s(dev_f: Batch, host_f: Batch, dev_tail: Batch, host_tail: Batch) -> Batch:
    """Forward seconds: the blocks (with the embedding before them), then the tail (final norm, logits, loss),
    each the longer of its device and host time. The host may queue kernels ahead of the device, so a phase
    takes the longer of the two in bulk; but device time idled while the host launched the blocks (the
    host-bound regime) cannot be spent on the tail's GEMMs, which the host has not launched yet: their
    device time follows the blocks'. Backward starts with the tail (the logits' gradient GEMMs, during which
    the host runs ahead), so it stays one bulk phase."""
    return np.maximum(dev_f - dev_tail, host_f - host_tail) + np.maximum(dev_tail, host_tail)


@dataclass(frozen=True)
class StageParts:
    """One micro-step of the busiest stage as the tasks a schedule needs, in seconds: each block's forward,
    backward and recompute, and what runs outside the blocks (embedding, logits and loss). layers x block +
    outer equals compute_times' totals (in the host-bound regime every part stretches alike)."""

    layers: int
    block_forward_s: float
    block_backward_s: float
    block_recompute_s: float
    outer_forward_s: float
    outer_backward_s: float


def stage_parts(job: Job, cfg: DSConfig, eff: Efficiency) -> StageParts:
    m, b = job.model, cfg.train_micro_batch_size_per_gpu
    rates = device_rates(job.cluster.hardware, cfg.precision, eff)
    layers = cfg.stage_layers(m.num_layers)
    block = layer_times(m, b, job.seq_len, cfg.mp_size, rates)
    outer = outer_times(m, b, job.seq_len, cfg.mp_size, rates, cfg.pp_size == 1)
    fwd, bwd, rec, _ = compute_times(job, cfg, eff)
    stretch_f = float(fwd) / float(layers * block.forward_s + outer.forward_s)
    stretch_b = float(bwd) / float(layers * block.backward_s + outer.backward_s)
    return StageParts(layers, float(block.forward_s) * stretch_f, float(block.backward_s) * stretch_b,
                      float(rec) / layers, float(outer.forward_s) * stretch_f, float(outer.backward_s) * stretch_b)


@lru_cache(maxsize=64)
def _op_times(model: ModelSpec, seq_len: int, rates: DeviceRates, tp: int, layers: int, embedding: bool,
              recompute: bool, sizes: tuple[float, ...], synchronous: bool = False) -> tuple[np.ndarray, ...]:
    """(forward, backward, recompute) device seconds of one stage at each micro-batch size, then the host's
    seconds launching their kernels, then forward's tail after the blocks (device, host seconds). Cached: the variants
    of a space differ in ZeRO knobs that leave compute alone, so ranking times each (model, device, sizes) once.
    A model whose forward was counted dispatching more ops than its structure's kernels (ModelSpec.
    dispatched_forward_ops, a stand-in's) launches those instead; on a `synchronous` device (one that runs its
    kernels on the host's thread: HardwareSpec.comm_compute_overlap false) the dispatches beyond the structure's
    add to the kernels' own time, as they run one after the other."""
    b = np.array(sizes)
    block, outer = layer_times(model, b, seq_len, tp, rates), outer_times(model, b, seq_len, tp, rates, embedding)
    launch = rates.kernel_launch_s
    device = (layers * block.forward_s + outer.forward_s, layers * block.backward_s + outer.backward_s,
              layers * block.forward_s * recompute)
    kernels_f = layers * block.forward_kernels + outer.forward_kernels
    kernels_b = layers * block.backward_kernels + outer.backward_kernels
    kernels_r = layers * block.forward_kernels * recompute
    if embedding and model.dispatched_forward_ops > kernels_f:  # the ops the profiling run counted
        share = model.dispatched_forward_ops / kernels_f
        counted = (model.dispatched_forward_ops, max(kernels_b, round(BACKWARD_OPS_PER_FORWARD
                                                                      * model.dispatched_forward_ops)),
                   kernels_r * share)
        if synchronous:
            device = tuple(d + launch * (c - k) for d, c, k in zip(device, counted, (kernels_f, kernels_b, kernels_r)))
        kernels_f, kernels_b, kernels_r = counted
    host = (launch * kernels_f, launch * kernels_b, launch * kernels_r)
    tail = outer_times(model, b, seq_len, tp, rates, False)  # what follows the blocks: norm, logits, loss
    tails = (tail.forward_s, launch * tail.forward_kernels)
    columns = tuple(np.broadcast_to(np.asarray(c, dtype=float), b.shape).copy() for c in device + host + tails)
    for column in columns:
        column.setflags(write=False)  # shared between callers through the cache
    return columns


def pipeline_stages(model: ModelSpec, pp: int) -> tuple[tuple[ModelSpec, int, bool], ...]:
    """The pipeline stages that can be the busiest, as (what runs outside the blocks, blocks, embedding):
    DeepSpeed's PipelineModule splits the blocks with partition_method 'type:transformer' (Megatron-DeepSpeed
    GPTModelPipe's), a balanced partition of the blocks alone (runtime/pipe/module.py:412-417,
    runtime/utils.py:627 partition_balanced) that gives the L mod pp extra blocks to the first stages: the
    first stage runs ceil(L / pp) blocks after the embedding, the last floor(L / pp) blocks and then the final
    norm, logits and loss. One stage runs everything."""
    if pp == 1:
        return ((model, model.num_layers, True),)
    blocks_only = model.replace(head="none", final_norm=False)
    return ((blocks_only, -(-model.num_layers // pp), True), (model, model.num_layers // pp, False))


def _stage_op_times(job: Job, cfg: DSConfig, eff: Efficiency, micro_batch: Batch) -> tuple[Batch, ...]:
    """_op_times of cfg's busiest stage (pipeline_stages; at each micro-batch size the one with the longer
    micro-step), shaped like micro_batch: device (forward, backward, recompute) seconds, then the host's (the
    same), then forward's tail (device, host)."""
    rates = device_rates(job.cluster.hardware, cfg.precision, eff)
    sizes = tuple(np.asarray(micro_batch, dtype=float).ravel())
    columns: tuple[np.ndarray, ...] = ()
    longest = None
    for model, layers, embedding in pipeline_stages(job.model, cfg.pp_size):
        stage = _op_times(model, job.seq_len, rates, cfg.mp_size, layers, embedding,
                          cfg.activation_checkpointing.enabled, sizes, not job.cluster.hardware.comm_compute_overlap)
        total = sum(np.maximum(stage[i], stage[i + 3]) for i in range(3))
        if longest is None:
            columns, longest = stage, total
        else:
            slower = total > longest
            columns, longest = tuple(np.where(slower, a, b) for a, b in zip(stage, columns)), np.maximum(total, longest)
    dev_f, dev_b, dev_r, host_f, host_b, host_r, dev_tail, host_tail = columns
    hooks = backward_hook_host_s(job.model, cfg, eff)
    if job.cluster.hardware.comm_compute_overlap:
        host_b = host_b + hooks
    else:  # a synchronized device (DeepSpeed's CPU accelerator) runs its kernels on the host: the hooks add
        dev_b = dev_b + hooks
    columns = (dev_f, dev_b, dev_r, host_f, host_b, host_r, dev_tail, host_tail)
    if isinstance(micro_batch, np.ndarray):
        return tuple(c.reshape(np.shape(micro_batch)) for c in columns)
    return tuple(float(c[0]) for c in columns)


def forward_device_host_s(job: Job, cfg: DSConfig, eff: Efficiency) -> tuple[float, float]:
    """(device, host) seconds of one micro-step's forward on the busiest stage at cfg's micro-batch: its kernels'
    time on the device and the host's launches of them (kernel_launch_s each), forward's tail included in both."""
    columns = _stage_op_times(job, cfg, eff, cfg.train_micro_batch_size_per_gpu)
    return float(columns[0]), float(columns[3])


def _exposed(comm_s: float, window_s: Batch, last_bucket_s: float, overlap: bool, eff: Efficiency) -> Batch:
    """Closed form: with overlap_comm, communication hides behind the compute window it runs beside,
    except the last bucket, which starts only when the window ends."""
    if not overlap:
        return comm_s + 0 * window_s
    return np.maximum(comm_s - eff.overlap_efficiency * window_s, min(comm_s, last_bucket_s))


def _windowed(comms: list[tuple[float, int]], window_s: Batch, overlap: bool, eff: Efficiency) -> Batch:
    """Exposed seconds of collectives (time, buckets) that run beside one compute window."""
    total = sum(t for t, _ in comms)
    last = max((t / n for t, n in comms), default=0.0)
    return _exposed(total, window_s, last, overlap, eff)


def last_micro_step_exposed(job: Job, cfg: DSConfig, eff: Efficiency = Efficiency()) -> float:
    """Exposed data-parallel communication inside the last micro-step (the one every stage >= 1 reduces in);
    what simulate.simulate_micro_step checks."""
    fwd, bwd, rec, _ = compute_times(job, cfg, eff)
    return float(_in_step_exposed(job, cfg, eff, fwd, bwd + rec)[0])


def _in_step_exposed(job: Job, cfg: DSConfig, eff: Efficiency, fwd: Batch, bwd: Batch) -> tuple[Batch, Batch]:
    """(last micro-step, any other micro-step) exposed seconds of the collectives run inside a micro-step.

    Stage 3 gathers parameters beside forward (prefetch needs no overlap_comm) and again beside backward,
    where the gradient reduce-scatter shares the link; each window hides only its own collectives.
    Hardware that cannot run communication beside compute (HardwareSpec.comm_compute_overlap false) hides
    nothing. DeepSpeed's CPU accelerator is a synchronized device without streams (accelerator/
    cpu_accelerator.py:42, :117-134: Stream and Event None, stream() a no-op context), so ZeRO-1/2's
    reduction stream and ZeRO-3's reduce-and-partition stream are never made (runtime/zero/
    stage_1_and_2.py:599, stage3.py:340-341); the bucket all-reduce and ZeRO-3's reduce-scatter are blocking
    calls (stage_1_and_2.py:2384, runtime/comm/coalesced_collectives.py:23 async_op=False); the prefetched
    all-gathers, though issued async (runtime/zero/partition_parameters.py:123), are gloo copying and reducing
    on the cores the ranks compute on."""
    n_dp = cfg.dp_size(job.cluster.world_size)
    bandwidth, latency = data_parallel_link(job, eff, cfg)
    hides = job.cluster.hardware.comm_compute_overlap
    overlap = cfg.zero.overlap_comm and hides
    timed = [(c, collective_s(c, n_dp, bandwidth, latency, eff)) for c in data_parallel_collectives(job, cfg, eff)]
    in_bwd = [(t, c.num_buckets) for c, t in timed if c.phase == "backward"]
    if cfg.zero.stage < 3:
        last = _windowed(in_bwd, bwd, overlap, eff)
        return last, (last if cfg.zero.stage == 2 else 0.0)
    gathers_bwd = [(t, c.num_buckets) for c, t in timed if c.phase == "backward" and c.kind == "all_gather"]
    reduces = [(t, c.num_buckets) for c, t in timed if c.phase == "backward" and c.kind != "all_gather"]
    # Gathers hide behind compute only when prefetched: with stage3_prefetch_bucket_size 0 each module waits for
    # its own fetch (partitioned_param_coordinator.py:452).
    prefetch = cfg.zero.stage3_prefetch_bucket_size_elems > 0 and hides
    forward = _windowed([(t, c.num_buckets) for c, t in timed if c.phase == "forward"], fwd, prefetch, eff)
    behind = (gathers_bwd if prefetch else []) + (reduces if overlap else [])
    alone = (gathers_bwd if not prefetch else []) + (reduces if not overlap else [])
    exposed = forward + _windowed(behind, bwd, True, eff) + sum(t for t, _ in alone)
    return exposed, exposed


def _data_parallel_exposed(job: Job, cfg: DSConfig, eff: Efficiency, fwd: Batch, bwd: Batch, rec: Batch,
                           gas: Batch) -> tuple[Batch, Batch]:
    """(exposed, total) seconds of data-parallel communication per optimizer step."""
    n_dp = cfg.dp_size(job.cluster.world_size)
    bandwidth, latency = data_parallel_link(job, eff, cfg)
    last, other = _in_step_exposed(job, cfg, eff, fwd, bwd + rec)
    exposed, total = last + (gas - 1) * other, 0.0
    for c in data_parallel_collectives(job, cfg, eff):
        t = collective_s(c, n_dp, bandwidth, latency, eff)
        total += t * (gas if c.per_micro_step else 1)
        if c.phase in ("after_backward", "after_step"):
            exposed += t  # nothing left to hide behind
    return exposed, total


CROSS_ENTROPY_ALLREDUCES = 3
"""Forward all-reduces of Megatron's vocabulary-parallel cross-entropy, each of one fp32 value per token: the
logits' max, the target logit and the sum of exponentials (Megatron-DeepSpeed megatron/core/tensor_parallel/
cross_entropy.py _VocabParallelCrossEntropy.forward: three torch.distributed.all_reduce calls on tensors of
the batch x sequence shape)."""


def _tensor_parallel_calls(job: Job, cfg: DSConfig) -> tuple[int, int, int]:
    """Megatron's activation-sized all-reduces (micro-batch x seq x hidden) per micro-step of the busiest stage,
    (forward, backward, recompute): two per block each way (after attention's and the MLP's row-parallel GEMM in
    forward, before their column-parallel GEMMs in backward; Shoeybi et al. 2019, fig. 3-4); the
    vocabulary-parallel embedding's sum on the first stage; on the last, the logits' input gradient backward
    (Megatron-LM mpu/layers.py VocabParallelEmbedding, parallel_lm_logits). Cross-entropy's per-token
    all-reduces are CROSS_ENTROPY_ALLREDUCES, timed at their own size."""
    layers = cfg.stage_layers(job.model.num_layers)
    lm = 1 if job.model.head == "lm" else 0
    recompute = 2 * layers if cfg.activation_checkpointing.enabled else 0
    return 2 * layers + (1 if cfg.pp_size == 1 else 0), 2 * layers + lm, recompute


def tensor_parallel_allreduce_s(job: Job, cfg: DSConfig, eff: Efficiency, size_bytes: Batch) -> Batch:
    """One tensor-parallel all-reduce of an activation: a ring over the node's links (and the nodes' NICs where
    the group is wider than a node, ring_across_nodes) whose bus bandwidth rises with the message as
    size / (size + n_1/2) (Hockney's half-performance length; NCCL's bus bandwidth climbs through the 1-64 MB
    these messages span), plus the call's fixed cost."""
    bandwidth, latency = intra_node_link(job, eff)
    if cfg.mp_size > job.cluster.num_gpus_per_node:  # a tensor-parallel group wider than a node
        bandwidth, latency = ring_across_nodes(job, eff, cfg.mp_size, job.cluster.num_gpus_per_node)
    ramp = size_bytes / (size_bytes + eff.tensor_parallel_half_bandwidth_bytes)
    ring = collective_s(Collective("all_reduce", size_bytes, 1, "forward_backward", True), cfg.mp_size,
                        bandwidth * ramp, latency)
    return ring + eff.tensor_parallel_call_s


def _tensor_parallel_s(job: Job, cfg: DSConfig, eff: Efficiency, micro_batch: Batch, gas: Batch) -> Batch:
    """Seconds per step that Megatron's tensor-parallel all-reduces add. NCCL runs each in order with the
    kernels around it (the compute stream waits on it: Megatron-LM mpu/mappings.py _reduce) but the host only
    enqueues it (torch.distributed waits stream on stream): each lengthens the device's side of its phase and
    costs nothing where the host's launches bound the phase (the small-model, small-batch regime)."""
    if cfg.mp_size == 1:
        return 0.0 * micro_batch
    size = micro_batch * job.seq_len * job.model.hidden_size * DTYPE_BYTES[cfg.precision]
    per_call = tensor_parallel_allreduce_s(job, cfg, eff, size)
    loss_calls = CROSS_ENTROPY_ALLREDUCES * (job.model.head == "lm")
    loss_s = loss_calls * tensor_parallel_allreduce_s(job, cfg, eff, micro_batch * job.seq_len * DTYPE_BYTES["fp32"])
    dev_f, dev_b, dev_r, host_f, host_b, host_r, dev_tail, host_tail = _stage_op_times(job, cfg, eff, micro_batch)
    calls_f, calls_b, calls_r = _tensor_parallel_calls(job, cfg)
    host_call = eff.tensor_parallel_host_call_s
    forward = _forward_s(dev_f + calls_f * per_call + loss_s, host_f + (calls_f + loss_calls) * host_call,
                         dev_tail + loss_s, host_tail + loss_calls * host_call)
    added = forward - _forward_s(dev_f, host_f, dev_tail, host_tail)
    for calls, dev, host in zip((calls_b, calls_r), (dev_b, dev_r), (host_b, host_r)):
        added = added + np.maximum(dev + calls * per_call, host + calls * host_call) - np.maximum(dev, host)
    return gas * added


PAGEABLE_H2D_SLOWDOWN = 5.0
"""How much slower a host-to-device copy from pageable memory runs than one from pinned memory: DeepSpeed measured
4-6x when ZeRO-1/2's offload moved its copy back to a pinned buffer (DeepSpeed PR #5301, "fix pagable h2d memcpy":
6x on one GPU, 4-5x on an 8-GPU node); the middle of that range."""


def _optimizer_and_offload_s(job: Job, cfg: DSConfig, eff: Efficiency, gas: Batch) -> tuple[float, Batch]:
    """(optimizer step on the device, offload time) per optimizer step."""
    z, hw = cfg.zero, job.cluster.hardware
    n_dp = cfg.dp_size(job.cluster.world_size)
    shard = n_dp if z.stage >= 1 else 1
    partition = _update_partition(job, cfg)
    p, g = DTYPE_BYTES[cfg.precision], DTYPE_BYTES[cfg.grad_precision]
    # ZeRO-Infinity parameter offload: each rank's partition, frozen parameters included, crosses to the device
    # for every forward and every backward of every micro-step (Rajbhandari et al. 2021, sec. 5).
    offload: Batch = 0.0
    if z.offload_param.device != "none":
        held = job.model.num_params / cfg.model_parallel_size / shard
        offload = gas * 2 * held * p / hw.host_to_device_bandwidth_bytes_per_s
    if z.offload_optimizer.device == "none":
        return sum(_device_update_s(job, cfg, eff)), offload
    # ZeRO-Offload: gradients down and updated 16-bit parameters up over PCIe, Adam on the node's CPU
    # shared by its GPUs (Ren et al. 2021, sec. 4).
    transfers = partition * (g + p) / hw.host_to_device_bandwidth_bytes_per_s
    if z.stage == 3 and z.offload_param.device == "none":
        # ZeRO-3 copies the updated fp32 partition into the device's 16-bit one with a blocking copy_ across devices
        # and dtypes (runtime/zero/stage3.py:2858-2861, _reassign_or_swap_out_partitioned_parameters), which torch
        # converts on the host into a fresh pageable tensor and sends from pageable memory (aten/src/ATen/native/
        # cuda/Copy.cu copy_kernel_cuda: blocking transfers convert on the CPU); ZeRO-1/2 convert into a pinned
        # buffer and copy it non-blocking (stage_1_and_2.py param_buffer_of_bit16_for_cpu_offload_groups)
        transfers = transfers + partition * p * (PAGEABLE_H2D_SLOWDOWN - 1) / hw.host_to_device_bandwidth_bytes_per_s
    host_adam = partition * job.cluster.num_gpus_per_node / eff.host_optimizer_params_per_s
    return 0.0, offload + transfers + host_adam


def _update_partition(job: Job, cfg: DSConfig) -> float:
    """Trainable parameters the optimizer updates on one rank: its partition under ZeRO 1-3."""
    shard = cfg.dp_size(job.cluster.world_size) if cfg.zero.stage >= 1 else 1
    return job.model.num_trainable_params / cfg.model_parallel_size / shard


def _device_update_s(job: Job, cfg: DSConfig, eff: Efficiency) -> tuple[float, float]:
    """(Adam's own traffic, the wrapper's casts, flattening, norm, unscale and copy back: zero_mechanics) seconds of
    the optimizer's step on the device, memory-bound."""
    partition, bandwidth = _update_partition(job, cfg), job.cluster.hardware.memory_bandwidth_bytes_per_s
    return (partition * eff.optimizer_bytes_per_param * adam_traffic_ratio(cfg) / bandwidth,
            partition * wrapper_bytes_per_param(cfg) / bandwidth)


def optimizer_update_s(job: Job, cfg: DSConfig, eff: Efficiency) -> tuple[float, float]:
    """(the optimizer's own update, the rest of DeepSpeed's step phase) seconds per optimizer step, as the engine's
    timers split them: ZeRO 1-3 time the wrapped optimizer's step alone (optimizer_step: Adam's traffic,
    Efficiency.optimizer_bytes_per_param), beside the gradients' unscale and norm and the all-gather of the updated
    partitions; the engine's step timer holds them all, with the per-step bookkeeping. The update is 0 where the
    optimizer runs on the host (offload)."""
    if cfg.zero.offload_optimizer.device != "none":
        return 0.0, 0.0
    n_dp = cfg.dp_size(job.cluster.world_size)
    update, wrapper = _device_update_s(job, cfg, eff)
    link = data_parallel_link(job, eff, cfg)
    gather = sum(collective_s(c, n_dp, *link, eff) for c in data_parallel_collectives(job, cfg, eff) if c.phase == "after_step")
    # ZeRO-0 flattens its gradients inside allreduce_gradients, which the engine's bwd_allreduce timer holds
    # (runtime/engine.py _backward_epilogue), not its step timer
    flattening = reduction_copies_s(job, cfg, eff) if cfg.zero.stage == 0 and n_dp > 1 else 0.0
    return update, wrapper + gather + _overheads_s(job, cfg, eff)[1] - flattening


def reduction_copies_s(job: Job, cfg: DSConfig, eff: Efficiency) -> float:
    """Seconds of the device copies of gradients into and out of the reduction buffers
    (zero_mechanics.grad_reduction), memory-bound, each new bucket's pages faulting in where the host maps it anew."""
    red = grad_reduction(job.model, cfg)
    hw = job.cluster.hardware
    return red.copy_bytes / hw.memory_bandwidth_bytes_per_s + red.num_calls * fresh_write_s(red.bucket_bytes, hw, eff)


def _overheads_s(job: Job, cfg: DSConfig, eff: Efficiency) -> tuple[float, float]:
    """(per micro-step, per step) fixed seconds: the calibrated catch-alls plus DeepSpeed's runtime overheads
    (hooks, per-tensor bookkeeping, collective launches; zero_mechanics.runtime_overhead_s) and the device
    copies of gradients into and out of the reduction buffers (reduction_copies_s)."""
    n_dp = cfg.dp_size(job.cluster.world_size)
    micro, step = runtime_overhead_s(job.model, cfg, n_dp, eff)
    copies_s = reduction_copies_s(job, cfg, eff)
    if cfg.zero.stage >= 2:
        micro += copies_s
    elif cfg.zero.stage == 1 or n_dp > 1:  # stage 0 flattens only when there is something to all-reduce
        step += copies_s
    return eff.micro_step_overhead_s + micro, eff.step_overhead_s + step


def _pipeline_bubble_s(job: Job, cfg: DSConfig, eff: Efficiency, micro_batch: Batch) -> Batch:
    """Idle seconds per step of 1F1B's fill and drain. With stages of times t_i, the busiest paces the steady
    state and the fill and drain pass once through every other stage: sum over i != busiest of t_i (Narayanan
    et al. 2021, sec. 2.2, with p - 1 equal stages). The last stage runs the logits and loss beside its blocks
    and is the busiest; the others run blocks only (DeepSpeed PipelineModule, partition_method
    'type:transformer' in Megatron-DeepSpeed's GPTModelPipe), the first also the embedding. DeepSpeed's
    TrainSchedule alternates forward and backward steps with blocking p2p between neighbours (runtime/pipe/
    schedule.py:197-245), which could have held the stages in lock-step at the longer of a forward and a backward
    a step; a real two-stage pipeline measured 1F1B (3.43 s a batch against 3.33-3.38 for 1F1B and 4.54-4.65 for
    lock-step: benchmarks/pipeline_schedule.py, data/measurements/pipeline_schedule_cpu_2026-11-27.jsonl)."""
    if cfg.pp_size == 1:
        return 0.0 * micro_batch
    blocks_only = job.model.replace(head="none", final_norm=False)
    inner = Job(blocks_only, job.cluster, job.seq_len)
    fwd, bwd, rec, _ = compute_times(inner, cfg, eff, micro_batch)
    return (cfg.pp_size - 1) * (fwd + bwd + rec)


def _pipeline_p2p_s(job: Job, cfg: DSConfig, eff: Efficiency, micro_batch: Batch, gas: Batch) -> Batch:
    """Seconds per step of the activations and gradients pipeline stages hand each other. DeepSpeed's
    PipelineEngine (runtime/pipe/engine.py:1024-1216, _exec_send_activations ... _exec_recv_grads) moves each
    micro-batch's hidden states (micro-batch x seq x hidden, 16-bit) to the next stage and their gradient back
    with blocking p2p.send / p2p.recv (runtime/pipe/p2p.py:46-84, async_op must be False), so each transfer
    sits on the compute path of both stages. The busiest (last) stage receives one activation and sends one
    gradient per micro-batch; the fill and drain carry the first micro-batch's across the other pp - 1 stage
    boundaries each way. Adjacent stages are world / pp ranks apart (Megatron's rank order: tensor, data, then
    pipeline), so on several nodes some boundary crosses the network: the data-parallel link's figures."""
    if cfg.pp_size == 1:
        return 0.0 * micro_batch
    size = micro_batch * job.seq_len * job.model.hidden_size * DTYPE_BYTES[cfg.precision]
    bandwidth, latency = data_parallel_link(job, eff)
    per_transfer = size / bandwidth + latency + eff.collective_launch_s
    return 2 * (gas + cfg.pp_size - 1) * per_transfer


def step_time_columns(job: Job, cfg: DSConfig, eff: Efficiency, micro_batch: Batch, gas: Batch
                      ) -> tuple[dict[str, Batch], Batch, Batch]:
    """(breakdown per TIME_TERMS, all data-parallel communication, model FLOPs per GPU) per optimizer step of
    `cfg` at the given micro-batch sizes and accumulation counts, which may be arrays of the same shape:
    the one formula both a single prediction and the ranking of a whole space evaluate."""
    fwd, bwd, rec, model_flops = compute_times(job, cfg, eff, micro_batch)
    exposed, comm_total = _data_parallel_exposed(job, cfg, eff, fwd, bwd, rec, gas)
    optimizer_s, offload_s = _optimizer_and_offload_s(job, cfg, eff, gas)
    per_micro_s, per_step_s = _overheads_s(job, cfg, eff)
    bubble = _pipeline_bubble_s(job, cfg, eff, micro_batch)
    breakdown = {"forward": gas * fwd, "backward": gas * bwd, "recompute": gas * rec, "pipeline_bubble": bubble,
                 "pipeline_p2p": _pipeline_p2p_s(job, cfg, eff, micro_batch, gas),
                 "exposed_comm": exposed,
                 "tensor_parallel_comm": _tensor_parallel_s(job, cfg, eff, micro_batch, gas),
                 "optimizer_step": optimizer_s, "offload": offload_s,
                 "overhead": per_step_s + gas * per_micro_s}
    return breakdown, comm_total, gas * model_flops


def estimate_time(job: Job, cfg: DSConfig, eff: Efficiency = Efficiency()) -> TimeEstimate:
    """Seconds per optimizer step for one configuration, with its breakdown."""
    breakdown, comm_total, model_flops = step_time_columns(job, cfg, eff, cfg.train_micro_batch_size_per_gpu,
                                                           cfg.gradient_accumulation_steps)
    return TimeEstimate(breakdown_s={term: float(value) for term, value in breakdown.items()},
                        comm_total_s=float(comm_total), model_flops_per_gpu=float(model_flops))
