"""What DeepSpeed 0.19's runtime does for one configuration, counted from the model's tensors.

One place for the mechanics that memory.py and step_time.py both depend on: which optimizer wrapper the
engine picks, the hooks ZeRO-3 fires per submodule, the parameter tensors it gathers and releases, the
collectives each stage actually issues, the gradient copies on the way, the transient fp32 gradients of
the optimizer step and the host seconds all this costs. Line numbers are deepspeed 0.19.8 (deepspeed/runtime/).

ZeRO-3 in one paragraph: every submodule gets pre/post forward hooks and two autograd Functions that fire
its pre/post backward hooks (zero/parameter_offload.py:337-528). The pre hooks fetch the module's own
parameters (zero/partitioned_param_coordinator.py:310-490): one all_gather_coalesced call for those not
yet gathered (one flat all-gather per dtype, zero/partition_parameters.py:1540-1602), then a prefetch call
for the next parameters of the recorded trace, up to stage3_prefetch_bucket_size elements; tensors of at
most stage3_param_persistence_threshold elements are gathered once and never released
(parameter_offload.py:317-335, coordinator:638-640). The post hooks release a module's parameters unless
the trace uses them again within stage3_max_reuse_distance elements (coordinator:634-664); the trace runs
on into backward, so with the default 1e9 a model under ~5e8 parameters is never released in forward nor
gathered again in backward. Each parameter's gradient hook copies it into the IPG bucket
(zero/stage3.py:1569-1644) and each full bucket is reduce-scattered (stage3.py:1648-1695, 1912-1946).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from zerotune.predictor.dsconfig import DSConfig
from zerotune.predictor.job import Efficiency
from zerotune.predictor.model import ModelSpec, Tensor

__all__ = ["OptimizerWrapper", "ReduceKind", "Zero3Trace", "GradReduction", "optimizer_wrapper", "zero3_trace", "fsdp_units",
           "grad_reduction", "grad_bytes_per_param", "transient_fp32_grad_bytes_per_param", "wrapper_bytes_per_param",
           "zero3_working_set_elems", "runtime_overhead_s", "backward_hook_host_s", "STAGE0_ALLREDUCE_BUCKET_ELEMS",
           "adam_traffic_ratio",
           "FUSED_ADAM_BYTES_PER_PARAM", "UNFUSED_ADAM_BYTES_PER_PARAM"]

OptimizerWrapper = Literal["zero", "fp16", "bf16", "none"]
"""DeepSpeed's optimizer wrapper: ZeRO (stage_1_and_2.py / stage3.py), FP16_Optimizer (also for bf16 without
ZeRO: DDP_BFLOAT16), BF16_Optimizer, or the bare torch optimizer (fp32 without ZeRO)."""
ReduceKind = Literal["all_reduce", "reduce_scatter"]

# engine.allreduce_gradients() flattens stage-0 gradients in buckets of MEMORY_OPT_ALLREDUCE_SIZE = 5e8
# elements (runtime/constants.py).
STAGE0_ALLREDUCE_BUCKET_ELEMS = 500_000_000
FP32_BYTES = 4
_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def optimizer_wrapper(cfg: DSConfig) -> OptimizerWrapper:
    """engine.py:2294-2325 (_do_optimizer_sanity_check): ZeRO wraps everything except stage 1 with bf16
    parameters and fp32 gradient accumulation (BF16_Optimizer); without ZeRO, 16-bit models get FP16_Optimizer
    (bf16 included, DDP_BFLOAT16) unless bf16 runs under pipeline parallelism (BF16_Optimizer). FP16_Optimizer is
    the engine's pick for FusedAdam, what an optimizer section builds; a client optimizer of another class (a
    ds_config without one, e.g. Hugging Face's Trainer's AdamW) gets FP16_UnfusedOptimizer instead
    (engine.py:2555-2600), a per-tensor step this model does not tell apart."""
    z, prec = cfg.zero, cfg.precision
    if z.stage >= 1:
        bf16_fp32_accum = prec == "bf16" and cfg.grad_precision == "fp32"
        if z.stage == 1 and bf16_fp32_accum and z.offload_optimizer.device == "none":
            return "bf16"
        return "zero"
    if prec == "fp32":
        return "none"
    return "bf16" if prec == "bf16" and cfg.pp_size > 1 else "fp16"


def grad_bytes_per_param(cfg: DSConfig) -> float:
    """Bytes of gradient kept per parameter (before partitioning): the .grad in the gradient dtype, and under
    BF16_Optimizer also its fp32 accumulation buffer of the whole model (bf16_optimizer.py:191), which
    update_hp_grads adds each micro-step's bf16 gradients into (bf16_optimizer.py:532-560)."""
    if optimizer_wrapper(cfg) == "bf16":
        return _BYTES[cfg.precision] + FP32_BYTES
    return _BYTES[cfg.grad_precision]


