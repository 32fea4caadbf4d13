"""The model `tune` starts from: a calibration profile's efficiencies and bands (or the uncalibrated defaults),
widened for a model the profile was not fitted on and rescaled to the device's pace that the profiling run timed."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from zerotune.calibrate.profiles import CalibrationProfile, find_profile, load_profile, profile_measurements
from zerotune.calibrate.measurement import Measurement
from zerotune.predictor import Efficiency, Job, estimate, load_hardware
from zerotune.predictor.step_time import forward_device_host_s, optimizer_update_s, reduction_copies_s
from zerotune.predictor.rank import Uncertainty
from zerotune.validate.search import measured_job
from zerotune.validate.settings import NO_PROFILE, TuneSettings

__all__ = ["Calibration", "calibration_for", "load_profile_for", "profile_bands", "paced", "cache_gain",
           "update_paced", "allreduce_paced", "host_paced", "micro_paced", "HOST_BOUND_MARGIN", "MODEL_TRANSFER_REL",
           "TRANSFER_SHARED_VARIANCE", "CALIBRATED_SLOPE_REL", "MAX_PACE_RATIO"]


@dataclass(frozen=True)
class Calibration:
    """The model the search starts from: efficiency parameters and the uncertainty of their predictions."""

    efficiency: Efficiency
    uncertainty: Uncertainty
    calibration_matmul_flops_per_s: Mapping[tuple[str, int], float] = field(default_factory=dict)
    """The calibration's microbenchmark FLOP/s of square matmuls by (dtype, edge); empty when uncalibrated."""
    calibration_copy_bytes_per_s: float | None = None
    """The calibration's memory microbenchmark (tensor copy, read + write); None when uncalibrated."""


MODEL_TRANSFER_REL = 0.15
"""What a calibration's step-time band leaves out when the job's model is not one it was fitted on: its
out-of-sample band holds configurations of the fitted model (held out by configuration, calibrate/fit.py), not
other models. Measured transfers: calibrating on three rows of one model of the published 16-V100 table and
predicting its others, 7.6% mean error on the test half (validate/fewshot.py; about 19% as the band's two standard
deviations of a half-normal error); the CPU profile fitted on zt-gpt-small predicted the encoder and decoder fixture
scripts within +1% to -14% (data/measurements/cpu_probes_other_models/README.md); five scripts written as users
write them, tuned on the 2-vCPU machine on 2026-11-26: +22% to +170% at micro-batch 1, where the band claimed +-3%.
Added in quadrature to the profile's band, as an error every configuration of the job shares (Uncertainty.shared_rel):
the transferred model's errors split by model (fit on three rows of one model, log error of every other row) are
mostly one offset per model, RMS 0.114 of the models' means against 0.066 about them on the 16-V100 table (7 models,
25 rows; 0.095 and 0.064 before GEMMs off the tensor cores' alignment were charged,
ops.MISALIGNED_GEMM_SLOWDOWN) and 0.107 against 0.101 on vTrain's single-node runs (7 models, 210 rows), where the spread about the mean is
the configuration error a model's own calibration also has (`python -m zerotune.validate.fewshot` prints the split).
TRANSFER_SHARED_VARIANCE says how much of it is shared."""
TRANSFER_SHARED_VARIANCE = 0.75
"""The share of MODEL_TRANSFER_REL's variance that all of the model's configurations share: 0.114^2 / (0.114^2 +
0.066^2) on the 16-V100 table, whose three-row fit MODEL_TRANSFER_REL comes from (0.53 on vTrain's single-node runs,
the other data set). The rest differs by configuration (spread over the search's prior like the profile's own band):
all of it shared, a Mixtral script's first experiment at micro-batch 11 was given +-5% after its micro-batch-1
profiling run and measured 12% above its prediction."""


