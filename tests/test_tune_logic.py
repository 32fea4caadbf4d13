"""zerotune.validate.tune with a fake launcher: the stopping rule, the budget, resume and overwrite, arg_mappings,
latency minimised, the results layout, failures recorded, learning-rate advice."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import warnings
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest

from zerotune.calibrate.launch import LaunchSpec, RunResult
from zerotune.calibrate.measurement import read_jsonl
from zerotune.predictor import DSConfig, ZeroConfig, experiment_name, parse_ds_config
from zerotune.predictor.rank import rank
from zerotune.predictor.space import space_from_ds_config
from zerotune.validate.experiments import (UserCommand, check_arg_mappings, model_from_num_params, read_hostfile,
                                  rewrite_args, split_user_command)
from zerotune.validate.plan import build_job
from zerotune.validate.results import ExperimentResult, Prediction, best_result, measured_from_metrics
from zerotune.validate.settings import (BUILTIN_SCRIPT, TuneSettings, add_tune_arguments, detected_gpu,
                                       settings_from_args)
from zerotune.validate.results import lr_advice
from zerotune.validate.tune import tune

TINY = str(Path(__file__).resolve().parent / "fixtures" / "tiny-gpt.yaml")
WORLD = 2
SEQ_LEN = 32


def _name(spec: LaunchSpec) -> str:
    return experiment_name(parse_ds_config({k: v for k, v in spec.ds_config.items() if k != "autotuning"},
                                           world_size=WORLD))


class FakeLauncher:
    """Answers each experiment like zerotune.calibrate.launch would: metrics in the run folder, or a failure."""

    def __init__(self, step_s: Callable[[dict], float] = lambda d: 0.01 * d["train_micro_batch_size_per_gpu"] ** 0.5,
                 outcomes: dict[str, object] | None = None) -> None:
        self.step_s, self.outcomes, self.calls = step_s, outcomes or {}, []

    def __call__(self, spec: LaunchSpec) -> RunResult:
        name = _name(spec)
        self.calls.append((name, spec))
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        for log in ("stdout.log", "stderr.log"):
            (spec.run_dir / log).write_text("")
        outcome = self.outcomes.get(name)
        if isinstance(outcome, BaseException):
            raise outcome
        if isinstance(outcome, tuple):
            return RunResult(outcome[0], outcome[1], None, 1.0, spec.run_dir, None)
        step = self.step_s(spec.ds_config)
        metrics = {"throughput": spec.ds_config["train_batch_size"] / step, "latency": step * 1e6}
        (spec.run_dir / "metrics.json").write_text(json.dumps(metrics))
        return RunResult("ok", "", 0, 1.0, spec.run_dir, metrics)


def _settings(tmp_path: Path, micro: list[int], stages: list[int], top_k: int = 3, args: tuple[str, ...] = (),
              **autotuning) -> TuneSettings:
    doc = {"train_micro_batch_size_per_gpu": micro, "zero_optimization": {"stage": stages},
           "autotuning": {"fast": True, "results_dir": str(tmp_path / "results"), "exps_dir": str(tmp_path / "exps"),
                          "start_profile_step": 1, "end_profile_step": 2, **autotuning}}
    command = UserCommand(BUILTIN_SCRIPT, args, "--deepspeed_config", tmp_path / "ds.json")
    return TuneSettings(command, doc, TINY, "cpu", WORLD, seq_len=SEQ_LEN, top_k=top_k, explore=())


@pytest.fixture
def budget_ends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every configuration counts as able to win, so the budget alone ends the search: for tests of what
    happens around the experiments (resume, overwrite, the optimal config), not of the stopping rule."""
    import zerotune.validate.search
    monkeypatch.setattr(zerotune.validate.search, "MIN_GAIN_REL", -0.99)


def _predicted(settings: TuneSettings) -> dict[str, float]:
    job = build_job(TINY, "cpu", 1, WORLD, SEQ_LEN)
    space = space_from_ds_config(settings.doc, world_size=WORLD, hidden_size=job.model.hidden_size, explore=())
    return {experiment_name(r.estimate.config): r.metric_value for r in rank(job, space, top=None).entries}


# -- the tuner's rules ---------------------------------------------------------------------------------------

def test_stops_when_no_remaining_band_can_beat_the_measured_best(tmp_path: Path) -> None:
    settings = _settings(tmp_path, [1, 16], [0], top_k=3)
    predicted = _predicted(settings)
    # precondition: micro-batch 1 is predicted below the 30% band of micro-batch 16 (uncalibrated Uncertainty)
    assert predicted["z0_gas1_tmbspg1"] / (1 - 0.3) < predicted["z0_gas1_tmbspg16"]
    launcher = FakeLauncher(step_s=lambda d: 0.01 * d["train_micro_batch_size_per_gpu"] ** 0.5)
    outcome = tune(settings, launcher, log=lambda _: None)
    assert [name for name, _ in launcher.calls] == ["z0_gas1_tmbspg16"]
    assert "cannot beat" in outcome.stop_reason


def test_a_close_race_runs_the_next_and_the_budget_is_never_exceeded(tmp_path: Path) -> None:
    settings = _settings(tmp_path, [6, 7, 8], [0, 1], top_k=2)
    launcher = FakeLauncher()
    outcome = tune(settings, launcher, log=lambda _: None)
    assert len(launcher.calls) == 2 and "budget of 2" in outcome.stop_reason
    capped = _settings(tmp_path / "capped", [6, 7, 8], [0, 1], top_k=5, tuner_num_trials=1)
    launcher = FakeLauncher()
    tune(capped, launcher, log=lambda _: None)
    assert len(launcher.calls) == 1  # tuner_num_trials caps top_k


def test_optimal_config_is_the_measured_best_not_the_predicted_best(tmp_path: Path, budget_ends_it: None) -> None:
    settings = _settings(tmp_path, [6, 7, 8], [0], top_k=3)
    first = max(_predicted(settings), key=_predicted(settings).get)
    slow_first = FakeLauncher(step_s=lambda d: 1.0 if d["train_micro_batch_size_per_gpu"] == 8 else 0.01)
    outcome = tune(settings, slow_first, log=lambda _: None)
    assert first == "z0_gas1_tmbspg8" and outcome.best is not None and outcome.best.name != first
    optimal = json.loads((tmp_path / "results" / "ds_config_optimal.json").read_text())
    assert optimal["train_micro_batch_size_per_gpu"] == outcome.best.config.train_micro_batch_size_per_gpu
    assert "autotuning" not in optimal  # DeepSpeed's write_optimal_config drops the section too


def test_latency_is_minimised(tmp_path: Path) -> None:
    settings = _settings(tmp_path, [6, 7, 8], [0], top_k=3, metric="latency")
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
    settings = _settings(tmp_path, [6, 7, 8], [0], top_k=3)
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
    settings = _settings(tmp_path, [6, 8], [0], top_k=2)
    fake = FakeLauncher()

    def short(spec: LaunchSpec) -> RunResult:
        if _name(spec) != "z0_gas1_tmbspg8":
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
    settings = _settings(tmp_path, [1, 2, 3, 4, 5, 6, 7, 8], [0, 1], top_k=8)
    broken = "ModuleNotFoundError: No module named 'nonexistent_module_xyz'"
    launcher = FakeLauncher(outcomes={name: ("failed", broken) for name in _predicted(settings)})
    with pytest.raises(ValueError, match=r"failed the same way and nothing has trained \(ModuleNotFoundError"):
        tune(settings, launcher, log=lambda _: None)
    assert len(launcher.calls) == 2
    summary = (tmp_path / "results" / "summary.txt").read_text()
    assert "failed the same way" in summary and summary.count("nonexistent_module_xyz") >= 2
    # failures that differ are the configurations' own (a micro-batch the data cannot fill): the budget goes on
    settings = _settings(tmp_path / "other", [1, 2, 3, 4, 5, 6, 7, 8], [0, 1], top_k=8)
    launcher = FakeLauncher(outcomes={name: ("failed", f"ValueError: {name}") for name in _predicted(settings)})
    outcome = tune(settings, launcher, log=lambda _: None)
    assert len(launcher.calls) == 8 and outcome.best is None


