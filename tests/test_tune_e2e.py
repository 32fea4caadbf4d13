"""`zerotune tune` for real: DeepSpeed's launcher, 2 CPU ranks with gloo, the built-in workload and fault scripts."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from zerotune.calibrate.measurement import read_jsonl
from zerotune.predictor.units import GIB
from zerotune.validate.experiments import split_user_command
from zerotune.validate.settings import TuneSettings, add_tune_arguments, settings_from_args
from zerotune.validate.tune import tune

pytestmark = pytest.mark.deepspeed

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
TINY = str(FIXTURES / "tiny-gpt.yaml")
FAULTS = FIXTURES / "tune_faults.py"
CPU_ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
RUN_FILES = ("cmd.txt", "ds_config.json", "exp.json", "metrics.json", "stdout.log", "stderr.log")


def _ds_config(tmp_path: Path, micro: list[int], stages: list[int], **autotuning) -> Path:
    doc = {"train_micro_batch_size_per_gpu": micro, "zero_optimization": {"stage": stages}, "steps_per_print": 1000,
           "autotuning": {"fast": True, "start_profile_step": 1, "end_profile_step": 2,
                          "results_dir": str(tmp_path / "autotuning_results"),
                          "exps_dir": str(tmp_path / "autotuning_exps"), **autotuning}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(doc))
    return path


def _fault_settings(tmp_path: Path, micro: list[int], faults: str, top_k: int, timeout_s: float) -> TuneSettings:
    config = _ds_config(tmp_path, micro, [0])
    command = split_user_command(FAULTS, ["--model", TINY, "--seq_len", "32", "--steps", "3", "--warmup", "0",
                                          "--deepspeed_config", str(config)])
    env = {**CPU_ENV, "ZT_TUNE_FAULTS": faults, "ZT_FIXTURE_PID_DIR": str(tmp_path)}
    return TuneSettings(command, json.loads(config.read_text()), TINY, "cpu", 2, seq_len=32, top_k=top_k,
                        timeout_s=timeout_s, env=env, memory_limit_bytes=4 * GIB, explore=())


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _signal_mask(pid: int, field: str) -> int:
    """A process's signal mask from /proc (SigIgn: ignored, SigCgt: caught), bit n-1 for signal n."""
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1], 16)


def _hang_pids(tmp_path: Path) -> list[int]:
    return [int(p.read_text()) for p in tmp_path.glob("*.pid")]


def test_real_tune_runs_at_most_k_and_picks_the_measured_best(tmp_path: Path) -> None:
    config = _ds_config(tmp_path, [1, 2], [0, 1])
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    settings = settings_from_args(parser.parse_args(["--deepspeed", str(config), "--model", TINY, "--seq_len", "32",
                                                     "--top_k", "2", "--explore", "none", "--timeout_s", "240",
                                                     "--hardware", "cpu"]))
    outcome = tune(settings, log=lambda _: None)
    results = tmp_path / "autotuning_results"
    assert 1 <= len(outcome.results) <= 2
    measured = {}
    for r in outcome.results:
        assert r.status == "ok", r.reason
        for name in RUN_FILES:
            assert (results / r.name / name).is_file(), (r.name, name)
        assert (tmp_path / "autotuning_exps" / f"{r.name}.json").is_file()
        assert json.loads((results / r.name / "metrics.json").read_text())["throughput"] > 0  # DeepSpeed's last step
        assert r.peak_memory_bytes and r.peak_memory_bytes > 2**20  # each rank's peak, written as it exited
        measured[r.name] = r.metric_value  # the median over the engine's window (window_step_s), not the last step
    best = max(measured, key=measured.get)
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    best_config = json.loads((results / best / "ds_config.json").read_text())
    best_config.pop("autotuning")
    assert best_config.pop("wall_clock_breakdown") is True  # experiments time every step (experiment_ds_config)
    assert "wall_clock_breakdown" not in optimal  # the user did not set it
    assert optimal == best_config and outcome.best is not None and outcome.best.name == best
    assert "autotuning" not in optimal
    for name in ("summary.txt", "cmd_optimal.txt", "measurements.jsonl", "space.png", "predicted_vs_measured.png"):
        assert (results / name).is_file(), name
    stored = read_jsonl(results / "measurements.jsonl")
    assert {m.status for m in stored} == {"ok"} and len(stored) == len(outcome.results)
    assert all(m.peak_memory_bytes for m in stored)
    by_source = {Path(m.source).name: m.throughput_samples_per_s for m in stored}
    assert by_source == pytest.approx(measured, rel=1e-9)  # what was ranked is what was stored
    global_row = next(line for line in (results / "summary.txt").read_text().splitlines() if line.startswith("| global"))
    assert best in global_row