CALIBRATED_SLOPE_REL = 0.042
"""Uncertainty.slope_rel of a calibrated job, the profile's own model included: the RMS, per doubling of the
micro-batch, of the log error of the first experiment after the profiling run at micro-batch 1 corrected the
predictions, on the fit half of `python -m benchmarks.first_prediction`'s scripts (encoder, decoder, hfloop, neox,
vit, lora: +0.042, -0.012, +0.034, +0.052, -0.026, +0.064 per doubling; 2026-11-27, this CPU VM, with the paces of
the profiling run's copies and all-reduce). The other half (bert_trainer, gpt2_trainer, t5_trainer, bert_cls_ckpt,
moe) is the check. A calibration's probes do not pin the trend of its own model either: the CPU profile's model,
zt-gpt-small, on the CPU grid it was not fitted on (data/measurements/cpu_grid_zt-gpt-small_seq128_2ranks.jsonl,
micro-batches 1-8) trends +0.027, +0.029, +0.046 and -0.086 a doubling at ZeRO 0-3 (least squares, RMS 0.052).
Without it the profiling run at micro-batch 1 fixed its family's error at micro-batch 8 within +-2.4%: replayed
with the profiling run (benchmarks.replay, seed 13), the CPU grid's deliberately wrong models ran ZeRO-1 and -2
and never ZeRO-0 at 8, the best, 5% faster than predicted from micro-batch 1: 49% -> 100% of choices within 3% of
the best at 2.17 -> 2.67 experiments; the H100 grid's real model 1.82 -> 2.00, the other data sets unchanged (the
uncalibrated model takes none: Uncertainty.slope_rel)."""


def calibration_for(settings: TuneSettings, log: Callable[[str], None] = print) -> Calibration:
    """The calibration tune starts from (_resolve_profile), its band widened by MODEL_TRANSFER_REL when the job's model
    is not one the profile was fitted on; the uncalibrated defaults without a profile."""
    profile = _resolve_profile(settings.hardware, settings.profile, log)
    if profile is None:
        return Calibration(Efficiency(), Uncertainty())
    micro = profile.environment.get("microbenchmarks") or {}
    copy = micro.get("memory_bandwidth_bytes_per_s")
    bands = profile_bands(profile)
    fitted = sorted({m.model for m in profile_measurements(profile)})
    if settings.model not in fitted:
        wider = math.hypot(bands.step_time_rel, MODEL_TRANSFER_REL)
        log(f"zerotune tune: the profile was fitted on {', '.join(fitted) or 'no named model'}; for another model "
            f"its step-time band widens from {bands.step_time_rel:.1%} to {wider:.1%} (MODEL_TRANSFER_REL)")
        shared = MODEL_TRANSFER_REL * math.sqrt(TRANSFER_SHARED_VARIANCE)
        bands = replace(bands, step_time_rel=wider, shared_rel=shared)
    return Calibration(profile.efficiency, bands, _square_matmuls(profile),
                       float(copy) if isinstance(copy, (int, float)) and copy > 0 else None)


def load_profile_for(hardware: str, given: Path | None = None, log: Callable[[str], None] = lambda _: None
                     ) -> tuple[Efficiency, Uncertainty]:
    """The efficiency and bands of the profile tune uses (_resolve_profile); the uncalibrated defaults without one."""
    profile = _resolve_profile(hardware, given, log)
    return (profile.efficiency, profile_bands(profile)) if profile else (Efficiency(), Uncertainty())


def profile_bands(profile: CalibrationProfile) -> Uncertainty:
    """The profile's error bands, with the ZeRO stages its runs measured (Uncertainty.num_stages_measured) and
    the trend in micro-batch its probes leave open (CALIBRATED_SLOPE_REL)."""
    stages = {m.config.zero.stage for m in profile_measurements(profile)}
    return replace(profile.uncertainty.bands(), num_stages_measured=len(stages), slope_rel=CALIBRATED_SLOPE_REL)


