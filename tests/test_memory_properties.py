"""Properties a DeepSpeed user relies on when reading a memory prediction (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from zerotune.predictor import DSConfig, ZeroConfig, estimate_memory, list_models
from zerotune.predictor.dsconfig import ActivationCheckpointing, OffloadConfig
from zerotune.predictor.memory import model_states
from tests.conftest import make_job

jobs = st.builds(make_job, model=st.sampled_from(list_models()), hardware=st.just("a100-80gb"),
                 num_nodes=st.integers(1, 4), num_gpus=st.integers(1, 8), seq_len=st.sampled_from([128, 256, 512]))
configs = st.builds(
    DSConfig, train_micro_batch_size_per_gpu=st.integers(1, 16), gradient_accumulation_steps=st.integers(1, 4),
    precision=st.sampled_from(["fp32", "fp16", "bf16"]),
    zero=st.builds(ZeroConfig, stage=st.sampled_from([0, 1, 2, 3]), overlap_comm=st.booleans(),
                   reduce_bucket_size_elems=st.sampled_from([10**6, 5 * 10**7, 5 * 10**8])),
    activation_checkpointing=st.builds(ActivationCheckpointing, enabled=st.booleans()))


def _states(job, cfg) -> float:
    s = model_states(job, cfg)
    return s.parameters + s.gradients + s.optimizer_states + s.master_gradients


@settings(max_examples=150, deadline=None)
@given(jobs, configs)
def test_model_states_never_grow_with_a_higher_stage(job, cfg) -> None:
    if cfg.precision == "fp32" and job.cluster.world_size == 1:
        cfg = cfg.replace(precision="bf16")  # the one exception: see test_fp32_zero_on_one_gpu_adds_a_copy
    per_stage = [_states(job, cfg.replace_zero(stage=s)) for s in range(4)]
    assert all(a >= b for a, b in zip(per_stage, per_stage[1:]))


@settings(max_examples=150, deadline=None)
@given(jobs, configs)
def test_peak_never_grows_from_stage_1_to_stage_2(job, cfg) -> None:
    # Same buckets, gradients partitioned: the peak cannot rise. (Stage 3 can cost more than 2 when
    # gathered parameters outweigh what partitioning saves, e.g. on one GPU; see test_memory.py.)
    one = estimate_memory(job, cfg.replace_zero(stage=1)).total_bytes
    two = estimate_memory(job, cfg.replace_zero(stage=2)).total_bytes
    assert two <= one


@settings(max_examples=150, deadline=None)
@given(jobs, configs)
def test_peak_grows_with_micro_batch(job, cfg) -> None:
    small = estimate_memory(job, cfg)
    large = estimate_memory(job, cfg.replace(train_micro_batch_size_per_gpu=cfg.train_micro_batch_size_per_gpu + 1))
    # Activations grow; the peak may sit in the optimizer step, where they are already freed.
    assert large.phase_totals_bytes["forward_backward"] > small.phase_totals_bytes["forward_backward"]
    assert large.total_bytes >= small.total_bytes


@settings(max_examples=150, deadline=None)
@given(jobs, configs, st.sampled_from(["cpu", "nvme"]))
def test_offload_never_adds_device_memory(job, cfg, device) -> None:
    cfg = cfg.replace_zero(stage=max(cfg.zero.stage, 1))
    off = cfg.replace_zero(offload_optimizer=OffloadConfig(device=device))
    assert estimate_memory(job, off).total_bytes <= estimate_memory(job, cfg).total_bytes
    if cfg.zero.stage == 3:
        both = off.replace_zero(offload_param=OffloadConfig(device=device))
        assert estimate_memory(job, both).total_bytes <= estimate_memory(job, off).total_bytes


@settings(max_examples=150, deadline=None)
@given(jobs, configs)
def test_activation_checkpointing_never_adds_memory(job, cfg) -> None:
    plain = cfg.replace(activation_checkpointing=ActivationCheckpointing(False))
    ckpt = cfg.replace(activation_checkpointing=ActivationCheckpointing(True))
    assert estimate_memory(job, ckpt).total_bytes <= estimate_memory(job, plain).total_bytes


def test_fp32_zero_on_one_gpu_adds_a_copy() -> None:
    # DeepSpeed's ZeRO optimizers clone an fp32 partition of the parameters even in fp32 training
    # (stage_1_and_2.py single_partition_of_fp32_groups), so with nothing to partition across ZeRO-1 costs
    # 4 + 4 bytes per parameter more than plain data parallelism.
    job = make_job("gpt2", num_gpus=1)
    zero0, zero1 = (_states(job, DSConfig(precision="fp32", zero=ZeroConfig(stage=s))) for s in (0, 1))
    assert zero1 - zero0 == 8 * job.model.num_params