def test_a_measurement_far_beyond_the_prediction_is_not_taken(tmp_path: Path, budget_ends_it: None) -> None:
    """A metrics file saying 1e30 samples/s (a script writing DeepSpeed's metrics path itself) was chosen as the
    optimum and corrected into every prediction (the next one 1.2e26, band up to 4e53)."""
    settings = _settings(tmp_path, [6, 8], [0], top_k=2)
    outcome = tune(settings, FakeLauncher(step_s=lambda d: 1e-12 if d["train_micro_batch_size_per_gpu"] == 8
                                          else 0.02), log=lambda _: None)
    absurd = {r.name: r for r in outcome.results}["z0_gas1_tmbspg8"]
    assert absurd.status == "failed" and "not taken as a measurement" in absurd.reason
    assert outcome.best is not None and outcome.best.name == "z0_gas1_tmbspg6"


def test_interrupted_tune_resumes_and_skips_finished_experiments(tmp_path: Path, budget_ends_it: None) -> None:
    settings = _settings(tmp_path, [6, 7, 8], [0], top_k=3)
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
    write their peak at exit (validate.profiled.peak_env); the largest rank's is the experiment's, in exp.json and
    measurements.jsonl, and a rerun that resumes the experiment reads it back (the search's memory scale uses it).
    The user's environment and the optimal command stay free of it."""
    from zerotune.validate.profiled import PROFILING_SITE
    settings = replace(_settings(tmp_path, [6, 8], [0], top_k=2), env={"PYTHONPATH": "/user/lib"})
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
    settings = _settings(tmp_path, [6, 7, 8], [0], top_k=1)
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
    settings = _settings(tmp_path, [6, 7, 8], [0], top_k=2, overwrite=True)
    tune(settings, FakeLauncher(), log=lambda _: None)
    launcher = FakeLauncher()
    tune(settings, launcher, log=lambda _: None)
    assert len(launcher.calls) == 2


# -- layout ------------------------------------------------------------------------------------------------

def test_layout_files_and_summary_columns(tmp_path: Path) -> None:
    settings = _settings(tmp_path, [6, 7, 8], [0], top_k=2, args=("--per_device_train_batch_size", "1"),
                         arg_mappings={"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"})
    launcher = FakeLauncher()
    outcome = tune(settings, launcher, log=lambda _: None)
    results = tmp_path / "results"
    for name, spec in launcher.calls:
        exp = json.loads((tmp_path / "exps" / f"{name}.json").read_text())
        assert exp["ds_config"]["autotuning"]["enabled"] is True and exp["num_gpus"] == WORLD
        assert json.loads((results / name / "exp.json").read_text())["result"]["status"] == "ok"
        micro = spec.ds_config["train_micro_batch_size_per_gpu"]
        assert spec.script_args == ("--per_device_train_batch_size", str(micro))  # rewritten per arg_mappings
        assert spec.master_port > 0 and spec.ds_config_flag == "--deepspeed_config"
    header = (results / "summary.txt").read_text().splitlines()[0]
    assert [c.strip() for c in header.strip("|").split("|")] == ["tuning_space", "num_experiments", "best_metric_val",
                                                               "predicted_metric_val", "best_exp_name"]
    cmd = (results / "cmd_optimal.txt").read_text()
    assert str((results / "ds_config_optimal.json").resolve()) in cmd
    assert f"--per_device_train_batch_size {outcome.best.config.train_micro_batch_size_per_gpu}" in cmd
    assert (results / "space.png").is_file() and (results / "predicted_vs_measured.png").is_file()


def test_nothing_fits_says_what_comes_closest(tmp_path: Path) -> None:
    settings = _settings(tmp_path, [64], [0])
    settings = TuneSettings(settings.command, settings.doc, "llama-2-70b", "cpu", WORLD, seq_len=4096, explore=())
    with pytest.raises(ValueError, match="least memory is .* GiB"):
        tune(settings, FakeLauncher(), log=lambda _: None)


# -- arguments and commands -----------------------------------------------------------------------------------

def test_split_user_command_finds_the_config_however_it_is_passed() -> None:
    hf = split_user_command("train.py", ["--lr", "1", "--deepspeed", "ds.json", "--x"])
    assert hf.args == ("--lr", "1", "--x") and hf.ds_config_flag == "--deepspeed" and hf.ds_config_path == Path("ds.json")
    eq = split_user_command("train.py", ["--deepspeed_config=cfg.json"])
    assert eq.args == () and eq.ds_config_path == Path("cfg.json")
    switch = split_user_command("train.py", ["--deepspeed", "--deepspeed_config", "c.json"])
    assert switch.args == ("--deepspeed",) and switch.ds_config_flag == "--deepspeed_config"
    with pytest.raises(ValueError, match="--deepspeed ds_config.json"):
        split_user_command("train.py", ["--lr", "1"])


def test_rewrite_args_replaces_appends_and_never_splits_values() -> None:
    mappings = {"train_micro_batch_size_per_gpu": "--bs", "gradient_accumulation_steps": "--gas",
                "stage": "--stage"}
    doc = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 3}}
    out = rewrite_args(["--name", "x; rm -rf /", "--bs", "1", "--gas=9"], mappings, doc)
    assert out == ("--name", "x; rm -rf /", "--bs", "4", "--gas=2", "--stage", "3")
    assert rewrite_args(["--bs", "1"], mappings, {"train_micro_batch_size_per_gpu": "auto"})[:2] == ("--bs", "1")


def test_missing_batch_mapping_is_a_one_line_error() -> None:
    with pytest.raises(ValueError, match="arg_mappings has no train_micro_batch_size_per_gpu"):
        check_arg_mappings({"train_micro_batch_size_per_gpu": "auto"}, [], None)
    with pytest.raises(ValueError, match="--per_device_train_batch_size"):
        check_arg_mappings({}, ["--per_device_train_batch_size", "8"], {})
    check_arg_mappings({}, ["--per_device_eval_batch_size", "8"], None)  # not a training batch
    # both "auto" keys in one message (they had been reported one run at a time), with what a script that sets its
    # batch in code must do (the Trainer flag the message suggests is one it does not take)
    with pytest.raises(ValueError, match=r"no train_micro_batch_size_per_gpu or gradient_accumulation_steps: .*"
                                         r"--per_device_train_batch_size.*--gradient_accumulation_steps.*give it the "
                                         r"flag first"):
        check_arg_mappings({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}, [], None)
    check_arg_mappings({"train_micro_batch_size_per_gpu": "auto"}, ["--bs", "8"],
                       {"train_micro_batch_size_per_gpu": "--bs", "gradient_accumulation_steps": "--gas"})