def transient_fp32_grad_bytes_per_param(cfg: DSConfig) -> float:
    """fp32 gradient bytes alive at the optimizer step per parameter it updates (of the partition under ZeRO).

    FP16_Optimizer.step (fp16/fused_optimizer.py:282-291) builds the list of every .grad cast to fp32 and then
    flattens it: both exist at once, 8 bytes per parameter, not 4. ZeRO 1-3 cast the flat gradient partition to
    fp32 (stage_1_and_2.py:3107-3119, stage3.py:2683-2690): 4 bytes (the 16-bit flat partition is the
    pre-flattened bucket wherever DeepSpeed kept one, and the 4 is what estimate_zero2_model_states_mem_needs
    counts). BF16_Optimizer steps on the fp32 buffer it keeps anyway (grad_bytes_per_param); fp32 without ZeRO
    steps on .grad itself."""
    wrapper = optimizer_wrapper(cfg)
    if wrapper == "fp16":
        return 2 * FP32_BYTES
    if wrapper == "zero":
        return FP32_BYTES
    return 0.0


FUSED_ADAM_BYTES_PER_PARAM = 28
"""One fused AdamW update of an fp32 parameter: read parameter, gradient, m and v (16 B), write parameter, m and v
(12 B), each once (DeepSpeed's FusedAdam multi_tensor_adam kernel; torch's AdamW(fused=True))."""
UNFUSED_ADAM_BYTES_PER_PARAM = 80
"""torch's unfused AdamW (torch/optim/adam.py _single_tensor_adam; _multi_tensor_adam runs the same ops for-each),
each op a pass over the tensors: param.mul_(1 - lr wd) 8 B, exp_avg.lerp_(grad) 12, exp_avg_sq.mul_(beta2) 8 and
.addcmul_(grad, grad) 12, denom = exp_avg_sq.sqrt() 8, / bias_correction2_sqrt 8, .add_(eps) 8, param.addcdiv_(
exp_avg, denom) 16: 80 B. Measured on this project's CPU (one thread, 10M fp32 parameters in 50 tensors, torch
2.13): 4.0 ns a parameter per-tensor, 4.4 for-each, 1.33 fused: 3.0-3.3x, against 80 / 28 = 2.9x."""


def adam_traffic_ratio(cfg: DSConfig) -> float:
    """The optimizer's memory traffic against a fused Adam's (Efficiency.optimizer_bytes_per_param is a fused one's)."""
    return UNFUSED_ADAM_BYTES_PER_PARAM / FUSED_ADAM_BYTES_PER_PARAM if cfg.optimizer_impl == "torch" else 1.0


def wrapper_bytes_per_param(cfg: DSConfig) -> float:
    """Memory traffic of the optimizer wrapper per parameter it updates, on top of the Adam update itself.

    FP16_Optimizer: cast to fp32 (read 2, write 4), flatten (4 + 4), norm (4), unscale (4 + 4), copy the fp32
    master back into the 16-bit parameters (4 + 2); ZeRO 1-3: flatten the 16-bit partition (2 + 2), cast (2 + 4),
    norm, unscale and copy back as above; BF16_Optimizer: add the bf16 grads into fp32 (2 + 4 + 4), norm,
    unscale, copy back."""
    wrapper = optimizer_wrapper(cfg)
    common = 4 + 8 + 6  # norm, unscale, copy back to the 16-bit parameters
    if wrapper == "fp16":
        return 6 + 8 + common
    if wrapper == "zero":
        return (4 + 6 if cfg.precision != "fp32" else 0) + common
    if wrapper == "bf16":
        return 10 + common
    return 0.0


