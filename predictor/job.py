"""A training job: what is trained (model, sequence length) on what (cluster)."""

from __future__ import annotations

from dataclasses import dataclass

from zerotune.predictor.hardware import ClusterSpec
from zerotune.predictor.model import ModelSpec

__all__ = ["Job", "Efficiency"]


@dataclass(frozen=True)
class Job:
    model: ModelSpec
    cluster: ClusterSpec
    seq_len: int

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"--seq_len must be at least 1, got {self.seq_len}")
        if self.model.position_embedding == "learned" and self.seq_len > self.model.max_position_embeddings:
            raise ValueError(f"--seq_len {self.seq_len} exceeds {self.model.name}'s "
                             f"max_position_embeddings {self.model.max_position_embeddings}; use at most that")


@dataclass(frozen=True)
class Efficiency:
    """Model parameters that a calibration profile fits to a cluster; these defaults are uncalibrated."""

    allocator_slack_fraction: float = 0.05
    """PyTorch caching-allocator fragmentation on top of live tensors. Uncalibrated default: peak reserved
    runs a few percent above peak allocated in steady-state training (PyTorch CUDA memory notes)."""
    runtime_reserved_bytes: float | None = None
    """Memory outside the allocator (CUDA context, NCCL); None takes the hardware catalog's figure."""
    # operator-level compute (ops.py)
    gemm_efficiency_scale: float = 0.7
    """GEMM throughput relative to the hardware catalog's achievable matmul FLOP/s (MAMF: the best over a shape
    sweep); the shape curve (tile and wave quantization, roofline) is ops.py's. Uncalibrated default 0.7, chosen
    on the fit half of the published data (zerotune.validate.accuracy --half fit: BLOOM and llm-foundry A100/H100 rows
    are closest at 0.7); plain torch.matmul on an H100 reached 0.83-0.86 of MAMF at 2048-4096 (h100 profile)."""
    memory_bandwidth_efficiency: float = 1.0
    """Memory-bound kernels' bandwidth relative to what the hardware catalog says they reach (the copy bandwidth
    times HardwareSpec.eager_bandwidth_share); 1 uncalibrated."""
    kernel_launch_s: float | None = None
    """Host seconds per kernel issued; None takes the hardware catalog's figure."""
    fp32_compute_scale: float = 1.43
    """GEMM efficiency in fp32 relative to gemm_efficiency_scale x the catalog's figure; fitted per precision where
    the measurements have several. Uncalibrated default 1 / 0.7: fp32 GEMMs run on CUDA cores (Volta has no
    TF32, PyTorch leaves TF32 off for matmuls), where cuBLAS reaches the catalog's fp32 figure at ordinary shapes
    (it is measured there: H100 51 TFLOPS at 2048-4096 in the h100 profile, V100 14 in the catalog's source), so
    the tensor-core discount of gemm_efficiency_scale is cancelled. On the fit half, bert-base-cased fp32 on 16 V100
    goes from 0.58-0.69 to 0.92-1.05 of its measured throughput (zerotune.validate.accuracy --half fit)."""
    fp16_compute_scale: float = 1.0
    bf16_compute_scale: float = 1.0
    intra_node_bandwidth_efficiency: float = 0.75
    """Achieved bus bandwidth / link peak within a node (nccl-tests busbw on NVLink is ~75-80% of peak)."""
    inter_node_bandwidth_efficiency: float = 0.8
    all_gather_bandwidth_ratio: float = 1.0
    """An all-gather's bus bandwidth over an all-reduce's on the same link, at the large messages data parallelism
    sends. 1 for NCCL, whose ring kernels move either at the same bus bandwidth (nccl-tests, doc/PERFORMANCE.md:
    busbw is defined so that it is comparable across operations). gloo is another matter: its all-reduce is a
    native ring while torch's all_gather_into_tensor and reduce_scatter_tensor on gloo are built from other
    calls; this machine's microbenchmark (data/profiles/cpu.json, environment.microbenchmarks, 2 ranks) read
    all-reduce 1.03 / 1.44 / 1.45 GB/s bus bandwidth at 16 / 64 / 256 MiB, all-gather 1.29 / 0.47 / 0.46 and
    reduce-scatter 0.41 / 0.37 / 0.38. A calibration sets it from its microbenchmarks
    (zerotune.calibrate.starting)."""
    reduce_scatter_bandwidth_ratio: float = 1.0
    """The same for a reduce-scatter."""
    tensor_parallel_half_bandwidth_bytes: float = 8e6
    """Message size at which a tensor-parallel all-reduce reaches half the intra-node bus bandwidth (Hockney's
    n_1/2): Megatron's activation all-reduces (micro-batch x seq x hidden, 4-64 MB) sit on NCCL's bandwidth
    ramp. Uncalibrated default 8 MB, with tensor_parallel_call_s, chosen on the fit half of vTrain's A100 runs
    (zerotune.validate.accuracy --half fit): for the 12-layer 2048-wide model at equal work per GPU (micro-batch = tp =
    1, 2, 4, 8) each micro-step grew by 11, 18 and 35 ms over tp 1, which 6 all-reduces per block take at
    65 us + rings of 53-115 GB/s bus bandwidth; of 4, 8, 16 and 32 MB, 8 and 65 us ranked best."""
    tensor_parallel_host_call_s: float = 15e-6
    """Host seconds of one tensor-parallel all-reduce call, added to the host's side of its phase (the device's side
    is tensor_parallel_call_s): Megatron's autograd function (mpu/mappings.py _ReduceFromModelParallelRegion),
    torch.distributed.all_reduce's Python and c10d dispatch, ProcessGroupNCCL's work object, the events it records
    and the stream wait, then NCCL's enqueue. It shows where the host bounds the phase (small micro-batches: vTrain's
    2048-wide models at tp 2-8 ran micro-batch 1-4 in nearly the same time per micro-step). Uncalibrated default
    chosen on the fit half of vTrain among 0, 15, 30, 45, 60, 90 and 120 us as the largest that costs neither the
    best-ranked-first count (zerotune.validate.accuracy --half fit) nor the replay of the fit half's groups
    (benchmarks.replay): 0 -> 15 us took the fit half's throughput error 9.8% -> 9.3% (47/72 first either way;
    30 us: 9.1%, 48/72, but the replay's choices within 3% 97.2% -> 94.4%). Test half: 9.7% -> 9.3%, 52 -> 53 of
    72 first, pick / best 97.9% either way; replay real 94.4% either way, wrong model 96.0% -> 94.7%."""
    tensor_parallel_call_s: float = 65e-6
    """Fixed seconds of one tensor-parallel all-reduce beyond its ring steps: the autograd function, NCCL's
    launch and the compute stream's wait on it (the fit above)."""
    intra_node_latency_s: float | None = None
    """Per-ring-step latency of a collective within a node; None takes the hardware catalog's figure."""
    inter_node_latency_s: float | None = None
    """The same across nodes; None takes the hardware catalog's figure."""
    overlap_efficiency: float = 0.9
    """Share of backward compute that overlap_comm can hide communication behind."""
    optimizer_bytes_per_param: float = 30.0
    """Memory traffic of one Adam update per fp32 parameter: read param, grad, m, v (16 B), write param,
    m, v (12 B) and the 16-bit copy (2 B); the step is memory-bandwidth bound."""
    step_overhead_s: float = 0.0
    """Fixed seconds per optimizer step the FLOP and byte counts miss: per-tensor kernel launches and Python in
    the optimizer step and gradient bookkeeping. Measured on an H100, DeepSpeed's step timer read 50-115 ms for
    GPT-2 medium whatever the micro-batch, against ~4 ms of memory traffic; 0 until a calibration fits it."""
    micro_step_overhead_s: float = 0.0
    """The same per micro-step, beyond the DeepSpeed runtime overheads named below; 0 until calibrated."""
    # DeepSpeed runtime overheads (zero_mechanics.py)
    # Host seconds of DeepSpeed 0.19's Python per hook, tensor and collective, added to the kernels' time. The
    # defaults are measured on the H100 probes (data/profiles/h100-80gb.measurements.jsonl: one GPU, GPT-2
    # medium in zerotune's workload, bf16, micro-batch 4, DeepSpeed's fwd / bwd / step timers), where one rank
    # makes every collective a no-op, so each difference between stages is hook and bookkeeping time alone.
    grad_hook_s: float = 5.8e-5
    """Per parameter tensor per gradient reduction under ZeRO-2 and -3: the hook that copies its gradient into the
    IPG bucket and books it inside backward (stage_1_and_2.py reduce_independent_p_g_buckets_and_remove_grads,
    stage3.py:1569-1644). Measured: stage 2 backward 72.1 ms against stage 1's 49.7 ms, 22.4 ms over the model's
    388 tensors; ZeRO-1, whose hooks return at once and which books the gradients once after backward, measured
    as stage 0 (50.1 ms) and is not charged it (zero_mechanics.runtime_overhead_s)."""
    grad_hook_host_s: float = 5.3e-5
    """Host seconds per trainable parameter tensor per backward of ZeRO-1's gradient hook, on the host's side of
    backward: DeepSpeed 0.19 registers grad_handling_hook on every parameter under stages 1 and 2
    (stage_1_and_2.py:1353-1381 create_gradient_handling_hooks); under ZeRO-1 it refreshes the expected hook
    count, re-enters backward if needed and calls process_gradients, which returns (2284-2291), all in Python
    inside autograd. Hidden where the device bounds backward (the H100 probes at micro-batch 4: ZeRO-1's
    backward timer equals ZeRO-0's), it paces backward where the host does (ZeRO-2 pays grad_hook_s instead).
    53 us read on the fit half of the H200 grid (data/measurements/gpu_grid): GPT-2 XL at micro-batch 1 under
    ZeRO-1 took 84.2 ms by DeepSpeed's backward timer against 43.3 ms of predicted kernel launches, over its 772
    tensors as ModelSpec counts them (Q, K and V apart); the test half's Llama-3.2-1B then reads 31.8 ms against
    33.1, and the 246M-parameter Qwen2 script's ZeRO-0 profiling run (no hooks) 24.1 against 24-28."""
    zero3_module_hook_s: float = 2.4e-4
    """Per module run per pass (forward, and again in backward; ModelSpec.hooked_modules_per_layer): ZeRO-3's
    pre/post hooks, the autograd Functions that carry the backward hooks, and fetch_sub_module /
    release_sub_module bookkeeping (parameter_offload.py:337-609, partitioned_param_coordinator.py:310-533).
    Fitted with zero3_param_fetch_s on the ZeRO-3 step times of the fit-half models of the H200 grid
    (data/measurements/gpu_grid: bert-large, gpt2-large, gpt2-xl; DeepSpeed 0.19.8, Hugging Face models, every
    module that runs counted, backward's hooks on backward's host side): RMS log error 0.097 over their six rows
    (a grid search over 20-290 us x 0-380 us). Earlier, with only modules owning parameters counted and every
    hook added to the step: 170 and 230 us. The H100 probes of the built-in workload on another host read 410 us
    (stage 3 backward 163 ms against stage 0's 50 ms). A 16- and 32-layer width-32 model on one CPU rank gave
    0.1-0.3 ms per module and pass (benchmarks/zero3_hooks.md). Host time: it varies with the host CPU, which
    calibration measures (calibrate.fit._local: from calibrate's ZeRO-3 probe). The H100 grid's fit half on
    another machine (2026-11-28, the same models, h100_rows.jsonl) reads 400 us with the fetch at 180; one
    value for both machines leaves an RMS log error of 0.17 on each, against 0.10 and 0.09 on its own."""
    zero3_param_fetch_s: float = 1.6e-4
    """Per parameter tensor gathered and released: status changes, stream and event handling per tensor
    (partitioned_param_coordinator.py:390-415), the torch.cat of its partitions (partition_parameters.py:795)
    and free_param on release. Fitted with zero3_module_hook_s (see there) on the H200 grid's fit half; the H100
    probes read 300 us (stage 3 forward 165 ms against stage 0's 31.5 ms, less the module hooks, over 146
    fetched tensors)."""
    zero3_gather_s: float = 7.8e-4
    """Per parameter tensor fetched, on top of zero3_param_fetch_s, where ZeRO-3 really gathers it (more than one
    data-parallel rank): all_gather_coalesced allocates the full tensor, views each rank's slice, launches the
    all-gather and waits for it (partition_parameters.py:1562-1640); with one rank the partition is the tensor
    and none of it runs (_no_gather_coalesced, :1559-1560), which is why the H200 grid, on one GPU, cannot show it.
    Fitted on the only ZeRO-3 row of the fit half of the published 16-V100 Hugging Face table
    (ds_autotuning_hf_v100: bert-base-cased, 2479.5 samples/s, 59 ms a step above the prediction without it, over
    75 fetched tensors); on its test half it moves GPT-2 XL's ZeRO-3 row from 22.6 to 14.7 samples/s predicted
    (measured 12.9) and leaves DistilBERT's within 1-7%."""
    zero3_gathers_per_block: float = 0.0
    """All-gathers per transformer block and pass under a fully sharded data-parallel runtime that gathers whole
    flat parameters (0: DeepSpeed's ZeRO-3, one all_gather_coalesced per module owning a fetched tensor,
    zero_mechanics.Zero3Trace). PyTorch FSDP wrapped per block gathers the block's one flat parameter in one
    call and reduce-scatters its gradient in one (torch/distributed/fsdp/_flat_param.py, _runtime_utils.py
    _pre_forward_unshard / _post_backward_hook), plus one unit for what lies outside the blocks; set to 1 for
    published FSDP rows (zerotune.validate.published.framework_efficiency). Not a DeepSpeed setting."""
    collective_launch_s: float = 2.0e-5
    """Per collective issued, on top of the link's latency: DeepSpeed's comm wrapper and torch.distributed's
    dispatch (~10-20 us of Python and C++) and the NCCL kernel launch (~5 us, CUDA launch overhead). Not
    measurable on one GPU; an estimate, to be replaced by calibration."""
    tensor_sync_check_s: float = 6.5e-5
    """Per parameter tensor per step under FP16_Optimizer (16-bit without ZeRO): its overflow test branches on
    each gradient's inf/nan check, one device synchronisation per tensor (runtime/utils.py:291-295).
    Measured: stage 0's step timer 91 ms (mean of three probes) against 66 ms for stages 1-2, 25 ms over
    388 tensors."""
    optimizer_tensor_s: float = 1.0e-4
    """Host seconds per parameter tensor per optimizer step in DeepSpeed's 16-bit optimizer wrappers, whose step
    walks the tensors one by one in Python: ZeRO-1/2 flattens each tensor's gradient into the partition
    (runtime/zero/stage_1_and_2.py:2750-2770 get_flat_partition) and takes its norm with a cast and a
    vector_norm per tensor (:2678-2685 get_grad_norm_direct); FP16_UnfusedOptimizer takes per-tensor norms, casts
    each gradient to fp32 and copies each fp32 master back (runtime/fp16/unfused_optimizer.py:210-239). The
    kernels are tiny; the host's calls are the step's time. Measured on one H200 (data/measurements/gpu_grid,
    DeepSpeed's step timer less the predicted memory traffic, over trainable tensors): a median 108 us over the
    grid's fit-half models (bert-large, gpt2-large, gpt2-xl; stages 0-2), 52-116 us on the test half. Megatron's
    own optimizer and FSDP are not charged it (zerotune.validate.published.framework_efficiency)."""
    host_optimizer_params_per_s: float = 2.7e9
    """Parameters per second a node's CPU updates with DeepSpeedCPUAdam (offload_optimizer), shared by the node's
    GPUs; its SIMD loops stream the fp32 parameter, gradient and both moments in and out, so the figure follows the
    host's memory bandwidth and a calibration with offload runs fits it. Uncalibrated default 2.7e9 (it was a
    guessed 1e9): the H200 grid's fit-half ZeRO-2 offload runs (data/measurements/gpu_grid: GPT-2 large at
    micro-batch 8, GPT-2 XL at 4; one GPU, 16 host cores) took 0.69 and 1.07 s a step against 1.17 and 2.02
    predicted at 1e9, and -1% and -2% at 2.7e9; DeepSpeed's step timer read 0.32 and 0.57 s, 2.7-3.1e9 parameters
    a second once the 16-bit copy back is taken off."""
    memory_cache_gain: tuple[tuple[float, float], ...] = ()
    """(bytes a memory-bound kernel moves, read + write; its bandwidth over the large copy's) measured on the device
    today, smallest first: a kernel whose working set fits the caches moves its bytes faster than the copy that
    paces memory_bandwidth_efficiency (the cache-aware roofline, Ilic, Pratas & Sousa 2014). Set by `tune` from
    its profiling run's copies on a CPU (zerotune.validate.calibration.paced); () leaves every kernel at the large
    copy's pace. Not part of a calibration profile."""
    dropout_rng_s_per_element: float | None = None
    """Seconds to draw a dropout mask element beyond its bytes (HardwareSpec.dropout_rng_s_per_element) as `tune`'s
    profiling run timed it on the day (zerotune.validate.calibration.paced); None: the catalog's figure. Not part of
    a calibration profile."""
    fresh_page_s_per_byte: float | None = None
    """Seconds beyond its memory pass per byte written into a tensor the host's allocator maps anew
    (HardwareSpec.fresh_page_s_per_byte), as `tune`'s profiling run timed it on the day (a fresh copy against a
    kept one, zerotune.validate.calibration.paced); None: the hardware catalog's figure. Not part of a calibration
    profile."""
