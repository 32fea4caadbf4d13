"""zerotune.calibrate.launch: the real `deepspeed` launcher on the CPU accelerator with 2 ranks, and how runs end."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from zerotune.predictor import load_model
from zerotune.calibrate.launch import LaunchSpec, classify, deepspeed_command, failure_reason, free_port, launch

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
WORKLOAD = REPO / "calibrate" / "workload.py"
CPU_ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
TINY_CONFIG = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
               "zero_optimization": {"stage": 1}, "steps_per_print": 1000}


def _spec(tmp_path: Path, script: Path, timeout_s: float = 240.0, **changes) -> LaunchSpec:
    changes = {"num_gpus": 2, "env": CPU_ENV, **changes}
    return LaunchSpec(script=script, ds_config=TINY_CONFIG, run_dir=tmp_path / "run", master_port=free_port(),
                      timeout_s=timeout_s, **changes)


def test_command_is_an_argument_list_for_one_node(tmp_path: Path) -> None:
    spec = _spec(tmp_path, WORKLOAD, script_args=("--model", "a model; rm -rf /"))
    cmd = deepspeed_command(spec)
    assert Path(cmd[0]).name == "deepspeed"
    assert cmd[1:3] == ["--num_gpus", "2"] and "--hostfile" not in cmd  # one node: no pdsh, no hostfile
    assert "a model; rm -rf /" in cmd  # passed as one argument: no shell ever parses it
    assert cmd[-2:] == ["--deepspeed_config", str(tmp_path / "run" / "ds_config.json")]


def test_multi_node_passes_hostfile_and_refuses_include_with_counts(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    cmd = deepspeed_command(_spec(tmp_path, WORKLOAD, num_nodes=2, hostfile=hostfile))
    assert cmd[cmd.index("--hostfile") + 1] == str(hostfile) and cmd[cmd.index("--num_nodes") + 1] == "2"
    with pytest.raises(ValueError, match="include"):
        deepspeed_command(_spec(tmp_path, WORKLOAD, include="worker-0:0,1"))
    with pytest.raises(ValueError, match="hostfile"):
        deepspeed_command(_spec(tmp_path, WORKLOAD, num_nodes=2))


def test_failure_reason_is_the_exception_line_not_launcher_noise() -> None:
    stderr = ("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"x.py\", line 3\n"
              "[rank1]: RuntimeError: Expected all tensors to be on the same device\n"
              "[2026-01-01 00:00:00] [ERROR] [launch.py:259:sigkill_handler] [...] exits with return code = 1\n")
    assert failure_reason(stderr) == "RuntimeError: Expected all tensors to be on the same device"


def test_failure_reason_reads_one_copy_of_two_ranks_writing_at_once() -> None:
    # A CI run's stderr.log: both ranks of tests/fixtures/crash.py raised at once into the launcher's stderr, and
    # Python writes the type, ": " and the message separately, so the two copies interleaved by write.
    crashed = ("Traceback (most recent call last):\n"
               "ValueErrorValueError: : fixture crash on purpose (argv 4 args)fixture crash on purpose (argv 4 args)\n")
    assert failure_reason(crashed) == "ValueError: fixture crash on purpose (argv 4 args)"
    joined = "ValueError: bad value for lr: -1ValueError: bad value for lr: -1"
    assert failure_reason(joined) == "ValueError: bad value for lr: -1"
    one_rank = "RuntimeError: Expected all tensors to be on the same device, cpu and cpu"  # pairs of letters not all
    assert failure_reason(one_rank) == one_rank


def test_failure_reason_keeps_the_lines_an_exception_message_goes_on_with() -> None:
    # A Trainer script's stderr.log (transformers integrations/deepspeed.py trainer_config_finalize): the values
    # that mismatch are on the lines after the exception's; rank 1 then prints the same.
    stderr = ("[rank0]: ValueError: Please correct the following DeepSpeed config values that mismatch "
              "TrainingArguments values:\n[rank0]: - ds train_batch_size=2 vs hf train_batch_size (calculated)=1\n"
              "[rank0]: The easiest method is to set these DeepSpeed config values to 'auto'.\n"
              "[rank1]: Traceback (most recent call last):\n"
              "[rank1]: ValueError: Please correct the following DeepSpeed config values that mismatch "
              "TrainingArguments values:\n[rank1]: - ds train_batch_size=2 vs hf train_batch_size (calculated)=1\n")
    assert failure_reason(stderr) == ("ValueError: Please correct the following DeepSpeed config values that mismatch "
                                      "TrainingArguments values: - ds train_batch_size=2 vs hf train_batch_size "
                                      "(calculated)=1")


def test_failure_reason_is_the_crashed_ranks_error_not_the_peers_echo() -> None:
    # a pipeline-parallel script under wall_clock_breakdown (2026-11-26): rank 0 failed, rank 1 then lost its gloo
    # peer and printed last; the recorded reason was rank 1's
    stderr = ("[rank0]: AssertionError: bwd_microstep timer has already been started\n"
              "[rank1]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
              "[127.0.0.1]:27299. This is typically caused by a remote worker crashing.\n")
    assert failure_reason(stderr) == "AssertionError: bwd_microstep timer has already been started"
    only_echo = stderr.splitlines()[1] + "\n"
    assert failure_reason(only_echo).startswith("RuntimeError: [../third_party/gloo")  # nothing better to say


def test_sigkill_is_oom_with_or_without_a_memory_cap(tmp_path: Path) -> None:
    # Without a cap the kernel's OOM killer is what SIGKILLs a rank (seen: a Trainer script at micro-batch 399 on
    # this 24 GiB machine, dmesg "Out of memory: Killed process"); as a failure, tune ran the same size again.
    status, _, _ = classify(247, False, "", "exits with return code = -9", True, tmp_path / "m.json")
    assert status == "oom"
    status, reason, _ = classify(247, False, "", "exits with return code = -9", False, tmp_path / "m.json")
    assert status == "oom" and "OOM killer" in reason
    assert classify(1, False, "", "exits with return code = 1", False, tmp_path / "m.json")[0] == "failed"


def test_cuda_oom_message_is_oom(tmp_path: Path) -> None:
    stderr = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    assert classify(1, False, "", stderr, False, tmp_path / "m.json")[0] == "oom"


@pytest.mark.deepspeed
def test_ok_run_writes_metrics_and_reproducible_folder(tmp_path: Path) -> None:
    args = ("--model", str(FIXTURES / "tiny-gpt.yaml"), "--seq_len", "32", "--steps", "3", "--warmup", "1")
    spec = _spec(tmp_path, WORKLOAD, script_args=args)
    result = launch(spec)
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{spec.master_port}_*"))  # none leaked
    assert result.status == "ok", result.reason
    # 0, or a rank aborted in interpreter teardown after the metrics were written (kept, and said so)
    assert result.returncode == 0 or result.reason.startswith("measured, then the launcher exited"), result.reason
    for name in ("ds_config.json", "cmd.txt", "stdout.log", "stderr.log", "environment.json", "metrics.json"):
        assert (result.run_dir / name).is_file(), name
    m = result.metrics
    assert m is not None and m["device"] == "cpu" and m["samples_per_step"] == 4  # 2 per rank x 2 ranks
    assert m["num_params"] == load_model(str(FIXTURES / "tiny-gpt.yaml")).num_params == 141_056
    assert m["step_s"] > 0 and m["throughput"] == pytest.approx(4 / m["step_s"])
    assert m["latency"] == pytest.approx(m["step_s"] * 1e6)  # microseconds, as DeepSpeed's engine writes it
    assert 50 * 2**20 < m["peak_memory_bytes"] < 4 * 2**30  # RSS of a torch + DeepSpeed process
    assert m["forward_s"] > 0 and m["backward_s"] > 0 and m["optimizer_s"] > 0


@pytest.mark.deepspeed
def test_crashing_script_is_failed_with_its_reason(tmp_path: Path) -> None:
    result = launch(_spec(tmp_path, FIXTURES / "crash.py", timeout_s=120))
    assert result.status == "failed"
    assert result.reason.startswith("ValueError: fixture crash on purpose"), result.reason
    assert result.returncode not in (0, None)


@pytest.mark.deepspeed
def test_hanging_script_times_out_and_leaves_no_process(tmp_path: Path) -> None:
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    spec = _spec(tmp_path, FIXTURES / "hang.py", timeout_s=15, env={**CPU_ENV, "ZT_FIXTURE_PID_DIR": str(pid_dir)})
    result = launch(spec)
    assert result.status == "timeout" and result.returncode is None
    assert result.wall_s == pytest.approx(15, abs=12)
    pids = [int(p.stem) for p in pid_dir.glob("*.pid")]
    assert len(pids) == 2, "both ranks should have started within the time limit"
    time.sleep(0.5)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


@pytest.mark.deepspeed
def test_allocation_past_the_memory_cap_is_oom(tmp_path: Path) -> None:
    result = launch(_spec(tmp_path, FIXTURES / "alloc.py", timeout_s=120, memory_limit_bytes=3 * 2**30))
    assert result.status == "oom", (result.status, result.reason)
    assert "MemoryError" in result.reason or "memory" in result.reason.lower()


def test_launch_refuses_multi_node_without_pdsh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import zerotune.calibrate.launch as launch_module
    real_which = launch_module.shutil.which
    monkeypatch.setattr(launch_module.shutil, "which", lambda name: None if name == "pdsh" else real_which(name))
    with pytest.raises(RuntimeError, match="pdsh"):
        launch(_spec(tmp_path, WORKLOAD, num_nodes=2, hostfile=tmp_path / "hostfile"))
    assert not os.path.exists(tmp_path / "run" / "cmd.txt")  # refused before anything ran or was written


def test_release_shm_buffers_removes_only_the_runs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed's CPU shm all-reduce leaves ~69 MB per rank in RAM-backed /dev/shm; launch removes its run's."""
    import zerotune.calibrate.launch as launch_module
    monkeypatch.setattr(launch_module, "SHM_DIR", tmp_path)
    for name in ("deepspeed_allreduce_buffer_0_127.0.0.1_4242_0", "deepspeed_allreduce_buffer_0_127.0.0.1_4242_1",
                 "deepspeed_allreduce_buffer_0_127.0.0.1_4243_0", "other_4242_0"):
        (tmp_path / name).write_bytes(b"x")
    assert launch_module.release_shm_buffers(4242) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deepspeed_allreduce_buffer_0_127.0.0.1_4243_0", "other_4242_0"]


