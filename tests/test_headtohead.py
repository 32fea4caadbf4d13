"""benchmarks/headtohead.py: the pieces of the head-to-head against DeepSpeed's autotuner, and its quick mode
run for real (both tuners, A/B re-measurement, grid) so the benchmark cannot rot."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from benchmarks.ds_workload import config_argument_to_file
from benchmarks.jobs import JOBS, QUICK_JOB, grid_points, script_args, user_ds_config
from benchmarks.measure import Remeasured, config_name, grid_configs
from benchmarks.report import JobResult, format_markdown, grid_best, grid_score, kept_user_zero, metric_ratio
from benchmarks.tools import ToolRun, with_root, cpu_env, read_experiments, run_env, zerotune_tune_command
from zerotune.calibrate.measurement import Measurement
from zerotune.predictor import parse_ds_config
from zerotune.validate.settings import DEFAULT_TOP_K


def test_base64_config_from_deepspeeds_autotuner_becomes_a_file(tmp_path: Path) -> None:
    # scheduler.py run_experiment passes urlsafe base64 JSON in place of the ds_config path
    doc = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}}
    encoded = base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()
    assert len(encoded) > 0 and not Path(encoded).exists()
    path = config_argument_to_file(encoded, tmp_path)
    assert json.loads(path.read_text()) == doc
    existing = tmp_path / "given.json"
    existing.write_text("{}")
    assert config_argument_to_file(str(existing), tmp_path / "unused") == existing


def test_a_base64_config_longer_than_a_file_name_is_decoded(tmp_path: Path) -> None:
    doc = {"autotuning": {"metric_path": "x" * 400}}  # os.stat raises ENAMETOOLONG on such a value
    encoded = base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()
    assert json.loads(config_argument_to_file(encoded, tmp_path).read_text()) == doc


def test_a_config_argument_that_is_neither_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--deepspeed_config .*neither a file nor base64 JSON"):
        config_argument_to_file("no-such-config.json", tmp_path)


def test_every_run_shares_one_absolute_op_build_folder(tmp_path: Path, monkeypatch) -> None:
    # An empty TORCH_EXTENSIONS_DIR made torch build DeepSpeed's shm op into each tool's working folder, so each
    # tool's first experiment compiled it again (about 50 s here, seen in a full run): the benchmark never passes
    # an empty or relative folder on.
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cpu_env(2)["TORCH_EXTENSIONS_DIR"].startswith(str(tmp_path / "torch_extensions" / "py"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "ops")
    assert cpu_env(2)["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "ops")


def test_every_job_config_parses_and_the_grid_spans_stages_and_micro_batches() -> None:
    for job in JOBS.values():
        doc = user_ds_config(job)
        assert doc["autotuning"]["end_profile_step"] - doc["autotuning"]["start_profile_step"] == job.measured_steps
        assert len(grid_configs(job)) == len(grid_points(job))  # names are unique per grid point
    assert grid_points(QUICK_JOB) == [(0, 1), (0, 2)]
    assert grid_points(JOBS["builtin"])[-1] == (3, 8)


def test_under_a_tuner_the_workload_outlives_deepspeeds_profile_window() -> None:
    # the engine exits at end_profile_step; the workload must not finish (and write its own metrics) first
    for job in JOBS.values():
        args = script_args(job, for_tuner=True)
        total = int(args[args.index("--steps") + 1])  # a user's script counts its warm-up steps in --steps
        total += int(args[args.index("--warmup") + 1]) if not job.script else 0
        assert total > user_ds_config(job)["autotuning"]["end_profile_step"], job.name


def test_deepspeeds_choice_and_the_grid_point_share_a_name() -> None:
    # DeepSpeed's ds_config_optimal.json carries train_batch_size; the grid's config does not
    chosen = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 0}, "train_batch_size": 4}
    assert config_name(chosen, 2) in grid_configs(QUICK_JOB)


def test_deepspeeds_dropping_of_the_users_zero_keys_is_detected() -> None:
    wide = JOBS["wide"]
    dropped = {"zero_optimization": {"stage": 1}}  # what autotuner.py run_tuning_micro_batch_sizes writes
    kept = {"zero_optimization": {"stage": 1, **wide.extra_zero}}
    assert (kept_user_zero(wide, dropped), kept_user_zero(wide, kept)) == (False, True)
    assert kept_user_zero(QUICK_JOB, dropped) is None  # the user set nothing to keep


def _again(label: str, samples_per_s: tuple[float, ...], step_s: tuple[float, ...]) -> Remeasured:
    return Remeasured(label, "z0_gas1_tmbspg1", samples_per_s, step_s, ())


def test_ratio_is_zerotune_over_deepspeed_and_inverted_for_latency() -> None:
    zt, ds = _again("zerotune", (10.0, 12.0, 11.0), (0.2, 0.2, 0.2)), _again("deepspeed", (5.0, 6.0, 5.5), (0.1,) * 3)
    assert metric_ratio(QUICK_JOB, zt, ds) == pytest.approx(2.0)
    assert metric_ratio(JOBS["latency"], zt, ds) == pytest.approx(0.5)  # 0.1 s over 0.2 s: zerotune slower
    assert zt.spread_rel == pytest.approx(2.0 / 11.0)
    assert metric_ratio(QUICK_JOB, zt, None) is None


def _grid_row(stage: int, micro: int, samples_per_s: float | None) -> Measurement:
    doc = {"train_micro_batch_size_per_gpu": micro, "zero_optimization": {"stage": stage}}
    return Measurement(model=QUICK_JOB.model, hardware="cpu", num_nodes=1, num_gpus_per_node=2,
                       seq_len=QUICK_JOB.seq_len, config=parse_ds_config(doc, world_size=2),
                       status="ok" if samples_per_s else "oom", throughput_samples_per_s=samples_per_s)


def test_grid_score_is_the_choice_over_the_best_and_ignores_failed_runs() -> None:
    grid = [_grid_row(0, 1, 50.0), _grid_row(0, 2, 80.0), _grid_row(1, 2, 100.0), _grid_row(1, 1, None)]
    assert grid_best(QUICK_JOB, grid) == ("z1_gas1_tmbspg2", 100.0)
    assert grid_score(QUICK_JOB, grid, "z0_gas1_tmbspg2") == pytest.approx(0.8)
    assert grid_score(QUICK_JOB, grid, "z1_gas1_tmbspg1") is None  # out of memory: no score, not zero


def test_experiments_are_read_from_deepspeeds_layout_in_start_order(tmp_path: Path) -> None:
    for name, start, end, metrics in (("z1_gas1_tmbspg2", 130, 150, {"throughput": 40.0}),
                                      ("profile_model_info", 100, 120, None)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "exp.json").write_text("{}")
        os.utime(folder / "exp.json", (start, start))
        (folder / "stdout.log").write_text("")
        os.utime(folder / "stdout.log", (end, end))
        if metrics:
            (folder / "metrics.json").write_text(json.dumps(metrics))
            os.utime(folder / "metrics.json", (end, end))
            (folder / "ds_config.json").write_text(json.dumps({"train_batch_size": 8}))
            os.utime(folder / "ds_config.json", (start, start))
    (tmp_path / "summary.txt").write_text("")
    found = read_experiments(tmp_path, started_at=90.0, key="throughput")
    assert [(e.name, e.start_s, e.end_s, e.throughput_samples_per_s) for e in found] == [
        ("profile_model_info", 10.0, 30.0, None), ("z1_gas1_tmbspg2", 40.0, 60.0, 40.0)]
    assert found[1].step_s == pytest.approx(8 / 40.0)  # samples per step over samples/s, whatever the tool's units


def test_table_has_a_row_per_tool_with_counts_choice_and_ratio(tmp_path: Path) -> None:
    chosen = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}}
    runs = {"deepspeed": ToolRun("deepspeed", tmp_path, 0, 130.0, (), chosen),
            "zerotune": ToolRun("zerotune", tmp_path, 0, 40.0, (), chosen)}
    again = {"deepspeed": _again("deepspeed", (50.0, 52.0, 48.0), (0.08,) * 3),
             "zerotune": _again("zerotune", (51.0, 49.0, 50.0), (0.08,) * 3)}
    grid = (_grid_row(1, 2, 100.0), _grid_row(0, 2, 125.0))
    table = format_markdown([JobResult(QUICK_JOB, runs, again, grid)], "2026-01-01", "cmd")
    rows = [line for line in table.splitlines() if "| DeepSpeed autotuner |" in line or "| zerotune |" in line]
    assert len(rows) == 2
    assert "| 130 | z1_gas1_tmbspg2 | 50.00 (±4%, n=3)" in rows[0]
    assert rows[1].endswith("| 1.00 | 0.80 | - |")  # ratio 50/50; grid score 100/125


@pytest.mark.deepspeed
def test_quick_mode_runs_both_tuners_and_re_measures_their_choices(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    from benchmarks.headtohead import main
    assert main(["--quick", "--out", str(tmp_path)]) == 0
    [summary] = json.loads((tmp_path / "results.json").read_text())
    ds, zt = summary["tools"]["deepspeed"], summary["tools"]["zerotune"]
    assert ds["returncode"] == 0 and zt["returncode"] == 0
    assert ds["experiments"][0]["name"] == "profile_model_info"  # DeepSpeed profiles the model first
    assert 1 <= zt["num_experiments"] <= DEFAULT_TOP_K  # zerotune's default top_k, a ceiling
    for tool in (ds, zt):
        assert tool["chosen"] is not None and tool["chosen_ds_config"]["zero_optimization"]["stage"] == 0
        assert len(tool["remeasured"]["throughput_samples_per_s"]) == 3, tool["remeasured"]["failures"]
        assert 0 < tool["grid_score"] <= 1.0
    assert summary["ratio_zerotune_over_deepspeed"] > 0
    assert summary["grid_runs"] >= len(grid_configs(QUICK_JOB))
    assert "| quick | DeepSpeed autotuner" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "timeline.png").stat().st_size > 10_000


def test_grid_rows_are_never_mixed_from_two_measuring_methods(tmp_path: Path, monkeypatch) -> None:
    from benchmarks import headtohead
    asked: list[list[str]] = []

    def fake_measure(job, configs, folder):  # type: ignore[no-untyped-def]
        asked.append(sorted(configs))
        return [_grid_row(0, int(name.rsplit("tmbspg", 1)[1]), 10.0) for name in configs]

    monkeypatch.setattr(headtohead, "measure_grid", fake_measure)
    published = [_grid_row(0, 1, 50.0), _grid_row(0, 2, 80.0)]
    rows = headtohead.grid_for(QUICK_JOB, {}, published, [], tmp_path)
    assert [m.throughput_samples_per_s for m in rows] == [50.0, 80.0] and asked == []  # covered: reused
    chosen = {"z0_gas1_tmbspg4": {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 0}}}
    rows = headtohead.grid_for(QUICK_JOB, chosen, published, [], tmp_path)
    assert asked == [["z0_gas1_tmbspg1", "z0_gas1_tmbspg2", "z0_gas1_tmbspg4"]]  # not covered: all re-run here
    assert {m.throughput_samples_per_s for m in rows} == {10.0}


def test_zerotune_gets_nothing_deepspeeds_autotuner_does_not_get(tmp_path: Path) -> None:
    from benchmarks.tools import deepspeed_tune_command, zerotune_tune_command
    zt = zerotune_tune_command(QUICK_JOB, tmp_path / "ds.json")
    assert "--model" not in zt[:zt.index(next(a for a in zt if a.endswith(".py")))]
    assert "--seq_len" not in zt[:zt.index(next(a for a in zt if a.endswith(".py")))]
    ds = deepspeed_tune_command(QUICK_JOB, tmp_path / "ds.json")
    assert zt[zt.index(next(a for a in zt if a.endswith(".py"))):] == ds[ds.index(next(a for a in ds if a.endswith(".py"))):]


def test_the_uncalibrated_job_tunes_without_a_profile_and_the_others_with_the_one_found(tmp_path: Path) -> None:
    # issue 13: one head-to-head job where zerotune has no calibration profile (tune --profile none)
    from benchmarks.tools import zerotune_tune_command
    cmd = zerotune_tune_command(JOBS["uncalibrated"], tmp_path / "ds.json")
    assert cmd[cmd.index("--profile") + 1] == "none" and "--model" not in cmd[:cmd.index(str(tmp_path / "ds.json"))]
    assert "--profile" not in zerotune_tune_command(JOBS["builtin"], tmp_path / "ds.json")
    assert grid_points(JOBS["uncalibrated"]) == grid_points(JOBS["builtin"])  # scored on the same grid


def test_users_script_jobs_give_both_tuners_the_same_script_and_arguments(tmp_path: Path) -> None:
    # issue 14: zerotune's choice on a user's own script against DeepSpeed's autotuner's, same ds_config
    from benchmarks.tools import deepspeed_tune_command, zerotune_tune_command
    for name in ("encoder", "decoder", "vit", "hfloop"):
        job = JOBS[name]
        zt, ds = zerotune_tune_command(job, tmp_path / "ds.json"), deepspeed_tune_command(job, tmp_path / "ds.json")
        assert Path(job.script).is_file() and zt[zt.index(job.script):] == ds[ds.index(job.script):]
        assert "--model" not in zt and "--seq_len" not in zt
    assert user_ds_config(JOBS["decoder"])["autotuning"]["arg_mappings"] == {"train_micro_batch_size_per_gpu": "--batch_size"}


def test_a_users_script_is_re_measured_by_the_engines_step_timers(tmp_path: Path) -> None:
    from zerotune.calibrate.launch import RunResult
    from benchmarks.measure import _engine_timed
    job = JOBS["decoder"]  # warm-up 2: steps 3 on are timed
    run = RunResult("failed", "metrics.json missing", 0, 30.0, tmp_path, None, (9.0, 5.0, 2.0, 2.2, 1.8, 2.0))
    timed = _engine_timed(job, {"train_batch_size": 8}, run)
    assert timed.status == "ok" and timed.metrics == {"step_s": 2.0, "throughput_samples_per_s": 4.0}
    crashed = _engine_timed(job, {"train_batch_size": 8}, RunResult("failed", "rank 1 died", 1, 3.0, tmp_path, None))
    assert crashed.status == "failed" and crashed.reason == "rank 1 died"
    untimed = _engine_timed(job, {"train_batch_size": 8}, RunResult("failed", "x", 0, 3.0, tmp_path, None, (1.0,)))
    assert untimed.status == "failed" and "1 steps timed" in untimed.reason


def test_a_finished_tuner_run_is_read_back_with_reuse(tmp_path: Path, monkeypatch) -> None:
    import benchmarks.tools as tools
    calls = []
    monkeypatch.setattr(tools, "_run", lambda cmd, folder, env, timeout_s: calls.append(cmd) or (0, 42.0))
    first = tools.run_tool("deepspeed", JOBS["encoder"], tmp_path, 60.0)
    again = tools.run_tool("deepspeed", JOBS["encoder"], tmp_path, 60.0, reuse=True)
    assert len(calls) == 1 and again.wall_s == first.wall_s == 42.0 and again.returncode == 0
    tools.run_tool("deepspeed", JOBS["decoder"], tmp_path, 60.0, reuse=True)  # another job's command: run again
    assert len(calls) == 2


def test_a_gpu_job_runs_on_the_detected_accelerator_with_the_callers_python_path(monkeypatch) -> None:
    # A DeepSpeed installed with pip --target is found only through PYTHONPATH and its launcher only through PATH
    # (benchmarks/gpu_headtohead_run.sh): the GPU job's runs keep both and never force the CPU accelerator.
    monkeypatch.setenv("PYTHONPATH", "/tmp/site")
    env = run_env(JOBS["gpu"])
    assert "DS_ACCELERATOR" not in env and env["PATH"].endswith(os.environ["PATH"])
    assert run_env(JOBS["builtin"])["DS_ACCELERATOR"] == "cpu"
    assert with_root(os.environ["PYTHONPATH"]).split(os.pathsep)[1:] == ["/tmp/site"]
    assert zerotune_tune_command(JOBS["gpu"], Path("ds.json"))[4:8] == ["--num_gpus", "1", "--hardware", "h200"]