def _resolve_profile(hardware: str, given: Path | None, log: Callable[[str], None]) -> CalibrationProfile | None:
    """The profile named by --profile, else the user's calibration of this hardware, else the shipped one;
    which one is used (or that none is) is said through `log`, never picked up silently. --profile none
    (NO_PROFILE): none, the uncalibrated defaults, even where a calibration exists."""
    if given is not None and str(given) == NO_PROFILE:
        log(f"zerotune tune: --profile {NO_PROFILE}: predicting {hardware} uncalibrated (default efficiencies and "
            f"bands)")
        return None
    if given is not None and not Path(given).is_file():
        raise ValueError(f"--profile {given}: no such file; give a calibration profile (zerotune calibrate "
                         f"writes one)")
    path = given or find_profile(load_hardware(hardware).name)  # honours ZEROTUNE_HOME / ZEROTUNE_DATA
    if path is None:
        log(f"zerotune tune: no calibration profile for {hardware}; predicting uncalibrated "
            f"(zerotune calibrate --hardware {hardware} makes one)")
        return None
    profile = load_profile(Path(path))
    if profile.hardware != hardware:
        warnings.warn(f"--profile {path} was fitted on {profile.hardware}, not {hardware}; tuning uncalibrated")
        return None
    log(f"zerotune tune: calibration profile {path}")
    return profile


def _square_matmuls(profile: CalibrationProfile) -> dict[tuple[str, int], float]:
    """The profile's microbenchmark FLOP/s of each edge^3 matmul, by (dtype, edge)."""
    micro = profile.environment.get("microbenchmarks") or {}
    rates: dict[tuple[str, int], float] = {}
    for r in micro.get("matmul") or []:
        if isinstance(r, dict) and r.get("m") == r.get("n") == r.get("k") and r.get("flops_per_s"):
            key = (str(r.get("dtype")), int(r["m"]))
            rates[key] = max(rates.get(key, 0.0), float(r["flops_per_s"]))
    return rates


MAX_PACE_RATIO = 4.0
"""A device timed more than this many times faster or slower than its calibration is not the calibrated one
(another machine, a thermal fault): the rescaling stops here."""


def paced(model: Calibration, settings: TuneSettings, log: Callable[[str], None]) -> Calibration:
    """The model with its GEMM rate scaled by the device's matmul pace now over the calibration's, and its memory
    bandwidth by its copy pace: a calibration holds for the machine as it ran that day, and a shared machine's
    pace moves (this CPU VM's single-thread fp32 matmul: 95 GFLOP/s in the shipped profile's microbenchmark on
    2026-11-23, 153-172 on 2026-11-25; its tensor copy 35 GB/s then, 12 now: the VM had moved from an AMD EPYC host
    to an Intel Xeon one). Each is clipped at MAX_PACE_RATIO; the profiling run's own measurement corrects the rest.
    On a CPU the profiling run's large copy into a fresh tensor sets the cost of a page faulting in
    (Efficiency.fresh_page_s_per_byte) as measured, not as a ratio: a host whose allocator keeps large blocks
    (jemalloc, tcmalloc, a raised MALLOC_MMAP_THRESHOLD_) times about none. Its dropout sets the mask's draw
    (Efficiency.dropout_rng_s_per_element) the same way: 15 ns an element on the Intel Xeon host the catalog's figure
    was measured on, 6.4 on an AMD EPYC one (2026-11-29)."""
    eff = model.efficiency
    if settings.device_matmul is not None:
        dtype, edge, now = settings.device_matmul
        then = model.calibration_matmul_flops_per_s.get((dtype, edge))
        if then and now > 0:
            ratio = _clip_pace(now / then)
            log(f"zerotune tune: a {edge}^3 {dtype} matmul ran at {now / 1e9:.4g} GFLOP/s in the profiling run against "
                f"{then / 1e9:.4g} in the calibration: GEMMs predicted x{ratio:.3g} as fast")
            eff = replace(eff, gemm_efficiency_scale=eff.gemm_efficiency_scale * ratio)
    now_copy, then_copy = settings.device_copy_bytes_per_s, model.calibration_copy_bytes_per_s
    if now_copy and then_copy:
        ratio = _clip_pace(now_copy / then_copy)
        log(f"zerotune tune: a tensor copy ran at {now_copy / 1e9:.3g} GB/s in the profiling run against "
            f"{then_copy / 1e9:.3g} in the calibration: memory-bound kernels predicted x{ratio:.3g} as fast")
        eff = replace(eff, memory_bandwidth_efficiency=eff.memory_bandwidth_efficiency * ratio)
        gain = cache_gain(settings.device_copy_curve)
        if gain:
            eff = replace(eff, memory_cache_gain=gain)
            shown = ", ".join(f"x{g:.2g} at {moved / 2**20:.3g} MiB" for moved, g in gain)
            log(f"zerotune tune: smaller copies moved their bytes faster (in the caches): memory-bound kernels "
                f"predicted by the bytes they move, {shown}")
    fresh = settings.device_fresh_copy_bytes_per_s
    if now_copy and fresh:
        # the same bytes moved (read + write) into a fresh tensor: what is left over is its pages faulting in, per
        # byte written (half the bytes moved)
        per_byte = max(0.0, 2.0 / fresh - 2.0 / now_copy)
        log(f"zerotune tune: a copy into a fresh tensor ran at {fresh / 1e9:.3g} GB/s against {now_copy / 1e9:.3g} into "
            f"a kept one: tensors the allocator maps anew charged {per_byte * 1e9:.3g} ns a byte written")
        eff = replace(eff, fresh_page_s_per_byte=per_byte)
    drawn = settings.device_dropout_s_per_element
    if drawn is not None:
        log(f"zerotune tune: a dropout mask took {drawn * 1e9:.3g} ns an element beyond its bytes in the profiling run: "
            f"dropout costed so")
        eff = replace(eff, dropout_rng_s_per_element=drawn)
    return replace(model, efficiency=eff)