def test_a_misspelt_arg_mappings_key_is_refused_before_the_profiling_run(tmp_path: Path) -> None:
    """A misspelt batch key would leave every experiment at the script's own accumulation: it is named with the fix,
    before anything runs. DeepSpeed's autotuning tutorial's "gradient_accumulation_steps " (a trailing space) is
    read as the key it means, as the experiments' arguments are rewritten (rewrite_args strips it)."""
    check_arg_mappings({"gradient_accumulation_steps": "auto"}, [], {"gradient_accumulation_steps ": "--gas"})
    mappings = {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
                "gradient_acumulation_steps": "--gradient_accumulation_steps"}
    with pytest.raises(ValueError, match="did you mean 'gradient_accumulation_steps'"):
        check_arg_mappings({}, [], mappings)
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "autotuning": {"arg_mappings": mappings}}))
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('never run')\n")
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    args = parser.parse_args(["--num_gpus", "2", "--hardware", "cpu", str(script), "--deepspeed", str(config)])
    with pytest.raises(ValueError, match="arg_mappings key 'gradient_acumulation_steps'"):
        settings_from_args(args)


def test_a_ds_config_given_before_the_script_is_refused_unless_the_script_gets_it_too(tmp_path: Path) -> None:
    """`zerotune tune --deepspeed ds.json train.py`: the flag before the script is the built-in workload's, so the
    script would never see the config; one line says where it goes."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2}))
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('never run')\n")
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    with pytest.raises(ValueError, match="before the script configures the built-in workload; pass the ds_config "
                                         "among train.py's arguments"):
        settings_from_args(parser.parse_args(["--num_gpus", "2", "--hardware", "cpu", "--deepspeed", str(config),
                                              str(script)]))
    settings = settings_from_args(parser.parse_args(["--num_gpus", "2", "--hardware", "cpu", "--deepspeed",
                                                     str(config), str(script), "--deepspeed_config", str(config)]))
    assert settings.command.ds_config_path == config


def test_lr_advice_square_root_for_adam_linear_for_sgd() -> None:
    adam = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    best = parse_ds_config({"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "AdamW"}}, world_size=WORLD)
    text = lr_advice(adam, best, WORLD)
    assert text is not None and "square root" in text and "x2 " in text and "0.0002" in text  # sqrt(16/4)
    sgd_best = parse_ds_config({"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "SGD"}}, world_size=WORLD)
    assert "x4," in lr_advice({"train_micro_batch_size_per_gpu": 2}, sgd_best, WORLD)
    assert lr_advice({"train_micro_batch_size_per_gpu": 8}, best, WORLD) is None


def test_model_from_parameter_count_recovers_gpt2_small_shape() -> None:
    # GPT-2 small: 124M parameters, 12 layers of width 768 (Radford et al. 2019, Table 2)
    doc = model_from_num_params(124_439_808, "p", "test")
    assert (doc["num_layers"], doc["hidden_size"], doc["vocab_size"]) == (12, 768, 50257)


def test_hostfile_and_script_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        read_hostfile(tmp_path / "missing")
    bad = tmp_path / "hostfile"
    bad.write_text("worker-0 slots=2\nworker-1 gpus=2\n")
    with pytest.raises(ValueError, match=":2: 'worker-1 gpus=2'"):
        read_hostfile(bad)
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    with pytest.raises(ValueError, match="no such file"):
        settings_from_args(parser.parse_args([str(tmp_path / "nope.py"), "--deepspeed", "ds.json"]))
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": [1, 2]}))
    builtin = settings_from_args(parser.parse_args(["--deepspeed", str(ds), "--hardware", "cpu"]))
    assert builtin.command.script == BUILTIN_SCRIPT and builtin.num_gpus == 2 and builtin.env["DS_ACCELERATOR"] == "cpu"
    assert builtin.command.args[builtin.command.args.index("--steps") + 1] == "6"  # DeepSpeed's end_profile_step 5, + 1
    assert math.isclose(builtin.timeout_s, 600.0)


def test_grid_runs_every_configuration_and_compares_the_pick(tmp_path: Path) -> None:
    from zerotune.validate.grid import compare, run_grid
    settings = _settings(tmp_path, [6, 7, 8], [0, 1], top_k=2)
    launcher = FakeLauncher(step_s=lambda d: 0.01 * d["train_micro_batch_size_per_gpu"] ** 0.5
                            * (1.5 if d["zero_optimization"]["stage"] else 1.0))
    out = tmp_path / "grid.jsonl"
    grid = run_grid(settings, launcher, out=out, log=lambda _: None)
    assert len(grid) == len(launcher.calls) == 6 and len(read_jsonl(out)) == 6
    assert (tmp_path / "results_grid" / "z0_gas1_tmbspg8" / "exp.json").is_file()
    line = compare("z1_gas1_tmbspg8", 700.0, grid, "throughput", 2)
    # the grid's best is stage 0 at micro-batch 8; stage 1 costs 1.5x the step time: ratio 1/1.5
    assert "the grid's best of 6 is z0_gas1_tmbspg8" in line and line.endswith("pick / best = 0.667")


def test_user_script_command_and_model_from_a_profiling_run(tmp_path: Path) -> None:
    from zerotune.validate.profiling_run import profile_model
    script = tmp_path / "train.py"
    script.write_text("")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": [2, 4],
                              "autotuning": {"results_dir": str(tmp_path / "results")}}))
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    settings = settings_from_args(parser.parse_args(["--num_gpus", "2", "--hardware", "cpu", str(script),
                                                     "--deepspeed", str(ds), "--lr", "0.1"]))
    assert settings.command.args == ("--lr", "0.1") and settings.command.ds_config_flag == "--deepspeed"
    assert settings.model == ""  # no --model: it comes from a profiling run

    structure = {"num_layers": 12, "hidden_size": 768, "num_heads": 12, "num_kv_heads": 12, "ffn_hidden_size": 3072,
                 "vocab_size": 50257, "max_position_embeddings": 1024}

    def engine(spec: LaunchSpec) -> RunResult:  # what calibrate/profiling_site writes inside the user's ranks
        assert spec.env["PYTHONPATH"].split(os.pathsep)[0].endswith("profiling_site")
        assert spec.ds_config["train_micro_batch_size_per_gpu"] == 2 and spec.ds_config["autotuning"]["enabled"]
        prefix = spec.env["ZEROTUNE_PROFILE_OUT"]
        Path(prefix).parent.mkdir(parents=True, exist_ok=True)
        Path(f"{prefix}.model.json").write_text(json.dumps({"structure": structure, "read": [], "assumed": []}))
        Path(f"{prefix}.rank0.json").write_text(json.dumps({"rank": 0, "step_s": [3.0, 1.0], "peak_memory_bytes": 2e9,
                                                            "inputs": [{"shape": [2, 512], "dtype": "int64"}]}))
        metrics = {"throughput": 4 / 0.8, "latency": 0.8e6}  # DeepSpeed's engine: 4 samples per step of 0.8 s
        return RunResult("ok", "", 0, 1.0, spec.run_dir, metrics)
    profiled = profile_model(settings, engine)
    from zerotune.predictor import load_model
    model = load_model(profiled.model_path)
    assert (model.num_layers, model.hidden_size, model.num_params) == (12, 768, 124_439_808)  # GPT-2 small
    assert profiled.seq_len == 512 and profiled.measurement is not None
    assert (profiled.measurement.step_s, profiled.measurement.peak_memory_bytes) == (pytest.approx(0.8), 2e9)
    # a script that failed before its engine started: --model would not help, the experiments would fail alike
    with pytest.raises(ValueError, match="failed before zerotune read its model .*ValueError: boom.* deepspeed "
                                         "with this ds_config first"):
        profile_model(settings, lambda spec: RunResult("failed", "ValueError: boom", 1, 1.0, spec.run_dir, None))
    # a run that ended cleanly without ever building an engine zerotune could read: the model must be given
    with pytest.raises(ValueError, match="could not read the model.*give --model"):
        profile_model(settings, lambda spec: RunResult("ok", "", 0, 1.0, spec.run_dir, None))

    def unreadable_then_failed(spec: LaunchSpec) -> RunResult:
        # a CNN (no repeated block to read) whose ds_config gives no optimizer and whose script passes none: the
        # engine starts, the site writes what it could not read, and backward stops the run (seen 2026-11-27); at
        # stage 0 and again at stage 3, where the profiling run tries once more (the real launcher makes the folder)
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        Path(f"{spec.env['ZEROTUNE_PROFILE_OUT']}.model.json").write_text(json.dumps({"structure": None,
                                                                                      "error": "no repeated block"}))
        return RunResult("failed", "AssertionError: must provide optimizer during init in order to use backward", 1,
                         1.0, spec.run_dir, None)
    # the failure comes first: --model alone would leave every experiment failing the same way
    with pytest.raises(ValueError, match="failed after its DeepSpeed engine started .*must provide optimizer.* "
                                         "with this ds_config first .*could not be read either.*give --model"):
        profile_model(settings, unreadable_then_failed)

    def pipeline(spec: LaunchSpec) -> RunResult:  # the site saw a PipelineModule handed to deepspeed.initialize
        prefix = spec.env["ZEROTUNE_PROFILE_OUT"]
        Path(f"{prefix}.pipeline.json").write_text(json.dumps({"num_stages": 2}))
        return RunResult("failed", "AssertionError: Check batch related parameters.", 1, 1.0, spec.run_dir, None)
    with pytest.raises(ValueError, match="pipeline-parallel model .*PipelineModule, 2 stages.*zerotune predict "
                                         "--model .* --pp_size 2"):
        profile_model(settings, pipeline)


@pytest.mark.parametrize("fixed, expected", [({"gradient_accumulation_steps": 2}, 2), ({}, 1)])
def test_the_profiling_run_keeps_the_users_gradient_accumulation(tmp_path: Path, fixed: dict, expected: int) -> None:
    """A Qwen2 script's ds_config fixed accumulation at 2 and every experiment ran 2, but the profiling run ran 1: a
    configuration outside the space, so the search started with no measured best (2026-11-26). DeepSpeed's
    autotuner keeps the user's (autotuning/autotuner.py:987 get_gas_from_user_config)."""
    from zerotune.validate.profiling_run import profile_model
    script, ds = tmp_path / "train.py", tmp_path / "ds.json"
    script.write_text("")
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": [2, 4], **fixed,
                              "autotuning": {"results_dir": str(tmp_path / "results")}}))
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    settings = settings_from_args(parser.parse_args(["--num_gpus", "2", "--hardware", "cpu", str(script),
                                                     "--deepspeed", str(ds)]))
    ran: list[dict] = []

    def engine(spec: LaunchSpec) -> RunResult:
        ran.append(spec.ds_config)
        return RunResult("failed", "ValueError: stop here", 1, 1.0, spec.run_dir, None)
    with pytest.raises(ValueError, match="failed before zerotune read its model"):
        profile_model(settings, engine)
    assert (ran[0]["train_micro_batch_size_per_gpu"], ran[0]["gradient_accumulation_steps"]) == (2, expected)


