"""zerotune tune's user command and arguments: where the ds_config is passed, arg_mappings and the flags they rewrite,
one-line errors for hostfiles, scripts and mappings, the learning-rate advice, and the profiling run's command and
model for a user's script."""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import pytest

from zerotune.calibrate.launch import LaunchSpec, RunResult
from zerotune.calibrate.measurement import read_jsonl
from zerotune.predictor import parse_ds_config
from zerotune.validate.experiments import (check_arg_mappings, model_from_num_params, read_hostfile, rewrite_args,
                                           split_user_command)
from zerotune.validate.settings import BUILTIN_SCRIPT, add_tune_arguments, settings_from_args
from zerotune.validate.results import lr_advice
from zerotune.validate.tune import tune

from tests.tune_fakes import TINY, WORLD, FakeLauncher, fake_settings


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
    settings = fake_settings(tmp_path, [6, 7, 8], [0, 1], top_k=2)
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
    lines: list[str] = []
    profiled = profile_model(settings, engine, log=lines.append)
    from zerotune.predictor import load_model
    model = load_model(profiled.model_path)
    assert (model.num_layers, model.hidden_size, model.num_params) == (12, 768, 124_439_808)  # GPT-2 small
    assert not any("warning" in line for line in lines)

    def own_batch(spec: LaunchSpec) -> RunResult:  # the script feeds 4 samples a forward whatever the ds_config says
        result = engine(spec)
        rank0 = Path(f"{spec.env['ZEROTUNE_PROFILE_OUT']}.rank0.json")
        rank0.write_text(rank0.read_text().replace("[2, 512]", "[4, 512]"))
        return result
    profile_model(settings, own_batch, log=lines.append)
    assert any("first training forward took 4 samples where its DeepSpeed engine's micro-batch is 2" in line
               and "autotuning.arg_mappings" in line for line in lines)
    assert profiled.seq_len == 512 and profiled.measurement is not None
    assert (profiled.measurement.step_s, profiled.measurement.peak_memory_bytes) == (pytest.approx(0.8), 2e9)
    # a script that failed before its engine started: --model would not help, the experiments would fail alike
    with pytest.raises(ValueError, match="failed before zerotune read its model .*ValueError: boom.* deepspeed "
                                         "with this ds_config first"):
        profile_model(settings, lambda spec: RunResult("failed", "ValueError: boom", 1, 1.0, spec.run_dir, None))
    # a Hugging Face Trainer on a machine without CUDA and without --use_cpu counts one process of the two
    # (transformers 5 here, 2026-11-29: "ds train_batch_size=2 vs hf train_batch_size (calculated)=1")
    trainer = ("ValueError: Please correct the following DeepSpeed config values that mismatch TrainingArguments "
               "values:\n- ds train_batch_size=4 vs hf train_batch_size (calculated)=2\nThe easiest method is ...")
    with pytest.raises(ValueError, match="counted 1 process where DeepSpeed's launcher started 2 .*add --use_cpu"):
        profile_model(settings, lambda spec: RunResult("failed", trainer, 1, 1.0, spec.run_dir, None))
    mismatch = trainer.replace("(calculated)=2", "(calculated)=8")  # another mismatch: the general error
    with pytest.raises(ValueError, match="failed before zerotune read its model"):
        profile_model(settings, lambda spec: RunResult("failed", mismatch, 1, 1.0, spec.run_dir, None))
    # read, then crashed (a bf16 script's fp32 buffers, 2026-11-29): a failure, not a run that trained
    dtype = "RuntimeError: expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16"

    def read_then_crashed(spec: LaunchSpec) -> RunResult:
        engine(spec)
        return RunResult("failed", dtype, 1, 1.0, spec.run_dir, None)
    with pytest.raises(ValueError, match="failed after its DeepSpeed engine started .*same dtype.*fail the same way"):
        profile_model(settings, read_then_crashed)
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
    tune(fake_settings(tmp_path, [6, 7, 8], [0], top_k=1, args=("--lr", "1")), FakeLauncher(), log=lambda _: None)
    launcher = FakeLauncher()
    outcome = tune(fake_settings(tmp_path, [6, 7, 8], [0], top_k=1, args=("--lr", "2")), launcher, log=lambda _: None)
    assert len(launcher.calls) == 1 and not outcome.results[0].resumed
