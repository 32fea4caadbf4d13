"""ZeRO-3's host cost per submodule, measured on one CPU rank with a model too narrow to compute anything.

    DS_ACCELERATOR=cpu python -m benchmarks.zero3_hooks --layers 16 --variant z3 > out.jsonl
    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 -m benchmarks.zero3_hooks --layers 16 --variant z3

One process, world size 1 (DeepSpeed's single-rank path: no collective is issued, partition_parameters.py
1559-1560), or under torchrun 2 gloo ranks (the real gather path, _all_gather_coalesced / _all_gather_sequential,
partition_parameters.py:1595-1598), width 32, so the forward / backward / step times are DeepSpeed's and
PyTorch's Python alone (and, on 2 ranks, gloo's collectives). Variants: z0 (no ZeRO), z2 (the gradient hooks
of stages 1-2), allgather (a bare gloo all_gather of 32 x 32 floats, the collective's own per-call cost),
z3 (ZeRO-3, persistence threshold 0: every tensor is fetched and released) and z3persist (threshold 1e9:
nothing is fetched, hooks only). Results and their reading: benchmarks/zero3_hooks.md. Not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

__all__ = ["main"]

VARIANTS = {"z0": {"stage": 0}, "z2": {"stage": 2}, "allgather": {"stage": 0},
            "z3": {"stage": 3, "stage3_param_persistence_threshold": 0},
            "z3persist": {"stage": 3, "stage3_param_persistence_threshold": 10**9}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--variant", choices=sorted(VARIANTS), default="z3")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--port", default="29611")
    args = p.parse_args(argv)
    import deepspeed
    import torch

    from zerotune.calibrate.workload import _init_partitioned, build_model
    from zerotune.predictor import ModelSpec
    torch.set_num_threads(1)
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", args.port)):
        os.environ.setdefault(key, value)
    deepspeed.init_distributed(dist_backend="gloo")
    if args.variant == "allgather":
        _bare_allgather(args.steps)
        return
    spec = ModelSpec(name=f"zt-hooks-{args.layers}", num_layers=args.layers, hidden_size=32, num_heads=2,
                     num_kv_heads=2, ffn_hidden_size=128, vocab_size=64, max_position_embeddings=64, attention="flash")
    zero = VARIANTS[args.variant]
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero, "steps_per_print": 10**6}
    with deepspeed.zero.Init(config_dict_or_path=cfg, enabled=zero["stage"] == 3):
        model = build_model(spec)
    if zero["stage"] == 3:
        _init_partitioned(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, model_parameters=model.parameters(),
                                      config=cfg)
    times: dict[str, list[float]] = {"forward_s": [], "backward_s": [], "step_s": []}
    for i in range(args.steps + 10):
        batch = torch.randint(0, spec.vocab_size, (1, 17))
        t0 = time.perf_counter()
        loss = engine(batch)
        t1 = time.perf_counter()
        engine.backward(loss)
        t2 = time.perf_counter()
        engine.step()
        t3 = time.perf_counter()
        if i >= 10:
            for name, value in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                times[name].append(value)
    summary = {f"{k}_median": statistics.median(v) for k, v in times.items()}
    summary.update({f"{k}_min": min(v) for k, v in times.items()})
    if int(os.environ["RANK"]) == 0:
        print(json.dumps({"variant": args.variant, "layers": args.layers, "world_size": int(os.environ["WORLD_SIZE"]),
                          **summary}))


def _bare_allgather(steps: int) -> None:
    """Seconds of one torch.distributed all_gather_into_tensor of a 32 x 32 fp32 tensor: the collective's own
    per-call cost, to subtract from what DeepSpeed's gather path adds per call."""
    import torch
    import torch.distributed as dist
    world = dist.get_world_size()
    shard, out, times = torch.ones(32 * 32), torch.empty(32 * 32 * world), []
    for i in range(steps + 10):
        t0 = time.perf_counter()
        dist.all_gather_into_tensor(out, shard)
        if i >= 10:
            times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print(json.dumps({"variant": "allgather", "world_size": world, "call_s_median": statistics.median(times),
                          "call_s_min": min(times)}))


if __name__ == "__main__":
    main()
