"""The kernels a micro-step is made of, timed on one device: a GEMM on a roofline with tile and wave quantization, a
memory-bound kernel as the bytes it moves (at the bandwidth of a copy of its size), and on a CPU the pages a new
large tensor faults in and the cold weights a GEMM reads from memory. zerotune.predictor.ops builds a transformer
block's forward and backward from them.

Time of a GEMM: the larger of FLOPs / (achievable matmul FLOP/s x wave and tile quantization) and its bytes
/ achievable bandwidth (a roofline, Williams et al. 2009). Output tiles of 128 x 128 (smaller for a smaller
dimension, as cuBLAS's heuristics pick) fill the device's compute units in waves; a last partial wave idles
the rest (NVIDIA, "Matrix Multiplication Background User's Guide", tile and wave quantization). Memory-bound
ops move their bytes at the achievable bandwidth. Everything is vectorised over arrays of sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np

from zerotune.predictor.hardware import HardwareSpec
from zerotune.predictor.job import Efficiency
from zerotune.predictor.memory import DTYPE_BYTES

__all__ = ["Batch", "DeviceRates", "device_rates", "gemm_s", "gemm_flops", "cold_weight_s", "fresh_s",
           "fresh_write_s", "TILE_ELEMS", "MIN_TILE_ELEMS", "ELEMENT_BYTES", "TENSOR_CORE_ALIGN_BYTES",
           "MISALIGNED_GEMM_SLOWDOWN"]

Batch = Union[int, float, np.ndarray]
TILE_ELEMS = 128
"""Largest output tile edge of a tensor-core GEMM (cuBLAS/CUTLASS 128 x 128 thread-block tiles): the default of
HardwareSpec.gemm_tile_elems."""
MIN_TILE_ELEMS = 16
TENSOR_CORE_ALIGN_BYTES = 16
"""Operand alignment a 16-bit GEMM needs for the tensor-core kernels that reach the catalog's matmul rate: M, N and K
multiples of 16 bytes, 8 fp16 / bf16 elements (NVIDIA, Matrix Multiplication Background User's Guide, sec. 2.2
"Tensor Core Requirements", and cuBLAS's tensorop restrictions: before cuBLAS 11 a requirement, since then tensor
cores run other sizes with narrower loads, less efficiently)."""
MISALIGNED_GEMM_SLOWDOWN = 2.0
"""How much slower a 16-bit GEMM with a dimension off that alignment computes. Measured in public: padding GPT-2's
vocabulary from 50,257 to 50,304 made nanoGPT's GPT-2 (124M) train about 25% faster on A100s (Karpathy, nanoGPT,
model.py GPTConfig comment and the announcement of 2023-02-03), where the vocabulary projection is about 27% of
the model's FLOPs: the misaligned projection took about 1.9x its aligned time. Held against the published data's
fit halves: BLOOM's candidates whose head width is off 8 (hidden 14,400 / 96 heads = 150) measured 28-31% slower
than predicted without it (validate.accuracy --half fit); the H200 grid's fit half (GPT-2's 50,257-token head)
moved from 5.4% to 5.8% median error, its test half from 7.0% to 6.2%."""
ELEMENT_BYTES = DTYPE_BYTES
"""Activation element size: DeepSpeed's fp16/bf16 modes cast the module's parameters to 16 bits, so its activations
are 16-bit too (deepspeed 0.19 runtime/engine.py:2080-2088, _configure_distributed_model)."""

@dataclass(frozen=True)
class DeviceRates:
    """What one device achieves for one precision, after the calibration's scales."""

    matmul_flops_per_s: float
    memory_bytes_per_s: float
    kernel_launch_s: float
    num_compute_units: int
    element_bytes: int
    tile_elems: int = 128
    """Largest output tile edge of the device's GEMM kernels (HardwareSpec.gemm_tile_elems)."""
    gemm_memory_bytes_per_s: float = 0.0
    """Bandwidth a GEMM library streams its operands at: the device's achievable (copy) bandwidth, not the eager
    elementwise kernels' share of it (HardwareSpec.eager_bandwidth_share, Efficiency.memory_bandwidth_efficiency);
    0 means memory_bytes_per_s."""
    rng_s_per_element: float = 0.0
    """Seconds to draw one dropout mask element beyond its bytes (HardwareSpec.dropout_rng_s_per_element)."""
    fp32_matmul_flops_per_s: float = 0.0
    """The fp32 GEMM rate, for the matmuls a 16-bit model runs in fp32 (ModelSpec.attention_upcast 'scores');
    0 means matmul_flops_per_s."""
    subnormal_gemm_slowdown: float = 0.0
    """HardwareSpec.subnormal_gemm_slowdown."""
    cache_gain: tuple[tuple[float, float], ...] = ()
    """Efficiency.memory_cache_gain: (bytes a kernel moves, its bandwidth over memory_bytes_per_s), smallest first."""
    flash_flops_per_s: float = 0.0
    """A fused attention kernel's rate (HardwareSpec.flash_attention_flops_per_s times the precision's compute
    scale, not the GEMMs' efficiency scale: the catalog figure is the kernel's own measured rate); 0 means
    matmul_flops_per_s."""
    packs_weights: bool = False
    """Whether a linear layer's forward GEMM first copies its weight into the BLAS's blocked layout, a pass nothing
    overlaps: on a CPU (HardwareSpec.kind 'cpu'), see _linear."""
    align_elems: int = 0
    """Elements a GEMM dimension must be a multiple of to run at the full rate (TENSOR_CORE_ALIGN_BYTES on a GPU in
    a 16-bit precision); 0 where no such rule is modelled (fp32 on CUDA cores, CPUs, HPUs)."""
    flash_score_s: tuple[float, float] = (0.0, 0.0)
    """HardwareSpec.flash_score_s: a fused attention kernel's seconds per score beyond its FLOPs, which then runs its
    GEMM work at the fp32 rate (ops._attention); (0, 0): the GPU form."""
    flash_block_elems: int = 0
    """HardwareSpec.flash_kv_block_elems; 0: FLASH_BLOCK_ELEMS."""
    fresh_map_bytes: float = 0.0
    """HardwareSpec.fresh_map_bytes: a tensor at least this large is mapped anew when allocated; 0: none is."""
    fresh_s_per_byte: float = 0.0
    """Seconds beyond its memory pass per byte written into such a tensor (its pages fault in): the profiling run's
    Efficiency.fresh_page_s_per_byte, else HardwareSpec.fresh_page_s_per_byte."""


