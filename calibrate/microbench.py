"""Microbenchmarks through DeepSpeed's accelerator abstraction: matmul FLOP/s, collectives, memory bandwidth.

One code path for CUDA (NCCL), Gaudi/HPU (HCCL) and the CPU (gloo): every device call goes through
`deepspeed.accelerator.get_accelerator()` and every collective through `deepspeed.comm`, so the accelerator
DeepSpeed picks (DS_ACCELERATOR or auto-detection) is the one measured. HPU is untested here (no Gaudi);
it assumes Habana's accelerator implements synchronize / pin_memory / is_*_supported as CUDA's does.

Collectives need N ranks, so everything runs under the DeepSpeed launcher as a script:

    deepspeed --num_gpus 2 calibrate/microbench.py [--quick] --metrics_out out.json

`run_microbenchmarks` does that through zerotune.calibrate.launch. Rank 0 also times matmuls and copies while the
other ranks wait, then writes one JSON document (the fitting code relies on its shape):

    {"device", "matmul": [{m, n, k, dtype, seconds, flops_per_s}],
     "collectives": [{op, bytes, num_ranks, seconds, bus_bandwidth_bytes_per_s, link}],
     "memory_bandwidth_bytes_per_s", "host_to_device_bytes_per_s", "environment"}

Collective `bytes` and bus bandwidth follow nccl-tests (PERFORMANCE.md): bytes is the all_reduce buffer,
the gathered output of all_gather and the input of reduce_scatter; bus bandwidth = bytes / seconds x
2(n-1)/n for all_reduce and x (n-1)/n for the other two, comparable with a link's peak.
This module imports torch and deepspeed only inside functions, so `import zerotune.calibrate.microbench` works
without them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from zerotune.calibrate.timing import MAX_REPS, MIN_BATCH_S, NUM_BATCHES, per_call_s

__all__ = ["run_microbenchmarks", "matmul_sweep", "collective_sweep", "memory_bandwidth_bytes_per_s",
           "host_to_device_bytes_per_s", "bus_bandwidth_bytes_per_s", "matmul_shapes", "collective_sizes_bytes",
           "main"]

MIB = 1024**2
DTYPE_NAMES = ("fp32", "bf16", "fp16")


def matmul_shapes(quick: bool) -> list[tuple[int, int, int]]:
    """(m, n, k): squares, and training-like shapes (tokens x hidden x 4 hidden and back)."""
    if quick:
        return [(512, 512, 512), (1024, 1024, 1024)]
    squares = [(s, s, s) for s in (256, 512, 1024, 2048, 4096)]
    training = [(tokens, 4 * h, h) for tokens in (512, 2048) for h in (768, 2048)]
    return squares + training + [(tokens, h, 4 * h) for tokens in (2048,) for h in (768, 2048)]


def collective_sizes_bytes(quick: bool) -> list[int]:
    if quick:
        return [4096, MIB, 16 * MIB]
    return [4 ** i * 1024 for i in range(0, 10)]  # 1 KiB to 256 MiB


def bus_bandwidth_bytes_per_s(op: str, num_bytes: float, seconds: float, num_ranks: int) -> float:
    """nccl-tests' bus bandwidth: algorithm bandwidth times the share of data each link carries."""
    factor = 2 * (num_ranks - 1) / num_ranks if op == "all_reduce" else (num_ranks - 1) / num_ranks
    return num_bytes / seconds * factor


def _dtypes() -> dict[str, Any]:
    """The precisions this accelerator supports, as torch dtypes."""
    import torch
    from deepspeed.accelerator import get_accelerator
    acc = get_accelerator()
    supported = {"fp32": True, "bf16": acc.is_bf16_supported(), "fp16": acc.is_fp16_supported()}
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    return {name: table[name] for name in DTYPE_NAMES if supported[name]}


def matmul_sweep(quick: bool = False) -> list[dict[str, Any]]:
    """FLOP/s of (m x k) @ (k x n) per shape and supported precision (2mnk FLOPs per product)."""
    import torch
    from deepspeed.accelerator import get_accelerator
    acc = get_accelerator()
    device = acc.current_device_name()
    out = []
    for name, dtype in _dtypes().items():
        for m, n, k in matmul_shapes(quick):
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            seconds = per_call_s(lambda: torch.matmul(a, b), acc.synchronize)
            out.append({"m": m, "n": n, "k": k, "dtype": name, "seconds": seconds,
                        "flops_per_s": 2.0 * m * n * k / seconds})
    return out