def test_crash_oom_and_hang_are_recorded_and_the_tuner_goes_on(tmp_path: Path) -> None:
    settings = _fault_settings(tmp_path, [1, 2, 3, 4], "4:crash,3:oom,2:hang,1:metrics", top_k=4, timeout_s=30)
    outcome = tune(settings, log=lambda _: None)
    by_micro = {r.config.train_micro_batch_size_per_gpu: r for r in outcome.results}
    assert by_micro[4].status == "failed" and "fixture crash on purpose" in by_micro[4].reason
    assert by_micro[3].status == "oom", by_micro[3].reason
    assert by_micro[2].status == "timeout" and "killed" in by_micro[2].reason
    assert by_micro[1].status == "ok" and outcome.best is not None and outcome.best.name == by_micro[1].name
    pids = _hang_pids(tmp_path)
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)  # the hung ranks were killed with the launcher
    summary = (tmp_path / "autotuning_results" / "summary.txt").read_text()
    for status in ("failed", "oom", "timeout", "ok"):
        assert f"| {status}" in summary


_INTERRUPTIBLE = """
import json, signal, sys
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever the test process ignores
sys.path.insert(0, {repo!r})
from tests.test_tune_e2e import _fault_settings
from zerotune.calibrate.launch import terminate_as_interrupt
from zerotune.validate.tune import tune
with terminate_as_interrupt():  # as the CLI runs every verb
    tune(_fault_settings(Path({tmp!r}), [1, 2, 4], "4:crash,2:hang,1:metrics", top_k=2, timeout_s=120),
         log=lambda line: print(line, flush=True))
"""


@pytest.mark.parametrize("signum, raised", [(signal.SIGINT, "KeyboardInterrupt"), (signal.SIGTERM, "Terminated")])
def test_interrupted_tune_leaves_no_orphans_and_resumes(tmp_path: Path, signum: int, raised: str) -> None:
    """Ctrl-C (SIGINT), or SIGTERM as `timeout`, a scheduler's time limit or `kill` sends it: the launcher and its
    ranks run in their own session, which neither signal reaches; tune stops them (SIGTERM had left them running
    under init, 2026-11-28)."""
    code = _INTERRUPTIBLE.format(repo=str(REPO), tmp=str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while len(_hang_pids(tmp_path)) < 2 and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.5)
    assert len(_hang_pids(tmp_path)) == 2, child.communicate(timeout=30)[0].decode()[-2000:]
    ignored = _signal_mask(child.pid, "SigIgn")
    assert not ignored & (1 << (signal.SIGINT - 1)), f"the child ignores SIGINT (SigIgn {ignored:#x})"
    child.send_signal(signum)  # what Ctrl-C does: the launcher runs in its own session, tune kills it
    try:  # seconds alone (22 s for the whole test); once over 60 s late in a loaded full suite, so a wide limit
        output = child.communicate(timeout=240)[0].decode()
    except subprocess.TimeoutExpired as exc:
        child.kill()
        raise AssertionError(f"tune did not stop within 240 s of Ctrl-C: {(exc.output or b'').decode()[-2000:]}")
    assert child.returncode != 0 and raised in output
    time.sleep(1)
    assert not any(_alive(pid) for pid in _hang_pids(tmp_path))
    results = tmp_path / "autotuning_results"
    assert "interrupted" in (results / "summary.txt").read_text()
    for pid_file in tmp_path.glob("*.pid"):
        os.unlink(pid_file)
    # rerun: the crash stays recorded (its experiment is not run again although it would now succeed)
    outcome = tune(_fault_settings(tmp_path, [1, 2, 4], "4:metrics,2:metrics,1:metrics", top_k=2, timeout_s=120),
                   log=lambda _: None)
    by_micro = {r.config.train_micro_batch_size_per_gpu: r for r in outcome.results}
    assert by_micro[4].resumed and by_micro[4].status == "failed"
    assert not by_micro[2].resumed and by_micro[2].status == "ok"
    assert outcome.best is not None and outcome.best.name == by_micro[2].name


