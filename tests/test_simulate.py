"""The one-step simulation (networkx, two streams) against the closed form the ranking uses."""

from __future__ import annotations

import statistics

import pytest

from zerotune.predictor import DSConfig, ZeroConfig
from zerotune.predictor.simulate import simulate_micro_step
from zerotune.predictor.step_time import last_micro_step_exposed
from tests.conftest import make_job

JOBS = [("gpt2", "a100-80gb", 1, 8), ("gpt2-large", "v100-32gb", 1, 16), ("bert-large", "v100-16gb", 2, 8),
        ("gpt2-xl", "a100-80gb", 2, 8), ("llama-2-7b", "a100-80gb", 4, 8)]
CONFIGS = [DSConfig(train_micro_batch_size_per_gpu=4, precision="fp16",
                    zero=ZeroConfig(stage=stage, overlap_comm=overlap, reduce_bucket_size_elems=bucket))
           for stage in (1, 2, 3) for overlap in (True, False) for bucket in (5 * 10**7, 5 * 10**8)]


def test_closed_form_agrees_with_simulation_on_the_test_set() -> None:
    # Tolerance: |closed - simulated| exposed communication within 10% of the simulated micro-step for
    # every case, and within 2% at the median (25% and 5% until 2026-11-28, below). Measured when written (operator-level compute with DeepSpeed's
    # per-module ZeRO-3 gathers): worst 16.0% (bert-large on 2 nodes, ZeRO-3, 5e7 buckets: the closed form
    # hides the gathers in bulk where the simulation's per-block prefetch runs out of window), median 0.5%;
    # since ZeRO-3's backward hooks lengthen backward on the host side (every module a Hugging Face block runs),
    # the same case reads 24.2% and GPT-2 XL's 22.8%, median unchanged. With a ring across nodes over one NIC per
    # rank a node (links.data_parallel_link, 2026-11-28) Llama-2-7B on 4 nodes read 31%: the simulation issued
    # backward's prefetched gathers behind the previous block's reduce-scatter on its one link, where DeepSpeed
    # prefetches from the pre-backward hook, before that block's gradients are reduced; issued so, and the
    # reduction without overlap_comm one call a bucket as the closed form counts it, worst 3.1%, median 0.6%.
    # Where they differ the product reports the simulation (estimate) and re-orders the ranking's kept rows by it.
    errors = []
    for model, hw, nodes, gpus in JOBS:
        job = make_job(model, hw, nodes, gpus, 512)
        for cfg in CONFIGS:
            sim = simulate_micro_step(job, cfg)
            errors.append(abs(last_micro_step_exposed(job, cfg) - sim.exposed_comm_s) / sim.makespan_s)
    assert max(errors) <= 0.10
    assert statistics.median(errors) <= 0.02


def test_nothing_is_exposed_on_one_gpu() -> None:
    job = make_job("gpt2", num_gpus=1)
    sim = simulate_micro_step(job, DSConfig(precision="fp16", zero=ZeroConfig(stage=2, overlap_comm=True)))
    assert sim.exposed_comm_s == pytest.approx(0.0, abs=1e-12)


def test_without_overlap_the_whole_reduction_is_exposed() -> None:
    job = make_job("gpt2-xl", "a100-80gb", 2, 8)
    sim = simulate_micro_step(job, DSConfig(precision="fp16", zero=ZeroConfig(stage=2, overlap_comm=False)))
    assert sim.exposed_comm_s == pytest.approx(sim.comm_s, rel=1e-9)
    assert sim.comm_s > 0


def test_a_single_prediction_is_the_simulated_schedule() -> None:
    # estimate() reports the exposed communication of the simulated schedule (the product path), the closed
    # form only where the two agree: same compute, and exposed communication within the tolerance above.
    from zerotune.predictor import estimate, estimate_time
    job = make_job("llama-2-7b", "a100-80gb", 4, 8, 512)
    cfg = DSConfig(train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=3, precision="fp16",
                   zero=ZeroConfig(stage=3, overlap_comm=False))
    product, closed = estimate(job, cfg).time.breakdown_s, estimate_time(job, cfg).breakdown_s
    sim = simulate_micro_step(job, cfg)
    expected = closed["exposed_comm"] + 3 * (sim.exposed_comm_s - last_micro_step_exposed(job, cfg))
    assert product["exposed_comm"] == pytest.approx(expected, rel=1e-9)
    assert product["exposed_comm"] != pytest.approx(closed["exposed_comm"], rel=1e-6)
    for term in ("forward", "backward", "recompute", "optimizer_step"):
        assert product[term] == closed[term]
    assert abs(product["exposed_comm"] - closed["exposed_comm"]) <= 0.15 * 3 * sim.makespan_s


@pytest.mark.parametrize("model, hw, nodes, gpus", JOBS + [("zt-gpt-small", "cpu", 1, 2)])
def test_without_overlap_the_schedule_and_the_closed_form_expose_the_same(model: str, hw: str, nodes: int,
                                                                          gpus: int) -> None:
    # A device that cannot communicate beside compute (comm_compute_overlap false, the CPU accelerator's case)
    # has one timeline: every in-step collective is exposed, in the simulation as in the closed form, whatever
    # overlap_comm, the bucket size or prefetching say. Agreement to rounding, not to the 20% above.
    import dataclasses
    job = make_job(model, hw, nodes, gpus, 512)
    device = dataclasses.replace(job.cluster.hardware, comm_compute_overlap=False)
    job = dataclasses.replace(job, cluster=dataclasses.replace(job.cluster, hardware=device))
    precision = "fp32" if hw == "cpu" else "fp16"
    for cfg in CONFIGS:
        cfg = dataclasses.replace(cfg, precision=precision)
        sim = simulate_micro_step(job, cfg)
        assert sim.exposed_comm_s == pytest.approx(sim.comm_s, rel=1e-9) and sim.comm_s > 0
        assert last_micro_step_exposed(job, cfg) == pytest.approx(sim.exposed_comm_s, rel=1e-9)
