"""Reading real ds_config files: DeepSpeed's rules, Hugging Face "auto" values, one-line errors."""

from __future__ import annotations

import warnings

import pytest

from zerotune.predictor.ds_json import parse_ds_config, to_ds_config

HF_ZERO3 = {  # the ZeRO-3 template of the Hugging Face DeepSpeed integration docs
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "zero_optimization": {
        "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
        "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
        "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
        "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
        "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False,
}


def test_hugging_face_auto_values_resolve_as_the_trainer_does() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = parse_ds_config(HF_ZERO3, world_size=8, hidden_size=1024)
    z = cfg.zero
    # transformers' HfTrainerDeepSpeedConfig: hidden^2, 0.9 * hidden^2 and 10 * hidden.
    assert z.reduce_bucket_size_elems == 1024 * 1024
    assert z.stage3_prefetch_bucket_size_elems == int(0.9 * 1024 * 1024)
    assert z.stage3_param_persistence_threshold_elems == 10 * 1024
    assert z.offload_optimizer.device == "cpu" and z.offload_param.device == "cpu"
    assert cfg.optimizer == "adamw" and cfg.precision == "fp32"


def test_an_auto_precision_stays_for_the_trainer_to_fill() -> None:
    """The Trainer sets fp16/bf16.enabled from --fp16/--bf16 only where the section exists (transformers
    integrations/deepspeed.py fill_match); a written config without it would train in fp32 under --fp16."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = parse_ds_config({**HF_ZERO3, "train_micro_batch_size_per_gpu": 2}, world_size=8, hidden_size=1024)
    out = to_ds_config(cfg, 8)
    assert out["fp16"] == HF_ZERO3["fp16"] and "bf16" not in out
    # a section the user switched off is theirs and comes back as written (issue 13: untuned keys go through)
    assert to_ds_config(parse_ds_config({"fp16": {"enabled": False}}), 1)["fp16"] == {"enabled": False}
    assert "fp16" not in to_ds_config(parse_ds_config({}), 1)


def test_batch_triple_is_derived_like_deepspeed() -> None:
    assert parse_ds_config({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}, world_size=8) \
        .gradient_accumulation_steps == 2
    assert parse_ds_config({"train_batch_size": 64, "gradient_accumulation_steps": 2}, world_size=8) \
        .train_micro_batch_size_per_gpu == 4


def test_inconsistent_batch_triple_names_the_keys() -> None:
    doc = {"train_batch_size": 48, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}
    with pytest.raises(ValueError, match="train_batch_size 48 != train_micro_batch_size_per_gpu 4"):
        parse_ds_config(doc, world_size=8)


def test_misspelled_zero_key_names_the_nearest_valid_key() -> None:
    with pytest.raises(ValueError, match=r"zero_optimization\.reduce_bucket_sise.*'reduce_bucket_size'"):
        parse_ds_config({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 5e8}})


def test_misspelled_offload_key_is_an_error() -> None:
    with pytest.raises(ValueError, match="offload_optimizer.pin_memroy"):
        parse_ds_config({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                                                                                  "pin_memroy": True}}})


def test_wrong_type_is_an_error() -> None:
    with pytest.raises(ValueError, match="zero_optimization.overlap_comm must be true or false"):
        parse_ds_config({"zero_optimization": {"stage": 2, "overlap_comm": "yes"}})
    with pytest.raises(ValueError, match="zero_optimization.stage must be 0, 1, 2 or 3"):
        parse_ds_config({"zero_optimization": {"stage": 4}})


def test_unknown_top_level_key_is_only_a_warning() -> None:
    with pytest.warns(UserWarning, match="'gradient_clippin'.*'gradient_clipping'"):
        cfg = parse_ds_config({"gradient_clippin": 1.0, "train_micro_batch_size_per_gpu": 2})
    assert cfg.train_micro_batch_size_per_gpu == 2


def test_overlap_comm_defaults_follow_deepspeed() -> None:
    # deepspeed/runtime/zero/config.py overlap_comm_valid: True for stage 3 only.
    assert parse_ds_config({"zero_optimization": {"stage": 3}}).zero.overlap_comm is True
    assert parse_ds_config({"zero_optimization": {"stage": 2}}).zero.overlap_comm is False


def test_both_half_precisions_is_an_error() -> None:
    with pytest.raises(ValueError, match="both fp16.enabled and bf16.enabled"):
        parse_ds_config({"fp16": {"enabled": True}, "bf16": {"enabled": True}})


def test_autotuning_section_is_read() -> None:
    cfg = parse_ds_config({"autotuning": {"enabled": True, "metric": "FLOPS", "fast": False, "mp_size": 2,
                                          "arg_mappings": {"train_micro_batch_size_per_gpu": "--bs"}}},
                          world_size=8)
    assert cfg.autotuning.metric == "flops" and cfg.autotuning.fast is False and cfg.mp_size == 2
    assert cfg.autotuning.arg_mappings == {"train_micro_batch_size_per_gpu": "--bs"}


def test_round_trip_keeps_the_users_other_keys() -> None:
    doc = {"train_micro_batch_size_per_gpu": 3, "gradient_clipping": 1.0, "bf16": {"enabled": True},
           "zero_optimization": {"stage": 2, "reduce_bucket_size": 2e8}}
    out = to_ds_config(parse_ds_config(doc, world_size=4), world_size=4)
    assert out["gradient_clipping"] == 1.0 and out["bf16"] == {"enabled": True}
    assert out["train_batch_size"] == 12 and out["zero_optimization"]["reduce_bucket_size"] == 200_000_000
    again = to_ds_config(parse_ds_config(out, world_size=4), world_size=4)
    assert again == out


def test_the_adam_implementation_follows_what_deepspeed_builds() -> None:
    # runtime/engine.py get_optimizer_configuration: an Adam/AdamW section builds FusedAdam unless "torch_adam" asks
    # for torch's; with no section the engine steps the script's own optimizer, most often torch.optim.AdamW as
    # written (unfused) until tune's profiling run reads which it is.
    base = {"train_micro_batch_size_per_gpu": 1}
    assert parse_ds_config({**base, "optimizer": {"type": "AdamW"}}).optimizer_impl == "fused"
    assert parse_ds_config({**base, "optimizer": {"type": "Adam", "params": {"torch_adam": True}}}).optimizer_impl == "torch"
    assert parse_ds_config(base).optimizer_impl == "torch"


def test_autotp_training_degree_is_the_tensor_parallel_degree() -> None:
    """DeepSpeed 0.19's AutoTP training (tensor_parallel.autotp_size) splits each linear layer over that many
    ranks, as autotuning.mp_size says of a Megatron model: it was read as no tensor parallelism at all."""
    cfg = parse_ds_config({"tensor_parallel": {"autotp_size": 2}}, world_size=4)
    assert cfg.mp_size == 2
    assert parse_ds_config({"tensor_parallel": {"autotp_size": 1}}, world_size=4).mp_size == 1
    assert to_ds_config(cfg, 4)["tensor_parallel"] == {"autotp_size": 2}  # the user's key goes back unchanged
    with pytest.raises(ValueError, match="autotp_size 2 and autotuning.mp_size 4 differ"):
        parse_ds_config({"tensor_parallel": {"autotp_size": 2}, "autotuning": {"mp_size": 4}}, world_size=8)
    with pytest.raises(ValueError, match="tensor-parallel degree 2"):
        parse_ds_config({"tensor_parallel": {"autotp_size": 2}}, world_size=3)


@pytest.mark.parametrize("stage", ["2", "2.0", 2.0])
def test_a_zero_stage_written_as_text_runs_as_deepspeed_runs_it(stage: object) -> None:
    # DeepSpeed validates zero_optimization with pydantic (runtime/zero/config.py DeepSpeedZeroConfig), whose lax
    # mode runs "stage": "2" as stage 2; zerotune had refused it ("must be a whole number")
    from zerotune.predictor.space import space_from_ds_config
    doc = {"train_micro_batch_size_per_gpu": 2,
           "zero_optimization": {"stage": stage, "reduce_bucket_size": "500000000"}}
    cfg = parse_ds_config(doc, world_size=2)
    assert cfg.zero.stage == 2 and cfg.zero.reduce_bucket_size_elems == 500_000_000
    assert {v.zero.stage for v in space_from_ds_config(doc, world_size=2, explore=()).variants} == {2}
    deepspeed_config = pytest.importorskip("deepspeed.runtime.zero.config")
    assert int(deepspeed_config.DeepSpeedZeroConfig(stage=stage).stage) == 2
    with pytest.raises(ValueError, match="zero_optimization.stage must be a whole number, got 'two'"):
        parse_ds_config({"zero_optimization": {"stage": "two"}}, world_size=2)
    with pytest.raises(ValueError, match="train_micro_batch_size_per_gpu must be a whole number"):
        parse_ds_config({"train_micro_batch_size_per_gpu": "2"}, world_size=2)  # DeepSpeed does its sums with it
