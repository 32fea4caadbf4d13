"""Benchmark: the search's choice of the next experiment over a space of about 250,000 configurations (every ZeRO
stage, offload and checkpointing, ZeRO's bucket and overlap knobs, micro-batches up to DeepSpeed's 1,024): tune
makes one choice per experiment, so it must take well under an experiment's start-up. Measured 2026-11-29 on this
project's CPU VM: 6-9 s a choice before the sibling bounds were grouped, 0.3 s after.

Run the timing with `python -m pytest tests/test_bench_search.py --benchmark-enable`; in the normal test run
the benchmark executes once, as a check that it still works.
"""

from __future__ import annotations

import numpy as np

from zerotune.predictor import Efficiency
from zerotune.predictor.rank import Uncertainty
from zerotune.predictor.space import space_from_ds_config
from zerotune.validate.search import Observation, candidate_table, choose
from tests.conftest import make_job


def test_a_choice_over_a_quarter_million_configurations(benchmark):
    job = make_job("gpt2", "h100-80gb", 1, 2, 1024)
    doc = {"bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    space = space_from_ds_config(doc, world_size=2, hidden_size=job.model.hidden_size)
    cands = candidate_table(job, space, Efficiency(), "throughput").candidates.with_cost(30.0, 6)
    assert len(cands) >= 200_000 and len(cands.families) >= 8
    done = np.zeros(len(cands), dtype=bool)
    first = choose(cands, [], Uncertainty(), done)
    assert first.index is not None
    i = first.index
    done[i] = True
    measured = Observation(cands.families[cands.family[i]], int(cands.micro_batch[i]), float(cands.step_s[i]),
                           float(cands.memory_ratio[i]), "ok", 1.2 * float(cands.step_s[i]), i)
    second = benchmark(choose, cands, [measured], Uncertainty(), done)
    assert second.index != i
