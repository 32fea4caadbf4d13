"""The jobs of the head-to-head: a model, a sequence length and the user's ds_config, as both tuners get them.

Each job is the ds_config a DeepSpeed autotuning user would write (zero stages as a list, a cap on the
micro-batch, the autotuning section); `deepspeed --autotuning tune` and `zerotune tune` read the very same
file. The grid that scores both choices is stages x powers of two up to that cap, gradient accumulation 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from zerotune.predictor.rank import Metric

__all__ = ["BenchJob", "JOBS", "QUICK_JOB", "FULL_JOBS", "UNCALIBRATED_JOB", "SCRIPT_JOBS", "GPU_JOB", "GPU01_JOB",
           "user_ds_config", "script_args", "workload", "grid_points", "job_by_name"]

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "ds_workload.py"
MODELS = HERE / "models"
USER_SCRIPTS = HERE.parent / "tests" / "fixtures" / "scripts"


@dataclass(frozen=True)
class BenchJob:
    name: str
    model: str
    """Catalog name or model YAML path, as the workload's and zerotune's --model take it."""
    seq_len: int
    stages: tuple[int, ...]
    """zero_optimization.stage as a list: the stages both tuners may choose from."""
    max_micro_batch: int
    """autotuning.max_train_micro_batch_size_per_gpu; also the largest micro-batch of the grid."""
    num_tuning_micro_batch_sizes: int = 3
    metric: Metric = "throughput"
    measured_steps: int = 4
    """Optimizer steps the workload times (after warm-up) in A/B and grid runs."""
    warmup_steps: int = 2
    num_gpus: int = 2
    hardware: str = "cpu"
    """zerotune's --hardware (a data/hardware name): "cpu" runs on DeepSpeed's CPU accelerator, any other on the
    GPUs DeepSpeed detects."""
    shows: str = ""
    """What the job demonstrates, one line for the report."""
    extra_zero: dict[str, Any] = field(default_factory=dict)
    """More zero_optimization keys of the user's (DeepSpeed's autotuner drops them; zerotune keeps them)."""
    zerotune_profile: str | None = None
    """zerotune tune's --profile (None: the one it finds, the shipped CPU profile; "none": uncalibrated)."""
    script: str | None = None
    """A user's training script run in place of the built-in workload (model and seq_len then only name the
    job: the script builds its own model, and no grid is scored); None: benchmarks/ds_workload.py."""
    script_flags: tuple[str, ...] = ()
    """The user script's own arguments besides the config and --steps."""
    arg_mappings: dict[str, str] = field(default_factory=dict)
    """autotuning.arg_mappings: ds_config keys the script takes as its own arguments (both tuners rewrite them)."""
    extra_config: dict[str, Any] = field(default_factory=dict)
    """More top-level ds_config sections of the user's (an `optimizer` section for a script that lets DeepSpeed
    build its optimizer)."""


def user_ds_config(job: BenchJob) -> dict[str, Any]:
    """The ds_config both tuners read. Profile steps 2-4: the engine measures steps 3 and 4 and exits."""
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": list(job.stages), **job.extra_zero},
        "autotuning": {
            "enabled": True, "fast": True, "metric": job.metric, "results_dir": "autotuning_results",
            "exps_dir": "autotuning_exps", "overwrite": True, "start_profile_step": job.warmup_steps,
            "end_profile_step": job.warmup_steps + job.measured_steps,
            "max_train_micro_batch_size_per_gpu": job.max_micro_batch,
            "num_tuning_micro_batch_sizes": job.num_tuning_micro_batch_sizes,
            **({"arg_mappings": dict(job.arg_mappings)} if job.arg_mappings else {}),
        },
        **job.extra_config,
    }


def workload(job: BenchJob) -> Path:
    """The script both tuners launch: the user's, or the built-in workload."""
    return Path(job.script) if job.script else WORKLOAD


def script_args(job: BenchJob, for_tuner: bool) -> tuple[str, ...]:
    """The workload's own arguments. Under a tuner the engine stops at end_profile_step, so the workload is
    given one step more than that, and it never ends (or writes its metrics) before DeepSpeed's exit."""
    steps = job.measured_steps + (1 if for_tuner else 0)
    if job.script:  # a user's script counts every step itself: warm-up and the timed window, one more under a tuner
        return (*job.script_flags, "--steps", str(job.warmup_steps + steps))
    return ("--model", job.model, "--seq_len", str(job.seq_len), "--steps", str(steps),
            "--warmup", str(job.warmup_steps))