def test_an_arg_mapping_the_script_refuses_is_named(tmp_path: Path) -> None:
    """A script taking --per_device_batch, its ds_config mapping the micro-batch to --batch_size: argparse refuses
    the flag in the profiling run. The error named the ds_config, not the mapping (2026-11-26)."""
    from zerotune.validate.profiling_run import profile_model
    script, ds = tmp_path / "train.py", tmp_path / "ds.json"
    script.write_text("")
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": [1, 4],
                              "autotuning": {"results_dir": str(tmp_path / "results"),
                                             "arg_mappings": {"train_micro_batch_size_per_gpu": "--batch_size"}}}))
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    settings = settings_from_args(parser.parse_args(["--num_gpus", "2", "--hardware", "cpu", str(script),
                                                     "--per_device_batch", "4", "--deepspeed_config", str(ds)]))
    refused = "train.py: error: unrecognized arguments: --batch_size 1"
    with pytest.raises(ValueError, match="arg_mappings maps train_micro_batch_size_per_gpu to --batch_size, which "
                                         "train.py does not accept .*map it to the flag the script takes"):
        profile_model(settings, lambda spec: RunResult("failed", refused, 2, 1.0, spec.run_dir, None))


def test_no_lr_advice_when_the_user_gave_a_list_or_auto() -> None:
    best = parse_ds_config({"train_micro_batch_size_per_gpu": 8}, world_size=WORLD)
    assert lr_advice({"train_micro_batch_size_per_gpu": [1, 8]}, best, WORLD) is None
    assert lr_advice({"train_micro_batch_size_per_gpu": "auto"}, best, WORLD) is None


def test_lr_advice_reads_the_batch_a_script_takes_as_arguments() -> None:
    """A Trainer's "auto" batch comes from its flags (a flag left out: TrainingArguments' default), a script's own
    --batch_size from its argument: the user ran 4 x 1 per GPU (Trainer) and 16 (script), the tuned 16 and 4."""
    from zerotune.validate.experiments import batch_as_given
    trainer = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
    mappings = {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
                "gradient_accumulation_steps": "--gradient_accumulation_steps"}
    given = batch_as_given(trainer, ["--per_device_train_batch_size", "4", "--do_train"], mappings)
    assert given == {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}
    tuned = parse_ds_config({"train_micro_batch_size_per_gpu": 16}, world_size=WORLD)
    advice = lr_advice(given, tuned, WORLD) or ""
    assert "yours was 8: " in advice and "x2," in advice  # 4 x 1 x 2 GPUs; sqrt(32 / 8) for an Adam-family optimizer  # sqrt(16 / 4) for an Adam-family optimizer
    own = batch_as_given({"train_micro_batch_size_per_gpu": 2}, ["--batch_size=16"],
                         {"train_micro_batch_size_per_gpu": "--batch_size"})
    tuned = parse_ds_config({"train_micro_batch_size_per_gpu": 4}, world_size=WORLD)
    assert "yours was 32: " in (lr_advice(own, tuned, WORLD) or "")


def test_run_tune_prints_the_pick_and_advice_then_trains_with_the_optimal_command(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from zerotune.validate import tune as tune_module
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": [6, 7, 8], "zero_optimization": {"stage": 0},
                              "autotuning": {"fast": True, "results_dir": str(tmp_path / "results"),
                                             "exps_dir": str(tmp_path / "exps")}}))
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    trained = []
    monkeypatch.setattr(tune_module.subprocess, "call", lambda cmd, env: trained.append((cmd, env)) or 0)
    args = parser.parse_args(["--run", "--deepspeed", str(ds), "--model", TINY, "--seq_len", "32", "--hardware",
                              "cpu", "--explore", "none", "--top_k", "1"])
    assert tune_module.run_tune(args, FakeLauncher()) == 0
    out = capsys.readouterr().out
    assert "optimal z0_gas1_tmbspg8" in out and "| global" in out
    (cmd, env), = trained
    assert cmd[-2:] == ["--deepspeed_config", str((tmp_path / "results" / "ds_config_optimal.json").resolve())]
    assert env["DS_ACCELERATOR"] == "cpu"