def _module_of(t: Tensor) -> str:
    """The submodule that owns a tensor: its name less a trailing .weight / .bias (embeddings are named alone)."""
    head, _, last = t.name.rpartition(".")
    return head if last in ("weight", "bias") else t.name


@dataclass(frozen=True)
class Zero3Trace:
    """ZeRO-3's work in one micro-step (forward + backward), per data-parallel rank, before tensor parallelism."""

    num_hooked_modules: int
    """Modules whose hooks fire in forward and again in backward: every module that runs (ModelSpec.
    hooked_modules_per_layer and hooked_outer_modules; by default the built-in workload's tree: every module
    owning parameters, one per transformer block, and the root)."""
    num_fetched_tensors_forward: int
    """Tensors above the persistence threshold, gathered in forward and released when done with."""
    num_fetched_tensors_backward: int
    """Those released in forward (their next use lies beyond stage3_max_reuse_distance) and gathered again."""
    num_gather_calls_forward: int
    """all_gather_coalesced calls: one per module owning a fetched tensor (its own fetch or the prefetch that
    an earlier module's hook issued for it; coordinator:376-381, 451-485)."""
    num_gather_calls_backward: int
    fetched_elems_forward: float
    fetched_elems_backward: float
    kept_elems: float
    """Elements still gathered when forward turns into backward (not released: reused within the distance)."""
    persistent_elems: float
    num_grad_tensors: int
    largest_module_elems: float


@lru_cache(maxsize=512)
def _trace(model: ModelSpec, persistence_threshold: int, max_reuse_distance: int) -> Zero3Trace:
    tensors = model.tensors()
    modules: dict[str, list[Tensor]] = {}
    for t in tensors:
        modules.setdefault(_module_of(t), []).append(t)
    sizes = [sum(t.num_elems for t in m) for m in modules.values()]
    # A module is released in forward when the trace from it to its backward use (the rest of forward and the
    # start of backward: about twice the parameters after it) reaches the reuse distance.
    after, released_elems, released_tensors, released_modules, fetch_modules = float(sum(sizes)), 0.0, 0, 0, 0
    for m, size in zip(modules.values(), sizes):
        big = [t.num_elems for t in m if t.num_elems > persistence_threshold]
        after -= size
        fetch_modules += bool(big)
        if big and 2 * after >= max_reuse_distance:
            released_elems += sum(big)
            released_tensors += len(big)
            released_modules += 1
    fetched = [t.num_elems for t in tensors if t.num_elems > persistence_threshold]
    own_outer = len({_module_of(t) for t in tensors if t.layer < 0})
    per_layer = model.hooked_modules_per_layer or (len(modules) - own_outer) / max(model.held_layers, 1) + 1
    outer = model.hooked_outer_modules or own_outer + 1
    return Zero3Trace(
        num_hooked_modules=round(model.num_layers * per_layer + outer),
        num_fetched_tensors_forward=len(fetched), num_fetched_tensors_backward=released_tensors,
        num_gather_calls_forward=fetch_modules, num_gather_calls_backward=released_modules,
        fetched_elems_forward=float(sum(fetched)), fetched_elems_backward=released_elems,
        kept_elems=float(sum(fetched)) - released_elems,
        persistent_elems=float(sum(t.num_elems for t in tensors if t.num_elems <= persistence_threshold)),
        num_grad_tensors=len(tensors), largest_module_elems=float(max(max(sizes), model.largest_layer_params)))


def fsdp_units(model: ModelSpec, cfg: DSConfig, eff: Efficiency | None) -> tuple[int, int] | None:
    """(gathers in forward, gathers in backward) of a runtime that gathers one flat parameter per wrapped block
    (Efficiency.zero3_gathers_per_block: the blocks, and one unit for what lies outside them; its gradient
    reduce-scatters count as the forward's gathers), None for DeepSpeed's ZeRO-3 (Zero3Trace)."""
    if eff is None or eff.zero3_gathers_per_block <= 0:
        return None
    blocks = max(1, round(cfg.stage_layers(model.num_layers) * eff.zero3_gathers_per_block))
    return blocks + 1, blocks


def zero3_trace(model: ModelSpec, cfg: DSConfig) -> Zero3Trace:
    """The ZeRO-3 trace of `model` under `cfg`'s persistence threshold and reuse distance."""
    z = cfg.zero
    return _trace(model, z.stage3_param_persistence_threshold_elems, z.stage3_max_reuse_distance_elems)


