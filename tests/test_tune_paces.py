"""The profiling run's paces and timers in zerotune.validate.calibration: the device's matmul, copy, cache, fresh-page and
dropout paces rescale the calibrated kernels, and DeepSpeed's step, fwd / bwd_inner and bwd_allreduce timers and the
timed forward pace the optimizer update, the per-micro-step catch-all, the link and the host's launches."""
from __future__ import annotations

from pathlib import Path

import pytest

from zerotune.predictor import parse_ds_config
from zerotune.validate.experiments import UserCommand
from zerotune.validate.plan import build_job
from zerotune.validate.settings import BUILTIN_SCRIPT, TuneSettings


def test_the_devices_matmul_pace_today_rescales_the_calibrated_gemm_rate() -> None:
    # The shipped CPU profile's microbenchmark timed a 2048^3 fp32 matmul at 95.5 GFLOP/s (2026-11-23); the same
    # matmul in a profiling run at twice that makes the GEMMs twice as fast, and nothing else changes
    from dataclasses import replace
    from zerotune.validate.calibration import MAX_PACE_RATIO, calibration_for, paced
    from zerotune.validate.settings import NO_PROFILE
    settings = TuneSettings(UserCommand(BUILTIN_SCRIPT, (), "--deepspeed_config", Path("ds.json")), {}, "m", "cpu", 2)
    lines: list[str] = []
    model = calibration_for(settings, lambda _: None)
    faster = paced(model, replace(settings, device_matmul=("fp32", 2048, 2 * 95.51e9)), lines.append)
    ratio = faster.efficiency.gemm_efficiency_scale / model.efficiency.gemm_efficiency_scale
    assert ratio == pytest.approx(2.0, rel=0.01) and "GFLOP/s" in lines[0]
    assert replace(faster.efficiency, gemm_efficiency_scale=model.efficiency.gemm_efficiency_scale) == model.efficiency
    far = paced(model, replace(settings, device_matmul=("fp32", 2048, 1e15)), lines.append)
    assert far.efficiency.gemm_efficiency_scale == pytest.approx(MAX_PACE_RATIO * model.efficiency.gemm_efficiency_scale)
    # no timing, another shape, or no calibration to compare with: unchanged
    assert paced(model, settings, lines.append) == model
    assert paced(model, replace(settings, device_matmul=("fp32", 1000, 1e11)), lines.append) == model
    none = replace(settings, device_matmul=("fp32", 2048, 1e11), profile=Path(NO_PROFILE))
    uncalibrated = calibration_for(none, lambda _: None)
    assert paced(uncalibrated, none, lines.append) == uncalibrated


def test_the_devices_copy_pace_today_rescales_the_memory_bound_kernels() -> None:
    # The shipped CPU profile's memory microbenchmark copied at 35.27 GB/s (read + write, 2026-11-23, an AMD EPYC
    # host); a profiling run that copies at a third of that makes the memory-bound kernels a third as fast and
    # leaves the GEMMs alone (on 2026-11-25 this VM, moved to an Intel Xeon host, copied at 12.2 GB/s)
    from dataclasses import replace
    from zerotune.validate.settings import NO_PROFILE
    from zerotune.validate.calibration import calibration_for, paced
    settings = TuneSettings(UserCommand(BUILTIN_SCRIPT, (), "--deepspeed_config", Path("ds.json")), {}, "m", "cpu", 2)
    lines: list[str] = []
    model = calibration_for(settings, lambda _: None)
    assert model.calibration_copy_bytes_per_s == pytest.approx(35.27e9, rel=0.001)
    slower = paced(model, replace(settings, device_copy_bytes_per_s=35.27e9 / 3), lines.append)
    ratio = slower.efficiency.memory_bandwidth_efficiency / model.efficiency.memory_bandwidth_efficiency
    assert ratio == pytest.approx(1 / 3, rel=0.01) and "GB/s" in lines[0]
    assert slower.efficiency.gemm_efficiency_scale == model.efficiency.gemm_efficiency_scale
    none = replace(settings, device_copy_bytes_per_s=1e10, profile=Path(NO_PROFILE))
    uncalibrated = calibration_for(none, lambda _: None)
    assert paced(uncalibrated, none, lines.append) == uncalibrated


