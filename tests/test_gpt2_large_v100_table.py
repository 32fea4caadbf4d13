"""Seed 002 / DeepSpeed's autotuning tutorial: GPT-2 large on one node of 16 V100-32GB, fp16, sequence 1024.

Autotuner metric (samples/s), best experiment per stage (github microsoft/DeepSpeedExamples@83757d9c,
training/autotuning/hf/gpt2-large/README.md; also data/measurements/published/ds_autotuning_hf_v100.jsonl):
ZeRO-1 micro-batch 3: 87.3 > ZeRO-2 micro-batch 3: 77.8 > ZeRO-0 micro-batch 2: 59.0; ZeRO-3 did not run.
GPT-2 large is in the test half of that data set (zerotune.validate.published.model_half): no default was chosen on it.
"""

from __future__ import annotations

import pytest

from zerotune.predictor import DSConfig, estimate
from zerotune.predictor.dsconfig import ZeroConfig
from zerotune.predictor.rank import rank
from zerotune.predictor.space import space_from_ds_config
from tests.conftest import make_job

MEASURED = {1: (3, 87.3017), 2: (3, 77.8338), 0: (2, 59.0229)}
"""stage: (micro-batch, samples/s)"""

@pytest.fixture(scope="module")
def job():
    return make_job("gpt2-large", "v100-32gb", 1, 16, 1024)


def _throughput(job, stage: int) -> float:
    micro_batch, _ = MEASURED[stage]
    cfg = DSConfig(train_micro_batch_size_per_gpu=micro_batch, precision="fp16", zero=ZeroConfig(stage=stage))
    return estimate(job, cfg).throughput_samples_per_s


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_1_and_2_within_25_percent(job, stage: int) -> None:
    assert _throughput(job, stage) == pytest.approx(MEASURED[stage][1], rel=0.25)


def test_zero_0_within_25_percent(job) -> None:
    assert _throughput(job, 0) == pytest.approx(MEASURED[0][1], rel=0.25)


def test_zero_0_is_predicted_slowest_of_the_three(job) -> None:
    # FP16_Optimizer without ZeRO: the whole model's fp32 step on every rank, a per-tensor overflow check and an
    # unoverlapped all-reduce (predictor/zero_mechanics.py) against ZeRO-1/2's partitioned step.
    assert _throughput(job, 0) < min(_throughput(job, 1), _throughput(job, 2))


def test_measured_order_zero1_zero2_zero0(job) -> None:
    # ZeRO-2 books every gradient in a hook inside backward (stage_1_and_2.py:2284-2295), ZeRO-1 once after it,
    # where it costs nothing measurable (predictor/zero_mechanics.py runtime_overhead_s; the H100 probes' backward
    # timers: stage 2 72.1 ms, stage 1 49.7, stage 0 50.1); ZeRO-0 steps the whole model on every rank.
    assert _throughput(job, 1) > _throughput(job, 2) > _throughput(job, 0)


def test_no_zero3_configuration_ranks_above_the_measured_ones(job) -> None:
    """No ZeRO-3 configuration (any micro-batch, checkpointing, offload) is ranked above the measured ZeRO-1 and
    ZeRO-2 configurations, nor above ZeRO-0's without activation checkpointing. ZeRO-0 at micro-batch 2 is
    predicted at 63.6 samples/s (measured 59.0) since the optimizer's per-tensor walk is charged
    (Efficiency.optimizer_tensor_s); ZeRO-3 with checkpointing at micro-batch 29-30, never measured, is predicted
    at about 68: the model's claim that recomputing at a 15x larger micro-batch beats the memory-starved ZeRO-0,
    which no measurement contradicts."""
    space = space_from_ds_config({"fp16": {"enabled": True}}, world_size=16, hidden_size=job.model.hidden_size)
    ranking = rank(job, space, top=None)
    zero12 = min(_throughput(job, stage) for stage in (1, 2))
    above = [r for r in ranking.entries if r.metric_value > zero12]
    assert above and all(r.estimate.config.zero.stage != 3 for r in above)
    zero0 = _throughput(job, 0)
    no_recompute = [r for r in ranking.entries
                    if r.metric_value > zero0 and not r.estimate.config.activation_checkpointing.enabled]
    assert no_recompute and all(r.estimate.config.zero.stage != 3 for r in no_recompute)
