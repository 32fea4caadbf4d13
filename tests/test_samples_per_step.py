"""Samples per optimizer step (DeepSpeed's train_batch_size) is micro-batch x accumulation x data-parallel ranks:
tensor- and pipeline-parallel ranks share their samples (deepspeed/runtime/config.py _batch_assertion). One
function, DSConfig.samples_per_step, and every caller agrees on a pipelined, tensor-parallel case."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerotune.calibrate.ingest import read_autotuning
from zerotune.calibrate.launch import RunResult
from zerotune.calibrate.measurement import Measurement
from zerotune.predictor import DSConfig, estimate, to_ds_config
from tests.conftest import make_job
from zerotune.validate.results import Prediction, lr_advice
from zerotune.validate.runs import experiment_result, window_step_s
from zerotune.validate.settings import autotuning_of

# 2 nodes x 8 GPUs, tensor parallel 2, pipeline 2: 4 data-parallel ranks, each 3 samples x 5 accumulation steps.
WORLD = 16
CFG = DSConfig(train_micro_batch_size_per_gpu=3, gradient_accumulation_steps=5, mp_size=2, pp_size=2)
SAMPLES = 3 * 5 * 4
THROUGHPUT = 120.0  # samples/s over the job, so a step takes SAMPLES / THROUGHPUT = 0.5 s


def test_the_config_and_the_ds_config_it_writes() -> None:
    assert CFG.samples_per_step(WORLD) == SAMPLES
    assert to_ds_config(CFG, WORLD)["train_batch_size"] == SAMPLES


def test_the_estimate() -> None:
    job = make_job("gpt2", "a100-80gb", 2, 8, 512)
    est = estimate(job, CFG)
    assert est.samples_per_step == SAMPLES
    assert est.throughput_samples_per_s == pytest.approx(SAMPLES / est.time.step_s)


def test_a_measurement() -> None:
    m = Measurement(model="gpt2", hardware="a100-80gb", num_nodes=2, num_gpus_per_node=8, seq_len=512, config=CFG,
                    status="ok", throughput_samples_per_s=THROUGHPUT)
    assert m.samples_per_step == SAMPLES and m.measured_step_s == pytest.approx(0.5)


def test_a_deepspeed_autotuning_folder(tmp_path: Path) -> None:
    exp = tmp_path / "autotuning_results" / "z1_gas5_tmbspg3"
    exp.mkdir(parents=True)
    (exp / "exp.json").write_text(json.dumps({"num_nodes": 2, "num_gpus": 8}))
    (exp / "ds_config.json").write_text(json.dumps(to_ds_config(CFG, WORLD) | {"autotuning": {"mp_size": 2}}))
    (exp / "metrics.json").write_text(json.dumps({"throughput": THROUGHPUT}))
    (m,) = read_autotuning(tmp_path, "gpt2", "a100-80gb", 512)
    assert m.config.pp_size == 2 and m.config.mp_size == 2
    assert m.step_s == pytest.approx(0.5)


def test_a_tune_experiment(tmp_path: Path) -> None:
    job = make_job("gpt2", "a100-80gb", 2, 8, 512)
    run = RunResult("ok", "", 0, 1.0, tmp_path, {"throughput": THROUGHPUT})
    result = experiment_result("x", CFG, Prediction(1.0, 1.0, 1.0, 1.0, 1.0), run, job, autotuning_of({}, 16))
    assert result.step_s == pytest.approx(0.5) and result.throughput_samples_per_s == pytest.approx(THROUGHPUT)


def test_the_learning_rate_advice() -> None:
    doc = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1}
    advice = lr_advice(doc, CFG, WORLD)
    assert advice is not None and f"global batch is {SAMPLES} samples, yours was 4" in advice


def test_the_measured_step_is_the_median_of_the_engines_window(tmp_path: Path) -> None:
    """DeepSpeed's metrics.json holds the exit step alone (its timers are reset after each printed step,
    runtime/engine.py:3657-3677): the window start_profile_step..end_profile_step is the printed steps before it
    plus that step, and one slow step (a shared machine) does not move the median."""
    at = autotuning_of({"autotuning": {"start_profile_step": 2, "end_profile_step": 6}}, 16)
    printed = (9.0, 1.2, 1.0, 1.1, 1.0, 1.2)  # steps 0-5; the engine exits in step 6
    slow_last = RunResult("ok", "", 0, 1.0, tmp_path, {"throughput": SAMPLES / 2.5}, printed)
    assert window_step_s(slow_last, SAMPLES, at) == pytest.approx(1.1)  # median of 1.0, 1.1, 1.0, 1.2, 2.5
    assert window_step_s(RunResult("ok", "", 0, 1.0, tmp_path, {"throughput": SAMPLES / 2.5}), SAMPLES, at) == \
        pytest.approx(2.5)  # nothing printed (no wall_clock_breakdown): the engine's figure as it is
    workload = RunResult("ok", "", 0, 1.0, tmp_path, {"step_s": 3.0}, printed)
    assert window_step_s(workload, SAMPLES, at) == pytest.approx(3.0)  # zerotune's workload reports a median