def memory_bandwidth_bytes_per_s(quick: bool = False) -> float:
    """Device-to-device tensor copy, counting the read and the write (as STREAM's copy kernel does)."""
    import torch
    from deepspeed.accelerator import get_accelerator
    acc = get_accelerator()
    num_bytes = (64 if quick else 512) * MIB
    src = torch.empty(num_bytes // 4, dtype=torch.float32, device=acc.current_device_name()).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * num_bytes / per_call_s(lambda: dst.copy_(src), acc.synchronize)


def host_to_device_bytes_per_s(quick: bool = False) -> float:
    """Pinned host memory to device, counted once. On the CPU accelerator 'device' is host memory too, so
    this is a host memcpy: the path ZeRO-Offload's optimizer and parameter transfers take there."""
    import torch
    from deepspeed.accelerator import get_accelerator
    acc = get_accelerator()
    num_bytes = (64 if quick else 512) * MIB
    src = acc.pin_memory(torch.empty(num_bytes // 4, dtype=torch.float32).fill_(1.0))
    dst = torch.empty(num_bytes // 4, dtype=torch.float32, device=acc.current_device_name())
    return num_bytes / per_call_s(lambda: dst.copy_(src, non_blocking=True), acc.synchronize)


def _agreed_s(seconds: float) -> float:
    """The slowest rank's time: a collective is as fast as its last rank, and every rank must agree on it
    so that all of them then run the same number of repetitions (or they would deadlock)."""
    import torch
    import deepspeed.comm as dist
    from deepspeed.accelerator import get_accelerator
    t = torch.tensor([seconds], dtype=torch.float64, device=get_accelerator().current_device_name())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _time_collective_s(fn: Callable[[], Any]) -> float:
    import deepspeed.comm as dist
    from deepspeed.accelerator import get_accelerator
    sync = get_accelerator().synchronize
    fn()
    sync()
    dist.barrier()
    start = time.perf_counter()
    fn()
    sync()
    reps = max(1, min(MAX_REPS, int(MIN_BATCH_S / max(_agreed_s(time.perf_counter() - start), 1e-9))))
    batches = []
    for _ in range(NUM_BATCHES):
        dist.barrier()
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        batches.append(_agreed_s((time.perf_counter() - start) / reps))
    return statistics.median(batches)


def _collective_ops(num_bytes: int, num_ranks: int) -> dict[str, Callable[[], Any]]:
    """all_reduce on a buffer of num_bytes; all_gather into and reduce_scatter from num_bytes in all."""
    import torch
    import deepspeed.comm as dist
    from deepspeed.accelerator import get_accelerator
    device = get_accelerator().current_device_name()
    elems = max(num_ranks, num_bytes // 4 // num_ranks * num_ranks)  # fp32, divisible into equal shards
    full = torch.ones(elems, dtype=torch.float32, device=device)
    shard = torch.ones(elems // num_ranks, dtype=torch.float32, device=device)
    return {"all_reduce": lambda: dist.all_reduce(full),
            "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full)}


def collective_sweep(quick: bool = False) -> list[dict[str, Any]]:
    """Every rank calls this (deepspeed.comm initialised); all get the same list back."""
    import deepspeed.comm as dist
    num_ranks = dist.get_world_size()
    if num_ranks < 2:
        return []
    link = "inter_node" if int(os.environ.get("CROSS_SIZE", "1")) > 1 else "intra_node"  # set by the launcher
    out = []
    for num_bytes in collective_sizes_bytes(quick):
        for op, fn in _collective_ops(num_bytes, num_ranks).items():
            elems = max(num_ranks, num_bytes // 4 // num_ranks * num_ranks)
            seconds = _time_collective_s(fn)
            out.append({"op": op, "bytes": 4 * elems, "num_ranks": num_ranks, "seconds": seconds, "link": link,
                        "num_ranks_per_node": int(os.environ.get("LOCAL_SIZE", num_ranks)),
                        "bus_bandwidth_bytes_per_s": bus_bandwidth_bytes_per_s(op, 4 * elems, seconds, num_ranks)})
    return out


def run_microbenchmarks(run_dir: Path, *, num_gpus: int | None = None, num_nodes: int | None = None,
                        hostfile: Path | None = None, quick: bool = False, timeout_s: float = 900.0,
                        env: Mapping[str, str] | None = None, master_port: int | None = None) -> dict[str, Any]:
    """Launch this module on num_gpus ranks per node and return its JSON document. A run that fails raises
    RuntimeError with the launcher's reason (and run_dir keeps the logs)."""
    from zerotune.calibrate.launch import LaunchSpec, free_port, launch
    spec = LaunchSpec(script=Path(__file__).resolve(), ds_config={}, run_dir=run_dir,
                      master_port=master_port or free_port(), timeout_s=timeout_s,
                      script_args=("--metrics_out", str(run_dir / "metrics.json"), *(("--quick",) if quick else ())),
                      num_gpus=num_gpus, num_nodes=num_nodes, hostfile=hostfile, env=dict(env or {}))
    result = launch(spec)
    if result.status != "ok" or result.metrics is None:
        reason = result.reason or "no output"
        raise RuntimeError(f"microbenchmarks {result.status} after {result.wall_s:.0f} s: {reason}; "
                           f"see {run_dir}/stderr.log")
    return result.metrics



def main(argv: list[str] | None = None) -> None:
    """The script run under the launcher: collectives on all ranks, the rest on rank 0, JSON from rank 0."""
    import deepspeed
    import deepspeed.comm as dist
    from deepspeed.accelerator import get_accelerator
    from zerotune.calibrate.environment import collect_environment
    from zerotune.calibrate.launch import write_json_atomic
    p = argparse.ArgumentParser(description="zerotune microbenchmarks (run under the deepspeed launcher)")
    p.add_argument("--quick", action="store_true", help="a few sizes only (CI)")
    p.add_argument("--metrics_out", type=Path, required=True)
    p.add_argument("--deepspeed_config", type=Path, help="accepted from zerotune.calibrate.launch and ignored")
    p.add_argument("--local_rank", type=int, default=-1)
    args = p.parse_args(argv)
    acc = get_accelerator()
    deepspeed.init_distributed(dist_backend=acc.communication_backend_name())
    if acc.device_name() != "cpu":
        acc.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    collectives = collective_sweep(args.quick)
    if dist.get_rank() == 0:
        doc = {"device": acc.device_name(), "matmul": matmul_sweep(args.quick), "collectives": collectives,
               "memory_bandwidth_bytes_per_s": memory_bandwidth_bytes_per_s(args.quick),
               "host_to_device_bytes_per_s": host_to_device_bytes_per_s(args.quick),
               "environment": collect_environment()}
        write_json_atomic(args.metrics_out, doc)
    dist.barrier()  # the other ranks wait rather than exit while rank 0 measures on its own


if __name__ == "__main__":
    main()