def test_the_profiling_runs_smaller_copies_pace_the_kernels_that_fit_the_caches() -> None:
    # This VM's copies on 2026-11-27 (bytes moved -> bytes per second, one thread): 85 GB/s moving 1 MiB, 26 at
    # 16 MiB, 14 at 128 MiB (the large copy that paces memory_bandwidth_efficiency). Each smaller copy's gain over
    # the large one is kept, the large one closes the curve at 1; a copy slower than the large one counts as 1
    from dataclasses import replace
    from zerotune.validate.calibration import cache_gain, calibration_for, paced
    curve = ((2**20, 85e9), (16 * 2**20, 26e9), (128 * 2**20, 14e9), (4 * 2**20, 12e9))
    gain = cache_gain(curve)
    assert [m for m, _ in gain] == [2**20, 4 * 2**20, 16 * 2**20, 128 * 2**20]
    assert [g for _, g in gain] == pytest.approx([85 / 14, 1.0, 26 / 14, 1.0])
    assert cache_gain(((2**20, 85e9),)) == ()  # one copy is no curve
    settings = TuneSettings(UserCommand(BUILTIN_SCRIPT, (), "--deepspeed_config", Path("ds.json")), {}, "m", "cpu", 2)
    model = calibration_for(settings, lambda _: None)
    lines: list[str] = []
    timed = paced(model, replace(settings, device_copy_bytes_per_s=14e9, device_copy_curve=curve), lines.append)
    assert timed.efficiency.memory_cache_gain == gain and "caches" in lines[-1]
    # without a curve (an accelerator's profiling run) every kernel keeps the large copy's pace
    plain = paced(model, replace(settings, device_copy_bytes_per_s=14e9), lines.append)
    assert plain.efficiency.memory_cache_gain == ()


def test_the_profiling_runs_fresh_copy_prices_a_page_faulting_in() -> None:
    # This VM on 2026-11-29 (data/hardware/cpu.yaml fresh_page_source): a 64 MiB copy into a kept tensor at 23 GB/s
    # (read + write), into a fresh one at 4.2: 2/4.2e9 - 2/23e9 = 0.39 ns a byte written beyond the copy
    from dataclasses import replace
    from zerotune.validate.calibration import calibration_for, paced
    settings = TuneSettings(UserCommand(BUILTIN_SCRIPT, (), "--deepspeed_config", Path("ds.json")), {}, "m", "cpu", 2)
    model = calibration_for(settings, lambda _: None)
    lines: list[str] = []
    timed = paced(model, replace(settings, device_copy_bytes_per_s=23e9, device_fresh_copy_bytes_per_s=4.2e9),
                  lines.append)
    assert timed.efficiency.fresh_page_s_per_byte == pytest.approx(2 / 4.2e9 - 2 / 23e9)
    assert "fresh tensor" in lines[-1] and "0.389 ns" in lines[-1]
    # an allocator that keeps large blocks (the fresh copy as fast as the kept one, or faster): nothing charged
    same = paced(model, replace(settings, device_copy_bytes_per_s=23e9, device_fresh_copy_bytes_per_s=25e9),
                 lines.append)
    assert same.efficiency.fresh_page_s_per_byte == 0.0
    # not timed (an accelerator's profiling run): the catalog's figure stays
    assert paced(model, replace(settings, device_copy_bytes_per_s=23e9), lines.append
                 ).efficiency.fresh_page_s_per_byte is None