def zero3_working_set_elems(model: ModelSpec, cfg: DSConfig) -> float:
    """Gathered parameter elements at ZeRO-3's peak (the forward / backward turn): what the reuse distance kept,
    or at least the module computing plus the prefetch in flight (capped by stage3_max_live_parameters)."""
    trace, z = zero3_trace(model, cfg), cfg.zero
    live = min(z.stage3_max_live_parameters_elems, trace.largest_module_elems + z.stage3_prefetch_bucket_size_elems)
    return max(trace.kept_elems, live)


@dataclass(frozen=True)
class GradReduction:
    """The collectives that average gradients, as DeepSpeed issues them."""

    kind: ReduceKind
    num_calls: int
    """Collectives per reduction (per micro-step for stages 2-3, per step otherwise)."""
    copy_bytes: float
    """Device bytes moved (read + write) per reduction copying gradients into and out of the flat buffers."""
    num_grad_tensors: int
    """Tensors that pass through the gradient hook / IPG bucket path per reduction (0 for stage 0)."""
    bucket_bytes: float = 0.0
    """Bytes of the flat tensor each collective's gradients are gathered into, a new one per call (stage 0 and
    1-2: torch._utils._flatten_dense_tensors, a torch.cat; stage 3: the interleaving copy's output)."""


def grad_reduction(model: ModelSpec, cfg: DSConfig) -> GradReduction:
    """Stage 0: engine.allreduce_gradients flattens in 5e8-element buckets, all-reduces and copies back.
    Stages 1-2 copy every gradient into the IPG bucket (stage_1_and_2.py reduce_independent_p_g_buckets_and_
    remove_grads) and average each bucket with an ALL-REDUCE even with reduce_scatter: true, because
    use_multi_rank_bucket_allreduce defaults to true (zero/config.py:119; stage_1_and_2.py:1618-1623,
    1695-1712 -> allreduce_and_scatter:1545-1588, which flattens, all-reduces and copies the rank's slices out).
    Stage 3 reduce-scatters each bucket after an interleaving copy (comm/coalesced_collectives.py:81-141) and
    copies the partition out (stage3.py:2006-2051); with reduce_scatter: false it all-reduces the contiguous
    bucket (stage3.py:1673-1675, 1863-1909)."""
    z = cfg.zero
    return _grad_reduction(model, z.stage, z.reduce_bucket_size_elems, z.reduce_scatter, cfg.model_parallel_size,
                           cfg.grad_precision)


@lru_cache(maxsize=4096)
def _grad_reduction(model: ModelSpec, stage: int, bucket_elems: int, reduce_scatter: bool, model_parallel: int,
                    grad_precision: str) -> GradReduction:
    psi, g = model.num_trainable_params / model_parallel, _BYTES[grad_precision]  # frozen: no gradient
    if stage == 0:
        calls = max(1, math.ceil(psi / STAGE0_ALLREDUCE_BUCKET_ELEMS))
        # flatten and copy back, read + write
        return GradReduction("all_reduce", calls, 2 * 2 * psi * g, 0, min(psi, STAGE0_ALLREDUCE_BUCKET_ELEMS) * g)
    calls = max(1, math.ceil(psi / max(bucket_elems, 1)))
    # into the bucket, flatten (stages 1-2) or interleave (stage 3) for the collective, the partition back out
    copies = 2 * 3 * psi * g
    kind: ReduceKind = "reduce_scatter" if stage == 3 and reduce_scatter else "all_reduce"
    return GradReduction(kind, calls, copies, model.num_trainable_tensors, min(psi, max(bucket_elems, 1)) * g)