def cache_gain(curve: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """(bytes moved, bandwidth over the largest copy's) of the copies smaller than the largest, from a copy curve
    (ProfiledRun.copy_curve): the bandwidth a memory-bound kernel reaches when its working set fits the caches,
    against the large copy that paces memory_bandwidth_efficiency. Measured on this project's CPU VM
    (2026-11-27, one thread, an Intel Xeon with 2 MiB of L2 a core): copies into a fresh tensor moving up to 1 MiB
    ran at 75-93 GB/s, 4-16 MiB at 25-27; the 64 MiB copy into a kept tensor at 13-16 (the calibration day's
    512 MiB copy at 35, on an AMD EPYC host), so the large copy alone paced a small model's kernels 2-6x too slow.
    From 64 MiB moved a fresh tensor's pages fault in (glibc maps large blocks anew: 5 GB/s), which no gain below 1
    keeps at the large copy's pace. The largest copy is the curve's last point, at 1. With the all-reduce pace
    (allreduce_paced) the fixture scripts' profiling runs at micro-batch 1 came from 1 / 11 inside their band (RMS
    log error 0.246) to 10 / 11 (0.10; data/measurements/first_prediction/results_2026-11-27_paces)."""
    points = sorted((float(m), float(b)) for m, b in curve if m > 0 and b > 0)
    if len(points) < 2:
        return ()
    largest, reference = points[-1]
    return tuple((moved, max(1.0, rate / reference)) for moved, rate in points[:-1] if moved < largest) + \
        ((largest, 1.0),)


def update_paced(model: Calibration, job: Job, initial: Sequence[Measurement], settings: TuneSettings,
                 log: Callable[[str], None]) -> Calibration:
    """The model with the optimizer's update scaled to what the profiling run's engine timed it at (its step
    phase does not depend on the micro-batch, so it carries to every configuration, by the partition each
    updates: zerotune.predictor.step_time.optimizer_update_s). ZeRO 1-3 time the update alone (optimizer_step);
    at ZeRO-0 the engine's step timer less the rest of the step phase the model holds. Unfused torch AdamW on this
    project's CPU VM took 7-13 ns a parameter on 2026-11-27 against 5 on the calibration day, while the copy pace,
    which paced() applies to elementwise kernels, had fallen 3x: the update is timed, not inferred. Clipped at
    MAX_PACE_RATIO; unchanged without a profiling run or its timers, or where the optimizer runs on the host. At
    ZeRO-0 a timer shorter than the rest alone shows the whole phase over-predicted: update and rest are lowered
    alike to the timer (at most to a quarter), the rest by its catch-all step_overhead_s (its mechanistic parts
    stay); a timer that leaves the update no more than the rest while the update is the smaller share (a LoRA run's
    few trainable parameters) times nothing. A residual MLP script of 3.1 M parameters, 2026-11-29: step timer 9-14
    ms against 11-15.5 predicted for the update and 11.2-11.5 for the rest (9 of it the CPU profile's per-step
    catch-all, fitted on zt-gpt-small); its profiling run was predicted 29-60% slow in six runs, the update alone
    lowered or not. The rest excludes ZeRO-0's gradient flattening, which the bwd_allreduce timer holds
    (step_time.optimizer_update_s)."""
    timed = next((m for m in initial if m.status == "ok"), None)  # the profiling run's measurement
    if timed is None or (settings.profiled_update_s is None and settings.profiled_step_phase_s is None):
        return model
    update, rest = optimizer_update_s(measured_job(job, timed), timed.config, model.efficiency)
    if update <= 0:
        return model
    measured = (settings.profiled_update_s if settings.profiled_update_s is not None
                else settings.profiled_step_phase_s - rest)  # type: ignore[operator]
    eff = model.efficiency
    if settings.profiled_update_s is None and measured < 0:
        # ZeRO-0's step timer shorter than the rest alone: the whole phase is over-predicted, so both shrink alike
        # to what the timer read, the rest through its catch-all (step_overhead_s; its mechanistic parts stay)
        phase = settings.profiled_step_phase_s
        ratio = _clip_pace(max(phase, 0.0) / (update + rest))  # type: ignore[operator]
        overhead = max(0.0, eff.step_overhead_s - rest * (1.0 - ratio))
        log(f"zerotune tune: the step phase took {phase * 1e3:.4g} ms in the profiling run (DeepSpeed's step timer) "
            f"against {(update + rest) * 1e3:.4g} predicted ({update * 1e3:.4g} the update): updates predicted "
            f"x{ratio:.3g} as long, the per-step overhead {eff.step_overhead_s * 1e3:.3g} -> {overhead * 1e3:.3g} ms")
        return replace(model, efficiency=replace(eff, optimizer_bytes_per_param=eff.optimizer_bytes_per_param * ratio,
                                                 step_overhead_s=overhead))
    if settings.profiled_update_s is None and measured <= rest and (measured >= update or update <= rest):
        return model  # what the step timer leaves is no larger than the model's own share subtracted: not a timing
    ratio = _clip_pace(measured / update)  # measured >= 0 here: a timer shorter than the rest returned above
    what = "optimizer_step timer" if settings.profiled_update_s is not None else "step timer less the rest of its step"
    log(f"zerotune tune: the optimizer's update took {measured * 1e3:.4g} ms in the profiling run (DeepSpeed's "
        f"{what}) against {update * 1e3:.4g} predicted: updates predicted x{ratio:.3g} as long")
    return replace(model, efficiency=replace(eff, optimizer_bytes_per_param=eff.optimizer_bytes_per_param * ratio))


def micro_paced(model: Calibration, job: Job, initial: Sequence[Measurement], settings: TuneSettings,
                log: Callable[[str], None]) -> Calibration:
    """The model with its per-micro-step catch-all (Efficiency.micro_step_overhead_s, which a calibration fits with
    its probes' total step times) no longer than what the profiling run's fwd and bwd_inner timers leave beyond the
    model's forward and backward: a step is measured by the engine's timers (fwd + bwd + step), and the catch-all
    has no timer of its own, so where those two hold no more than the modelled compute it is not in this script's
    steps. The shipped CPU profile's 3 ms (fitted on zt-gpt-small) against a residual MLP script whose fwd and
    bwd_inner timers read 2.0-2.6 and 2.4-2.5 ms, its modelled forward and backward 2.3 and 3.0 (2026-11-29). Only
    lowered, never raised (a compute the model under-predicts is the correction's to carry); DeepSpeed's CPU
    accelerator (on a GPU the timers hold the host's launches as well: host_paced) at ZeRO-0 (above it, gradient
    hooks reduce inside the backward)."""
    timed = next((m for m in initial if m.status == "ok"), None)  # the profiling run's measurement
    eff = model.efficiency
    if timed is None or settings.profiled_forward_s is None or settings.profiled_backward_s is None \
            or job.cluster.hardware.comm_compute_overlap or timed.config.zero.stage != 0 \
            or eff.micro_step_overhead_s <= 0:
        return model
    parts = estimate(measured_job(job, timed), timed.config, eff).time.breakdown_s
    gas = timed.config.gradient_accumulation_steps
    compute = (parts["forward"] + parts["backward"] + parts["recompute"]) / gas
    timers = (settings.profiled_forward_s + settings.profiled_backward_s) / gas
    left = max(timers - compute, 0.0)
    if left >= eff.micro_step_overhead_s:
        return model
    log(f"zerotune tune: the forward and backward took {timers * 1e3:.4g} ms a micro-step in the profiling run "
        f"(DeepSpeed's fwd and bwd_inner timers) against {compute * 1e3:.4g} of modelled compute: the per-micro-step "
        f"overhead {eff.micro_step_overhead_s * 1e3:.3g} -> {left * 1e3:.3g} ms")
    return replace(model, efficiency=replace(eff, micro_step_overhead_s=left))


MIN_PACED_ALLREDUCE_S = 1e-3
"""A gradient reduction predicted shorter than this is mostly latency and timer noise: not paced by."""


def allreduce_paced(model: Calibration, job: Job, initial: Sequence[Measurement], settings: TuneSettings,
                    log: Callable[[str], None]) -> Calibration:
    """The model with the link's bandwidth scaled to the gradient all-reduce the profiling run's engine timed: at
    ZeRO-0 the engine's bwd_allreduce timer holds the whole reduction after the backward (runtime/engine.py
    _backward_epilogue -> allreduce_gradients -> buffered_allreduce_fallback, :3095), the collective and the
    buffer copies DeepSpeed runs around it: the model's exposed communication at that stage, and its gradient
    flattening (step_time.reduction_copies_s), which is charged apart and so comes off the timer first (a residual
    MLP script's 2.2 ms of 12-22, counted twice before, 2026-11-29). Like the
    copy and matmul paces, a calibration's link holds for its day: the shipped CPU profile's gloo link (fitted
    efficiency 0.338, 2026-11-23, an AMD EPYC host) put a decoder script's 29 MB all-reduce at 88 ms where its
    profiling run's engine timed 34-49 ms (2026-11-27, an Intel Xeon host). Single node only (the run crossed one
    link), ZeRO-0 only (ZeRO-1 reduces in its own pattern, ZeRO-2 and 3 overlap the reduction with the backward, so
    their timer holds only a part); clipped at MAX_PACE_RATIO."""
    timed = next((m for m in initial if m.status == "ok"), None)  # the profiling run's measurement
    if timed is None or settings.profiled_allreduce_s is None or timed.config.zero.stage != 0 \
            or job.cluster.num_nodes != 1:
        return model
    run_job = measured_job(job, timed)
    predicted = estimate(run_job, timed.config, model.efficiency).time.breakdown_s.get("exposed_comm", 0.0)
    if predicted < MIN_PACED_ALLREDUCE_S or settings.profiled_allreduce_s <= 0:
        return model
    # the timer also holds the flattening of the gradients into the bucket, which the model charges apart
    flattening = reduction_copies_s(run_job, timed.config, model.efficiency)
    on_link = max(settings.profiled_allreduce_s - flattening, predicted / MAX_PACE_RATIO)
    ratio = _clip_pace(predicted / on_link)
    log(f"zerotune tune: the gradient all-reduce took {settings.profiled_allreduce_s * 1e3:.4g} ms in the profiling "
        f"run (DeepSpeed's bwd_allreduce timer) against {(predicted + flattening) * 1e3:.4g} predicted "
        f"({flattening * 1e3:.3g} of it the gradients' flattening): the link predicted x{ratio:.3g} as fast")
    eff = model.efficiency
    return replace(model, efficiency=replace(eff, intra_node_bandwidth_efficiency=eff.intra_node_bandwidth_efficiency
                                             * ratio))


HOST_BOUND_MARGIN = 1.5
"""A forward timed more than this over its kernels' predicted device time waited on the host. The device-bound
forwards of this project's GPU grids (ZeRO 0-2, predicted device time above 1.5x the host's; 100 rows on the H200,
H200-shapes and H100 grids, data/measurements/gpu_grid) timed 0.81-1.44x their predicted device time."""


def host_paced(model: Calibration, job: Job, initial: Sequence[Measurement], settings: TuneSettings,
               log: Callable[[str], None]) -> Calibration:
    """The model with the host's seconds per kernel (kernel_launch_s) scaled to the profiling run's forward where
    DeepSpeed's fwd timer shows the host paced it: the timer synchronizes the device at both ends
    (utils/timer.py SynchronizedWallClockTimer), so a forward timed beyond HOST_BOUND_MARGIN x its kernels' device
    time took the host's time to launch them, and the same script's kernels take that host time at any micro-batch
    (their count does not grow with it). Where it was device-bound, the host took no longer than the forward: a
    catalog pace above that is lowered to it. The catalog's figure is one NVIDIA default (chosen on vTrain's A100
    runs); Hugging Face models' Python around their kernels runs 1.5-2.6x it on the H200 shapes grid's micro-batch-1
    forwards (BERT-base 8.4 ms timed against 5.7 predicted, DeBERTa-v2-xlarge 62.0 against 23.8), and those rows'
    step times were predicted 27-59% fast. GPUs only (on DeepSpeed's CPU accelerator the host runs the kernels
    itself: paced() and update_paced() time it); not at ZeRO-3, whose forward timer also holds the hooks'
    fetches, nor with pipeline stages, whose engine times a forward per instruction. Clipped at MAX_PACE_RATIO."""
    timed = next((m for m in initial if m.status == "ok"), None)  # the profiling run's measurement
    forward = settings.profiled_forward_s
    if timed is None or forward is None or forward <= 0 or not job.cluster.hardware.comm_compute_overlap \
            or timed.config.zero.stage == 3 or timed.config.pp_size > 1:
        return model
    eff = model.efficiency
    device, host = forward_device_host_s(measured_job(job, timed), timed.config, eff)
    per_micro = forward / timed.config.gradient_accumulation_steps  # the timer sums the step's micro-steps
    if per_micro <= HOST_BOUND_MARGIN * device and host <= per_micro:
        return model  # device-bound, and the host no slower than the forward: its pace cannot be read
    ratio = _clip_pace(per_micro / host)
    launch = job.cluster.hardware.kernel_launch_s if eff.kernel_launch_s is None else eff.kernel_launch_s
    how = "the host paced it" if per_micro > HOST_BOUND_MARGIN * device else "the host took no longer"
    log(f"zerotune tune: the forward took {per_micro * 1e3:.4g} ms a micro-step in the profiling run (DeepSpeed's fwd "
        f"timer) against {device * 1e3:.4g} ms of predicted device time and {host * 1e3:.4g} of kernel launches "
        f"({how}): {launch * 1e6:.3g} -> {launch * ratio * 1e6:.3g} us of host time a kernel")
    return replace(model, efficiency=replace(eff, kernel_launch_s=launch * ratio))


def _clip_pace(ratio: float) -> float:
    return min(max(ratio, 1.0 / MAX_PACE_RATIO), MAX_PACE_RATIO)