def test_the_profiling_runs_dropout_prices_a_mask_element() -> None:
    # 2026-11-29, an AMD EPYC host: torch's dropout on 2M fp32 elements 6.67 ns an element, its clone 0.24: 6.4 ns
    # drawn, against the catalog's 15 measured on an Intel Xeon host (data/hardware/cpu.yaml dropout_rng_source)
    from dataclasses import replace
    from zerotune.predictor import load_hardware
    from zerotune.predictor.ops import device_rates
    from zerotune.validate.calibration import calibration_for, paced
    settings = TuneSettings(UserCommand(BUILTIN_SCRIPT, (), "--deepspeed_config", Path("ds.json")), {}, "m", "cpu", 2)
    model = calibration_for(settings, lambda _: None)
    lines: list[str] = []
    timed = paced(model, replace(settings, device_dropout_s_per_element=6.4e-9), lines.append)
    assert device_rates(load_hardware("cpu"), "fp32", timed.efficiency).rng_s_per_element == pytest.approx(6.4e-9)
    assert "dropout" in lines[-1] and "6.4 ns" in lines[-1]
    assert device_rates(load_hardware("cpu"), "fp32", model.efficiency).rng_s_per_element == pytest.approx(15e-9)


def _profiled_zt_gpt_small():
    """(settings, job, calibration) of a tune of the built-in zt-gpt-small on 2 CPU ranks with the shipped profile."""
    from zerotune.validate.calibration import calibration_for
    from tests.conftest import make_job
    settings = TuneSettings(UserCommand(BUILTIN_SCRIPT, (), "--deepspeed_config", Path("ds.json")), {}, "zt-gpt-small",
                            "cpu", 2)
    return settings, make_job("zt-gpt-small", "cpu", 1, 2, seq_len=128), calibration_for(settings, lambda _: None)


