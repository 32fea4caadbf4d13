"""The pace checks rank 0 of a profiling run times before the first step (and the matmul again at exit): this
device's matmul rate in the engine's dtype, its copy bandwidth, and on a CPU copies of cache sizes, a large copy into
a fresh tensor, dropout's mask and GEMMs with subnormal operands. Loaded from its file by
calibrate/profiling_site/sitecustomize.py inside the user's process; imports torch and deepspeed, never zerotune."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

__all__ = ["matmul_rate", "copy_rate", "subnormal_rate", "COPY_BYTES", "CACHE_COPY_BYTES", "DROPOUT_ELEMS",
           "MATMUL_SIZE", "SLOW_MATMUL_SIZE", "MATMUL_BUDGET_S", "SUBNORMAL_CHECK_SHARES", "SUBNORMAL_CHECK_SHAPE",
           "SUBNORMAL_CHECK_REPEATS"]

COPY_BYTES = 64 * 1024 * 1024  # the calibration's quick memory microbenchmark's size
CACHE_COPY_BYTES = (128 * 1024, 512 * 1024, 2 * 1024 * 1024, 8 * 1024 * 1024, 32 * 1024 * 1024)
"""Smaller copies timed on a CPU, each into a fresh tensor: the bandwidth of an eager kernel whose working set
fits the caches (the cache-aware roofline, Ilic, Pratas & Sousa 2014); on a GPU a copy this small times its
launch, not its bytes."""
DROPOUT_ELEMS = 2 * 1024 * 1024
"""Elements of the CPU's dropout check: 8 MiB in fp32, under glibc's mmap threshold as a block's activations are."""
MATMUL_SIZE = 2048
"""Edge of the square matmul timed before the first step: one of the shapes zerotune's microbenchmarks time
(calibrate/microbench.py), so the rate compares with the calibration profile's."""
SLOW_MATMUL_SIZE = 512
"""The edge timed instead on a device where MATMUL_SIZE's product would take longer than MATMUL_BUDGET_S (also
one of the microbenchmarks' squares)."""
MATMUL_BUDGET_S = 1.0
"""Longest one timed product may take: the timing repeats it about seven times. bf16 on a CPU without bf16 units
ran a 2048^3 product at 0.27 GFLOP/s (64 s), which made one profiling run take 7.5 minutes."""


def matmul_rate(engine: Any) -> dict[str, Any]:
    """This device's matmul FLOP/s now, in the engine's compute dtype (the calibration may be from a day the
    machine ran at another pace: a shared CPU VM's single-thread fp32 rate read 95 and 153 GFLOP/s two days
    apart). Rank 0 only, a fraction of a second; the other ranks wait in their first collective."""
    import torch
    from deepspeed.accelerator import get_accelerator
    acc = get_accelerator()
    bf16 = getattr(engine, "bfloat16_enabled", lambda: False)()
    fp16 = getattr(engine, "fp16_enabled", lambda: False)()
    dtype, name = (torch.bfloat16, "bf16") if bf16 else (torch.float16, "fp16") if fp16 else (torch.float32, "fp32")
    n = SLOW_MATMUL_SIZE
    a = torch.randn(n, n, dtype=dtype, device=acc.device_name())
    b = torch.randn(n, n, dtype=dtype, device=acc.device_name())
    a @ b
    acc.synchronize()  # the first product pays for kernel selection
    start = time.perf_counter()
    a @ b
    acc.synchronize()
    if (MATMUL_SIZE / n) ** 3 * (time.perf_counter() - start) <= MATMUL_BUDGET_S:
        n = MATMUL_SIZE
        a = torch.randn(n, n, dtype=dtype, device=acc.device_name())
        b = torch.randn(n, n, dtype=dtype, device=acc.device_name())
    seconds = _timing_module().per_call_s(lambda: a @ b, acc.synchronize)
    return {"m": n, "n": n, "k": n, "dtype": name, "flops_per_s": 2.0 * n ** 3 / seconds}