def test_resume_reruns_an_experiment_that_ran_with_other_arguments(tmp_path: Path) -> None:
    tune(_settings(tmp_path, [6, 7, 8], [0], top_k=1, args=("--lr", "1")), FakeLauncher(), log=lambda _: None)
    launcher = FakeLauncher()
    outcome = tune(_settings(tmp_path, [6, 7, 8], [0], top_k=1, args=("--lr", "2")), launcher, log=lambda _: None)
    assert len(launcher.calls) == 1 and not outcome.results[0].resumed


def test_offload_is_explored_only_when_deepspeed_builds_the_optimizer(tmp_path: Path) -> None:
    """A client optimizer with ZeRO-Offload stops DeepSpeed at start-up: no experiment is spent on it."""
    from dataclasses import replace as dc_replace

    from zerotune.validate.tune import _explorable
    client = dc_replace(_settings(tmp_path, [1], [1]), explore=("offload", "checkpointing"))
    assert _explorable(client, "gpu") == ("checkpointing",)
    built = dc_replace(client, doc={**client.doc, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}})
    assert _explorable(built, "gpu") == ("offload", "checkpointing")


def test_offload_is_not_explored_where_the_device_is_the_cpu(tmp_path: Path) -> None:
    """On the CPU target the device's memory is the host's: an offload variant frees nothing (a session's own-script
    tune chose ZeRO-2 with CPU offload on the CPU). A ranking there has no offload variant unless the user set one."""
    from dataclasses import replace as dc_replace

    from zerotune.validate.plan import Plan, build_job, ranking
    from zerotune.validate.tune import _explorable
    built = dc_replace(_settings(tmp_path, [1], [1]), explore=("offload", "checkpointing"))
    built = dc_replace(built, doc={**built.doc, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}})
    assert _explorable(built, "cpu") == ("checkpointing",)
    job = build_job("gpt2", "cpu", 1, 2, 128)
    doc = {"train_micro_batch_size_per_gpu": [1, 2], "zero_optimization": {"stage": [1, 2, 3]}}
    devices = {(e.estimate.config.zero.offload_optimizer.device, e.estimate.config.zero.offload_param.device)
               for e in ranking(job, doc, Plan(top=10_000)).entries}
    assert devices == {("none", "none")}
    pinned = {**doc, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert {e.estimate.config.zero.offload_optimizer.device for e in ranking(job, pinned, Plan(top=10_000)).entries} == {"cpu"}


def test_a_user_scripts_checkpointing_is_its_own_costed_as_seen_and_its_section_kept(tmp_path: Path,
                                                                                    budget_ends_it: None) -> None:
    """DeepSpeed's engine never acts on the activation_checkpointing section (ActivationCheckpointing.by_script):
    for a user's script no experiment is spent adding it, every configuration is costed with the recomputation the
    profiling run saw, and the section goes into each experiment and ds_config_optimal.json as the user wrote it."""
    from dataclasses import replace as dc_replace

    from zerotune.validate.tune import _explorable
    builtin = dc_replace(_settings(tmp_path, [1], [1]), explore=("checkpointing",))
    assert _explorable(builtin, "gpu") == ("checkpointing",)  # the built-in workload switches it by the section
    script = tmp_path / "train.py"
    script.write_text("")
    user = dc_replace(builtin, command=UserCommand(script, (), "--deepspeed_config", tmp_path / "ds.json"))
    assert _explorable(user, "gpu") == ()
    section_of_user = {"partition_activations": True, "cpu_checkpointing": False, "number_checkpoints": 4}
    # (what the profiling run saw, None: no profiling run (--model given); the user's section; costed with recompute)
    for seen, section, costed in ((True, None, True), (False, section_of_user, False), (None, section_of_user, True),
                                  (None, None, False)):
        doc = {**user.doc, **({"activation_checkpointing": section} if section else {})}
        launcher = FakeLauncher()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outcome = tune(dc_replace(user, doc=doc, script_checkpointing=seen, top_k=2), launcher,
                           log=lambda _: None)
        # a section that does nothing (the script was seen not to recompute) is said to do nothing
        assert any("saw the script recompute nothing" in str(w.message) for w in caught) is (seen is False)
        assert all(r.config.activation_checkpointing.enabled is costed for r in outcome.results)
        for _, spec in launcher.calls:
            assert spec.ds_config.get("activation_checkpointing") == section
        optimal = json.loads(outcome.layout.optimal_config.read_text())
        assert optimal.get("activation_checkpointing") == section
        for path in (tmp_path / "results", tmp_path / "exps"):
            shutil.rmtree(path, ignore_errors=True)


def test_initial_measurements_correct_the_predictions_but_are_not_experiments(tmp_path: Path) -> None:
    from zerotune.calibrate.measurement import Measurement
    settings = _settings(tmp_path, [6, 7, 8], [0], top_k=1)
    job = build_job(TINY, "cpu", 1, WORLD, SEQ_LEN)
    cfg = parse_ds_config({"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 0}}, world_size=WORLD)
    plain = tune(settings, FakeLauncher(), log=lambda _: None)
    # a profiling run of the configuration tune chose measured 3x what tune predicted for it
    assert plain.results[0].config.train_micro_batch_size_per_gpu == 8 and job.seq_len == SEQ_LEN
    given = Measurement(model=TINY, hardware="cpu", num_nodes=1, num_gpus_per_node=WORLD, seq_len=SEQ_LEN, config=cfg,
                        status="ok", step_s=3 * plain.results[0].prediction.step_s, source="profiling run")
    corrected = tune(_settings(tmp_path / "again", [6, 7, 8], [0], top_k=1), FakeLauncher(), log=lambda _: None,
                     initial=[given])
    assert len(corrected.results) == 1  # the given measurement did not use the budget of 1
    # ... nor is its configuration run again (it was: a checkpointing script's first experiment repeated its profiling
    # run, the cheapest to run); the next one's prediction carries the given error
    assert corrected.results[0].config.train_micro_batch_size_per_gpu != 8
    assert corrected.results[0].prediction.step_s > 1.5 * plain.results[0].prediction.step_s * 6 / 8
    stored = read_jsonl(tmp_path / "again" / "results" / "measurements.jsonl")
    assert [m.source for m in stored] != ["profiling run"] and len(stored) == 1


def test_a_profiling_run_faster_than_the_choice_is_reported(tmp_path: Path) -> None:
    """A profiling run whose configuration is not in the space (micro-batch 1 here) cannot be run again, so when it
    measured better than every experiment (the machine's pace changed during the tune: a nanoGPT-style script's micro-batch 1 at 4.64
    samples/s, the chosen micro-batch 5 at 3.75), the log and summary.txt say so and what to do."""
    from zerotune.calibrate.measurement import Measurement
    cfg = parse_ds_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}}, world_size=WORLD)
    fake = FakeLauncher()  # 0.01 s x sqrt(micro-batch) a step: micro-batch 1 runs 1 / 0.01 x 2 ranks = 200 samples/s
    lines: list[str] = []

    def ran_at(step_s: float, where: Path):  # type: ignore[no-untyped-def]
        given = Measurement(model=TINY, hardware="cpu", num_nodes=1, num_gpus_per_node=WORLD, seq_len=SEQ_LEN,
                            config=cfg, status="ok", step_s=step_s, source="profiling run")
        return tune(_settings(where, [6, 8], [0], top_k=1), fake, log=lines.append, initial=[given])
    slow = ran_at(0.05, tmp_path / "slow")  # 40 samples/s: slower than any experiment
    assert not any("profiling run (z0_gas1_tmbspg1) measured" in line for line in lines)
    fast = ran_at(0.001, tmp_path / "fast")  # 2000 samples/s
    (note,) = [line for line in lines if "profiling run (z0_gas1_tmbspg1) measured" in line]
    assert fast.best is not None and slow.best is not None and "better than the chosen" in note and "rerun" in note
    assert "profiling run (z0_gas1_tmbspg1)" in (tmp_path / "fast" / "results" / "summary.txt").read_text()


