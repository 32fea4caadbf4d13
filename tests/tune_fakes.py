"""A fake launcher and tune settings for tests of zerotune.validate.tune's logic: each experiment answered as
zerotune.calibrate.launch would (metrics in the run folder, or a failure), on the tiny fixture model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from zerotune.calibrate.launch import LaunchSpec, RunResult
from zerotune.predictor import experiment_name, parse_ds_config
from zerotune.validate.experiments import UserCommand
from zerotune.validate.settings import BUILTIN_SCRIPT, TuneSettings

__all__ = ["TINY", "WORLD", "SEQ_LEN", "spec_name", "FakeLauncher", "fake_settings"]

TINY = str(Path(__file__).resolve().parent / "fixtures" / "tiny-gpt.yaml")
WORLD = 2
SEQ_LEN = 32


def spec_name(spec: LaunchSpec) -> str:
    return experiment_name(parse_ds_config({k: v for k, v in spec.ds_config.items() if k != "autotuning"},
                                           world_size=WORLD))


class FakeLauncher:
    """Answers each experiment like zerotune.calibrate.launch would: metrics in the run folder, or a failure."""

    def __init__(self, step_s: Callable[[dict], float] = lambda d: 0.01 * d["train_micro_batch_size_per_gpu"] ** 0.5,
                 outcomes: dict[str, object] | None = None) -> None:
        self.step_s, self.outcomes, self.calls = step_s, outcomes or {}, []

    def __call__(self, spec: LaunchSpec) -> RunResult:
        name = spec_name(spec)
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


def fake_settings(tmp_path: Path, micro: list[int], stages: list[int], top_k: int = 3, args: tuple[str, ...] = (),
              **autotuning) -> TuneSettings:
    doc = {"train_micro_batch_size_per_gpu": micro, "zero_optimization": {"stage": stages},
           "autotuning": {"fast": True, "results_dir": str(tmp_path / "results"), "exps_dir": str(tmp_path / "exps"),
                          "start_profile_step": 1, "end_profile_step": 2, **autotuning}}
    command = UserCommand(BUILTIN_SCRIPT, args, "--deepspeed_config", tmp_path / "ds.json")
    return TuneSettings(command, doc, TINY, "cpu", WORLD, seq_len=SEQ_LEN, top_k=top_k, explore=())