def _timing_module() -> Any:
    """calibrate/timing.py: the pace checks time as the calibration's microbenchmarks do."""
    spec = importlib.util.spec_from_file_location("_zerotune_timing", Path(__file__).resolve().parent / "timing.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def copy_rate() -> dict[str, Any]:
    """This device's memory pace now: a COPY_BYTES tensor copy, counting the read and the write (as the calibration's
    microbenchmark does, calibrate/microbench.py memory_bandwidth_bytes_per_s). A VM that moved to another host can
    run its matmuls faster and its memory-bound kernels slower than on the day it was calibrated (this one: fp32
    matmul 95 -> 155 GFLOP/s, copy 35 -> 12 GB/s). On a CPU also CACHE_COPY_BYTES copies ("cache_curve": bytes
    moved, bytes per second), a few milliseconds each, the COPY_BYTES copy into a fresh tensor
    ("fresh_bytes_per_s") and torch's dropout on DROPOUT_ELEMS beyond a clone ("dropout_s_per_element")."""
    import torch
    from deepspeed.accelerator import get_accelerator
    acc = get_accelerator()
    timing = _timing_module()

    def rate(num_bytes: int, fresh: bool = False) -> float:
        src = torch.empty(num_bytes // 4, dtype=torch.float32, device=acc.device_name()).fill_(1.0)
        dst = torch.empty_like(src)
        call = src.clone if fresh else (lambda: dst.copy_(src))
        return 2.0 * num_bytes / timing.per_call_s(call, acc.synchronize)

    doc: dict[str, Any] = {"bytes": COPY_BYTES, "bytes_per_s": rate(COPY_BYTES)}
    if acc.device_name() == "cpu":  # bytes moved (read + write) -> bytes per second, into a fresh tensor as an eager
        # kernel writes its output (glibc maps a large one anew each time: its pages fault in as they are written)
        doc["cache_curve"] = [[2.0 * n, rate(n, fresh=True)] for n in CACHE_COPY_BYTES] + \
            [[2.0 * COPY_BYTES, doc["bytes_per_s"]]]
        # the same large copy into a fresh tensor: above glibc's mmap threshold (at most 32 MiB) each one is mapped
        # anew and its pages fault in as written (the predictor's fresh_page_s_per_byte)
        doc["fresh_bytes_per_s"] = rate(COPY_BYTES, fresh=True)
        # a dropout mask drawn element by element on this thread, beyond the clone of the same tensor
        x = torch.ones(DROPOUT_ELEMS)
        drop = timing.per_call_s(lambda: torch.nn.functional.dropout(x, 0.1, training=True), acc.synchronize)
        doc["dropout_s_per_element"] = max(0.0, drop - timing.per_call_s(x.clone, acc.synchronize)) / DROPOUT_ELEMS
    return doc


SUBNORMAL_CHECK_SHARES = (0.0, 0.03, 0.3, 0.0)
"""Shares of subnormal values in the left operand of the subnormal check's GEMMs: none, about what a freshly
initialised model's logits' gradient holds after a few steps (1.5-3.3% measured, data/hardware/cpu.yaml), ten
times that (a model with a wide N(0, 1) tied embedding read 17%), and none again (the faster of the two normal
timings is the reference: a shared machine's pace drifts)."""
SUBNORMAL_CHECK_SHAPE = (256, 1024, 256)
"""(m, k, n) of the subnormal check's fp32 GEMMs: 0.13 GFLOP, about a millisecond at a CPU core's normal pace."""
SUBNORMAL_CHECK_REPEATS = 5
"""Products timed per share; the fastest counts (a CPU VM's neighbours only ever slow a product down)."""


def subnormal_rate() -> dict[str, Any]:
    """On the CPU, whether this host slows a GEMM down for subnormal operands: seconds per product of a
    SUBNORMAL_CHECK_SHAPE fp32 GEMM whose left operand holds each of SUBNORMAL_CHECK_SHARES of subnormal values
    (1e-40, below fp32's smallest normal). An x86 core without flush-to-zero runs a vector instruction with a
    subnormal operand through a microcode assist, how slowly depends on the core: an Intel Xeon host of this
    project's VM ran 7x slower at 3% (data/hardware/cpu.yaml subnormal_gemm_source), an AMD EPYC one not at all
    (2026-11-29: x1.00 at 3% and 17%). Rank 0 only, a fraction of a second."""
    import torch
    m, k, n = SUBNORMAL_CHECK_SHAPE
    gen = torch.Generator().manual_seed(0)
    b = torch.randn(k, n, generator=gen)
    seconds = []
    for share in SUBNORMAL_CHECK_SHARES:
        a = torch.randn(m, k, generator=gen)
        a[torch.rand(m, k, generator=gen) < share] = 1e-40
        a @ b  # the first product pays for the kernel's setup
        runs = []
        for _ in range(SUBNORMAL_CHECK_REPEATS):
            start = time.perf_counter()
            a @ b
            runs.append(time.perf_counter() - start)
        seconds.append(min(runs))
    return {"shares": list(SUBNORMAL_CHECK_SHARES), "seconds": seconds, "shape": list(SUBNORMAL_CHECK_SHAPE)}
