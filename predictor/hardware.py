"""Accelerators and clusters as data (SI units inside; the YAML catalog uses human units in its keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["HardwareSpec", "ClusterSpec", "Precision", "DeviceKind"]

Precision = Literal["fp32", "fp16", "bf16"]
DeviceKind = Literal["gpu", "hpu", "cpu"]


@dataclass(frozen=True)
class HardwareSpec:
    """One accelerator (or CPU socket) and the node it sits in."""

    name: str
    description: str
    kind: DeviceKind
    memory_bytes: float
    """Device memory capacity as the vendor states it."""
    runtime_reserved_bytes: float
    """Memory the runtime holds outside the allocator (CUDA context, kernels, communicator buffers)."""
    peak_flops: dict[str, float]
    """Dense peak FLOP/s per precision; a precision the device cannot run is absent."""
    memory_bandwidth_bytes_per_s: float
    intra_node_bandwidth_bytes_per_s: float
    """Unidirectional per-device bandwidth to peers in the same node."""
    intra_node_latency_s: float
    inter_node_bandwidth_bytes_per_s: float
    """Unidirectional per-device share of the node's scale-out network."""
    inter_node_latency_s: float
    host_to_device_bandwidth_bytes_per_s: float
    num_devices_per_node: int
    host_memory_bytes: float
    """Host (CPU) memory of one node, for offloaded state."""
    matmul_flops: dict[str, float]
    """Achievable (measured) dense matmul FLOP/s per precision on large shapes: what a GEMM reaches, not the
    datasheet peak; same precisions as peak_flops."""
    achievable_memory_bandwidth_bytes_per_s: float
    """What a streaming copy reaches (read + write counted), the rate memory-bound kernels run at."""
    kernel_launch_s: float
    """Host time per kernel a training framework issues: a stream of short kernels cannot run faster."""
    num_compute_units: int
    """Streaming multiprocessors (or matrix engines) a GEMM's output tiles are spread over in waves."""
    achievable_source: str
    """Where matmul_flops, achievable_memory_bandwidth, kernel_launch and num_compute_units come from."""
    source: str
    comm_compute_overlap: bool = True
    """Whether data-parallel communication can run beside compute: a device with streams whose collectives move
    data on their own engines (NCCL on GPUs, the HPU's streams). False where the accelerator has no streams
    and the communication library copies and reduces on the cores the ranks compute on (DeepSpeed's CPU
    accelerator with gloo): every collective's time then adds to the step, whatever overlap_comm and
    prefetching say."""

    flash_attention_flops_per_s: float = 0.0
    """FLOP/s a fused (flash) attention kernel reaches in 16-bit at long sequences, where it is below the GEMMs'
    matmul_flops: FlashAttention-2 reaches 335 TFLOPs/s on an H100 against 794.5 for a GEMM, because it uses none
    of Hopper's TMA or warpgroup tensor-core instructions (Dao 2023, arXiv:2307.08691, sec. 4.1). 0: the GEMM
    rate (ops._attention)."""
    eager_bandwidth_share: float = 1.0
    """Share of achievable_memory_bandwidth that eager PyTorch's memory-bound kernels reach (norms, GELU's pieces,
    dropout with its random numbers, residual adds, softmax, as a Hugging Face model runs them one op at a time);
    GEMMs stream their operands at the full copy pace. Measured below 1 on Hopper (data/hardware h100-80gb, h200),
    1 where nothing measured says otherwise. Megatron's fused kernels are not charged it
    (zerotune.validate.published.framework_efficiency)."""
    dropout_rng_s_per_element: float = 0.0
    """Seconds to draw one dropout mask element where the framework draws it outside the kernel's memory pass: on a
    CPU rank torch's dropout draws its mask with bernoulli_ on the rank's one thread, 10-22 ns per element against
    0.55-0.83 ns for a copy (torch 2.13, this project's CPU; data/hardware/cpu.yaml). 0 on GPUs, where the mask's
    random numbers come from the kernel itself (Philox) and cost only its bytes."""
    subnormal_gemm_slowdown: float = 0.0
    """How much longer a GEMM takes per unit share of subnormal values in an operand: time x (1 + this x share).
    x86 cores run a vector instruction with a subnormal operand through a microcode assist (~100-150 cycles
    against half a cycle) unless flush-to-zero is set, which PyTorch leaves off. Measured on this project's CPU
    (data/hardware/cpu.yaml); 0 on GPUs, whose FMA units take subnormals at full rate."""
    flash_score_s: tuple[float, float] = (0.0, 0.0)
    """Seconds a fused attention kernel spends per score it computes beyond its GEMM FLOPs, forward and backward,
    where that kernel runs its online softmax element by element: PyTorch's CPU flash attention
    (scaled_dot_product_attention's CPU kernel) exponentiates and rescales each score in fp32 between small
    blocked GEMMs, in any precision (data/hardware/cpu.yaml flash_score_source). (0, 0): the GPU form, GEMM
    FLOPs at flash_attention_flops_per_s."""
    flash_kv_block_elems: int = 0
    """Keys per block of such a kernel, the granularity at which a causal mask skips blocks above the diagonal;
    0: ops.FLASH_BLOCK_ELEMS (128, FlashAttention-2's)."""
    fresh_map_bytes: float = 0.0
    """Size from which the host's allocator maps every tensor anew, so that its pages fault in as they are first
    written: PyTorch's CPU allocator takes each tensor from malloc (c10/core/impl/alloc_cpu.cpp, posix_memalign, no
    cache), and glibc's malloc serves a block at or above its mmap threshold with a fresh mmap and returns it to the
    system when freed; the threshold rises with freed blocks up to DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB on a 64-bit
    host (glibc malloc/malloc.c). 0 where no such rule is modelled (GPUs, whose caching allocators keep blocks)."""
    fresh_page_s_per_byte: float = 0.0
    """Seconds beyond its memory pass that writing one byte of a tensor of fresh_map_bytes or more costs: the page
    faults and the kernel's zeroing of each new page (data/hardware/cpu.yaml, fresh_page_source)."""
    gemm_tile_elems: int = 128
    """Largest output tile edge the device's GEMM kernels pad a dimension to (ops.gemm_s: tile and wave
    quantization). 128 on GPUs (cuBLAS/CUTLASS thread-block tiles); a CPU core's kernels block the output in
    register and AMX tiles of 16 rows, so a dimension one past a multiple of 128 costs 144 / 128, not twice."""
    heap_retained_activation_fraction: float = 0.0
    """Activation bytes the host allocator keeps resident at every step's peak beyond the live tensors, as a
    fraction of the activations (0 for a device's caching allocator, whose reserve is allocator_slack). On a CPU
    rank PyTorch takes tensors from glibc malloc (c10/core/impl/alloc_cpu.cpp posix_memalign); glibc maps a block
    above M_MMAP_THRESHOLD and unmaps it on free, but raises the threshold to every such block freed, up to
    DEFAULT_MMAP_THRESHOLD_MAX = 32 MiB on 64-bit (malloc.c "dynamic mmap threshold", mallopt(3)), so from the
    second step a layer's activations (each under 32 MiB) come from the brk heap, whose freed chunks stay
    resident, while the logits (far above it) are still mapped and unmapped."""

    def supports(self, precision: Precision) -> bool:
        return precision in self.peak_flops


@dataclass(frozen=True)
class ClusterSpec:
    """num_nodes nodes of num_gpus_per_node devices each (the DeepSpeed launcher's --num_nodes/--num_gpus)."""

    hardware: HardwareSpec
    num_nodes: int
    num_gpus_per_node: int

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"--num_nodes must be at least 1, got {self.num_nodes}")
        if self.num_gpus_per_node < 1:
            raise ValueError(f"--num_gpus must be at least 1, got {self.num_gpus_per_node}")
        node = self.hardware.num_devices_per_node
        if self.num_gpus_per_node > node:  # a larger "node" would be predicted with intra-node links it lacks
            nodes = -(-self.num_gpus_per_node // node)
            raise ValueError(f"--num_gpus {self.num_gpus_per_node} exceeds the {node} devices per node of "
                             f"{self.hardware.name} (gpus_per_node in its hardware YAML); --num_gpus counts devices "
                             f"per node: add nodes with --num_nodes (e.g. --num_nodes {nodes} --num_gpus {node}), or "
                             f"give a hardware YAML with a larger node")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_gpus_per_node
