"""zerotune.calibrate.profiles: a profile survives save/load unchanged; a damaged or misspelled one is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerotune.calibrate.fit import fit, make_profile
from zerotune.calibrate.measurement import Measurement
from zerotune.calibrate.profiles import (CalibrationProfile, default_profile_path, load_profile, profile_measurements,
                               save_profile)
from zerotune.predictor import DSConfig, Efficiency, estimate
from tests.conftest import make_job


def _measurements() -> list[Measurement]:
    job = make_job("gpt2", "a100-40gb", num_gpus=8, seq_len=1024)
    true = Efficiency(gemm_efficiency_scale=0.3)
    out = []
    for stage, micro_batch, factor in ((0, 1, 1.02), (1, 2, 0.97), (2, 4, 1.01), (3, 8, 0.99), (2, 8, 1.0)):
        cfg = DSConfig(train_micro_batch_size_per_gpu=micro_batch, precision="bf16").replace_zero(stage=stage)
        out.append(Measurement("gpt2", "a100-40gb", 1, 8, 1024, cfg, "ok",
                               step_s=estimate(job, cfg, true).time.step_s * factor, source=f"run {stage}/{micro_batch}"))
    return out


@pytest.fixture(scope="module")
def profile() -> CalibrationProfile:
    data = _measurements()
    env = {"torch": "2.13.0", "deepspeed": "0.19.8", "nccl": "2.21.5", "device": "NVIDIA A100-SXM4-40GB",
           "device_memory_bytes": 42505273344, "date": "2026-11-22"}
    return make_profile(fit(data, params=("gemm_efficiency_scale",)), data, env,
                        created="2026-11-22")


def _saved(profile: CalibrationProfile, tmp_path: Path) -> tuple[Path, dict]:
    path = tmp_path / "a100-40gb.json"
    save_profile(profile, path)
    return path, json.loads(path.read_text())


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_round_trip_is_exact_and_leaves_no_temporary_files(profile: CalibrationProfile, tmp_path: Path) -> None:
    path, _ = _saved(profile, tmp_path)
    assert load_profile(path) == profile
    assert [p.name for p in tmp_path.iterdir()] == ["a100-40gb.json"]
    assert profile.hardware == "a100-40gb" and profile.fitted_on["count"] == 5
    assert profile.efficiency.gemm_efficiency_scale == pytest.approx(0.3, rel=0.05)
    # The measurements come back as Measurement records.
    assert [m.config for m in profile_measurements(load_profile(path))] == [m.config for m in _measurements()]


def test_a_profile_from_before_the_residual_was_removed_loads_only_without_one(profile: CalibrationProfile,
                                                                              tmp_path: Path) -> None:
    path, doc = _saved(profile, tmp_path)
    assert load_profile(_write(path, {**doc, "residual": None})) == profile
    with pytest.raises(ValueError, match="holds a learned residual, which zerotune no longer applies"):
        load_profile(_write(path, {**doc, "residual": {"library": "xgboost", "model_file": "x.residual.json"}}))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(hardwre="x"), "unknown key 'hardwre' \\(did you mean 'hardware'\\?\\)"),
    (lambda d: d["efficiency"].update(gemm_eficiency_scale=0.4),
     "efficiency: unknown key 'gemm_eficiency_scale' \\(did you mean 'gemm_efficiency_scale'\\?\\)"),
    (lambda d: d["efficiency"].update(overlap_efficiency="high"), "efficiency.overlap_efficiency must be a number"),
    (lambda d: d["fit_quality"].update(step_mape=0.1), "fit_quality: unknown key 'step_mape'"),
    (lambda d: d["uncertainty"].pop("step_time_rel"), "uncertainty: missing key 'step_time_rel'"),
    (lambda d: d.pop("efficiency"), "missing key 'efficiency'"),
    (lambda d: d.update(format="zerotune-profile-0"), "format 'zerotune-profile-0' is not 'zerotune-profile-1'"),
    (lambda d: d["fitted_on"]["measurements"][0].update(status="crashed"), "status must be one of"),
])
def test_strict_loading_names_the_problem(profile: CalibrationProfile, tmp_path: Path, edit, message: str) -> None:
    path, doc = _saved(profile, tmp_path)
    edit(doc)
    with pytest.raises(ValueError, match=message):
        load_profile(_write(path, doc))


def test_unreadable_profiles(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{\"hardware\": ")
    with pytest.raises(ValueError, match="malformed JSON"):
        load_profile(tmp_path / "bad.json")


def test_default_profile_path_is_in_the_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_profile_path("h100-80gb").parts[-3:] == ("data", "profiles", "h100-80gb.json")
    monkeypatch.setenv("ZEROTUNE_DATA", str(tmp_path))
    assert default_profile_path("cpu") == tmp_path / "profiles" / "cpu.json"
