"""The user's ds_config survives tuning: every key zerotune does not tune goes unchanged into each experiment
and into ds_config_optimal.json; keys DeepSpeed 0.19 refuses are refused up front with its reason."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pytest

from zerotune.calibrate.launch import LaunchSpec, RunResult
from zerotune.predictor import parse_ds_config, to_ds_config
from zerotune.predictor.ds_keys import REMOVED_TOP_LEVEL_KEYS, REMOVED_ZERO_KEYS
from zerotune.validate.experiments import UserCommand
from zerotune.validate.settings import BUILTIN_SCRIPT, TuneSettings
from zerotune.validate.tune import tune

TINY = str(Path(__file__).resolve().parent / "fixtures" / "tiny-gpt.yaml")
WORLD = 2

# One value for every section DeepSpeed's configuration documentation lists (deepspeed.ai/docs/config-json),
# the removed ones excepted; stage and micro-batch are lists, so they are what tune chooses.
EVERY_SECTION: dict[str, Any] = {
    "train_micro_batch_size_per_gpu": [2, 4],
    "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
                                                      "warmup_num_steps": 100, "total_num_steps": 1000}},
    "communication_data_type": "fp32",
    "prescale_gradients": False,
    "gradient_predivide_factor": 1.0,
    "fp16": {"enabled": True, "auto_cast": False, "loss_scale": 0, "initial_scale_power": 12,
             "loss_scale_window": 500, "hysteresis": 3, "consecutive_hysteresis": True, "min_loss_scale": 2},
    "bf16": {"enabled": False, "immediate_grad_update": True},
    "gradient_clipping": 1.0,
    "zero_optimization": {
        "stage": [1, 2], "contiguous_gradients": True, "overlap_comm": False, "reduce_scatter": True,
        "reduce_bucket_size": 200_000_000, "allgather_partitions": True, "allgather_bucket_size": 200_000_000,
        "round_robin_gradients": True, "stage3_gather_16bit_weights_on_model_save": True,
        "ignore_unused_parameters": False, "load_from_fp32_weights": False, "zero_hpz_partition_size": 1,
        "zero_quantized_weights": False, "zero_quantized_gradients": False, "elastic_checkpoint": False,
        "offload_optimizer": {"device": "cpu", "nvme_path": "/local_nvme", "pin_memory": True, "buffer_count": 4,
                              "fast_init": False, "ratio": 1.0},
    },
    "zero_allow_untested_optimizer": True,
    "zero_force_ds_cpu_optimizer": True,
    "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": False,
            "overlap_events": True},
    "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False,
                                 "contiguous_memory_optimization": False, "number_checkpoints": 4,
                                 "synchronize_checkpoint_boundary": False, "profile": False},
    "flops_profiler": {"enabled": False, "profile_step": 1, "module_depth": -1, "top_modules": 1, "detailed": True,
                       "output_file": None},
    "comms_logger": {"enabled": False, "verbose": False, "prof_all": True, "debug": False},
    "steps_per_print": 10,
    "wall_clock_breakdown": False,
    "dump_state": False,
    "memory_breakdown": False,
    "tensorboard": {"enabled": False, "output_path": "log/", "job_name": "run"},
    "wandb": {"enabled": False, "group": "g", "team": "t", "project": "p"},
    "csv_monitor": {"enabled": False, "output_path": "log/", "job_name": "run"},
    "comet": {"enabled": False, "project": "p"},
    "data_efficiency": {"enabled": False, "seed": 1234},
    "checkpoint": {"tag_validation": "Warn", "load_universal": False, "use_node_local_storage": False,
                   "parallel_write": {"pipeline_stage": False}},
    "data_types": {"grad_accum_dtype": "fp32"},
    "dataloader_drop_last": False,
    "compile": {"disable": True},
    "timers": {"throughput": {"enabled": True, "synchronized": True}},
    "torch_autocast": {"enabled": False},
}
TUNED = {("train_micro_batch_size_per_gpu",), ("train_batch_size",), ("gradient_accumulation_steps",),
         ("zero_optimization", "stage")}


def _leaves(doc: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(doc, dict) and doc:
        for key, value in doc.items():
            yield from _leaves(value, path + (key,))
    else:
        yield path, doc


def _value(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return KeyError
        doc = doc[key]
    return doc


def _launcher(seen: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    def launch(spec: LaunchSpec) -> RunResult:
        seen.append(copy.deepcopy(spec.ds_config))
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        metrics = {"step_s": 0.1 / spec.ds_config["train_micro_batch_size_per_gpu"]}
        (spec.run_dir / "metrics.json").write_text(json.dumps(metrics))
        return RunResult("ok", "", 0, 1.0, spec.run_dir, metrics)
    return launch


def test_every_documented_section_comes_back_with_only_the_tuned_keys_changed(tmp_path: Path) -> None:
    doc = {**copy.deepcopy(EVERY_SECTION),
           "autotuning": {"fast": True, "results_dir": str(tmp_path / "r"), "exps_dir": str(tmp_path / "e")}}
    settings = TuneSettings(UserCommand(BUILTIN_SCRIPT, (), "--deepspeed_config", tmp_path / "ds.json"), doc, TINY,
                            "a100-80gb", WORLD, seq_len=32, explore=())  # fp16: a GPU
    seen: list[dict[str, Any]] = []
    outcome = tune(settings, _launcher(seen), log=lambda _: None)
    assert outcome.best is not None and seen
    optimal = json.loads((tmp_path / "r" / "ds_config_optimal.json").read_text())
    assert "autotuning" not in optimal
    for ds_config in seen + [optimal]:
        for path, value in _leaves(EVERY_SECTION):
            if path in TUNED or (ds_config is not optimal and path == ("wall_clock_breakdown",)):
                continue  # experiments time every step (experiment_ds_config); the optimal config keeps false
            assert _value(ds_config, path) == value, ".".join(path)
    assert all(ds_config["wall_clock_breakdown"] is True for ds_config in seen)
    assert optimal["zero_optimization"]["stage"] in (1, 2)
    assert optimal["train_micro_batch_size_per_gpu"] in (2, 4)


def test_parse_and_write_back_keep_untuned_keys_without_tuning() -> None:
    doc = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3, "round_robin_gradients": True,
           "offload_param": {"device": "nvme", "nvme_path": "/nvme", "buffer_size": 1e8}},
           "fp16": {"enabled": True, "loss_scale": 128, "hysteresis": 4}}
    out = to_ds_config(parse_ds_config(doc, world_size=WORLD), WORLD)
    assert out["fp16"] == doc["fp16"]
    assert out["zero_optimization"]["round_robin_gradients"] is True
    off = {"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": False}, "bf16": {"enabled": False}}
    cfg = parse_ds_config(off, world_size=WORLD)
    written = to_ds_config(cfg, WORLD)
    assert cfg.precision == "fp32" and (written["fp16"], written["bf16"]) == (off["fp16"], off["bf16"])
    assert parse_ds_config(written, world_size=WORLD) == cfg  # written and read back: the same configuration
    assert out["zero_optimization"]["offload_param"] == {**doc["zero_optimization"]["offload_param"],
                                                         "pin_memory": True}


@pytest.mark.parametrize("key", sorted(REMOVED_TOP_LEVEL_KEYS))
def test_top_level_keys_deepspeed_refuses_are_refused_naming_the_key(key: str) -> None:
    with pytest.raises(ValueError, match=f"ds_config {key}: DeepSpeed 0.19 refuses it") as info:
        parse_ds_config({key: {}}, world_size=WORLD)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key", sorted(REMOVED_ZERO_KEYS))
def test_zero_keys_deepspeed_refuses_are_refused_naming_the_key(key: str) -> None:
    with pytest.raises(ValueError, match=f"zero_optimization.{key}: DeepSpeed 0.19 refuses it"):
        parse_ds_config({"zero_optimization": {"stage": 3, key: 1}}, world_size=WORLD)


def test_the_refused_keys_are_the_installed_deepspeeds() -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import config as ds_runtime_config
    assert set(REMOVED_TOP_LEVEL_KEYS) == set(ds_runtime_config._REMOVED_TOP_LEVEL_CONFIG_KEYS)
    assert set(REMOVED_ZERO_KEYS) == set(ds_runtime_config._REMOVED_ZERO_CONFIG_KEYS)


def test_a_trainers_auto_zero_keys_stay_auto_where_the_optimum_holds_the_trainers_fill() -> None:
    """A T5 Trainer script's ds_config (2026-11-26): reduce_bucket_size "auto" came back as 65536 (what the Trainer
    fills at hidden 256) and its stage-3 "auto" keys were dropped at the stage-0 optimum. Both stay "auto"; a value
    zerotune chose other than the fill is written as the number."""
    from zerotune.validate.experiments import optimal_ds_config
    user = {"train_micro_batch_size_per_gpu": 4,
            "zero_optimization": {"stage": 0, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                  "param_persistence_threshold": "auto", "overlap_comm": True}}
    cfg = parse_ds_config(user, world_size=2, hidden_size=256)
    zero = optimal_ds_config(cfg, 2, user, 256)["zero_optimization"]
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"], zero["param_persistence_threshold"]) \
        == ("auto", "auto", "auto")
    assert zero["overlap_comm"] is True and zero["stage"] == 0
    tuned = cfg.replace(zero=replace(cfg.zero, reduce_bucket_size_elems=5 * 10**8))
    assert optimal_ds_config(tuned, 2, user, 256)["zero_optimization"]["reduce_bucket_size"] == 5 * 10**8
    at_stage_3 = cfg.replace(zero=replace(cfg.zero, stage=3))
    zero3 = optimal_ds_config(at_stage_3, 2, user, 256)["zero_optimization"]
    assert zero3["stage3_prefetch_bucket_size"] == "auto" and zero3["stage3_param_persistence_threshold"] == "auto"
    assert "param_persistence_threshold" not in zero3  # the alias is the canonical key's
