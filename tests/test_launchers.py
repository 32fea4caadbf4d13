"""Launchers users bring: deepspeed's own flags (--hostfile, --include / --exclude, --launcher, --launcher_args,
--no_ssh, --master_addr, --master_port, --no_local_rank, --bind_cores_to_rank, --bind_core_list) reach DeepSpeed's
runner unchanged in every run's command, and the world size zerotune models is the one the runner's filter leaves
(launcher/runner.py parse_resource_filter)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from zerotune.calibrate.launch import LaunchSpec, deepspeed_command, launch
from zerotune.validate.experiments import filtered_resources
from zerotune.validate.settings import LAUNCHERS, add_tune_arguments, settings_from_args
from zerotune.validate.runs import launch_spec


def _settings(tmp_path: Path, *flags: str):  # type: ignore[no-untyped-def]
    script = tmp_path / "train.py"
    script.write_text("")
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2}))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=4\nworker-1 slots=4\n")
    parser = argparse.ArgumentParser()
    add_tune_arguments(parser)
    argv = ["--hardware", "a100-80gb", "--model", "gpt2", "--hostfile", str(hostfile), *flags, str(script),
            "--deepspeed", str(ds)]
    return settings_from_args(parser.parse_args(argv))


def _command(settings, tmp_path: Path) -> list[str]:  # type: ignore[no-untyped-def]
    return deepspeed_command(launch_spec(settings, {"train_micro_batch_size_per_gpu": 2}, tmp_path / "run", ()))


def _flag(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


@pytest.mark.parametrize("backend", LAUNCHERS)
def test_each_backend_is_passed_through_with_its_flags(tmp_path: Path, backend: str) -> None:
    settings = _settings(tmp_path, "--launcher", backend.upper(), "--launcher_args", "--mca btl ^openib",
                         "--master_addr", "10.0.0.1", "--master_port", "29600", "--no_ssh")
    cmd = _command(settings, tmp_path)
    script = cmd.index(str(tmp_path / "train.py"))
    runner = cmd[:script]  # the runner's own flags come before the script
    assert _flag(runner, "--launcher") == backend and _flag(runner, "--launcher_args") == "--mca btl ^openib"
    assert _flag(runner, "--master_addr") == "10.0.0.1" and _flag(runner, "--master_port") == "29600"
    assert "--no_ssh" in runner and _flag(runner, "--hostfile") == str(tmp_path / "hostfile")
    assert (_flag(runner, "--num_nodes"), _flag(runner, "--num_gpus")) == ("2", "4")
    assert (settings.num_nodes, settings.num_gpus) == (2, 4)


def test_include_and_exclude_replace_the_counts_and_set_the_world_size(tmp_path: Path) -> None:
    settings = _settings(tmp_path, "--include", "worker-0:0,1@worker-1:2,3")
    cmd = _command(settings, tmp_path)
    assert _flag(cmd, "--include") == "worker-0:0,1@worker-1:2,3"
    assert "--num_gpus" not in cmd and "--num_nodes" not in cmd  # the runner refuses counts beside a filter
    assert (settings.num_nodes, settings.num_gpus) == (2, 2)
    settings = _settings(tmp_path, "--exclude", "worker-1")
    assert _flag(_command(settings, tmp_path), "--exclude") == "worker-1"
    assert (settings.num_nodes, settings.num_gpus) == (1, 4)


def test_resource_filter_counts_as_deepspeeds_runner_does() -> None:
    hosts = [("worker-0", 8), ("worker-1", 8)]
    assert filtered_resources(hosts, "worker-0:0,1@worker-1", None) == [("worker-0", 2), ("worker-1", 8)]
    assert filtered_resources(hosts, None, "worker-0:0,1@worker-1") == [("worker-0", 6)]
    with pytest.raises(ValueError, match="not among worker-0, worker-1"):
        filtered_resources(hosts, "worker-9", None)


def test_filter_mistakes_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot be combined with --num_gpus"):
        _settings(tmp_path, "--include", "worker-0", "--num_gpus", "2")
    with pytest.raises(ValueError, match="same number of devices on every node"):
        _settings(tmp_path, "--include", "worker-0:0@worker-1")
    with pytest.raises(SystemExit):  # argparse: an unknown backend
        _settings(tmp_path, "--launcher", "torchrun")


def test_pdsh_is_needed_only_by_the_pdsh_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None if name == "pdsh" else "/usr/bin/" + name)
    hostfile = tmp_path / "hostfile"
    spec = LaunchSpec(Path("train.py"), {}, tmp_path / "run", 29500, 10.0, hostfile=hostfile, launcher="openmpi")
    started: list[list[str]] = []
    monkeypatch.setattr("zerotune.calibrate.launch._start", lambda s, cmd: started.append(cmd) or (_ for _ in ()).throw(
        OSError("not started in this test")))
    with pytest.raises(OSError, match="not started"):
        launch(spec)  # openmpi: no pdsh check, the launcher is started
    with pytest.raises(RuntimeError, match="needs pdsh"):
        launch(LaunchSpec(Path("train.py"), {}, tmp_path / "run2", 29501, 10.0, hostfile=hostfile))
    assert started and "--launcher" in started[0]


def test_the_runners_per_rank_flags_reach_every_run_before_the_script(tmp_path: Path) -> None:
    """--no_local_rank (a script whose argparse takes no --local_rank) and the CPU core binding DeepSpeed advises
    for CPU training (--bind_cores_to_rank, --bind_core_list) are the runner's, so they come before the script."""
    settings = _settings(tmp_path, "--no_local_rank", "--bind_cores_to_rank", "--bind_core_list", "0-3")
    cmd = _command(settings, tmp_path)
    runner = cmd[:cmd.index(str(tmp_path / "train.py"))]
    assert "--no_local_rank" in runner and "--bind_cores_to_rank" in runner
    assert _flag(runner, "--bind_core_list") == "0-3"
    (tmp_path / "plain").mkdir()
    plain = _command(_settings(tmp_path / "plain"), tmp_path)
    assert not {"--no_local_rank", "--bind_cores_to_rank", "--bind_core_list"} & set(plain)
