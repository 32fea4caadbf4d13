"""What a user's own script needs from its ds_config, checked before anything runs (no DeepSpeed launched)."""

from __future__ import annotations

import pytest

from zerotune.validate.experiments import check_arg_mappings


def test_a_trainer_config_gets_the_trainer_flag_for_each_auto_batch_key() -> None:
    """The Hugging Face Trainer fills "auto" from --per_device_train_batch_size and --gradient_accumulation_steps
    (transformers integrations/deepspeed.py trainer_config_process); the error names the flag to map."""
    micro_mapped = {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"}
    with pytest.raises(ValueError, match='"gradient_accumulation_steps": "--gradient_accumulation_steps"'):
        check_arg_mappings({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"},
                           ["--per_device_train_batch_size", "8"], micro_mapped)
    check_arg_mappings({"gradient_accumulation_steps": "auto"}, [],
                       {**micro_mapped, "gradient_accumulation_steps": "--gradient_accumulation_steps"})
