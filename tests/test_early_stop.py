"""An experiment that cannot beat the measured best is stopped as soon as its timed steps show it, with status
"stopped" and the reason in its run folder: a fake launcher for the tuner's side, a real 2-rank CPU DeepSpeed run
for the launcher's (DeepSpeed's per-step throughput lines, utils/timer.py ThroughputTimer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zerotune.calibrate.engine_timers import step_times_s
from zerotune.calibrate.launch import LaunchSpec, RunResult, free_port, launch
from zerotune.calibrate.measurement import read_jsonl
from zerotune.predictor import experiment_name, parse_ds_config
from zerotune.validate.experiments import UserCommand
from zerotune.predictor.dsconfig import AutotuningConfig
from zerotune.validate.results import ExperimentResult, Prediction
from zerotune.predictor.rank import rank
from zerotune.predictor.space import space_from_ds_config
from zerotune.validate.settings import BUILTIN_SCRIPT, TuneSettings
from zerotune.validate.runs import EARLY_STOP_MARGIN, stop_rule_for, stopped_step_s
from zerotune.validate.calibration import load_profile_for
from zerotune.validate.tune import tune
from tests.conftest import make_job

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY = str(FIXTURES / "tiny-gpt.yaml")
WORLD = 2
# Lines as DeepSpeed 0.19's engine prints them on rank 0: the global timers at each optimizer step with
# wall_clock_breakdown on (a real 2-rank CPU run of calibrate/workload.py, stdout.log), and ThroughputTimer lines
# (utils/timer.py) at log level info, batch 4 per step.
TIMER_LINES = ("[Rank 0] time (ms) | fwd_microstep: 2.37 | bwd_microstep: 5.86 | step_microstep: 4.19\n"
               "[Rank 0] time (ms) | fwd: 2.38 | bwd: 5.86 | bwd_inner: 2.64 | bwd_allreduce: 3.18 | step: 4.19\n"
               "[Rank 0] time (ms) | fwd: 2.00 | bwd: 6.00 | bwd_inner: 2.64 | bwd_allreduce: 3.18 | step: 2.00\n")
LINES = ("[INFO] [timer.py:264:stop] epoch=0/micro_step=3/global_step=3, RunningAvgSamplesPerSec=20.1, "
         "CurrSamplesPerSec=20.0, MemAllocated=0.0GB, MaxMemAllocated=0.0GB\n"
         "[INFO] [timer.py:264:stop] epoch=0/micro_step=4/global_step=4, RunningAvgSamplesPerSec=18.0, "
         "CurrSamplesPerSec=16.0, MemAllocated=0.0GB, MaxMemAllocated=0.0GB\n")


def _best(value: float) -> ExperimentResult:
    cfg = parse_ds_config({}, world_size=WORLD)
    return ExperimentResult("best", cfg, Prediction(1.0, value, value, value, 1.0), "ok", metric_value=value)


def test_step_times_come_from_the_engines_timer_lines_else_its_throughput_lines() -> None:
    assert step_times_s("noise\n" + TIMER_LINES + LINES, 4) == pytest.approx((0.01243, 0.010))  # fwd+bwd+step
    assert step_times_s("noise\n" + LINES, 4) == pytest.approx((4 / 20.0, 4 / 16.0))


def test_the_rule_skips_warm_up_waits_for_two_steps_and_stops_only_what_cannot_win() -> None:
    at = AutotuningConfig(start_profile_step=2, end_profile_step=6)  # steps 0-1 warm up, 5 are measured
    rule = stop_rule_for(_best(100.0), "throughput", samples=10, flops=1.0, at=at)
    assert rule((0.2, 0.2)) is None  # warm-up steps say nothing
    assert rule((0.2, 0.2, 0.2)) is None  # one measured step is not enough
    assert rule((1.0, 1.0, 0.2, 0.2)) is not None and "cannot beat" in rule((1.0, 1.0, 0.2, 0.2))  # 50 vs 100 /s
    assert rule((1.0, 1.0, 0.2, 0.1 / (1 - EARLY_STOP_MARGIN / 2))) is None  # its fastest is within the margin
    assert rule((1.0, 1.0) + (0.2,) * 5) is None  # its whole window is timed: let it write its metrics
    latency = stop_rule_for(_best(50.0), "latency", samples=10, flops=1.0, at=at)  # ms per step, minimised
    assert latency((1, 1, 0.04, 0.045)) is None and latency((1, 1, 0.08, 0.09)) is not None


# Steps 0-5 of the encoder fixture (tests/fixtures/scripts/encoder_mlm.py) on 2 CPU ranks, 2026-11-28, z0 at micro-batch
# 9: the script speeds up as it trains (1.71 s at step 0, 0.94 by step 23), alike in every configuration.
SPEEDING_UP = (1.647, 1.478, 1.343, 1.248, 1.152, 1.121)


def _speeding_best() -> ExperimentResult:
    cfg = parse_ds_config({}, world_size=WORLD)
    window_s = 1.152  # the median of its window, steps 2-6 (window_step_s)
    return ExperimentResult("best", cfg, Prediction(1.0, 10 / window_s, 1, 1, 1.0), "ok", metric_value=10 / window_s,
                            step_s=window_s, step_times_s=SPEEDING_UP)


def test_a_run_is_compared_with_the_best_at_the_same_step() -> None:
    at = AutotuningConfig(start_profile_step=2, end_profile_step=6)
    rule = stop_rule_for(_speeding_best(), "throughput", samples=10, flops=1.0, at=at)
    # as fast as the best step for step: its steps 2-3 are slower than the best's window (1.152 s) by 17% and 8%,
    # which stopped it before steps were paired; at the same steps it is the best's equal
    same = SPEEDING_UP[:4]
    assert rule(same) is None
    # 10% slower at every step: stopped, however much faster than the best's first steps it is
    slower = tuple(1.10 * s for s in SPEEDING_UP[:4])
    assert rule(slower) is not None and "same index" in rule(slower)
    # what the stopped run would have measured over the window: the best's window x its median ratio
    run = RunResult("stopped", "", None, 1.0, Path("."), None, slower)
    assert stopped_step_s(run, _speeding_best(), at) == pytest.approx(1.10 * 1.152)
    # without the best's steps (a result read back from before they were kept): the median of its timed steps,
    # never its warm-up
    assert stopped_step_s(run, None, at) == pytest.approx(1.10 * (1.343 + 1.248) / 2)


def test_tune_stops_a_losing_experiment_and_records_why(tmp_path: Path) -> None:
    calls: list[str] = []

    def launcher(spec: LaunchSpec) -> RunResult:
        name = experiment_name(parse_ds_config({k: v for k, v in spec.ds_config.items() if k != "autotuning"},
                                               world_size=WORLD))
        calls.append(name)
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        # the first experiment runs at half its predicted speed (so the model still expects better elsewhere and
        # a second experiment is run); the second is ten times slower again and must be stopped early
        step = first_step if len(calls) == 1 else 10 * first_step
        if spec.stop_rule is not None:
            for n in range(1, 6):  # the run's steps as they are logged, one by one (window: steps 3-5)
                reason = spec.stop_rule((step,) * n)
                if reason:
                    return RunResult("stopped", reason, None, 0.5, spec.run_dir, None, (step,) * n)
        metrics = {"step_s": step}
        (spec.run_dir / "metrics.json").write_text(json.dumps(metrics))
        return RunResult("ok", "", 0, 1.0, spec.run_dir, metrics)

    doc = {"train_micro_batch_size_per_gpu": [6, 7, 8], "zero_optimization": {"stage": [0, 1]},
           "autotuning": {"fast": True, "results_dir": str(tmp_path / "r"), "exps_dir": str(tmp_path / "e")}}
    settings = TuneSettings(UserCommand(BUILTIN_SCRIPT, (), "--deepspeed_config", tmp_path / "ds.json"), doc, TINY,
                            "cpu", WORLD, seq_len=32, top_k=2, explore=())
    eff, _ = load_profile_for("cpu")  # the profile tune predicts with: the first pick at half its predicted speed
    space = space_from_ds_config(doc, world_size=WORLD, explore=())
    top = rank(make_job(TINY, "cpu", 1, WORLD, seq_len=32), space, eff, top=1)
    first_step = 2 * top.entries[0].estimate.time.step_s
    outcome = tune(settings, launcher, log=lambda _: None)
    assert len(outcome.results) == 2
    first, second = outcome.results
    assert first.status == "ok" and outcome.best is first
    assert second.status == "stopped" and "cannot beat" in second.reason
    assert second.step_s == pytest.approx(10 * first_step)
    recorded = json.loads((tmp_path / "r" / second.name / "exp.json").read_text())["result"]
    assert recorded["status"] == "stopped" and "cannot beat" in recorded["reason"]
    assert recorded["step_times_s"] and recorded["step_times_s"] == pytest.approx([10 * first_step] * len(
        recorded["step_times_s"]))  # kept, so that a resumed tune compares later runs with them step for step
    stored = {m.source.rsplit("/", 1)[-1]: m for m in read_jsonl(tmp_path / "r" / "measurements.jsonl")}
    assert stored[second.name].status == "stopped" and stored[second.name].step_s == pytest.approx(10 * first_step)
    assert "stopped early" in (tmp_path / "r" / "summary.txt").read_text()


@pytest.mark.deepspeed
def test_a_real_run_is_stopped_on_its_logged_steps(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    ds_config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 4,
                 "zero_optimization": {"stage": 1}, "wall_clock_breakdown": True}
    args = ("--model", TINY, "--seq_len", "32", "--steps", "20000", "--warmup", "0")  # minutes if not stopped
    seen: list[int] = []

    def rule(steps: tuple[float, ...]) -> str | None:
        seen.append(len(steps))
        return "three steps are enough" if len(steps) >= 3 else None

    spec = LaunchSpec(script=FIXTURES.parent.parent / "calibrate" / "workload.py", ds_config=ds_config,
                      run_dir=tmp_path / "run", master_port=free_port(), timeout_s=300.0, script_args=args,
                      num_gpus=2, env={"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}, stop_rule=rule)
    result = launch(spec)
    assert result.status == "stopped", result.reason
    assert result.reason == "three steps are enough" and len(result.step_times_s) >= 3
    assert all(0 < s < 60 for s in result.step_times_s)
    assert not (result.run_dir / "metrics.json").exists()  # it never reached its end
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{spec.master_port}_*"))


def test_the_step_phase_and_zero_update_timers_come_from_the_engines_lines() -> None:
    # DeepSpeed 0.19.8's lines from a ZeRO-1 profiling run on this machine (tests/fixtures/scripts/mixtral_moe_loop.py):
    # the engine's global timers, then ZeRO's optimizer timers (stage_1_and_2.py: the update alone is optimizer_step)
    from zerotune.calibrate.engine_timers import step_phase_times_s
    zero1 = TIMER_LINES + ("[Rank 0] time (ms) | optimizer_allgather: 67.28 | optimizer_gradients: 8.71 | "
                           "optimizer_step: 62.36\n")
    steps, updates = step_phase_times_s(zero1)
    assert steps == pytest.approx((0.00419, 0.002)) and updates == pytest.approx((0.06236,))
    assert step_phase_times_s(TIMER_LINES)[1] == ()  # ZeRO-0: no update timer of its own


def test_the_forward_timer_comes_from_the_global_lines_not_the_micro_step_ones() -> None:
    from zerotune.calibrate.engine_timers import forward_times_s
    assert forward_times_s(TIMER_LINES) == pytest.approx((0.00238, 0.002))  # fwd_microstep's line is not a step's


def test_the_backward_less_its_reduction_comes_from_bwd_inner_not_its_micro_step_twin() -> None:
    # DeepSpeed 0.19.8 prints bwd_inner_microstep in the micro-step line and bwd_inner in the global one (a residual
    # MLP script's profiling run on this machine, 2026-11-29)
    from zerotune.calibrate.engine_timers import backward_inner_times_s
    micro = ("[Rank 0] time (ms) | fwd_microstep: 2.16 | bwd_microstep: 30.30 | bwd_inner_microstep: 2.38 | "
             "step_microstep: 13.38\n")
    assert backward_inner_times_s(micro + TIMER_LINES) == pytest.approx((0.00264, 0.00264))
