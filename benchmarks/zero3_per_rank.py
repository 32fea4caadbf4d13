"""Host cost of ZeRO-3's per-rank Python loops, which a one-rank probe never runs: the split of a coalesced
all-gather into each parameter (AllGatherCoalescedHandle.wait, deepspeed 0.19.8 runtime/zero/
partition_parameters.py:772-792: one narrow per rank, then torch.cat) and the interleaving slices of
reduce_scatter_coalesced (runtime/comm/coalesced_collectives.py:92-118: one slice per tensor per rank).

    python -m benchmarks.zero3_per_rank

Microseconds per tensor at world sizes 1, 2, 16 and 64 (200 tensors of 4096 floats, CPU, one thread, minimum of
30 repeats). Results and their reading: benchmarks/zero3_hooks.md. Not part of the test run.
"""

from __future__ import annotations

import json
import math
import time
from typing import Callable

__all__ = ["main"]


def _split_like_wait(partitions: list, numels: list[int], world: int) -> None:
    """AllGatherCoalescedHandle.wait's split of the gathered partitions into each parameter."""
    import torch
    offset = 0
    for numel in numels:
        part, pieces = math.ceil(numel / world), []
        for rank in range(world):
            start = rank * part
            if start < numel:
                pieces.append(partitions[rank].narrow(0, offset, min(numel - start, part)))
        torch.cat(pieces)
        offset += part


def _slices_like_reduce_scatter(tensors: list, world: int) -> list:
    """reduce_scatter_coalesced's per-tensor, per-rank slices and their interleaving."""
    per_tensor = []
    for tensor in tensors:
        flat, chunk = tensor.view(-1), math.ceil(tensor.numel() / world)
        per_tensor.append([flat[r * chunk:r * chunk + chunk] for r in range(world)])
    return [per_tensor[i][r] for r in range(world) for i in range(len(tensors))]


def _us_per_tensor(fn: Callable[[], object], num_tensors: int, repeats: int = 30) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) / num_tensors * 1e6


def main() -> None:
    import torch
    torch.set_num_threads(1)
    for world in (1, 2, 16, 64):
        numels = [4096] * 200
        part = sum(math.ceil(n / world) for n in numels)
        partitions = [torch.zeros(part) for _ in range(world)]
        tensors = [torch.zeros(n) for n in numels]
        split = _us_per_tensor(lambda: _split_like_wait(partitions, numels, world), len(numels))
        slices = _us_per_tensor(lambda: _slices_like_reduce_scatter(tensors, world), len(tensors))
        print(json.dumps({"world_size": world, "gather_split_us_per_tensor": round(split, 2),
                          "reduce_scatter_slices_us_per_tensor": round(slices, 2)}))


if __name__ == "__main__":
    main()