def test_model_information_from_one_profiling_run_of_the_script(tmp_path: Path) -> None:
    from zerotune.predictor import load_model
    from zerotune.validate.profiling_run import profile_model
    settings = _fault_settings(tmp_path, [2], "", top_k=1, timeout_s=240)
    profiled = profile_model(replace(settings, seq_len=None))
    model = load_model(profiled.model_path)
    # tiny-gpt.yaml, read back from the module the script built: 2 blocks of width 64, 4 heads, MLP 256, vocabulary 512
    assert (model.num_layers, model.hidden_size, model.num_heads, model.ffn_hidden_size, model.vocab_size) == \
        (2, 64, 4, 256, 512)
    assert model.num_params == 141_056  # DeepSpeed's engine counts the same (tests/test_launch.py)
    # the workload feeds seq_len + 1 tokens and shifts them for the targets: its blocks run over 32 positions
    assert profiled.seq_len == 32
    m = profiled.measurement
    assert m is not None and m.step_s > 0 and m.peak_memory_bytes > 50 * 2**20  # a torch process' RSS


SCRIPTS = FIXTURES / "scripts"


def _script_config(tmp_path: Path, micro: list[int], **autotuning) -> Path:
    doc = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": [0, 1]}, "steps_per_print": 1000,
           "autotuning": {"start_profile_step": 1, "end_profile_step": 2, "results_dir": str(tmp_path / "results"),
                          "exps_dir": str(tmp_path / "exps"), **autotuning}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(doc))
    return path


def _script_settings(argv: list[str]) -> TuneSettings:
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    return settings_from_args(parser.parse_args(["--num_gpus", "2", "--hardware", "cpu", "--timeout_s", "400",
                                                 "--explore", "none", "--memory_cap_gib", "6", *argv]))


def test_deepspeed_examples_style_script_is_read_and_measured(tmp_path: Path) -> None:
    """--deepspeed --deepspeed_config, deepspeed.add_config_arguments, data through initialize(training_data=...)."""
    from zerotune.predictor import load_model
    from zerotune.validate.profiling_run import profile_model
    config = _script_config(tmp_path, [1, 2])
    settings = _script_settings([str(SCRIPTS / "encoder_mlm.py"), "--deepspeed", "--deepspeed_config", str(config),
                                 "--steps", "50"])
    assert settings.command.args == ("--deepspeed", "--steps", "50") and settings.model == ""
    profiled = profile_model(settings)
    model = load_model(profiled.model_path)
    # the script's constants (tests/fixtures/scripts/encoder_mlm.py)
    assert (model.num_layers, model.hidden_size, model.num_heads, model.vocab_size) == (4, 384, 6, 8192)
    assert profiled.seq_len == 128 and profiled.measurement is not None
    assert profiled.measurement.config.train_micro_batch_size_per_gpu == 1  # the space's smallest
    # the script steps its own torch.optim.AdamW(model.parameters()): unfused, and the run says so
    assert profiled.optimizer_impl == "torch" and profiled.measurement.config.optimizer_impl == "torch"
    assert "# read: optimizer AdamW (unfused" in Path(profiled.model_path).read_text()
    # its tied head keeps nn.Embedding's N(0, 1) initialisation: softmax underflows, and the logits' gradient held
    # 1.4-2.8% subnormal values per backward on this CPU (2026-11-27: 2.46% median over 8 passes)
    assert 0.005 < model.logits_grad_subnormal_share < 0.1
    assert "subnormal values" in Path(profiled.model_path).read_text()


