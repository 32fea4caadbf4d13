"""Host cost of ZeRO-3's per-rank Python loops, which a one-rank probe never runs: the split of a coalesced
all-gather into each parameter (AllGatherCoalescedHandle.wait, deepspeed 0.19.8 runtime/zero/
partition_parameters.py:772-792: one narrow per rank, then torch.cat) and the interleaving slices of
reduce_scatter_coalesced (runtime/comm/coalesced_collectives.py:92-118: one slice per tensor per rank).

    python -m benchmarks.zero3_per_rank

Microseconds per tensor at world sizes 1, 2, 16 and 64 (200 tensors of 4096 floats, CPU, one thread, minimum of
30 repeats). Results and their reading: benchmarks/zero3_hooks.md. Not part of the test run.
"""
import math
import time

import torch

torch.set_num_threads(1)
def split_like_wait(partitions, numels, world):  # AllGatherCoalescedHandle.wait's split, partition_parameters.py:772-792
    off = 0
    for n in numels:
        part = math.ceil(n / world); parts = []
        for rank in range(world):
            start = rank * part
            if start < n:
                parts.append(partitions[rank].narrow(0, off, min(n - start, part)))
        torch.cat(parts)
        off += part
def slices_like_rs(tensors, world):  # reduce_scatter_coalesced's per-tensor, per-rank slicing, coalesced_collectives.py:92-118
    lst = []
    for t in tensors:
        f = t.view(-1); c = math.ceil(t.numel() / world)
        lst.append([f[r * c:r * c + c] for r in range(world)])
    out = []
    for r in range(world):
        for i in range(len(tensors)):
            out.append(lst[i][r])
    return out
for world in (1, 2, 16, 64):
    numels = [4096] * 200
    part = sum(math.ceil(n / world) for n in numels)
    partitions = [torch.zeros(part) for _ in range(world)]
    tensors = [torch.zeros(n) for n in numels]
    res = {}
    for name, fn in (("wait_split", lambda: split_like_wait(partitions, numels, world)), ("rs_slices", lambda: slices_like_rs(tensors, world))):
        ts = []
        for _ in range(30):
            t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
        res[name] = min(ts) / len(numels) * 1e6
    print(world, {k: round(v, 2) for k, v in res.items()}, "us per tensor")