def grid_points(job: BenchJob) -> list[tuple[int, int]]:
    """(stage, micro-batch) of the exhaustive grid: every listed stage x 1, 2, 4 ... max_micro_batch."""
    micro, sizes = 1, []
    while micro <= job.max_micro_batch:
        sizes.append(micro)
        micro *= 2
    return [(stage, mbs) for stage in job.stages for mbs in sizes]


QUICK_JOB = BenchJob(
    name="quick", model=str(MODELS / "zt-gpt-tiny.yaml"), seq_len=32, stages=(0,), max_micro_batch=2,
    num_tuning_micro_batch_sizes=2, measured_steps=2, warmup_steps=1,
    shows="CI smoke run: tiny model, ZeRO-0, 2 micro-batch sizes, fewest steps")
BUILTIN_JOB = BenchJob(
    name="builtin", model="zt-gpt-small", seq_len=128, stages=(0, 1, 2, 3), max_micro_batch=8,
    shows="the built-in example (calibrate/workload.py, data/models/zt-gpt-small.yaml)")
WIDE_JOB = BenchJob(
    name="wide", model=str(MODELS / "zt-gpt-wide.yaml"), seq_len=64, stages=(0, 1, 2), max_micro_batch=8,
    extra_zero={"reduce_bucket_size": 20_000_000, "allgather_bucket_size": 20_000_000},
    shows="a wide, shallow model (communication and optimizer step weigh more than the FLOPs) whose user "
          "sets smaller buckets: DeepSpeed's autotuner replaces the user's zero_optimization with the stage "
          "alone (autotuner.py run_tuning_micro_batch_sizes), zerotune keeps it")
LATENCY_JOB = BenchJob(
    name="latency", model="zt-gpt-small", seq_len=128, stages=(0, 1), max_micro_batch=8, metric="latency",
    shows="metric latency: DeepSpeed's autotuner keeps the largest latency; zerotune minimises it")
UNCALIBRATED_JOB = BenchJob(
    name="uncalibrated", model="zt-gpt-small", seq_len=128, stages=(0, 1, 2, 3), max_micro_batch=8,
    zerotune_profile="none",
    shows="the built-in job with zerotune given no calibration profile (--profile none: default efficiencies, "
          "the uncalibrated band), as a user who never ran zerotune calibrate")
ENCODER_JOB = BenchJob(
    name="encoder", model="encoder_mlm (4 x 384, vocabulary 8192)", seq_len=128, stages=(0, 1, 2, 3),
    max_micro_batch=32, script=str(USER_SCRIPTS / "encoder_mlm.py"), script_flags=("--deepspeed",),
    shows="a user's BERT-style masked-LM script written as DeepSpeedExamples' are (--deepspeed --deepspeed_config, "
          "data through deepspeed.initialize); zerotune learns the model from its profiling run")
DECODER_JOB = BenchJob(
    name="decoder", model="decoder_lm (6 x 256, vocabulary 6000)", seq_len=96, stages=(0, 1, 2, 3),
    max_micro_batch=32, script=str(USER_SCRIPTS / "decoder_lm.py"),
    arg_mappings={"train_micro_batch_size_per_gpu": "--batch_size"},
    shows="a user's Llama-style decoder script that takes its micro-batch as its own --batch_size "
          "(autotuning.arg_mappings)")
VIT_JOB = BenchJob(
    name="vit", model="vit_classifier (6 x 256, 65 patches, no vocabulary)", seq_len=65, stages=(0, 1, 2, 3),
    max_micro_batch=64, script=str(USER_SCRIPTS / "vit_classifier.py"), script_flags=("--deepspeed",),
    shows="a user's ViT image classifier in DeepSpeedExamples' CIFAR style: no token embedding, so zerotune reads "
          "the width from its blocks and the sequence from the first block's input")
