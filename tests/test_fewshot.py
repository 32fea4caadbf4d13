"""zerotune.validate.fewshot: calibrating on a few rows of one model through `calibrate --from` transfers to the others."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerotune.predictor import DSConfig, Efficiency, estimate
from tests.conftest import make_job
from zerotune.validate.fewshot import fewshot, main

PLANTED = Efficiency(fp16_compute_scale=0.5)
"""The cluster runs fp16 kernels at half the rate the uncalibrated model assumes."""


def _row(model: str, stage: int, micro_batch: int, quality: str, factor: float = 1.0) -> dict:
    job = make_job(model, "v100-32gb", 1, 8, 512)
    cfg = DSConfig(train_micro_batch_size_per_gpu=micro_batch, precision="fp16").replace_zero(stage=stage)
    samples_per_s = micro_batch * 8 / estimate(job, cfg, PLANTED).time.step_s * factor
    m = job.model
    return {"source": "synthetic", "value_quality": quality,
            "model": {"name": model, "num_layers": m.num_layers, "hidden_size": m.hidden_size,
                      "num_heads": m.num_heads, "ffn_hidden_size": m.ffn_hidden_size, "vocab_size": m.vocab_size,
                      "num_params": m.num_params},
            "hardware": "v100-32gb", "num_gpus_total": 8, "num_gpus_per_node": 8,
            "parallel": {"dp": 8, "tp": 1, "pp": 1, "zero_stage": stage, "sequence_parallel": False, "offload": "none"},
            "batch": {"micro_batch": micro_batch, "global_batch": micro_batch * 8, "grad_accum": 1, "seq_len": 512},
            "precision": "fp16", "recompute": "none", "framework": "DeepSpeed",
            "metrics": {"throughput_samples_per_s": samples_per_s}, "notes": ""}


@pytest.fixture
def published(tmp_path: Path) -> Path:
    rows = [_row(model, stage, mb, "timers") for model in ("gpt2-medium", "gpt2") for stage in (0, 1, 2)
            for mb in (2, 4)]
    # Another kind of figure for the same models (end-to-end, 30% lower): never mixed with the timer rows.
    rows += [_row("gpt2", 1, 4, "end-to-end", factor=0.7), _row("gpt2-medium", 1, 2, "end-to-end", factor=0.7)]
    path = tmp_path / "published.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_three_rows_of_one_model_calibrate_the_others(published: Path) -> None:
    result = fewshot(published, "gpt2-medium", num_rows=3)
    assert result.fit_model == "gpt2-medium" and len(result.fit_rows) == 3
    assert result.test_models == ("gpt2",) and result.num_test_rows == 6  # the split is by model, one kind
    assert result.quality == "timers"
    # Three rows support one parameter: the measured precision's compute rate, which is what was planted.
    assert result.fitted_params == ("fp16_compute_scale",)
    assert result.mape_before > 0.1  # compute is most, not all, of a step
    assert result.mape_after < 0.01


def test_the_script_prints_the_split_and_the_figure(published: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--data", str(published), "--fit_model", "gpt2-medium"]) == 0
    out = capsys.readouterr().out
    assert "fit:  gpt2-medium, 3 rows" in out and "test: 1 other models, 6 rows" in out
    assert "throughput MAPE on the test models:" in out
    assert main(["--data", str(published), "--fit_model", "llama-2-7b"]) == 2
    assert "need rows of the fit model" in capsys.readouterr().err


def test_a_transferred_calibrations_error_is_mostly_one_offset_per_model() -> None:
    # The published 16-V100 table (DeepSpeed autotuning's Hugging Face examples), calibrated on GPT-2 large's three
    # per-stage bests: each other model's configurations err together (RMS of the models' mean log errors 0.114)
    # more than they err apart (0.066 about the means), so tune counts the transfer as a shared error
    # (zerotune.validate.calibration.MODEL_TRANSFER_REL, Uncertainty.shared_rel)
    from zerotune.validate.accuracy import DEFAULT_DATA_DIR
    result = fewshot(DEFAULT_DATA_DIR / "ds_autotuning_hf_v100.jsonl")
    assert result.shared_rms == pytest.approx(0.114, abs=0.02) and result.within_rms == pytest.approx(0.066, abs=0.02)
    assert result.shared_rms > result.within_rms
    from zerotune.validate.calibration import TRANSFER_SHARED_VARIANCE
    share = result.shared_rms ** 2 / (result.shared_rms ** 2 + result.within_rms ** 2)
    assert share == pytest.approx(TRANSFER_SHARED_VARIANCE, abs=0.05)