def test_the_profiling_runs_timed_update_rescales_every_configurations_optimizer_step() -> None:
    # Unfused torch AdamW on this VM: the profiling runs of 2026-11-27 timed ZeRO-1's optimizer_step at 2.4-4x the
    # model's update (tests/fixtures/scripts: t5 24 ms against 7, mixtral 48 against 9). The update is per parameter
    # of the partition, so the ratio carries to other stages and micro-batches; the rest of the step is untouched.
    from dataclasses import replace
    from zerotune.calibrate.measurement import Measurement
    from zerotune.predictor import estimate
    from zerotune.predictor.step_time import optimizer_update_s
    from zerotune.validate.calibration import MAX_PACE_RATIO, update_paced
    settings, job, model = _profiled_zt_gpt_small()
    z1 = parse_ds_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1}}, world_size=2)
    update, rest = optimizer_update_s(job, z1, model.efficiency)
    assert update + rest > estimate(job, z1, model.efficiency).time.breakdown_s["optimizer_step"] >= update > 0
    run = Measurement(model="zt-gpt-small", hardware="cpu", num_nodes=1, num_gpus_per_node=2, seq_len=128, config=z1,
                      status="ok", step_s=1.0)
    lines: list[str] = []
    timed = update_paced(model, job, [run], replace(settings, profiled_update_s=3 * update), lines.append)
    assert timed.efficiency.optimizer_bytes_per_param == pytest.approx(3 * model.efficiency.optimizer_bytes_per_param)
    assert replace(timed.efficiency, optimizer_bytes_per_param=model.efficiency.optimizer_bytes_per_param) == \
        model.efficiency and "x3 as long" in lines[0]
    z0 = parse_ds_config({"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 0}}, world_size=2)
    before, after = (optimizer_update_s(job, z0, m.efficiency)[0] for m in (model, timed))
    assert after == pytest.approx(3 * before)  # ZeRO-0 updates the whole model, three times as long too
    # ZeRO-0's engine times the step as a whole: the rest of the step phase comes off first
    z0_run = replace(run, config=z0.replace(train_micro_batch_size_per_gpu=1))
    u0, r0 = optimizer_update_s(job, z0_run.config, model.efficiency)
    whole = update_paced(model, job, [z0_run], replace(settings, profiled_step_phase_s=r0 + 2 * u0), lines.append)
    assert whole.efficiency.optimizer_bytes_per_param == pytest.approx(2 * model.efficiency.optimizer_bytes_per_param)
    far = update_paced(model, job, [run], replace(settings, profiled_update_s=100 * update), lines.append)
    assert far.efficiency.optimizer_bytes_per_param == pytest.approx(MAX_PACE_RATIO * model.efficiency.optimizer_bytes_per_param)
    # ZeRO-0's step timer leaving the update no more than the rest times nothing where the update is the smaller
    # share (a LoRA run's few trainable parameters)
    small = replace(model, efficiency=replace(model.efficiency, optimizer_bytes_per_param=0.01))
    u_small, _ = optimizer_update_s(job, z0_run.config, small.efficiency)
    assert u_small < 0.5 * r0
    assert update_paced(small, job, [z0_run], replace(settings, profiled_step_phase_s=1.5 * r0), lines.append) == small
    # where the update is the larger share and the timer leaves more than the rest, the update is what the model
    # over-predicts: lowered to what the timer leaves
    assert u0 > r0
    left = (u0 + r0) / 2  # more than the rest, less than the update
    lowered = update_paced(model, job, [z0_run], replace(settings, profiled_step_phase_s=r0 + left), lines.append)
    assert lowered.efficiency.optimizer_bytes_per_param == pytest.approx(left / u0
                                                                         * model.efficiency.optimizer_bytes_per_param)
    assert lowered.efficiency.step_overhead_s == model.efficiency.step_overhead_s
    # a timer shorter than the rest alone (the residual MLP fixture: 9-14 ms against 15.5 + 11.5): the whole phase is
    # over-predicted, update and rest shrink alike, the rest by the per-step catch-all, so the phase is the timer's
    even = replace(model, efficiency=replace(model.efficiency, optimizer_bytes_per_param=(
        model.efficiency.optimizer_bytes_per_param * r0 / u0)))  # update and rest alike, as the MLP's 11 and 11.2
    ue, re_ = optimizer_update_s(job, z0_run.config, even.efficiency)
    phase = 0.8 * re_
    both = update_paced(even, job, [z0_run], replace(settings, profiled_step_phase_s=phase), lines.append)
    share = phase / (ue + re_)
    assert share > 1 / MAX_PACE_RATIO
    assert both.efficiency.optimizer_bytes_per_param == pytest.approx(share * even.efficiency.optimizer_bytes_per_param)
    u1, r1 = optimizer_update_s(job, z0_run.config, both.efficiency)
    assert u1 == pytest.approx(share * ue) and "the per-step overhead" in lines[-1]
    expected_overhead = max(0.0, even.efficiency.step_overhead_s - re_ * (1 - share))
    assert both.efficiency.step_overhead_s == pytest.approx(expected_overhead)
    assert expected_overhead < even.efficiency.step_overhead_s
    assert r1 == pytest.approx(re_ - (even.efficiency.step_overhead_s - expected_overhead))
    floor = update_paced(model, job, [z0_run], replace(settings, profiled_step_phase_s=0.05 * r0), lines.append)
    assert floor.efficiency.optimizer_bytes_per_param == pytest.approx(model.efficiency.optimizer_bytes_per_param
                                                                       / MAX_PACE_RATIO)
    # no profiling run, or no timers: unchanged
    assert update_paced(model, job, [], replace(settings, profiled_update_s=3 * update), lines.append) == model
    assert update_paced(model, job, [run], settings, lines.append) == model



def test_the_profiling_runs_fwd_and_bwd_timers_cap_the_per_micro_step_catch_all() -> None:
    # A residual MLP script on the CPU (2026-11-29): its fwd and bwd_inner timers read 2.0-2.6 and 2.4-2.5 ms against
    # 2.3 and 3.0 of modelled compute, where the shipped profile adds a 3 ms per-micro-step catch-all (fitted on
    # zt-gpt-small) that no timer holds: lowered to what the timers leave beyond the compute, never raised; ZeRO-1 and
    # above (hooks reduce inside the backward) and a missing timer leave it.
    from dataclasses import replace
    from zerotune.calibrate.measurement import Measurement
    from zerotune.predictor import estimate
    from zerotune.validate.calibration import micro_paced
    settings, job, model = _profiled_zt_gpt_small()
    assert model.efficiency.micro_step_overhead_s > 0.002
    z0 = parse_ds_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}}, world_size=2)
    run = Measurement(model="zt-gpt-small", hardware="cpu", num_nodes=1, num_gpus_per_node=2, seq_len=128, config=z0,
                      status="ok", step_s=1.0)
    parts = estimate(job, z0, model.efficiency).time.breakdown_s
    compute = parts["forward"] + parts["backward"] + parts["recompute"]
    lines: list[str] = []

    def timed(left: float, cfg_run: Measurement = run) -> float:
        timers = replace(settings, profiled_forward_s=parts["forward"],
                         profiled_backward_s=compute - parts["forward"] + left)
        return micro_paced(model, job, [cfg_run], timers, lines.append).efficiency.micro_step_overhead_s

    assert timed(0.001) == pytest.approx(0.001) and "3 -> 1 ms" in lines[-1]
    assert timed(-0.002) == 0.0
    assert timed(0.01) == model.efficiency.micro_step_overhead_s  # the timers leave room: not raised
    z1_run = replace(run, config=z0.replace(zero=replace(z0.zero, stage=1)))
    assert timed(0.001, z1_run) == model.efficiency.micro_step_overhead_s
    assert micro_paced(model, job, [run], settings, lines.append) == model


