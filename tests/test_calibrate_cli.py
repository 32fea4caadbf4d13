"""`zerotune calibrate` as a user runs it: a reduced real calibration on 2 CPU ranks, `--from`, and errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zerotune.calibrate.profiles import load_profile

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "tests" / "fixtures" / "tiny-gpt.yaml")


def zerotune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zerotune.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**__import__("os").environ, "PYTHONPATH": str(REPO)})


@pytest.mark.deepspeed
def test_reduced_real_calibration_writes_a_profile(tmp_path: Path) -> None:
    """Microbenchmarks and two real probe runs through the deepspeed launcher, then a fit and a profile."""
    out = tmp_path / "cpu.json"
    run = zerotune("calibrate", "--hardware", "cpu", "--num_gpus", "2", "--quick", "--max_probes", "2",
                   "--model", TINY, "--seq_len", "32", "--out", str(out), "--plot", str(tmp_path / "fit.png"),
                   "--timeout_s", "300", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "probe z" in run.stderr and "step time MAPE" in run.stdout  # progress per run, then the fit table
    profile = load_profile(out)
    assert profile.hardware == "cpu" and profile.fitted_on["count"] == 2
    assert {m["status"] for m in profile.fitted_on["measurements"]} == {"ok"}
    assert profile.environment["microbenchmarks"]["matmul"]  # measured here, not copied
    assert profile.fit_quality.step_time_mape_in_sample <= profile.fit_quality.step_time_mape_before + 1e-9
    assert (tmp_path / "cpu.measurements.jsonl").is_file()
    assert (tmp_path / "fit.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "zerotune_calibration" / "cpu" / "probes").is_dir()


def test_calibrate_from_csv_and_predict_with_the_profile(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    run = zerotune("calibrate", "--hardware", "cpu", "--from", str(REPO / "tests" / "fixtures" / "measurements.csv"),
                   "--out", str(out), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert load_profile(out).fitted_on["count"] >= 5
    predicted = zerotune("predict", "--model", "gpt2", "--hardware", "cpu", "--num_gpus", "2", "--micro_batch", "2",
                         "--profile", str(out), "--json", cwd=tmp_path)
    assert predicted.returncode == 0, predicted.stderr
    assert json.loads(predicted.stdout)["calibrated"] is True


@pytest.mark.parametrize("args,needle", [
    (["--hardware", "cpu", "--from", "/nonexistent/results"], "/nonexistent/results"),
    (["--hardware", "tpu-v9", "--num_gpus", "2"], "--hardware"),
    (["--hardware", "cpu", "--num_gpus", "2", "--max_probes", "7"], "--max_probes"),
])
def test_calibrate_mistakes_are_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    run = zerotune("calibrate", *args, cwd=tmp_path)
    assert run.returncode == 2 and needle in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_refit_rebuilds_a_profile_whose_efficiency_names_a_dropped_field(tmp_path: Path) -> None:
    """After a model change the shipped profiles are refitted from their own measurements (zerotune.calibrate.refit)."""
    from zerotune.calibrate.refit import main as refit
    path = tmp_path / "cpu.json"
    doc = json.loads((REPO / "data" / "profiles" / "cpu.json").read_text())
    doc["efficiency"]["compute_curve_of_an_old_model"] = 0.5  # a field no longer in Efficiency
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="unknown key 'compute_curve_of_an_old_model'"):
        load_profile(path)
    assert refit([str(path)]) == 0
    profile = load_profile(path)
    assert profile.fitted_on["count"] == doc["fitted_on"]["count"] and profile.environment == doc["environment"]
    assert (tmp_path / "cpu.measurements.jsonl").is_file()
    assert refit([str(tmp_path / "missing.json")]) == 2
