"""What a user's own script needs from its ds_config, checked before anything runs (no DeepSpeed launched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zerotune.validate.experiments import check_arg_mappings

USER_SCRIPTS = Path(__file__).resolve().parent / "fixtures" / "scripts"


def test_a_trainer_config_gets_the_trainer_flag_for_each_auto_batch_key() -> None:
    """The Hugging Face Trainer fills "auto" from --per_device_train_batch_size and --gradient_accumulation_steps
    (transformers integrations/deepspeed.py trainer_config_process); the error names the flag to map."""
    micro_mapped = {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"}
    with pytest.raises(ValueError, match='"gradient_accumulation_steps": "--gradient_accumulation_steps"'):
        check_arg_mappings({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"},
                           ["--per_device_train_batch_size", "8"], micro_mapped)
    check_arg_mappings({"gradient_accumulation_steps": "auto"}, [],
                       {**micro_mapped, "gradient_accumulation_steps": "--gradient_accumulation_steps"})


def test_a_trainer_command_with_auto_batch_keys_is_mapped_to_the_trainers_own_flags() -> None:
    """A Trainer command (it passes --per_device_train_batch_size) with "auto" batch keys and no arg_mappings: the
    Trainer refuses a ds_config number that differs from its flags, so those flags are the only ones to rewrite;
    they are added (and said), the user's other autotuning keys kept. Any other script still has to say which
    flag it reads."""
    from zerotune.validate.experiments import rewrite_args, trainer_arg_mappings
    doc = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "autotuning": {"enabled": True, "end_profile_step": 4}}
    args = ["--output_dir", "out", "--per_device_train_batch_size=4"]
    mapped, added = trainer_arg_mappings(doc, args)
    assert added == ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    assert mapped["autotuning"]["end_profile_step"] == 4
    check_arg_mappings(mapped, args, mapped["autotuning"]["arg_mappings"])
    assert rewrite_args(args, mapped["autotuning"]["arg_mappings"],
                        {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2}) == \
        ("--output_dir", "out", "--per_device_train_batch_size=16", "--gradient_accumulation_steps", "2")
    assert trainer_arg_mappings(doc, ["--batch_size", "4"]) == (doc, ())  # not a Trainer: nothing guessed
    # a Trainer script given without its batch flag (TrainingArguments defaults it to 8): its source says so, and the
    # flag is appended to each experiment's command
    trainer, loop = USER_SCRIPTS / "gru_classifier_trainer.py", USER_SCRIPTS / "encoder_mlm.py"
    mapped, added = trainer_arg_mappings(doc, ["--output_dir", "out"], trainer)
    assert added == ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    assert trainer_arg_mappings(doc, ["--output_dir", "out"], loop) == (doc, ())
    with pytest.raises(ValueError, match="arg_mappings has no train_micro_batch_size_per_gpu"):
        check_arg_mappings(doc, ["--batch_size", "4"], None)