def test_the_profiling_runs_timed_all_reduce_paces_the_link() -> None:
    # The decoder fixture's profiling run (2026-11-27, ZeRO-0, 7.3M fp32 gradients over gloo): DeepSpeed's
    # bwd_allreduce timer read 34-49 ms where the shipped CPU profile's link put the all-reduce at 88 ms. At ZeRO-0
    # the timer holds the whole reduction: the model's exposed communication there and the gradients' flattening into
    # the bucket, charged apart (reduction_copies_s), which comes off the timer first; the link's bandwidth
    # efficiency is scaled by the ratio of the rest, every other stage's collectives on that link with it.
    from dataclasses import replace
    from zerotune.calibrate.measurement import Measurement
    from zerotune.predictor import estimate
    from zerotune.predictor.step_time import reduction_copies_s
    from zerotune.validate.calibration import allreduce_paced
    settings, job, model = _profiled_zt_gpt_small()
    z0 = parse_ds_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}}, world_size=2)
    predicted = estimate(job, z0, model.efficiency).time.breakdown_s["exposed_comm"]
    flattening = reduction_copies_s(job, z0, model.efficiency)
    assert predicted > 1e-3 and flattening > 0
    run = Measurement(model="zt-gpt-small", hardware="cpu", num_nodes=1, num_gpus_per_node=2, seq_len=128, config=z0,
                      status="ok", step_s=1.0)
    lines: list[str] = []
    timed = allreduce_paced(model, job, [run], replace(settings, profiled_allreduce_s=predicted / 2 + flattening),
                            lines.append)
    assert timed.efficiency.intra_node_bandwidth_efficiency == pytest.approx(
        2 * model.efficiency.intra_node_bandwidth_efficiency)
    assert "x2 as fast" in lines[0]
    again = estimate(job, z0, timed.efficiency).time.breakdown_s["exposed_comm"]
    assert predicted / 2 <= again < predicted  # the bandwidth part halves; the latency part stays
    # ZeRO-1 and above reduce in other patterns (or overlap the backward): not paced by; nor without the timer
    z1_run = replace(run, config=z0.replace(zero=replace(z0.zero, stage=1)))
    assert allreduce_paced(model, job, [z1_run], replace(settings, profiled_allreduce_s=predicted / 2),
                           lines.append) == model
    assert allreduce_paced(model, job, [run], settings, lines.append) == model