def test_a_profiling_run_faster_than_every_experiment_is_rerun_as_one_and_can_be_chosen(tmp_path: Path) -> None:
    """Where the profiling run's configuration is a candidate and it measured better than every experiment by more
    than their spread (a script padding each batch to its longest sequence: micro-batch 1 at 15.8 samples/s, the
    four experiments at micro-batches 6-14 13.6-14.0), tune runs it as an experiment before choosing: like is
    compared with like, and the faster configuration is written, not only reported."""
    from zerotune.calibrate.measurement import Measurement
    cfg = parse_ds_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}}, world_size=WORLD)
    fake = FakeLauncher(step_s=lambda d: 0.01 * d["train_micro_batch_size_per_gpu"] ** 1.2)  # mb 1: 200 samples/s
    given = Measurement(model=TINY, hardware="cpu", num_nodes=1, num_gpus_per_node=WORLD, seq_len=SEQ_LEN, config=cfg,
                        status="ok", step_s=0.01, source="profiling run")
    lines: list[str] = []
    outcome = tune(_settings(tmp_path, [1, 6, 8], [0], top_k=3), fake, log=lines.append, initial=[given])
    names = [name for name, _ in fake.calls]
    assert names[-1] == "z0_gas1_tmbspg1" and names.count("z0_gas1_tmbspg1") == 1 and len(names) <= 3
    assert outcome.best is not None and outcome.best.name == "z0_gas1_tmbspg1"
    assert json.loads(outcome.layout.optimal_config.read_text())["train_micro_batch_size_per_gpu"] == 1
    assert any("running its configuration as an experiment" in line for line in lines)
    assert "rerun" in outcome.stop_reason and not any("better than the chosen" in line for line in lines)


