"""Does DeepSpeed's PipelineEngine run 1F1B, as predictor/step_time.py's pipeline terms assume, or lock-step?

DeepSpeed's TrainSchedule (runtime/pipe/schedule.py:197-245) gives every stage 2 x (micro-batches + stages - 1)
steps, forward on one parity of step and stage, backward on the other, each step opening with blocking p2p
sends and receives with a neighbour (runtime/pipe/p2p.py). If those exchanges held neighbouring stages in
lock-step, every step would take the longer of a forward and a backward, 2 x (M + S - 1) x max(F, B) a batch,
about 1.3x 1F1B's (M + S - 1) x (F + B) without recompute and 1.5x with it. This runs a real two-stage pipeline
and times it against both, with each stage's own forward F and backward B of one micro-batch timed alone on its rank.

    DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 deepspeed --num_gpus 2 benchmarks/pipeline_schedule.py

Each rank prints one JSON line (step seconds, F, B, both predictions). Measured on this project's CPU VM
(2026-11-27, gloo, one thread a rank, 8 blocks of a 1024-wide MLP, micro-batch 4 x 64 tokens, 8 micro-batches):
data/measurements/pipeline_schedule_cpu_2026-11-27.jsonl. Not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any, Iterator

import deepspeed
import torch
from deepspeed.pipe import PipelineModule
from torch import nn

HIDDEN, BLOCKS, MICRO_BATCH, ACCUMULATION, TOKENS, STAGES = 1024, 8, 4, 8, 64, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(x)))


def _batches() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    while True:
        yield torch.randn(MICRO_BATCH, TOKENS, HIDDEN), torch.randn(MICRO_BATCH, TOKENS, HIDDEN)


def _stage_alone(engine: Any, repeats: int = 5) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch through this rank's stage, outside the pipeline."""
    forward, backward = [], []
    for _ in range(repeats):
        out = torch.randn(MICRO_BATCH, TOKENS, HIDDEN, requires_grad=True)
        start = time.perf_counter()
        for layer in engine.module.forward_funcs:
            out = layer(out)
        middle = time.perf_counter()
        out.sum().backward()
        forward.append(middle - start)
        backward.append(time.perf_counter() - middle)
    return statistics.median(forward), statistics.median(backward)


def main() -> None:
    parser = deepspeed.add_config_arguments(argparse.ArgumentParser())
    parser.add_argument("--local_rank", type=int, default=0)
    parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    deepspeed.init_distributed(dist_backend="gloo")
    model = PipelineModule(layers=[Block() for _ in range(BLOCKS)], num_stages=STAGES, partition_method="uniform",
                           loss_fn=lambda out, target: ((out - target) ** 2).mean())
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": ACCUMULATION,
              "steps_per_print": 10**9, "optimizer": {"type": "SGD", "params": {"lr": 1e-6}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=config)
    batches, steps = _batches(), []
    for _ in range(6):
        start = time.perf_counter()
        engine.train_batch(batches)
        steps.append(time.perf_counter() - start)
    forward, backward = _stage_alone(engine)
    deepspeed.comm.barrier()
    slots = ACCUMULATION + STAGES - 1
    print(json.dumps({"rank": int(os.environ.get("RANK", "0")), "step_s": statistics.median(steps[2:]),
                      "forward_s": forward, "backward_s": backward, "one_f_one_b_s": slots * (forward + backward),
                      "lock_step_s": 2 * slots * max(forward, backward)}), flush=True)
    deepspeed.comm.destroy_process_group()


if __name__ == "__main__":
    main()
