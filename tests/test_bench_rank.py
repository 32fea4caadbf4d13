"""Benchmark: ranking a space of more than 100,000 configurations (target: under one second on one core).

Run the timing with `python -m pytest tests/test_bench_rank.py --benchmark-enable`; in the normal test run
the benchmark executes once, as a check that it still works.
"""

from __future__ import annotations

from zerotune.predictor.rank import rank
from zerotune.predictor.space import space_from_ds_config
from tests.conftest import make_job


def test_rank_default_space_gpt2_large_16_v100(benchmark):
    job = make_job("gpt2-large", "v100-32gb", 1, 16, 1024)
    space = space_from_ds_config({"fp16": {"enabled": True}}, world_size=16, hidden_size=job.model.hidden_size)
    assert space.num_configs(16) >= 100_000
    ranking = benchmark(rank, job, space, top=10)
    assert len(ranking.entries) == 10


def test_rank_llama_7b_two_nodes_with_accumulation(benchmark):
    job = make_job("llama-2-7b", "a100-80gb", 2, 8, 2048)
    doc = {"bf16": {"enabled": True}, "gradient_accumulation_steps": [1, 2, 4, 8],
           "autotuning": {"max_train_micro_batch_size_per_gpu": 64}}
    space = space_from_ds_config(doc, world_size=16, hidden_size=job.model.hidden_size)
    assert space.num_configs(16) >= 100_000
    ranking = benchmark(rank, job, space, top=10)
    assert ranking.num_fit > 0