def test_a_vision_transformer_script_is_read_from_its_blocks(tmp_path: Path) -> None:
    """A ViT (no nn.Embedding): the real profiling run reads the width from its blocks and the sequence (64
    patches and the class token) from the first block's input, which the profiling hook records."""
    from zerotune.predictor import load_model
    from zerotune.validate.profiling_run import profile_model
    config = _script_config(tmp_path, [1, 2])
    settings = _script_settings([str(SCRIPTS / "vit_classifier.py"), "--deepspeed", "--deepspeed_config",
                                 str(config), "--steps", "50"])
    profiled = profile_model(settings)
    model = load_model(profiled.model_path)
    # the script's constants (tests/fixtures/scripts/vit_classifier.py)
    assert (model.num_layers, model.hidden_size, model.num_heads, model.vocab_size, model.head) == \
        (6, 256, 8, 0, "none")
    assert profiled.seq_len == 65 and profiled.measurement is not None and profiled.measurement.step_s
    # rank 0 timed the device's matmul pace before the first step (fp32 on this CPU: tens to hundreds of GFLOP/s)
    assert profiled.device_matmul is not None and profiled.device_matmul[:2] == ("fp32", 2048)
    assert 1e9 < profiled.device_matmul[2] < 1e13
    # and a 64 MiB tensor copy (this CPU: 12-35 GB/s read + write)
    assert profiled.device_copy_bytes_per_s is not None and 1e9 < profiled.device_copy_bytes_per_s < 1e12
    # and the engine's gradient all-reduce timer (ZeRO-0 over gloo: milliseconds)
    assert profiled.allreduce_s is not None and 0 < profiled.allreduce_s < 10
    # and, on a CPU, smaller copies down to 256 KiB moved: the curve ends at the 64 MiB copy, and the smallest,
    # which fits a core's L2, ran faster than it (this VM: 85-90 GB/s against 14-26)
    curve = profiled.device_copy_curve
    assert curve[0][0] == 2 * 128 * 1024
    assert curve[-1] == (2 * 64 * 2**20, profiled.device_copy_bytes_per_s)
    assert curve[0][1] > curve[-1][1]
    # and the 64 MiB copy into a fresh tensor (this VM: 4.1-4.4 GB/s, its pages faulting in past glibc's mmap
    # threshold; a host whose allocator keeps large blocks times it as fast as the kept copy)
    assert profiled.device_fresh_copy_bytes_per_s is not None and 1e8 < profiled.device_fresh_copy_bytes_per_s < 1e12
    # and torch's dropout beyond a clone (this VM: 6-15 ns an element for the mask's random numbers)
    assert profiled.device_dropout_s_per_element is not None and 0 <= profiled.device_dropout_s_per_element < 1e-6


def test_evaluation_passes_do_not_hide_a_scripts_checkpointing(tmp_path: Path) -> None:
    """A script that evaluates at step 0 and every few steps (engine.eval() under no_grad) and recomputes its
    blocks through deepspeed.checkpointing: only training forwards count, so the recomputes are seen (its
    evaluation forwards, counted as forwards, outnumbered them and it was costed without checkpointing)."""
    from zerotune.predictor import load_model
    from zerotune.validate.profiling_run import profile_model
    config = _script_config(tmp_path, [1, 2])
    doc = json.loads(config.read_text())
    config.write_text(json.dumps({**doc, "activation_checkpointing": {"partition_activations": False}}))
    settings = _script_settings([str(SCRIPTS / "eval_checkpointed_gpt.py"), "--deepspeed", "--deepspeed_config",
                                 str(config), "--steps", "50", "--eval_interval", "2"])
    profiled = profile_model(settings)
    assert profiled.activation_checkpointing
    model = load_model(profiled.model_path)  # the script's constants
    assert (model.num_layers, model.hidden_size, model.num_heads, model.vocab_size) == (3, 160, 5, 3000)
    assert profiled.seq_len == 80


def test_script_taking_its_micro_batch_from_its_own_argument_is_tuned(tmp_path: Path) -> None:
    """arg_mappings: each experiment's --batch_size is its micro-batch; the profiling run is a measurement."""
    from zerotune.validate.tune import run_tune
    config = _script_config(tmp_path, [2, 4], arg_mappings={"train_micro_batch_size_per_gpu": "--batch_size"})
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    args = parser.parse_args(["--num_gpus", "2", "--hardware", "cpu", "--timeout_s", "400", "--explore", "none",
                              "--top_k", "1", "--memory_cap_gib", "6", str(SCRIPTS / "decoder_lm.py"),
                              "--batch_size", "8", "--deepspeed_config", str(config)])
    assert run_tune(args) == 0
    results = tmp_path / "results"
    assert "gated_mlp: true" in (results / "model_profiled.yaml").read_text()
    profile_cmd = (results / "profile" / "cmd.txt").read_text()
    assert "--batch_size 2" in profile_cmd  # the profiling run's micro-batch, rewritten as the experiments' are
    measured = read_jsonl(results / "measurements.jsonl")
    assert len(measured) == 1 and measured[0].status == "ok"
    run_cmd = results / Path(measured[0].source).name / "cmd.txt"
    assert f"--batch_size {measured[0].config.train_micro_batch_size_per_gpu}" in run_cmd.read_text()



