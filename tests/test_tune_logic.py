"""zerotune.validate.tune with a fake launcher (tests/tune_fakes.py): the stopping rule, the budget, resume and
overwrite, latency minimised, failures recorded (test_tune_runs.py: the results layout, offload and checkpointing as the
script runs them, measurements given beforehand, runs that end early)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from zerotune.calibrate.launch import LaunchSpec, RunResult
from zerotune.calibrate.measurement import read_jsonl
from zerotune.predictor import experiment_name, parse_ds_config
from zerotune.predictor.rank import rank
from zerotune.predictor.space import space_from_ds_config
from zerotune.validate.plan import build_job
from zerotune.validate.results import ExperimentResult, Prediction, best_result, measured_from_metrics
from zerotune.validate.settings import TuneSettings
from zerotune.validate.tune import tune

from tests.tune_fakes import SEQ_LEN, TINY, WORLD, FakeLauncher, fake_settings, spec_name


def _predicted(settings: TuneSettings) -> dict[str, float]:
    job = build_job(TINY, "cpu", 1, WORLD, SEQ_LEN)
    space = space_from_ds_config(settings.doc, world_size=WORLD, hidden_size=job.model.hidden_size, explore=())
    return {experiment_name(r.estimate.config): r.metric_value for r in rank(job, space, top=None).entries}


# -- the tuner's rules ---------------------------------------------------------------------------------------

def test_stops_when_no_remaining_band_can_beat_the_measured_best(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, [1, 16], [0], top_k=3)
    predicted = _predicted(settings)
    # precondition: micro-batch 1 is predicted below the 30% band of micro-batch 16 (uncalibrated Uncertainty)
    assert predicted["z0_gas1_tmbspg1"] / (1 - 0.3) < predicted["z0_gas1_tmbspg16"]
    launcher = FakeLauncher(step_s=lambda d: 0.01 * d["train_micro_batch_size_per_gpu"] ** 0.5)
    outcome = tune(settings, launcher, log=lambda _: None)
    assert [name for name, _ in launcher.calls] == ["z0_gas1_tmbspg16"]
    assert "cannot beat" in outcome.stop_reason


def test_a_close_race_runs_the_next_and_the_budget_is_never_exceeded(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, [6, 7, 8], [0, 1], top_k=2)
    launcher = FakeLauncher()
    outcome = tune(settings, launcher, log=lambda _: None)
    assert len(launcher.calls) == 2 and "budget of 2" in outcome.stop_reason
    capped = fake_settings(tmp_path / "capped", [6, 7, 8], [0, 1], top_k=5, tuner_num_trials=1)
    launcher = FakeLauncher()
    tune(capped, launcher, log=lambda _: None)
    assert len(launcher.calls) == 1  # tuner_num_trials caps top_k


def test_optimal_config_is_the_measured_best_not_the_predicted_best(tmp_path: Path, budget_ends_it: None) -> None:
    settings = fake_settings(tmp_path, [6, 7, 8], [0], top_k=3)
    first = max(_predicted(settings), key=_predicted(settings).get)
    slow_first = FakeLauncher(step_s=lambda d: 1.0 if d["train_micro_batch_size_per_gpu"] == 8 else 0.01)
    outcome = tune(settings, slow_first, log=lambda _: None)
    assert first == "z0_gas1_tmbspg8" and outcome.best is not None and outcome.best.name != first
    optimal = json.loads((tmp_path / "results" / "ds_config_optimal.json").read_text())
    assert optimal["train_micro_batch_size_per_gpu"] == outcome.best.config.train_micro_batch_size_per_gpu
    assert "autotuning" not in optimal  # DeepSpeed's write_optimal_config drops the section too


def test_latency_is_minimised(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, [6, 7, 8], [0], top_k=3, metric="latency")
    outcome = tune(settings, FakeLauncher(step_s=lambda d: 0.1 * d["train_micro_batch_size_per_gpu"]),
                   log=lambda _: None)
    measured = {r.name: r.metric_value for r in outcome.results}
    assert outcome.best is not None and outcome.best.metric_value == min(measured.values())
    assert outcome.best.metric_value == pytest.approx(0.1 * 6 * 1e3)  # ms per step, as predict reports latency


def test_best_result_ignores_failures_and_respects_the_metric_direction() -> None:
    cfg = parse_ds_config({}, world_size=WORLD)
    pred = Prediction(1.0, 1.0, 0.5, 2.0, 1.0)
    results = [ExperimentResult("a", cfg, pred, "ok", metric_value=3.0), ExperimentResult("b", cfg, pred, "ok",
               metric_value=5.0), ExperimentResult("c", cfg, pred, "oom", "out of memory")]
    assert best_result(results, "throughput").name == "b"
    assert best_result(results, "latency").name == "a"
    assert best_result(results[2:], "throughput") is None


def test_deepspeed_engine_metrics_latency_is_microseconds() -> None:
    # A real 2-rank CPU run of the built-in workload (tiny-gpt, micro-batch 2) wrote, through
    # runtime/engine.py _autotuning_exit: throughput 290.771 samples/s, latency 13756.5 for a 4-sample step.
    step_s, throughput, value = measured_from_metrics({"throughput": 290.7713, "latency": 13756.51}, 4, 1e9, "latency")
    assert step_s == pytest.approx(13756.51e-6, rel=1e-4) and value == pytest.approx(13.7565, rel=1e-4)
    assert throughput == pytest.approx(290.7713)


# -- failures, resume, overwrite -----------------------------------------------------------------------------

def test_failures_are_recorded_with_their_reason_and_the_tuner_goes_on(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, [6, 7, 8], [0], top_k=3)
    outcomes = {"z0_gas1_tmbspg8": ("oom", "a rank was killed (SIGKILL) under the memory cap"),
                "z0_gas1_tmbspg7": RuntimeError("a multi-node launch needs pdsh")}
    outcome = tune(settings, FakeLauncher(outcomes=outcomes), log=lambda _: None)
    by_name = {r.name: r for r in outcome.results}
    assert by_name["z0_gas1_tmbspg8"].status == "oom" and "SIGKILL" in by_name["z0_gas1_tmbspg8"].reason
    assert by_name["z0_gas1_tmbspg7"].status == "failed" and "launcher error" in by_name["z0_gas1_tmbspg7"].reason
    assert outcome.best is not None and outcome.best.name == "z0_gas1_tmbspg6"
    stored = {m.source.rsplit("/", 1)[-1]: m for m in read_jsonl(tmp_path / "results" / "measurements.jsonl")}
    assert stored["z0_gas1_tmbspg8"].status == "oom" and stored["z0_gas1_tmbspg6"].status == "ok"
    summary = (tmp_path / "results" / "summary.txt").read_text()
    assert "pdsh" in summary and "oom" in summary


def test_a_script_that_ends_before_the_engine_measures_says_how_many_steps_it_needs(tmp_path: Path,
                                                                                     budget_ends_it: None) -> None:
    # A clean exit with no metrics: the user's loop (--max_steps, a short dataset) stopped before DeepSpeed's engine
    # reached end_profile_step; "no metrics written" alone does not say what to change.
    settings = fake_settings(tmp_path, [6, 8], [0], top_k=2)
    fake = FakeLauncher()

    def short(spec: LaunchSpec) -> RunResult:
        if spec_name(spec) != "z0_gas1_tmbspg8":
            return fake(spec)
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        return RunResult("failed", "no metrics written", 0, 1.0, spec.run_dir, None)
    outcome = tune(settings, short, log=lambda _: None)
    failed = {r.name: r for r in outcome.results}["z0_gas1_tmbspg8"]
    assert failed.status == "failed" and "end_profile_step 2" in failed.reason and "at least 3" in failed.reason


def test_a_script_that_fails_the_same_way_twice_before_training_stops_the_tune(tmp_path: Path,
                                                                                 budget_ends_it: None) -> None:
    """Given --model there is no profiling run: a script that cannot import was launched for every one of the 8
    experiments of the budget, 1 min 39 s, then ended with exit 1 and no reason. Now two identical failures with
    nothing trained stop it with one line naming the script and the error (exit 2 from the CLI), the folder kept."""
    settings = fake_settings(tmp_path, [1, 2, 3, 4, 5, 6, 7, 8], [0, 1], top_k=8)
    broken = "ModuleNotFoundError: No module named 'nonexistent_module_xyz'"
    launcher = FakeLauncher(outcomes={name: ("failed", broken) for name in _predicted(settings)})
    with pytest.raises(ValueError, match=r"failed the same way and nothing has trained \(ModuleNotFoundError"):
        tune(settings, launcher, log=lambda _: None)
    assert len(launcher.calls) == 2
    summary = (tmp_path / "results" / "summary.txt").read_text()
    assert "failed the same way" in summary and summary.count("nonexistent_module_xyz") >= 2
    # failures that differ are the configurations' own (a micro-batch the data cannot fill): the budget goes on
    settings = fake_settings(tmp_path / "other", [1, 2, 3, 4, 5, 6, 7, 8], [0, 1], top_k=8)
    launcher = FakeLauncher(outcomes={name: ("failed", f"ValueError: {name}") for name in _predicted(settings)})
    outcome = tune(settings, launcher, log=lambda _: None)
    assert len(launcher.calls) == 8 and outcome.best is None


def test_a_script_that_fails_above_the_micro_batch_it_trained_at_stops_the_tune(tmp_path: Path,
                                                                                budget_ends_it: None) -> None:
    """A script that trained in its profiling run at micro-batch 1 and fails the same way at larger ones (a decoder
    script's `labels.view(-1)` of a sliced tensor, 2026-11-29: all 8 experiments failed at micro-batch 50, ZeRO-2's
    knobs varied) stops after two such failures with one line naming the cap to set; a stage's own failure (the
    profiling run trained at another stage) is no reason to stop."""
    from zerotune.calibrate.measurement import Measurement
    cfg = parse_ds_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}}, world_size=WORLD)
    given = Measurement(model=TINY, hardware="cpu", num_nodes=1, num_gpus_per_node=WORLD, seq_len=SEQ_LEN, config=cfg,
                        status="ok", step_s=0.01, source="profiling run")
    settings = fake_settings(tmp_path, [1, 2, 4, 6, 8], [0, 1], top_k=8)
    view = "RuntimeError: view size is not compatible with input tensor's size and stride"
    failing = {name: ("failed", view) for name in _predicted(settings) if not name.endswith("tmbspg1")}
    launcher = FakeLauncher(outcomes=failing)
    with pytest.raises(ValueError, match=r"fails at larger micro-batches: .*max_train_micro_batch_size_per_gpu below "
                                         r"\d+, then rerun; the profiling run trained at micro-batch 1"):
        tune(settings, launcher, log=lambda _: None, initial=[given])
    assert len(launcher.calls) == 2
    assert "fails at larger micro-batches" in (tmp_path / "results" / "summary.txt").read_text()
    # ZeRO-1 fails whatever its micro-batch, ZeRO-0 trains: the budget goes on and ZeRO-0 is chosen
    settings = fake_settings(tmp_path / "stage", [1, 2, 4, 6, 8], [0, 1], top_k=8)
    stage1 = {name: ("failed", view) for name in _predicted(settings) if name.startswith("z1")}
    outcome = tune(settings, FakeLauncher(outcomes=stage1), log=lambda _: None, initial=[given])
    assert outcome.best is not None and outcome.best.name.startswith("z0")


def test_a_measurement_far_beyond_the_prediction_is_not_taken(tmp_path: Path, budget_ends_it: None) -> None:
    """A metrics file saying 1e30 samples/s (a script writing DeepSpeed's metrics path itself) was chosen as the
    optimum and corrected into every prediction (the next one 1.2e26, band up to 4e53)."""
    settings = fake_settings(tmp_path, [6, 8], [0], top_k=2)
    outcome = tune(settings, FakeLauncher(step_s=lambda d: 1e-12 if d["train_micro_batch_size_per_gpu"] == 8
                                          else 0.02), log=lambda _: None)
    absurd = {r.name: r for r in outcome.results}["z0_gas1_tmbspg8"]
    assert absurd.status == "failed" and "not taken as a measurement" in absurd.reason
    assert outcome.best is not None and outcome.best.name == "z0_gas1_tmbspg6"


def test_interrupted_tune_resumes_and_skips_finished_experiments(tmp_path: Path, budget_ends_it: None) -> None:
    settings = fake_settings(tmp_path, [6, 7, 8], [0], top_k=3)
    with pytest.raises(KeyboardInterrupt):
        tune(settings, FakeLauncher(outcomes={"z0_gas1_tmbspg7": KeyboardInterrupt()}), log=lambda _: None)
    results = tmp_path / "results"
    assert "result" in json.loads((results / "z0_gas1_tmbspg8" / "exp.json").read_text())
    assert "result" not in json.loads((results / "z0_gas1_tmbspg7" / "exp.json").read_text())
    assert "interrupted" in (results / "summary.txt").read_text()
    launcher = FakeLauncher()
    outcome = tune(settings, launcher, log=lambda _: None)
    names = [name for name, _ in launcher.calls]
    assert names[0] == "z0_gas1_tmbspg7" and "z0_gas1_tmbspg8" not in names  # the finished one is read back
    assert [r.resumed for r in outcome.results] == [True] + [False] * len(names)
    # the closing line counts the resumed experiment's own wall time and says it was resumed (it had read 0:00:00
    # for a tune whose experiments had all run before)
    closing = (results / "summary.txt").read_text().strip().splitlines()[-1]
    assert f"Total number of experiments: {len(outcome.results)} (1 of them measured by an earlier run" in closing
    from zerotune.validate.results import format_summary
    minutes = format_summary(outcome.results[:1], "throughput", 0.0, "stopped").strip().splitlines()[-1]
    wall = outcome.results[0].wall_s
    assert f"in 0:{int(round(wall)) // 60:02d}:{int(round(wall)) % 60:02d}." in minutes
    # a resumed result is the configuration as tuned, not as its experiment ran it (timers switched on): a user's
    # wall_clock_breakdown false reached ds_config_optimal.json as true when a resumed experiment was the best
    assert all("wall_clock_breakdown" not in r.config.passthrough for r in outcome.results)
    assert "wall_clock_breakdown" not in json.loads(outcome.layout.optimal_config.read_text())


def test_each_experiments_peak_memory_is_read_from_its_ranks_and_kept_for_a_rerun(tmp_path: Path,
                                                                                   budget_ends_it: None) -> None:
    """Every experiment runs with the profiling site first on PYTHONPATH and ZEROTUNE_PEAK_OUT naming where its ranks
    write their peak at exit (validate.site_env.peak_env); the largest rank's is the experiment's, in exp.json and
    measurements.jsonl, and a rerun that resumes the experiment reads it back (the search's memory scale uses it).
    The user's environment and the optimal command stay free of it."""
    from zerotune.validate.site_env import PROFILING_SITE
    settings = replace(fake_settings(tmp_path, [6, 8], [0], top_k=2), env={"PYTHONPATH": "/user/lib"})
    fake = FakeLauncher()

    def with_peaks(spec: LaunchSpec) -> RunResult:
        run = fake(spec)
        assert spec.env["PYTHONPATH"].split(":") == [str(PROFILING_SITE), "/user/lib"]
        prefix = Path(spec.env["ZEROTUNE_PEAK_OUT"])
        assert prefix.parent == spec.run_dir
        for index, peak in ((0, 3e9), (1, 4e9)):
            Path(f"{prefix}.rank{index}.json").write_text(json.dumps({"peak_memory_bytes": peak}))
        return run
    outcome = tune(settings, with_peaks, log=lambda _: None)
    assert outcome.results and all(r.peak_memory_bytes == 4e9 for r in outcome.results)
    stored = read_jsonl(tmp_path / "results" / "measurements.jsonl")
    assert [m.peak_memory_bytes for m in stored] == [4e9] * len(outcome.results)
    again = tune(replace(settings, top_k=1), FakeLauncher(), log=lambda _: None)
    resumed = [r for r in again.results if r.resumed]
    assert resumed and all(r.peak_memory_bytes == 4e9 for r in resumed)
    assert "ZEROTUNE_PEAK_OUT" not in (tmp_path / "results" / "cmd_optimal.txt").read_text()
    assert settings.env == {"PYTHONPATH": "/user/lib"}


def test_a_rerun_starts_from_the_earlier_tunes_measurements_and_keeps_them(tmp_path: Path,
                                                                           budget_ends_it: None) -> None:
    """A T5 script tuned twice in one folder (2026-11-26): the rerun's profiling run measured another speed, its
    search chose other experiments, and summary.txt and measurements.jsonl then listed only the new three, the
    earlier best among the folders but in neither. Now the earlier tune's finished experiments are measured
    configurations to the rerun's search (not run again, no budget spent) and stay in its outputs."""
    settings = fake_settings(tmp_path, [6, 7, 8], [0], top_k=1)
    first = tune(settings, FakeLauncher(), log=lambda _: None)
    launcher = FakeLauncher()
    lines: list[str] = []
    second = tune(settings, launcher, log=lines.append)
    (earlier,) = first.results
    assert [r.name for r in second.results][0] == earlier.name and second.results[0].resumed
    assert len(launcher.calls) == 1 and launcher.calls[0][0] != earlier.name  # one new experiment: the budget
    assert any(line.startswith(f"zerotune tune: resumed {earlier.name}") for line in lines)
    stored = [m.source.rsplit("/", 1)[-1] for m in read_jsonl(tmp_path / "results" / "measurements.jsonl")]
    assert stored == [r.name for r in second.results]
    assert earlier.name in (tmp_path / "results" / "summary.txt").read_text()


def test_overwrite_reruns_finished_experiments(tmp_path: Path, budget_ends_it: None) -> None:
    settings = fake_settings(tmp_path, [6, 7, 8], [0], top_k=2, overwrite=True)
    tune(settings, FakeLauncher(), log=lambda _: None)
    launcher = FakeLauncher()
    tune(settings, launcher, log=lambda _: None)
    assert len(launcher.calls) == 2