def test_a_rank_dying_after_the_metrics_were_written_keeps_the_measurement(tmp_path: Path) -> None:
    """Seen in CI: rank 0 wrote its metrics and exited, rank 1 aborted in teardown ("terminate called without an
    active exception"); the launcher then exits non-zero, but the measurement is complete."""
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"step_s": 0.5, "throughput_samples_per_s": 4.0}))
    status, reason, got = classify(1, False, "", "terminate called without an active exception\n", False, metrics)
    assert status == "ok" and got == {"step_s": 0.5, "throughput_samples_per_s": 4.0}
    assert "status 1" in reason
    assert classify(1, False, "", "ValueError: boom\n", False, tmp_path / "none.json")[0] == "failed"


def test_an_accelerator_named_in_ds_accelerator_that_this_machine_has_not_is_refused(monkeypatch, tmp_path) -> None:
    # DS_ACCELERATOR=cuda on a machine without a GPU: every run had failed at start-up and the tune blamed the script;
    # with --hardware cpu it would have trained on (or failed on) another device than the one named
    import zerotune.calibrate.launch as launch_module
    from zerotune.calibrate.launch import check_accelerator_here
    monkeypatch.setattr(launch_module, "ACCELERATOR_TOOLS", ("no-such-vendor-tool",))
    monkeypatch.setattr(launch_module, "ACCELERATOR_NODES", (str(tmp_path / "no-device"),))
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with pytest.raises(ValueError, match="--hardware cpu is the CPU, but DS_ACCELERATOR=cuda .*which this machine "
                                         "has not; set DS_ACCELERATOR=cpu"):
        check_accelerator_here("cpu", "cpu", None)
    with pytest.raises(ValueError, match="DS_ACCELERATOR=cuda, but this machine has no accelerator"):
        check_accelerator_here("gpu", "h100-80gb", None)
    check_accelerator_here("gpu", "h100-80gb", tmp_path / "hostfile")  # the ranks run on the listed hosts
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    check_accelerator_here("cpu", "cpu", None)
    monkeypatch.delenv("DS_ACCELERATOR")
    check_accelerator_here("cpu", "cpu", None)
    (tmp_path / "no-device").mkdir()  # a device node: a GPU named here is taken to be here
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    check_accelerator_here("gpu", "h100-80gb", None)


def test_a_run_folders_environment_names_the_installed_versions_without_importing_them() -> None:
    # environment.json beside every run: importing torch and DeepSpeed for it cost the tune 1.4-2.3 s before its
    # first launch; the installed packages' metadata says the same versions
    import subprocess
    import sys
    code = ("import sys, json; from zerotune.calibrate.environment import collect_environment; "
            "env = collect_environment(query_device=False); "
            "print(json.dumps([env['torch'], env['deepspeed'], 'torch' in sys.modules, 'deepspeed' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    torch_version, ds_version, torch_imported, ds_imported = json.loads(out.strip().splitlines()[-1])
    import deepspeed
    import torch
    assert (torch_version, ds_version) == (torch.__version__, deepspeed.__version__)
    assert not torch_imported and not ds_imported