def test_hugging_face_trainer_script_with_auto_values_is_tuned(tmp_path: Path) -> None:
    """`--deepspeed ds_config.json` with "auto" values the Trainer fills in, the batch through arg_mappings, the
    model read from the Hugging Face model's config and modules by the profiling run (a BertForMaskedLM)."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from zerotune.validate.tune import run_tune
    doc = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
           "gradient_clipping": "auto", "steps_per_print": 1000, "bf16": {"enabled": "auto"},
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                     "weight_decay": "auto", "torch_adam": True}},
           "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                        "warmup_num_steps": "auto"}},
           "zero_optimization": {"stage": [0, 1]},
           "autotuning": {"start_profile_step": 1, "end_profile_step": 2, "max_train_micro_batch_size_per_gpu": 4,
                          "results_dir": str(tmp_path / "results"), "exps_dir": str(tmp_path / "exps"),
                          "arg_mappings": {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
                                           "gradient_accumulation_steps": "--gradient_accumulation_steps"}}}
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(doc))
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    args = parser.parse_args(["--num_gpus", "2", "--hardware", "cpu", "--timeout_s", "400", "--explore", "none",
                              "--top_k", "1", "--memory_cap_gib", "6", str(SCRIPTS / "hf_trainer_mlm.py"),
                              "--deepspeed", str(config), "--output_dir", str(tmp_path / "out"), "--use_cpu",
                              "--per_device_train_batch_size", "8", "--report_to", "none", "--save_strategy", "no",
                              "--max_steps", "20"])
    assert run_tune(args) == 0
    results = tmp_path / "results"
    profiled = (results / "model_profiled.yaml").read_text()
    assert "Hugging Face config (model_type bert)" in profiled and "head_transform: true" in profiled
    from zerotune.predictor import load_model
    model = load_model(str(results / "model_profiled.yaml"))
    # the script's BertConfig: 3 layers of 320, 5 heads, MLP 1280, vocabulary 5000, sequence 64
    assert (model.num_layers, model.hidden_size, model.num_heads, model.ffn_hidden_size, model.vocab_size) == \
        (3, 320, 5, 1280, 5000)
    assert "--per_device_train_batch_size 1" in (results / "profile" / "cmd.txt").read_text()
    measured = read_jsonl(results / "measurements.jsonl")
    assert len(measured) == 1 and measured[0].status == "ok"
    best = measured[0].config
    optimal = json.loads((results / "ds_config_optimal.json").read_text())
    assert optimal["train_micro_batch_size_per_gpu"] == best.train_micro_batch_size_per_gpu
    assert optimal["optimizer"]["params"]["lr"] == "auto"  # the Trainer's own values stay the Trainer's
    assert optimal["bf16"] == {"enabled": "auto"}
    assert f"--per_device_train_batch_size {best.train_micro_batch_size_per_gpu}" in \
        (results / "cmd_optimal.txt").read_text()


def test_lora_finetune_script_is_read_with_what_trains(tmp_path: Path) -> None:
    """A LoRA fine-tune (frozen base, loralib-style adapters, only the trainable parameters given to the ds_config's
    optimizer): the real profiling run reads the frozen parameters and the adapters, and the model it writes charges
    optimizer states for the adapters alone."""
    from zerotune.predictor import load_model
    from zerotune.validate.profiling_run import profile_model
    config = _script_config(tmp_path, [1, 2])
    doc = json.loads(config.read_text())
    doc["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}
    config.write_text(json.dumps(doc))
    settings = _script_settings([str(SCRIPTS / "lora_finetune.py"), "--deepspeed", "--deepspeed_config", str(config),
                                 "--steps", "30"])
    profiled = profile_model(settings)
    model = load_model(profiled.model_path)
    # the script's constants (tests/fixtures/scripts/lora_finetune.py): 8 blocks of 3,152,384 frozen parameters
    # (two norms, QKV 512 -> 1536 and 512 -> 512 with biases, MLP 512 -> 2048 -> 512), rank-16 adapters on two of
    # them (16 x (512 + 1536) + 16 x (512 + 512) = 49,152 a block), embeddings 10000 x 512 + 128 x 512 and the
    # final norm frozen
    assert (model.num_layers, model.hidden_size, model.vocab_size, model.ffn_hidden_size) == (8, 512, 10000, 2048)
    assert model.frozen_layer_params == 3_152_384 and model.num_layer_params == 3_152_384
    assert (model.adapter_params, model.num_adapter_tensors) == (8 * 49_152, 32)
    assert model.frozen_outer_params == 10000 * 512 + 128 * 512 + 2 * 512
    assert model.num_trainable_params == 393_216 and model.num_params == 30_798_848


def _fixture(name: str):  # type: ignore[no-untyped-def]
    """A fixture script's module, for its model classes and constants."""
    spec = importlib.util.spec_from_file_location(f"zt_fixture_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _tune_with_ds_optimizer(tmp_path: Path, script: str, micro: list[int]) -> Path:
    """`zerotune tune --top_k 1` of a fixture script taking its optimizer (torch's AdamW) from the ds_config, as
    DeepSpeedExamples' scripts do; the results folder."""
    from zerotune.validate.tune import run_tune
    config = _script_config(tmp_path, micro)
    doc = json.loads(config.read_text())
    doc["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}
    config.write_text(json.dumps(doc))
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    args = parser.parse_args(["--num_gpus", "2", "--hardware", "cpu", "--timeout_s", "400", "--explore", "none",
                              "--top_k", "1", "--memory_cap_gib", "6", str(SCRIPTS / script),
                              "--deepspeed", "--deepspeed_config", str(config), "--steps", "20"])
    assert run_tune(args) == 0
    return tmp_path / "results"


def test_a_convolutional_script_is_tuned_through_a_stand_in_of_its_measured_costs(tmp_path: Path) -> None:
    """DeepSpeedExamples' CIFAR style with a CNN (no transformer block to read): the real profiling run counts its
    forward FLOPs and the bytes it keeps for backward, the stand-in model carries them and its parameter count, and
    the tune runs and writes ds_config_optimal.json as for any script (no --model, no --seq_len)."""
    from zerotune.predictor import load_model
    cnn_classifier = _fixture("cnn_classifier")
    results = _tune_with_ds_optimizer(tmp_path, "cnn_classifier.py", [4, 8])
    model = load_model(results / "model_profiled.yaml")
    counted = sum(p.numel() for p in cnn_classifier.ConvNet().parameters())
    assert abs(model.num_params - counted) / counted < 1e-3
    # forward FLOPs per image by hand: 3 x 3 convolutions over 32, 32, 16 and 8 pixels a side, then the linears
    pixels = (32 * 32, 32 * 32, 16 * 16, 8 * 8)
    chans = cnn_classifier.CHANNELS
    per_image = sum(2 * a * b * 9 * p for (a, b), p in zip(zip(chans, chans[1:]), pixels)) + \
        sum(2 * a * b for a, b in zip(cnn_classifier.FC, cnn_classifier.FC[1:]))
    assert f"{per_image:.4g} forward FLOPs" in (results / "model_profiled.yaml").read_text()
    assert len(read_jsonl(results / "measurements.jsonl")) == 1
    assert json.loads((results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] in (4, 8)


def test_a_residual_mlp_over_feature_vectors_is_tuned_without_a_sequence_length(tmp_path: Path) -> None:
    """tests/fixtures/scripts/mlp_regression.py: repeated blocks without attention and no token or sequence input.
    The profiling run used to read them as transformer blocks and stop ("saw no token input ...; give --seq_len",
    exit 2), which DeepSpeed's autotuner never asks; now its measured costs describe it (one position per sample,
    its parameters) and the tune runs through."""
    from zerotune.predictor import load_model
    mlp_regression = _fixture("mlp_regression")
    results = _tune_with_ds_optimizer(tmp_path, "mlp_regression.py", [8, 16])
    model = load_model(results / "model_profiled.yaml")
    counted = sum(p.numel() for p in mlp_regression.Regressor().parameters())
    assert abs(model.num_params - counted) / counted < 0.01
    assert "no attention" in (results / "model_profiled.yaml").read_text()
    assert len(read_jsonl(results / "measurements.jsonl")) == 1
    assert json.loads((results / "ds_config_optimal.json").read_text())["train_micro_batch_size_per_gpu"] in (8, 16)