HF_LOOP_JOB = BenchJob(
    name="hfloop", model="hf_causal_lm_loop (Llama-style 6 x 512, vocabulary 12000)", seq_len=256,
    stages=(0, 1, 2, 3), max_micro_batch=16, script=str(USER_SCRIPTS / "hf_causal_lm_loop.py"),
    script_flags=("--deepspeed",),
    shows="a Hugging Face model in a plain DeepSpeed loop (own DataLoader sized from the engine's micro-batch), "
          "grouped K/V and an untied head; needs transformers")
CNN_JOB = BenchJob(
    name="cnn", model="cnn_classifier (4 convolutions, 3 linears, 5.4M parameters, no transformer)", seq_len=0,
    stages=(0, 1, 2, 3), max_micro_batch=64, script=str(USER_SCRIPTS / "cnn_classifier.py"),
    script_flags=("--deepspeed",),
    extra_config={"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}},
    shows="a user's CNN in DeepSpeedExamples' CIFAR style (optimizer from the ds_config): no transformer block to "
          "read, so zerotune describes it by a stand-in of its measured costs")
ALBERT_JOB = BenchJob(
    name="albert", model="albert_mlm_loop (8 passes of one 512-wide block, embedding 128, vocabulary 8000)",
    seq_len=128, stages=(0, 1, 2, 3), max_micro_batch=32, script=str(USER_SCRIPTS / "albert_mlm_loop.py"),
    script_flags=("--deepspeed",),
    extra_config={"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}},
    shows="ALBERT's masked LM in DeepSpeedExamples' BERT style (optimizer from the ds_config): eight layers that run "
          "one block's weights, which the profiling run reads from the model's config and the block's calls")
MLP_JOB = BenchJob(
    name="mlp", model="mlp_regression (6 residual MLP blocks 256 -> 1024, feature vectors, no tokens)", seq_len=0,
    stages=(0, 1, 2, 3), max_micro_batch=128, script=str(USER_SCRIPTS / "mlp_regression.py"),
    script_flags=("--deepspeed",),
    extra_config={"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}},
    shows="a user's residual MLP over feature vectors in DeepSpeedExamples' style (optimizer from the ds_config): "
          "repeated blocks without attention and no sequence, described by a stand-in of their measured costs")
NANOGPT_JOB = BenchJob(
    name="nanogpt", model="nanogpt_loop (5 x 384, 6 heads, vocabulary 7000, tied)", seq_len=192, stages=(0, 1, 2, 3),
    max_micro_batch=32, script=str(USER_SCRIPTS / "nanogpt_loop.py"), script_flags=("--deepspeed",),
    shows="a nanoGPT-style decoder written from scratch (fused c_attn, causal SDPA, client AdamW)")
GPU_JOB = BenchJob(
    name="gpu", model="qwen2_loop (16 x 1024, 16 heads sharing 4 K/V heads, vocabulary 32000)", seq_len=1024,
    stages=(0, 1, 2, 3), max_micro_batch=32, num_gpus=1, hardware="h200", script=str(USER_SCRIPTS / "qwen2_loop.py"),
    script_flags=("--deepspeed",), extra_config={"bf16": {"enabled": True}},
    shows="one GPU: a user's Qwen2-style bf16 script in a plain DeepSpeed loop (client AdamW, its own DataLoader), "
          "zerotune uncalibrated (no profile ships for the GPU); --hardware names another catalog GPU")
GPU01_JOB = replace(
    GPU_JOB, name="gpu01", stages=(0, 1),
    shows="the gpu job with stages [0, 1]: a head to head that fits one session's 15 minutes of device time (on "
          "2026-11-27 DeepSpeed's autotuner took 25-33 s a run and had not left stage 1 after 230 s)")
FULL_JOBS = (BUILTIN_JOB, WIDE_JOB, LATENCY_JOB, UNCALIBRATED_JOB)
SCRIPT_JOBS = (ENCODER_JOB, DECODER_JOB, VIT_JOB, HF_LOOP_JOB, CNN_JOB, ALBERT_JOB, MLP_JOB, NANOGPT_JOB)
JOBS = {job.name: job for job in (QUICK_JOB, *FULL_JOBS, *SCRIPT_JOBS, GPU_JOB, GPU01_JOB)}


def job_by_name(name: str) -> BenchJob:
    if name not in JOBS:
        raise ValueError(f"--jobs {name!r}: no such job; choose from {', '.join(JOBS)}")
    return JOBS[name]
