"""zerotune.calibrate.probe: which configurations are probed, and probe runs as Measurements (failures included)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from zerotune.calibrate import probe as probe_module
from zerotune.calibrate.launch import RunResult
from zerotune.calibrate.measurement import read_jsonl, append_jsonl
from zerotune.calibrate.probe import Probe, probe_ds_config, run_probes, select_probes
from zerotune.predictor import DSConfig, Efficiency, estimate, parse_ds_config
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
    assert len({_stage(p) for p in probes}) >= 2 and len({_micro(p) for p in probes}) >= 2
    for p in probes:
        est = estimate(dataclasses.replace(job, seq_len=p.seq_len or seq), p.config, Efficiency())
        assert est.memory.fits and est.time.step_s <= 10.0  # select_probes default max_step_s
        assert p.config.precision == precision


@pytest.mark.parametrize("model, hardware, gpus, seq", [("gpt2", "a100-80gb", 8, 1024),
                                                         ("llama-2-7b", "h100-80gb", 8, 2048)])
def test_probes_vary_accumulation_and_sequence_so_the_fit_can_separate_overheads(model: str, hardware: str,
                                                                                 gpus: int, seq: int) -> None:
    # Issue 12: with accumulation 1 in every probe, per-step and per-micro-step overheads are one number (the
    # H100 profile split them 50/50); one sequence length leaves the problem shape confounded with micro-batch.
    probes = select_probes(make_job(model, hardware, 1, gpus, seq), DSConfig(precision="bf16"))
    assert len(probes) == 6
    assert {p.config.gradient_accumulation_steps for p in probes} == {1, 4}
    assert sorted({p.seq_len or seq for p in probes}) == [seq // 2, seq]
    assert 3 in {_stage(p) for p in probes}  # ZeRO-3's per-tensor cost needs a ZeRO-3 run
    assert [p.name for p in probes if p.seq_len] == [f"{p.name.split('_seq')[0]}_seq{seq // 2}"
                                                     for p in probes if p.seq_len]


def test_small_model_on_the_cpu_gets_both_ends_of_a_sweep_zero3_accumulation_and_a_shorter_sequence() -> None:
    # Uncalibrated, a CPU step is predicted several times slower than it runs: a looser time limit stands in
    # for the microbenchmarked starting values measure() selects with.
    probes = select_probes(make_job("zt-gpt-small", "cpu", 1, 2, 128), max_step_s=60.0)
    first, largest = probes[0], probes[1]
    assert (_stage(first), _micro(first)) == (0, 1)  # the smallest problem anchors the low end
    assert _stage(largest) == 0 and _micro(largest) > 4
    assert _stage(probes[2]) == 3 and probes[3].config.gradient_accumulation_steps > 1
    assert probes[4].seq_len == 64 and len(probes) == 6


def test_max_probes_is_respected_and_one_is_allowed() -> None:
    job = make_job("zt-gpt-small", "cpu", 1, 2, 128)
    assert len(select_probes(job, max_probes=1)) == 1
    assert len(select_probes(job, max_probes=3)) == 3
    # The first two are the micro-batch sweep's ends: a reduced calibration still spans problem sizes.
    assert [_micro(p) for p in select_probes(job, max_probes=2)] == [1, _micro(select_probes(job)[1])]
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


def test_a_probe_with_its_own_sequence_length_runs_and_is_recorded_at_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    specs = []
    monkeypatch.setattr(probe_module, "launch", lambda spec: specs.append(spec) or RunResult(
        "ok", "", 0, 1.0, spec.run_dir, {"step_s": 0.5}))
    shorter = [p for p in select_probes(make_job("gpt2", "a100-80gb", 1, 8, 1024), DSConfig(precision="bf16"))
               if p.seq_len]
    [m] = run_probes("gpt2", "a100-80gb", tmp_path, num_gpus=8, seq_len=1024, probes=shorter)
    args = list(specs[0].script_args)
    assert args[args.index("--seq_len") + 1] == "512" and m.seq_len == 512
    assert specs[0].run_dir == tmp_path / shorter[0].name


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
