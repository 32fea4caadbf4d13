"""calibrate.probe: which configurations are probed, and probe runs as Measurements (failures included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate import probe as probe_module
from calibrate.launch import RunResult
from calibrate.measurement import read_jsonl, append_jsonl
from calibrate.probe import Probe, probe_ds_config, run_probes, select_probes
from predictor import DSConfig, Efficiency, estimate, parse_ds_config
from tests.conftest import make_job

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY = str(FIXTURES / "tiny-gpt.yaml")
CPU_ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}


def _stage(p: Probe) -> int:
    return p.config.zero.stage


def _micro(p: Probe) -> int:
    return p.config.train_micro_batch_size_per_gpu


@pytest.mark.parametrize("model, hardware, gpus, seq, precision", [
    ("zt-gpt-small", "cpu", 2, 128, "fp32"), ("gpt2", "a100-80gb", 8, 1024, "bf16"),
    ("llama-2-7b", "h100-80gb", 8, 2048, "bf16")])
def test_probes_span_stages_and_micro_batches_and_all_fit(model: str, hardware: str, gpus: int, seq: int,
                                                          precision: str) -> None:
    job = make_job(model, hardware, 1, gpus, seq)
    probes = select_probes(job, DSConfig(precision=precision))  # type: ignore[arg-type]
    assert 2 <= len(probes) <= 6
    assert len({p.name for p in probes}) == len(probes)  # each probe tells something new
    assert len({_stage(p) for p in probes}) >= 2 or len({_micro(p) for p in probes}) >= 2
    for p in probes:
        est = estimate(job, p.config, Efficiency())
        assert est.memory.fits and est.time.step_s <= 10.0  # select_probes default max_step_s
        assert p.config.precision == precision and p.config.gradient_accumulation_steps == 1


def test_small_model_on_the_cpu_gets_a_three_point_sweep_and_every_stage() -> None:
    probes = select_probes(make_job("zt-gpt-small", "cpu", 1, 2, 128))
    sweep = [p for p in probes if _stage(p) == 0]
    assert [_micro(p) for p in sweep] == sorted({_micro(p) for p in sweep}) and len(sweep) == 3
    assert _micro(sweep[0]) == 1  # the smallest problem anchors the efficiency curve's low end
    assert sorted(_stage(p) for p in probes if _stage(p) != 0) == [1, 2, 3]
    assert {_micro(p) for p in probes if _stage(p) != 0} == {_micro(sweep[1])}  # stages compared at one size


def test_max_probes_is_respected_and_one_is_allowed() -> None:
    job = make_job("zt-gpt-small", "cpu", 1, 2, 128)
    assert len(select_probes(job, max_probes=1)) == 1
    assert len(select_probes(job, max_probes=3)) == 3
    with pytest.raises(ValueError, match="max_probes"):
        select_probes(job, max_probes=0)


def test_a_model_that_fits_nowhere_is_a_one_line_error() -> None:
    job = make_job("llama-2-70b", "v100-16gb", 1, 2, 4096)
    with pytest.raises(ValueError, match="no ZeRO stage runs llama-2-70b"):
        select_probes(job, DSConfig(precision="fp16"))


def test_probe_config_is_the_configuration_deepspeed_runs() -> None:
    cfg = DSConfig(train_micro_batch_size_per_gpu=4).replace_zero(stage=2)
    doc = probe_ds_config(cfg, 2)
    assert doc["train_batch_size"] == 8 and doc["zero_optimization"]["stage"] == 2
    assert doc["wall_clock_breakdown"] is True  # the workload reads DeepSpeed's fwd / bwd / step timers
    assert parse_ds_config(doc, world_size=2).zero.stage == 2


def test_a_failed_probe_is_a_measurement_not_an_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = iter([RunResult("oom", "torch.OutOfMemoryError: CUDA out of memory", 1, 3.0, tmp_path / "a", None),
                     RunResult("ok", "", 0, 9.0, tmp_path / "b", {"throughput": 4.0, "peak_memory_bytes": 1e9})])
    monkeypatch.setattr(probe_module, "launch", lambda spec: next(outcomes))
    job = make_job("zt-gpt-small", "cpu", 1, 2, 128)
    lines: list[str] = []
    probes = select_probes(job, max_probes=2)
    ms = run_probes("zt-gpt-small", "cpu", tmp_path, num_gpus=2, probes=probes, progress=lines.append)
    assert [m.status for m in ms] == ["oom", "ok"]
    assert ms[0].reason.startswith("torch.OutOfMemoryError") and ms[0].source == str(tmp_path / "a")
    assert ms[1].measured_step_s == pytest.approx(_micro(probes[1]) * 2 / 4.0)  # DeepSpeed-style throughput only
    assert lines[0].startswith(f"probe {probes[0].name}: oom") and f"probe {probes[1].name}: ok, step" in lines[1]
    append_jsonl(tmp_path / "m.jsonl", ms)  # the shared store takes them as they are
    assert read_jsonl(tmp_path / "m.jsonl") == ms


@pytest.mark.deepspeed
def test_one_real_probe_on_two_cpu_ranks(tmp_path: Path) -> None:
    job = make_job(TINY, "cpu", 1, 2, 32)
    cfg = DSConfig(train_micro_batch_size_per_gpu=2).replace_zero(stage=2)
    est = estimate(job, cfg)
    probe = Probe("z2_gas1_tmbspg2", cfg, est.time.step_s, est.memory.total_bytes)
    lines: list[str] = []
    [m] = run_probes(TINY, "cpu", tmp_path, num_gpus=2, seq_len=32, probes=[probe], steps=2, warmup=1,
                     timeout_s=240, env=CPU_ENV, progress=lines.append)
    assert m.status == "ok", m.reason
    assert m.source == str(tmp_path / "z2_gas1_tmbspg2") and (tmp_path / "z2_gas1_tmbspg2" / "metrics.json").is_file()
    assert m.step_s is not None and m.throughput_samples_per_s == pytest.approx(4 / m.step_s)
    assert m.peak_memory_bytes is not None and 50 * 2**20 < m.peak_memory_bytes < 4 * 2**30
    assert m.forward_s and m.backward_s and m.optimizer_s
    assert m.config.zero.stage == 2 and m.world_size == 2
    assert len(lines) == 1 and lines[0].startswith("probe z2_gas1_tmbspg2: ok, step")