def device_rates(hw: HardwareSpec, precision: str, eff: Efficiency) -> DeviceRates:
    precision_scale = getattr(eff, f"{precision}_compute_scale")
    scale = precision_scale * eff.gemm_efficiency_scale
    flash = hw.flash_attention_flops_per_s * precision_scale if precision != "fp32" else 0.0
    launch = hw.kernel_launch_s if eff.kernel_launch_s is None else eff.kernel_launch_s
    return DeviceRates(hw.matmul_flops[precision] * scale,
                       hw.achievable_memory_bandwidth_bytes_per_s * hw.eager_bandwidth_share
                       * eff.memory_bandwidth_efficiency, launch,
                       hw.num_compute_units, ELEMENT_BYTES[precision], hw.gemm_tile_elems,
                       hw.achievable_memory_bandwidth_bytes_per_s,
                       hw.dropout_rng_s_per_element if eff.dropout_rng_s_per_element is None
                       else eff.dropout_rng_s_per_element,
                       hw.matmul_flops["fp32"] * eff.fp32_compute_scale * eff.gemm_efficiency_scale,
                       hw.subnormal_gemm_slowdown, tuple(eff.memory_cache_gain), flash, hw.kind == "cpu",
                       TENSOR_CORE_ALIGN_BYTES // ELEMENT_BYTES[precision]
                       if hw.kind == "gpu" and ELEMENT_BYTES[precision] == 2 else 0,
                       hw.flash_score_s, hw.flash_kv_block_elems,
                       hw.fresh_map_bytes, _fresh_page_s_per_byte(hw, eff))


def gemm_flops(m: Batch, n: Batch, k: Batch, batch: Batch = 1) -> Batch:
    return 2.0 * m * n * k * batch


def _tile(dim: Batch, largest: int) -> Batch:
    """The tile edge a GEMM library picks for a dimension: the next power of two, from MIN_TILE_ELEMS (or the
    device's largest, if smaller) up to the device's largest."""
    return np.clip(2.0 ** np.ceil(np.log2(np.maximum(dim, 1))), min(MIN_TILE_ELEMS, largest), largest)


def gemm_s(m: Batch, n: Batch, k: Batch, batch: Batch, rates: DeviceRates) -> Batch:
    """Device seconds of `batch` (m x k) @ (k x n) products: roofline with tile and wave quantization."""
    tm, tn = _tile(m, rates.tile_elems), _tile(n, rates.tile_elems)
    tiles_m, tiles_n = np.ceil(m / tm), np.ceil(n / tn)
    tiles = tiles_m * tiles_n * batch
    units = rates.num_compute_units
    waves = np.ceil(tiles / units)
    useful = (m * n) / (tiles_m * tm * tiles_n * tn) * tiles / (waves * units)
    compute = gemm_flops(m, n, k, batch) / (rates.matmul_flops_per_s * useful)
    if rates.align_elems:  # a dimension off the tensor cores' alignment (TENSOR_CORE_ALIGN_BYTES)
        off = (np.mod(m, rates.align_elems) != 0) | (np.mod(n, rates.align_elems) != 0) \
            | (np.mod(k, rates.align_elems) != 0)
        compute = compute * np.where(off, MISALIGNED_GEMM_SLOWDOWN, 1.0)
    bandwidth = rates.gemm_memory_bytes_per_s or rates.memory_bytes_per_s
    memory = rates.element_bytes * batch * (m * k + k * n + m * n) / bandwidth
    return np.maximum(compute, memory) + fresh_s(m * n * batch, 1, rates)


