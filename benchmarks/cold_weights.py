"""What a linear layer's GEMMs cost beyond their FLOPs when their weight-shaped operand is cold, on this CPU.

    python -m benchmarks.cold_weights

A GEMM timed alone, back to back, finds its weight W (forward x W^T, input gradient dY W) or its weight gradient
dW (dY^T x) in cache; inside a model the other layers' activations have evicted it since the last use. Each GEMM
of a few linear shapes is timed warm (repeated) and cold (after writing a 64 MiB buffer, larger than the caches),
one thread, fp32, medians of 40 calls; the difference is printed in copies of the weight at the pace of a cold
16 MiB tensor copy (one copy reads and writes the weight once). predictor/ops.py _linear charges one read or
write of the weight per GEMM on a CPU from this.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

SHAPES = ((128, 384, 1536), (128, 1536, 384), (128, 384, 384), (640, 384, 1536), (128, 384, 8192), (640, 384, 8192))
"""(rows, in, out): the encoder fixture's block and head shapes at micro-batch 1 and 5 (sequence 128)."""
CALLS = 40


def _median_s(fn: Callable[[], object], flush: Callable[[], object] | None) -> float:
    times = []
    for _ in range(CALLS):
        if flush is not None:
            flush()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    import torch
    torch.set_num_threads(1)
    buffer = torch.empty(64 * 2**20 // 4)
    flush = lambda: buffer.add_(1.0)  # noqa: E731
    src = torch.randn(16 * 2**20 // 4)
    dst = torch.empty_like(src)
    copy_s = _median_s(lambda: dst.copy_(src), flush)
    copy_bytes_per_s = 2 * src.numel() * 4 / copy_s
    print(f"cold 16 MiB copy: {copy_bytes_per_s / 1e9:.1f} GB/s (read + write)")
    extras = []
    for rows, n_in, n_out in SHAPES:
        x, w, dy = torch.randn(rows, n_in), torch.randn(n_out, n_in), torch.randn(rows, n_out)
        copy_of_weight_s = 2 * w.numel() * 4 / copy_bytes_per_s
        for name, fn in (("forward x W^T", lambda: torch.nn.functional.linear(x, w)),
                         ("input grad dY W", lambda: dy @ w), ("weight grad dY^T x", lambda: dy.t() @ x)):
            warm, cold = _median_s(fn, None), _median_s(fn, flush)
            extras.append((cold - warm) / copy_of_weight_s)
            print(f"{rows} x {n_in} -> {n_out} {name:18s} warm {warm * 1e3:7.3f} ms "
                  f"({2 * rows * n_in * n_out / warm / 1e9:4.0f} GFLOP/s), cold {cold * 1e3:7.3f} ms: "
                  f"{extras[-1]:+.2f} copies of the weight")
    print(f"median over {len(extras)} GEMMs: {statistics.median(extras):+.2f} copies of the weight")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