def backward_hook_host_s(model: ModelSpec, cfg: DSConfig, eff: Efficiency) -> float:
    """Host seconds per micro-step that DeepSpeed's backward hooks add to backward's host side, where they hide
    behind the device's kernels when those take longer: ZeRO-1's per-parameter gradient hooks (Efficiency.
    grad_hook_host_s, one call per trainable tensor of the pipeline stage), ZeRO-3's module hooks, which autograd
    runs on its own thread between the kernels it queues (parameter_offload.py:474-528, PreBackwardFunction /
    PostBackwardFunction), with the bookkeeping of the tensors backward gathers again. On one H200 ZeRO-3's
    backward timer exceeded ZeRO-1's by 1-29 ms at micro-batches 8-16 of GPT-2 and GPT-Neo (device-bound) and by
    100-225 ms at micro-batch 1 (data/measurements/gpu_grid, h200_rows.jsonl, h200_shapes_rows.jsonl). On a
    synchronized device (DeepSpeed's CPU accelerator) the host runs the kernels itself, and the hooks add to them
    (step_time._stage_op_times)."""
    if cfg.zero.stage == 3:
        t = zero3_trace(model, cfg)
        return (t.num_hooked_modules * eff.zero3_module_hook_s
                + t.num_fetched_tensors_backward * eff.zero3_param_fetch_s) / cfg.pp_size
    if cfg.zero.stage != 1:
        return 0.0
    return model.num_trainable_tensors / cfg.pp_size * eff.grad_hook_host_s


def runtime_overhead_s(model: ModelSpec, cfg: DSConfig, num_dp: int, eff: Efficiency) -> tuple[float, float]:
    """(per micro-step, per optimizer step) host seconds DeepSpeed's runtime adds to the kernels' time.

    Charged on top of compute, not hidden behind it (backward's hooks excepted: backward_hook_host_s): the
    fetch path waits on an event once more than two
    fetches are in flight (partitioned_param_coordinator.py:400-411), which keeps the host at most a few
    modules ahead of the device, and the H100 probes step as compute + hooks (Efficiency docstrings)."""
    share = 1.0 / cfg.pp_size  # a pipeline stage runs the hooks of its own layers
    z, launch = cfg.zero, eff.collective_launch_s if num_dp > 1 else 0.0
    red = grad_reduction(model, cfg)
    reduce_s = red.num_grad_tensors * share * eff.grad_hook_s + red.num_calls * launch
    per_step = 0.0
    wrapper = optimizer_wrapper(cfg)
    if wrapper == "fp16" or (wrapper == "zero" and z.stage in (1, 2)):
        # the wrapper's step walks its tensors in Python (Efficiency.optimizer_tensor_s); ZeRO-1/2 those of the
        # rank's partition, FP16_Optimizer all of them
        tensors = model.num_trainable_tensors * share / (num_dp if wrapper == "zero" else 1)
        per_step += max(1.0, tensors) * eff.optimizer_tensor_s
    if wrapper == "fp16":
        # FP16_Optimizer.step tests every .grad for inf/nan and branches on it in Python: one device
        # synchronisation per tensor (runtime/utils.py:291-295 has_overflow_serial, 205 has_inf_or_nan).
        per_step += model.num_trainable_tensors * share * eff.tensor_sync_check_s  # its groups: trainable only
    if z.stage == 3:
        t = zero3_trace(model, cfg)
        hooks = t.num_hooked_modules * eff.zero3_module_hook_s  # forward's; backward's: backward_hook_host_s
        gather = eff.zero3_gather_s if num_dp > 1 else 0.0
        # forward's fetches; backward's re-gathers wait on their all-gathers here too, their bookkeeping is on
        # backward's host side (backward_hook_host_s)
        fetches = (t.num_fetched_tensors_forward * (eff.zero3_param_fetch_s + gather)
                   + t.num_fetched_tensors_backward * gather)
        gathers = sum(fsdp_units(model, cfg, eff) or (t.num_gather_calls_forward, t.num_gather_calls_backward)) * launch
        return share * (hooks + fetches) + gathers + reduce_s, per_step
    if z.stage == 2:
        return reduce_s, per_step + launch  # + the all-gather of the updated partitions
    if z.stage == 1:
        # ZeRO-1's gradient hooks return at once (process_gradients, stage_1_and_2.py:2284-2291: the bucket path
        # runs only with partition_gradients or overlap_comm); its one pass over the gradients at the boundary
        # (reduce_gradients, 958-978) was measured free: stage 1's backward timer equals stage 0's (49.7 against
        # 50.1 ms) where stage 2's, whose hooks book every tensor inside autograd, reads 72.1 ms (H100 probes,
        # Efficiency.grad_hook_s). Only its collectives' launches are charged here; the hooks' own Python is on
        # the host's side of backward (backward_hook_host_s), hidden where the device bounds it.
        return 0.0, per_step + red.num_calls * launch + launch
    return 0.0, per_step + red.num_calls * launch
