"""zerotune.validate.tune with a fake launcher (tests/tune_fakes.py), continued from test_tune_logic.py: the results
layout, offload and checkpointing as the script runs them, measurements given beforehand, the profiling run's
configuration, runs that end early, the hardware found from nvidia-smi and the calibration band."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from zerotune.calibrate.launch import LaunchSpec, RunResult
from zerotune.calibrate.measurement import read_jsonl
from zerotune.predictor import DSConfig, ZeroConfig, parse_ds_config
from zerotune.predictor.space import space_from_ds_config
from zerotune.validate.experiments import UserCommand
from zerotune.validate.plan import build_job
from zerotune.validate.results import ExperimentResult
from zerotune.validate.settings import TuneSettings, detected_gpu
from zerotune.validate.tune import tune

from tests.tune_fakes import SEQ_LEN, TINY, WORLD, FakeLauncher, fake_settings, spec_name


# -- layout ------------------------------------------------------------------------------------------------

def test_layout_files_and_summary_columns(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path, [6, 7, 8], [0], top_k=2, args=("--per_device_train_batch_size", "1"),
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
    settings = fake_settings(tmp_path, [64], [0])
    settings = TuneSettings(settings.command, settings.doc, "llama-2-70b", "cpu", WORLD, seq_len=4096, explore=())
    with pytest.raises(ValueError, match="least memory is .* GiB"):
        tune(settings, FakeLauncher(), log=lambda _: None)


def test_offload_is_explored_only_when_deepspeed_builds_the_optimizer(tmp_path: Path) -> None:
    """A client optimizer with ZeRO-Offload stops DeepSpeed at start-up: no experiment is spent on it."""
    from dataclasses import replace as dc_replace

    from zerotune.validate.tune import _explorable
    client = dc_replace(fake_settings(tmp_path, [1], [1]), explore=("offload", "checkpointing"))
    assert _explorable(client, "gpu") == ("checkpointing",)
    built = dc_replace(client, doc={**client.doc, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}})
    assert _explorable(built, "gpu") == ("offload", "checkpointing")


def test_offload_is_not_explored_where_the_device_is_the_cpu(tmp_path: Path) -> None:
    """On the CPU target the device's memory is the host's: an offload variant frees nothing (a session's own-script
    tune chose ZeRO-2 with CPU offload on the CPU). A ranking there has no offload variant unless the user set one."""
    from dataclasses import replace as dc_replace

    from zerotune.validate.plan import Plan, build_job, ranking
    from zerotune.validate.tune import _explorable
    built = dc_replace(fake_settings(tmp_path, [1], [1]), explore=("offload", "checkpointing"))
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
    builtin = dc_replace(fake_settings(tmp_path, [1], [1]), explore=("checkpointing",))
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
    settings = fake_settings(tmp_path, [6, 7, 8], [0], top_k=1)
    job = build_job(TINY, "cpu", 1, WORLD, SEQ_LEN)
    cfg = parse_ds_config({"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 0}}, world_size=WORLD)
    plain = tune(settings, FakeLauncher(), log=lambda _: None)
    # a profiling run of the configuration tune chose measured 3x what tune predicted for it
    assert plain.results[0].config.train_micro_batch_size_per_gpu == 8 and job.seq_len == SEQ_LEN
    given = Measurement(model=TINY, hardware="cpu", num_nodes=1, num_gpus_per_node=WORLD, seq_len=SEQ_LEN, config=cfg,
                        status="ok", step_s=3 * plain.results[0].prediction.step_s, source="profiling run")
    corrected = tune(fake_settings(tmp_path / "again", [6, 7, 8], [0], top_k=1), FakeLauncher(), log=lambda _: None,
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
        return tune(fake_settings(where, [6, 8], [0], top_k=1), fake, log=lines.append, initial=[given])
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
    outcome = tune(fake_settings(tmp_path, [1, 6, 8], [0], top_k=3), fake, log=lines.append, initial=[given])
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
        self.calls.append((spec_name(spec), spec))
        return RunResult("failed", "no metrics written", 0, 1.0, spec.run_dir, None, (0.01,) * done)


def test_a_run_that_ends_before_the_profile_window_bounds_the_batch_of_the_next(tmp_path: Path) -> None:
    """A script training one epoch of a small dataset runs fewer optimizer steps the larger its batch: an experiment
    that ended early after k steps of S samples bounds the next to k x S / 3 samples a step, which reaches the
    window (before: micro-batches 48, 47, ... 41 each ended after one step, the budget of 8 spent, no result)."""
    launcher = DataLimitedLauncher(samples=96)  # 2 ranks: micro-batch 16 and below reach 3 steps
    outcome = tune(fake_settings(tmp_path, [4, 8, 16, 24, 32, 40, 48], [0], top_k=8), launcher, log=lambda _: None)
    ended = [r for r in outcome.results if r.status == "failed"]
    assert all("ended before DeepSpeed's engine reached" in r.reason for r in ended) and len(ended) <= 2
    assert outcome.best is not None and outcome.best.config.train_micro_batch_size_per_gpu <= 16
    assert len(launcher.calls) <= 4


def test_runs_that_end_early_whatever_their_batch_stop_the_search(tmp_path: Path) -> None:
    """A script whose own loop stops after two optimizer steps ends every experiment before the window: after the
    second such run, within the reach the first had set, the search stops and says what to change."""
    launcher = DataLimitedLauncher(steps=2)
    outcome = tune(fake_settings(tmp_path, [4, 8, 16, 24, 32, 40, 48], [0], top_k=8), launcher, log=lambda _: None)
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
    settings = replace(fake_settings(Path("."), [1, 4, 16], [0]), input_lengths=lengths, input_micro_batch=1)
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
    settings = dc_replace(fake_settings(tmp_path, [1], [1]),
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
    settings = dc_replace(fake_settings(tmp_path, [1], [0], start_profile_step=2, end_profile_step=4),
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
    base = dc_replace(fake_settings(tmp_path, [1], [1]),
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
    fitted = calibration_for(dc_replace(fake_settings(tmp_path, [1], [1]), model="zt-gpt-small"), said.append)
    assert fitted.uncertainty.step_time_rel == shipped and fitted.uncertainty.shared_rel == 0
    other = calibration_for(fake_settings(tmp_path, [1], [1]), said.append)  # TINY, not among the profile's models
    assert other.uncertainty.step_time_rel == pytest.approx(math.hypot(shipped, MODEL_TRANSFER_REL))
    # most of it one offset for all its configurations (the published table's split, validate/fewshot.py)
    assert other.uncertainty.shared_rel == pytest.approx(MODEL_TRANSFER_REL * math.sqrt(TRANSFER_SHARED_VARIANCE))
    assert any("widens" in line for line in said)
    # and a trend in micro-batch its probes leave open, for the fitted model too (CALIBRATED_SLOPE_REL); none
    # without a calibration
    from zerotune.validate.calibration import CALIBRATED_SLOPE_REL
    assert other.uncertainty.slope_rel == fitted.uncertainty.slope_rel == CALIBRATED_SLOPE_REL > 0
    from zerotune.validate.settings import NO_PROFILE
    uncalibrated = calibration_for(dc_replace(fake_settings(tmp_path, [1], [1]), profile=Path(NO_PROFILE)), said.append)
    assert uncalibrated.uncertainty.slope_rel == 0


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


def test_an_experiment_whose_steps_swing_is_weighted_as_the_noisier_measurement_it_is(tmp_path: Path) -> None:
    """Step times as a helper's two experiments printed them on a shared 2-core machine (2026-11-29, another job
    running during the first): ZeRO-0 at micro-batch 32 swung 2.4-6.2 s, ZeRO-2 held 2.0-2.2. Each now counts with
    the standard error of its window's median (validate/profiled.py steps_rel_error), not the +-2% of a steady one."""
    from zerotune.validate.candidates import NOISE_STD
    from zerotune.validate.plan import build_job
    from zerotune.validate.results import Layout, Prediction
    from zerotune.validate.runs import measurement_of
    settings = fake_settings(tmp_path, [32], [0, 2])  # start_profile_step 1
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