class DataLimitedLauncher(FakeLauncher):
    """A script that reads `samples` samples once (one epoch) or runs `steps` optimizer steps, whichever ends first:
    a configuration of train_batch_size T runs min(samples // T, steps) steps, printing each, and writes metrics
    only if it reaches the engine's profile window (end_profile_step 2 in _settings: 3 steps)."""

    def __init__(self, samples: int = 96, steps: int = 10 ** 6) -> None:
        super().__init__()
        self.samples, self.steps = samples, steps

    def __call__(self, spec: LaunchSpec) -> RunResult:
        done = min(self.samples // spec.ds_config["train_batch_size"], self.steps)
        if done >= 3:
            return super().__call__(spec)
        self.calls.append((_name(spec), spec))
        return RunResult("failed", "no metrics written", 0, 1.0, spec.run_dir, None, (0.01,) * done)


def test_a_run_that_ends_before_the_profile_window_bounds_the_batch_of_the_next(tmp_path: Path) -> None:
    """A script training one epoch of a small dataset runs fewer optimizer steps the larger its batch: an experiment
    that ended early after k steps of S samples bounds the next to k x S / 3 samples a step, which reaches the
    window (before: micro-batches 48, 47, ... 41 each ended after one step, the budget of 8 spent, no result)."""
    launcher = DataLimitedLauncher(samples=96)  # 2 ranks: micro-batch 16 and below reach 3 steps
    outcome = tune(_settings(tmp_path, [4, 8, 16, 24, 32, 40, 48], [0], top_k=8), launcher, log=lambda _: None)
    ended = [r for r in outcome.results if r.status == "failed"]
    assert all("ended before DeepSpeed's engine reached" in r.reason for r in ended) and len(ended) <= 2
    assert outcome.best is not None and outcome.best.config.train_micro_batch_size_per_gpu <= 16
    assert len(launcher.calls) <= 4


def test_runs_that_end_early_whatever_their_batch_stop_the_search(tmp_path: Path) -> None:
    """A script whose own loop stops after two optimizer steps ends every experiment before the window: after the
    second such run, within the reach the first had set, the search stops and says what to change."""
    launcher = DataLimitedLauncher(steps=2)
    outcome = tune(_settings(tmp_path, [4, 8, 16, 24, 32, 40, 48], [0], top_k=8), launcher, log=lambda _: None)
    assert len(launcher.calls) == 2 and outcome.best is None
    assert "whatever their batch" in outcome.stop_reason and "end_profile_step" in outcome.stop_reason


def test_batches_padded_to_their_longest_sample_are_timed_at_the_expected_longest() -> None:
    """A collator that pads each batch to its longest sample: the profiling run saw each forward's length (micro-batch
    1, lengths 16-128); a micro-batch of b samples on 2 ranks goes at the pace of the longest of 2b, so small
    micro-batches are timed at shorter lengths and memory stays at the longest (an encoder measured 15.8 samples/s
    at micro-batch 1 and 13.6-14.0 at 6-14, ranked the other way when every configuration was costed at 250)."""
    import numpy as np

    from zerotune.predictor import Efficiency
    from zerotune.predictor.rank import evaluate_space
    from zerotune.validate.profiled import expected_longest
    from zerotune.validate.tune import padding_paced
    assert expected_longest([1, 2], 1) == pytest.approx(1.5) and expected_longest([1, 2], 2) == pytest.approx(1.75)
    lengths = tuple(range(16, 129))
    assert expected_longest(lengths, 2) == pytest.approx(sum(max(a, b) for a in lengths for b in lengths)
                                                         / len(lengths) ** 2)
    job = build_job(TINY, "cpu", 1, WORLD, 128)
    settings = replace(_settings(Path("."), [1, 4, 16], [0]), input_lengths=lengths, input_micro_batch=1)
    space = space_from_ds_config(settings.doc, world_size=WORLD, hidden_size=job.model.hidden_size, explore=())
    plain = evaluate_space(job, space)
    paced = padding_paced(plain, job, space, Efficiency(), settings)
    ratio = paced.step_s / plain.step_s
    assert np.all(ratio <= 1) and ratio[0, 0] < ratio[0, 1] < ratio[0, 2] <= 1  # mb 1 gains most
    assert ratio[0, 0] < 0.9 and ratio[0, 2] > 0.95
    assert np.array_equal(paced.memory_bytes, plain.memory_bytes)
    assert padding_paced(plain, job, space, Efficiency(), replace(settings, input_lengths=())) is plain


def test_profile_none_tunes_uncalibrated_even_where_a_profile_exists() -> None:
    # the head-to-head's uncalibrated job (issue 13): the shipped CPU profile exists, --profile none ignores it
    from zerotune.predictor.job import Efficiency
    from zerotune.predictor.rank import Uncertainty
    from zerotune.validate.settings import NO_PROFILE
    from zerotune.validate.calibration import load_profile_for
    said: list[str] = []
    assert load_profile_for("cpu", Path(NO_PROFILE), said.append) == (Efficiency(), Uncertainty())
    assert "uncalibrated" in said[-1]
    assert load_profile_for("cpu")[1] != Uncertainty()  # without it the shipped calibration is used


def test_the_scripts_own_optimizer_is_costed_only_where_the_ds_config_builds_none() -> None:
    from zerotune.predictor.space import space_from_ds_config
    from zerotune.validate.profiling_run import with_script_optimizer
    bare = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": [0, 1]}}
    built = {**bare, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}
    for doc, expected in ((bare, "fused"), (built, "torch")):  # the profiling run read a fused AdamW
        settings = SimpleNamespace(optimizer_impl="fused", doc=doc)
        space = with_script_optimizer(settings, space_from_ds_config(doc, world_size=2))  # type: ignore[arg-type]
        assert {v.optimizer_impl for v in space.variants} == {expected}


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


def test_a_script_whose_engine_ignores_the_given_config_is_refused_in_one_line(tmp_path: Path) -> None:
    """A script that builds its engine from its own config (a dict read through its own --config) ran micro-batch 16
    in the profiling run that asked for 1; the run was scored at 1 (16x too slow) and both experiments then 'ended
    before end_profile_step'. The engine's own micro-batch shows it: one line naming the flag and the fix."""
    from dataclasses import replace as dc_replace

    from zerotune.predictor import load_model
    from zerotune.validate.profiled import ProfiledRun
    from zerotune.validate.profiling_run import _check_followed
    script = tmp_path / "train.py"
    script.write_text("")
    settings = dc_replace(_settings(tmp_path, [1], [1]),
                          command=UserCommand(script, (), "--deepspeed_config", tmp_path / "ds.json"))
    run = ProfiledRun(load_model(TINY), (), (), 64, 16, 1, {}, "float32", False, (1.0,), None, engine_micro_batch=16)
    asked = DSConfig(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=2, zero=ZeroConfig(stage=0))
    with pytest.raises(ValueError, match=r"through --deepspeed_config but its DeepSpeed engine ran "
                                         r"train_micro_batch_size_per_gpu 16 \(asked 1\).*deepspeed\.initialize"):
        _check_followed(settings, run, asked, tmp_path)
    followed = {"zero_stage": 0, "gradient_accumulation_steps": 2, "autotuning": True}
    _check_followed(settings, dc_replace(run, engine_micro_batch=1, engine_config=followed), asked, tmp_path)
    _check_followed(settings, dc_replace(run, engine_micro_batch=None), asked, tmp_path)  # no step recorded: no claim
    # a script that took the batch flags (arg_mappings) into a dict of its own: the batch agreed, its ZeRO-1 and the
    # missing autotuning section did not (every experiment then 'ended before end_profile_step')
    own = {"zero_stage": 1, "gradient_accumulation_steps": 2, "autotuning": False}
    with pytest.raises(ValueError, match=r"zero_optimization.stage 1 \(asked 0\), autotuning.enabled False"):
        _check_followed(settings, dc_replace(run, engine_micro_batch=1, engine_config=own), asked, tmp_path)


def test_a_profiling_run_that_ended_before_the_window_times_only_its_steps_past_warm_up(tmp_path: Path) -> None:
    """Without the engine's metrics (the script ended before end_profile_step), the profiling run is timed by the
    median of its steps past start_profile_step (2 here); with fewer than two of those it is no
    measurement, and a warning says why: a script of 8 samples ran 4 steps and read 14.4 samples/s against 49.8
    over 96 samples, and the search trusted it within +-4% (2026-11-28)."""
    from dataclasses import replace as dc_replace

    from zerotune.predictor import load_model
    from zerotune.validate.profiled import ProfiledRun
    from zerotune.validate.profiling_run import _profile_measurement
    script = tmp_path / "train.py"
    script.write_text("")
    settings = dc_replace(_settings(tmp_path, [1], [0], start_profile_step=2, end_profile_step=4),
                          command=UserCommand(script, (), "--deepspeed_config", tmp_path / "ds.json"))
    cfg = parse_ds_config({"train_micro_batch_size_per_gpu": 1}, world_size=WORLD)
    ended = RunResult("failed", "no metrics written", 0, 1.0, tmp_path, None)
    run = ProfiledRun(load_model(TINY), (), (), 64, 1, 1, {}, "float32", False, (3.0, 2.0, 0.5, 0.4, 0.6), None)
    m = _profile_measurement(settings, run, cfg, ended, TINY, SEQ_LEN)
    assert m is not None and m.step_s == pytest.approx(0.5)  # the median of 2.0, 0.5, 0.4, 0.6 would be 0.55
    with pytest.warns(UserWarning, match=r"ended after 3 optimizer steps, before .*end_profile_step 4: its timing "
                                         r"is not used"):
        assert _profile_measurement(settings, dc_replace(run, step_s=(3.0, 2.0, 0.5)), cfg, ended, TINY,
                                    SEQ_LEN) is None


def test_a_trainer_filled_precision_is_costed_as_the_engine_ran_it(tmp_path: Path) -> None:
    """A Hugging Face Trainer config leaves "fp16"/"bf16" "enabled": "auto" for --fp16 / --bf16 to fill: costed as
    fp32 a bf16 run on a GPU would be predicted at fp32's matmul rate. The profiling run's engine holds its weights in
    the precision it runs (DeepSpeed casts the module), so that decides; the written section keeps "auto"."""
    from dataclasses import replace as dc_replace

    from zerotune.predictor.ds_json import to_ds_config
    from zerotune.validate.profiling_run import as_the_script_runs
    from zerotune.validate.profiled import precision_of_dtype
    assert [precision_of_dtype(d) for d in ("bfloat16", "float32,float16", "float32", "")] == \
        ["bf16", "fp16", "fp32", None]
    script = tmp_path / "train.py"
    script.write_text("")
    base = dc_replace(_settings(tmp_path, [1], [1]),
                      command=UserCommand(script, (), "--deepspeed", tmp_path / "ds.json"))
    auto = dc_replace(base, doc={**base.doc, "bf16": {"enabled": "auto"}}, script_precision="bf16")
    cfg = parse_ds_config({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": "auto"}}, world_size=WORLD)
    assert cfg.precision == "fp32"  # "auto" alone reads as off
    ran = as_the_script_runs(cfg, auto)
    assert ran.precision == "bf16" and to_ds_config(ran, WORLD)["bf16"] == {"enabled": "auto"}
    stated = dc_replace(base, script_precision="bf16")  # no "auto": the ds_config's own precision stands
    assert as_the_script_runs(parse_ds_config({"train_micro_batch_size_per_gpu": 1}, world_size=WORLD),
                               stated).precision == "fp32"


def test_the_mapped_flags_the_optimal_command_changes_are_named() -> None:
    """A Trainer run tuned to micro-batch 123 writes ds_config_optimal.json with it; the user's own command (its
    --per_device_train_batch_size 8) then fails the Trainer's check. tune names the flags cmd_optimal.txt sets."""
    from zerotune.validate.tune import _changed_flags
    given = ("--output_dir", "out", "--per_device_train_batch_size", "8", "--do_train")
    cmd = ("deepspeed", "--num_gpus", "2", "run.py", "--output_dir", "out", "--per_device_train_batch_size", "123",
           "--gradient_accumulation_steps", "2", "--do_train", "--deepspeed", "opt.json")
    flags = ("--per_device_train_batch_size", "--gradient_accumulation_steps", "--per_device_train_batch_size")
    assert _changed_flags(given, cmd, flags) == "--per_device_train_batch_size 123, --gradient_accumulation_steps 2"
    assert _changed_flags(cmd[4:], cmd, flags) == ""  # already what the user gives: nothing to say


def test_a_calibration_band_widens_for_a_model_it_was_not_fitted_on(tmp_path: Path) -> None:
    """The shipped CPU profile's band (out of sample, by configuration of zt-gpt-small) is +-3%; users' scripts' first
    predictions missed by 22-170%. For another model the band adds MODEL_TRANSFER_REL in quadrature; for the fitted
    model it stays the profile's."""
    from dataclasses import replace as dc_replace

    from zerotune.calibrate.profiles import load_profile, shipped_profile_path
    from zerotune.validate.calibration import MODEL_TRANSFER_REL, TRANSFER_SHARED_VARIANCE, calibration_for
    shipped = load_profile(shipped_profile_path("cpu")).uncertainty.bands().step_time_rel
    said: list[str] = []
    fitted = calibration_for(dc_replace(_settings(tmp_path, [1], [1]), model="zt-gpt-small"), said.append)
    assert fitted.uncertainty.step_time_rel == shipped and fitted.uncertainty.shared_rel == 0
    other = calibration_for(_settings(tmp_path, [1], [1]), said.append)  # TINY, not among the profile's models
    assert other.uncertainty.step_time_rel == pytest.approx(math.hypot(shipped, MODEL_TRANSFER_REL))
    # most of it one offset for all its configurations (the published table's split, validate/fewshot.py)
    assert other.uncertainty.shared_rel == pytest.approx(MODEL_TRANSFER_REL * math.sqrt(TRANSFER_SHARED_VARIANCE))
    assert any("widens" in line for line in said)
    # and a trend in micro-batch it may split otherwise than the fitted model (TRANSFER_SLOPE_REL); none for it
    from zerotune.validate.calibration import TRANSFER_SLOPE_REL
    assert other.uncertainty.slope_rel == TRANSFER_SLOPE_REL > 0 and fitted.uncertainty.slope_rel == 0


def test_a_train_batch_size_no_micro_batch_divides_is_refused_before_any_run(tmp_path: Path) -> None:
    """train_batch_size 7 on 2 GPUs: was found only after the profiling run, as 'the tuning space is empty'; now the
    space itself refuses it, naming the key, so profile_model stops before launching anything."""
    with pytest.raises(ValueError, match=r"ds_config train_batch_size 7 is not .* 2 data-parallel GPUs"):
        space_from_ds_config({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2}, world_size=WORLD)
    assert space_from_ds_config({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2},
                                world_size=WORLD).batch_grid(WORLD)[0].tolist() == [1, 2, 4]


@pytest.mark.parametrize("line, entry", [
    ("NVIDIA H200, 143771", "h200"),  # data/measurements/gpu_grid/h200_environment.json's device
    ("NVIDIA H100 80GB HBM3, 81559", "h100-80gb"),
    ("NVIDIA A100-SXM4-40GB, 40960", "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB, 81920", "a100-80gb"),
    ("Tesla V100-SXM2-16GB, 16160", "v100-16gb"),
    ("NVIDIA H100 PCIe, 81559", "h100-pcie"),  # not the SXM card's h100-80gb, whose family and memory it shares
    ("NVIDIA L4, 23034", "l4"),
    ("NVIDIA L40S, 46068", "l40s"),
    ("NVIDIA GeForce RTX 4090, 24564", "rtx-4090"),
    ("NVIDIA RTX A6000, 49140", "rtx-a6000"),
])
def test_tune_on_a_gpu_without_hardware_uses_the_catalog_gpu_nvidia_smi_names(line: str, entry: str) -> None:
    assert detected_gpu(line + "\n" + line + "\n") == entry


@pytest.mark.parametrize("line, named", [("NVIDIA H100 NVL, 95830", "NVIDIA H100 NVL with 94 GiB"),
                                         ("NVIDIA A10G, 23028", "NVIDIA A10G with 22 GiB"),
                                         ("NVIDIA GeForce RTX 3090, 24576", "RTX 3090 with 24 GiB"),
                                         ("", "listed none")])
def test_a_gpu_the_catalog_lacks_is_named_and_hardware_asked_for(line: str, named: str) -> None:
    with pytest.raises(ValueError, match=f"which GPU is this\\? .*{named}.*give --hardware"):
        detected_gpu(line)


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


def test_an_experiment_whose_steps_swing_is_weighted_as_the_noisier_measurement_it_is(tmp_path: Path) -> None:
    """Step times as a helper's two experiments printed them on a shared 2-core machine (2026-11-29, another job
    running during the first): ZeRO-0 at micro-batch 32 swung 2.4-6.2 s, ZeRO-2 held 2.0-2.2. Each now counts with
    the standard error of its window's median (validate/profiled.py steps_rel_error), not the +-2% of a steady one."""
    from zerotune.validate.candidates import NOISE_STD
    from zerotune.validate.plan import build_job
    from zerotune.validate.results import Layout, Prediction
    from zerotune.validate.runs import measurement_of
    settings = _settings(tmp_path, [32], [0, 2])  # start_profile_step 1
    job = build_job(TINY, "cpu", 1, WORLD, SEQ_LEN)
    layout = Layout(tmp_path / "results", tmp_path / "exps")
    cfg = parse_ds_config({"train_micro_batch_size_per_gpu": 32}, world_size=WORLD)
    pred = Prediction(3.0, 10.0, 9.0, 11.0, 1e9)
    swinging = ExperimentResult("z0", cfg, pred, "ok", step_s=4.0, throughput_samples_per_s=16.0,
                                step_times_s=(4.12, 2.4, 6.22, 4.69, 3.15, 3.19))
    steady = ExperimentResult("z2", cfg, pred, "ok", step_s=2.03, throughput_samples_per_s=31.5,
                              step_times_s=(2.2, 2.0, 2.03, 2.07, 2.02, 2.0))
    noisy, calm = (measurement_of(settings, job, r, layout) for r in (swinging, steady))
    assert noisy.step_s_rel_error == pytest.approx(0.21, abs=0.03)  # 1.2533 x stdev(log steps) / sqrt(5)
    assert calm.step_s_rel_error < NOISE_STD
    failed = measurement_of(settings, job, ExperimentResult("z1", cfg, pred, "failed", reason="x"), layout)
    assert failed.step_s_rel_error is None


def test_a_best_within_run_to_run_noise_of_another_is_said_to_be_a_tie() -> None:
    # three tunes of one Trainer script on a shared machine chose ZeRO-2 mb14 (15.29) over ZeRO-0 mb16 (15.12), then
    # others, each on 0.4-1% (a helper's tunes, 2026-11-29): the closing lines now say such a choice is a tie
    from zerotune.validate.results import NEAR_TIE_REL, Prediction, near_ties
    cfg = parse_ds_config({"train_micro_batch_size_per_gpu": 8}, world_size=WORLD)
    pred = Prediction(1.0, 15.0, 13.0, 17.0, 1e9)

    def result(name: str, value: float | None, status: str = "ok") -> ExperimentResult:
        return ExperimentResult(name, cfg, pred, status, metric_value=value)
    results = [result("z2_gas1_tmbspg14", 15.29), result("z0_gas1_tmbspg16", 15.12), result("z1_gas1_tmbspg16", 13.0),
               result("z3_gas1_tmbspg16", 15.2, "stopped")]
    line = near_ties(results, "throughput")
    assert line is not None and line.startswith("z2_gas1_tmbspg14 (15.29) is within 3% of z0_gas1_tmbspg16 (15.12)")
    assert "z1_gas1" not in line and "z3_gas1" not in line  # 15% apart; a stopped run did not finish
    assert near_ties(results[:1] + results[2:3], "throughput") is None
    assert NEAR_TIE_REL == 0.03
    # latency is minimised: 100 ms against 102 ms is a tie too, 100 against 110 is not
    lat = [result("a", 100.0), result("b", 102.0), result("c", 110.0)]
    assert near_ties(lat, "latency").startswith("a (100) is within 3% of b (102)")