def _fresh_page_s_per_byte(hw: HardwareSpec, eff: Efficiency) -> float:
    """The profiling run's timing of a page faulting in where it made one, else the catalog's."""
    return hw.fresh_page_s_per_byte if eff.fresh_page_s_per_byte is None else eff.fresh_page_s_per_byte


def _fresh_bytes_s(size_bytes: Batch, threshold_bytes: float, s_per_byte: float) -> Batch:
    """Seconds for a new tensor of `size_bytes` to fault its pages in: only at or past the threshold."""
    return np.where(np.asarray(size_bytes, dtype=float) >= threshold_bytes, size_bytes * s_per_byte, 0.0)


def fresh_write_s(num_bytes: float, hw: HardwareSpec, eff: Efficiency) -> float:
    """fresh_s of one new tensor of `num_bytes`, outside a micro-step's kernels (a gradient bucket's flat copy)."""
    if not hw.fresh_map_bytes:
        return 0.0
    return float(_fresh_bytes_s(num_bytes, hw.fresh_map_bytes, _fresh_page_s_per_byte(hw, eff)))


def fresh_s(elems: Batch, writes: float, rates: DeviceRates) -> Batch:
    """Seconds beyond their memory pass to write `writes` new tensors of `elems` elements each where the host maps
    so large a tensor anew (DeviceRates.fresh_map_bytes): its pages fault in as they are first written, 0.4 ns a
    byte on this project's CPU VM against 0.04 for the copy itself (data/hardware/cpu.yaml, fresh_page_source).
    A GPT-2-vocabulary head's logits at 4096 tokens (823 MB a tensor) pay it on every pass over them; a block's
    activations at the fixtures' sizes (a few MiB) never do. 0 on a device without the rule."""
    if not rates.fresh_map_bytes or not rates.fresh_s_per_byte:
        return 0 * elems
    return writes * _fresh_bytes_s(np.asarray(elems, dtype=float) * rates.element_bytes, rates.fresh_map_bytes,
                                   rates.fresh_s_per_byte)


def cold_weight_s(n_in: float, n_out: float, rates: DeviceRates) -> float:
    """Seconds of one read (or write) of an n_in x n_out weight-shaped GEMM operand at the memory-bound pace, which
    each of a linear layer's three GEMMs pays on a CPU (rates.packs_weights; 0 elsewhere): inside a model the other
    layers' activations have evicted W since its last use, so the forward and the input gradient read it and the
    weight gradient writes dW from and to memory, where a GEMM timed alone finds them in cache. Measured on this
    project's CPU VM (one thread, fp32, 2026-11-28, `python -m benchmarks.cold_weights`): a 64 MiB write between
    calls added 0.05-1.0 of one copy of the weight at a cold 16 MiB copy's pace per GEMM, median 0.43 over 18
    GEMMs of the encoder fixture's shapes (one read is half a copy), at 128 rows as at 640, whatever the FLOPs.
    With it, `python -m benchmarks.first_prediction` (11 scripts, back to back with the code before): the first
    experiment inside its band for 10 of 11 scripts against 6, RMS log error 0.099 -> 0.075; the profiling run
    11 / 11 against 10, 0.096 -> 0.076 (data/measurements/first_prediction/results_2026-11-28_cold_weights)."""
    if not rates.packs_weights:
        return 0.0
    return rates.element_bytes * n_in * n_out / rates.memory_bytes_per_s


def _mask_draws(elems: Batch, rates: DeviceRates) -> Batch:
    """Seconds to draw `elems` dropout mask elements beyond their bytes, in forward only (backward multiplies by the
    saved mask; recompute draws them again as its forward): DeviceRates.rng_s_per_element, 0 on GPUs."""
    return elems * rates.rng_s_per_element


def _memory_bytes_per_s(elems: Batch, rates: DeviceRates) -> Batch:
    """The bandwidth eager kernels over `elems` elements move their bytes at: memory_bytes_per_s, times the
    measured gain of a copy that moves as many bytes (one read and one write of the tensor) where they fit the
    device's caches (DeviceRates.cache_gain, interpolated in log bytes; none beyond the largest copy timed)."""
    if not rates.cache_gain:
        return rates.memory_bytes_per_s
    moved, gain = np.array(rates.cache_gain, dtype=float).T
    key = np.log(np.maximum(2.0 * elems * rates.element_bytes, 1.0))
    return rates.memory_bytes_per_s * np.interp(key, np.log(moved), gain, left=gain[0], right=1.0)


def _elementwise(elems: Batch, reads: float, writes: float, extra_bytes: Batch, rates: DeviceRates,
                 fresh: bool = True) -> Batch:
    """Seconds of eager kernels that read and write tensors of `elems` elements `reads` and `writes` times; each
    write a new tensor (fresh_s) unless `fresh` is False."""
    moved = (elems * (reads + writes) * rates.element_bytes + extra_bytes) / _memory_bytes_per_s(elems, rates)
    return moved + fresh_s(elems, writes, rates) if fresh else moved