def test_the_profiling_runs_timed_forward_paces_the_hosts_kernel_launches() -> None:
    """DeBERTa-v2-xlarge's classifier on one H200 (data/measurements/gpu_grid/h200_shapes_grid.jsonl, 2026-11-27):
    at micro-batch 1 under ZeRO-1 DeepSpeed's fwd timer read 55.7 ms, against 7.2 ms of predicted device time and
    23.8 ms of kernel launches at the catalog's 23 us: the host paced it. Paced by it, the same model's ZeRO-1 step
    at micro-batch 8 (226.4 ms measured, 157 predicted before: -30%) comes to -13%; the CPU, ZeRO-3 and a forward the
    device bounds with the host no slower leave the model as it was."""
    from dataclasses import replace
    from benchmarks.gpu_grid import read_grid
    from zerotune.predictor import Efficiency, estimate
    from zerotune.predictor.rank import Uncertainty
    from zerotune.predictor.step_time import forward_device_host_s
    from zerotune.validate.calibration import Calibration, HOST_BOUND_MARGIN, host_paced
    grid = Path(__file__).resolve().parent.parent / "data" / "measurements" / "gpu_grid" / "h200_shapes_grid.jsonl"
    rows = {(m.model.rsplit("/", 1)[-1], m.config.zero.stage, m.config.train_micro_batch_size_per_gpu): m
            for _, m in read_grid(grid) if m.status == "ok"}
    profiled, later = rows[("deberta-v2-xlarge-cls.yaml", 1, 1)], rows[("deberta-v2-xlarge-cls.yaml", 1, 8)]
    job = build_job(profiled.model, "h200", 1, 1, profiled.seq_len)
    model = Calibration(Efficiency(), Uncertainty())
    settings = TuneSettings(UserCommand(BUILTIN_SCRIPT, (), "--deepspeed_config", Path("ds.json")), {}, profiled.model,
                            "h200", 1, profiled_forward_s=0.0557)
    device, host = forward_device_host_s(job, profiled.config, model.efficiency)
    assert 0.0557 > HOST_BOUND_MARGIN * device and host < 0.0557
    lines: list[str] = []
    paced = host_paced(model, job, [profiled], settings, lines.append)
    assert paced.efficiency.kernel_launch_s == pytest.approx(job.cluster.hardware.kernel_launch_s * 0.0557 / host)
    assert "the host paced it" in lines[0]
    before, after = (estimate(job, later.config, m.efficiency).time.step_s / later.measured_step_s
                     for m in (model, paced))
    assert before < 0.75 and after == pytest.approx(1.0, abs=0.15)  # 0.70 -> 0.87
    # no timer, ZeRO-3's forward (its hooks' fetches), or the CPU (the host runs the kernels): unchanged
    assert host_paced(model, job, [profiled], replace(settings, profiled_forward_s=None), lines.append) == model
    z3 = replace(profiled, config=profiled.config.replace(zero=replace(profiled.config.zero, stage=3)))
    assert host_paced(model, job, [z3], settings, lines.append) == model
    cpu = build_job(profiled.model, "cpu", 1, 1, profiled.seq_len)
    assert host_paced(model, cpu, [replace(profiled, hardware="cpu")], settings, lines.append) == model
    # device-bound (micro-batch 8: fwd timer 52.3 ms, 43.4 predicted on the device, 23.8 launching): unchanged; a
    # host predicted slower than the whole forward is lowered to it
    bound = replace(settings, profiled_forward_s=0.0523)
    assert host_paced(model, job, [later], bound, lines.append) == model
    slow_host = Calibration(Efficiency(kernel_launch_s=4 * job.cluster.hardware.kernel_launch_s), Uncertainty())
    lowered = host_paced(slow_host, job, [later], bound, lines.append)
    assert lowered.efficiency.kernel_launch_s < slow_host.efficiency.kernel_launch_s
    assert "the host took no longer" in lines[-1]
