"""A published measurement row as zerotune sees it: the rows of data/measurements/published/*.jsonl (schema in
that folder's README.md) read and checked, split into a fitting and a test half by model (never by row), and each
turned into a (Job, DSConfig) Case, or a Skip with the reason zerotune cannot express it; and the runtime it ran
under (framework_efficiency). zerotune.validate.accuracy scores the cases; benchmarks.replay and
zerotune.validate.fewshot replay and fit them.

Filled gaps: a null precision becomes fp16 only where the GPU's fp16 and bf16 peaks are equal (the prediction is
then the same for both); a null zero_stage is 0 (Megatron's data-parallel all-reduce, which the vTrain notes name)
and a null offload is none; a model whose dimensions match a catalog entry (Llama 3.1 = Llama 3) takes that
entry's architecture, else a GPT-style ModelSpec with num_kv_heads = num_heads and learned positions of seq_len
rows. Rows zerotune cannot express are skipped with their reason: fp8, sequence parallelism, selective recompute,
missing fields."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Sequence

from zerotune.predictor import ClusterSpec, DSConfig, Efficiency, Job, ModelSpec, load_hardware
from zerotune.predictor.catalog import data_dir, list_hardware, list_models, load_model
from zerotune.predictor.dsconfig import ActivationCheckpointing, ZeroConfig
from zerotune.predictor.hardware import HardwareSpec, Precision
from zerotune.predictor.zero_mechanics import wrapper_bytes_per_param

__all__ = ["Half", "DEFAULT_DATA_DIR", "SPEED_METRICS", "RUN_METRICS", "MEMORY_PARTS", "ROW_KEYS", "MODEL_DIMS",
           "Skip", "Case", "model_spec", "row_case", "read_rows", "model_half", "split_rows",
           "MEGATRON_WRAPPER_BYTES_PER_PARAM", "framework_efficiency", "hardware", "precision_of"]

Half = Literal["fit", "test"]
DEFAULT_DATA_DIR = data_dir() / "measurements" / "published"
SPEED_METRICS = ("step_time_s", "throughput_samples_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu")
"""Time metrics in order of preference: the first a row has is the one scored."""
RUN_METRICS = frozenset(SPEED_METRICS) | {"peak_memory_bytes"}
"""Metrics that only a run that trained can have: a row with one of them fitted in memory."""
MEMORY_PARTS = {"model_state_memory_bytes": ("parameters", "gradients", "optimizer_states", "master_gradients"),
                "activation_memory_bytes": ("activations",)}
"""Korthikanti Fig. 1 parts and the memory breakdown terms they count (their 'parameters + optimizer state'
bar; activations of the transformer blocks, without the logits)."""
ROW_KEYS = frozenset({"source", "value_quality", "model", "hardware", "num_gpus_total", "num_gpus_per_node",
                      "parallel", "batch", "precision", "recompute", "framework", "metrics", "notes"})
MEGATRON_VOCAB_DIVISIBLE_BY = 128
"""Megatron-LM's --make-vocab-size-divisible-by default (megatron/arguments.py), times the tensor-parallel degree."""
MODEL_DIMS = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size")


@dataclass(frozen=True)
class Skip:
    row_id: str
    reason: str


@dataclass(frozen=True)
class Case:
    """A published row as zerotune sees it."""

    row_id: str
    row: dict[str, Any]
    job: Job
    config: DSConfig


@lru_cache(maxsize=None)
def hardware(name: str) -> HardwareSpec:
    return load_hardware(name)


@lru_cache(maxsize=None)
def _catalog_by_dims() -> dict[tuple[int, ...], ModelSpec]:
    models = [load_model(name) for name in list_models()]
    return {tuple(getattr(m, d) for d in MODEL_DIMS): m for m in models}


def _same_family(name: str, dims: tuple[int, ...]) -> ModelSpec | None:
    """A catalog model the row's name starts with and whose blocks match, with the row's vocabulary
    (bert-base-cased is the catalog's bert-base with a 28,996-token vocabulary)."""
    for model in (load_model(n) for n in list_models() if name.startswith(n)):
        if tuple(getattr(model, d) for d in MODEL_DIMS[:-1]) == dims[:-1]:
            return model.replace(vocab_size=dims[-1], name=name)
    return None


def model_spec(fields: dict[str, Any], seq_len: int, source: str, framework: str = "") -> ModelSpec | str:
    """The catalog model with the row's dimensions, else a GPT-style ModelSpec; a str says what is missing.
    A Megatron row runs Megatron's own GPT whatever its dimensions match: the catalog's entries are the Hugging
    Face implementations (GPT-2's eight-kernel gelu_new, GPT-Neo without dropout), which Megatron does not run."""
    missing = [d for d in MODEL_DIMS if not fields.get(d)]
    if missing:
        return f"model {', '.join(missing)} not given (source gives a nominal size only)"
    dims = tuple(int(fields[d]) for d in MODEL_DIMS)
    known = None if framework.startswith("Megatron") else (
        _catalog_by_dims().get(dims) or _same_family(str(fields.get("name") or ""), dims))
    if known is not None:
        return known if known.position_embedding != "learned" or seq_len <= known.max_position_embeddings \
            else known.replace(max_position_embeddings=seq_len)
    layers, hidden, heads, ffn, vocab = dims
    name = str(fields.get("name") or "unnamed")
    # MPT adds ALiBi biases to the scores and has no position table (mosaicml/mpt-7b config.json attn_config
    # "alibi": true; llm-foundry's pretraining yamls likewise)
    positions = "none" if name.upper().startswith("MPT-") else "learned"
    spec = ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=heads,
                     ffn_hidden_size=ffn, vocab_size=vocab, max_position_embeddings=seq_len,
                     position_embedding=positions, source=source)
    if framework.startswith("Megatron"):
        # Megatron pads the vocabulary to 128 x the tensor-parallel degree (--make-vocab-size-divisible-by 128,
        # megatron/tokenizer/tokenizer.py _vocab_size_with_padding); the rows keep the size the source gives
        spec = spec.replace(vocab_padding_multiple=MEGATRON_VOCAB_DIVISIBLE_BY)
    if "llm-foundry" in framework:
        # llm-foundry's MPT trains without dropout (llmfoundry/models/mpt/configuration_mpt.py: resid_pdrop and
        # emb_pdrop 0.0; utils/config_defaults.py attn_pdrop 0.0; the benchmark yamls set none) and takes its
        # loss from flash-attn's fused cross-entropy (modeling_mpt.py ComposerMPTCausalLM loss_fn default
        # 'fused_crossentropy'), at llm-foundry@8c8dd48f7, the benchmark tables' commit
        spec = spec.replace(dropout=False, cross_entropy="fused")
    return spec


def _unsupported(row: dict[str, Any]) -> str | None:
    """Why zerotune cannot express the row's setup, or None."""
    par, metrics = row["parallel"], row["metrics"]
    if not set(metrics) & (RUN_METRICS | set(MEMORY_PARTS)):
        return f"only extension metrics ({', '.join(sorted(metrics))}), which this scorer does not compare"
    if row["hardware"] not in list_hardware():
        return f"hardware {row['hardware']!r} not in the catalog"
    if par["pp"] is None or par["tp"] is None:
        return "parallel layout (tp / pp) not given"
    if par["sequence_parallel"]:
        return "sequence parallelism not modelled"
    if row["recompute"] not in ("full", "none"):
        return (f"recompute {row['recompute']!r} not modelled (zerotune has full or none)" if row["recompute"]
                else "recompute not given")
    if row["precision"] == "fp8":
        return "fp8 not modelled (the catalog has fp32 / fp16 / bf16 peaks)"
    if par["offload"] not in (None, "none"):
        return f"offload {par['offload']!r} not described precisely enough to model"
    return None


def precision_of(row: dict[str, Any], hw: HardwareSpec) -> str | None:
    if row["precision"] is not None:
        return row["precision"] if hw.supports(row["precision"]) else None
    same = hw.supports("fp16") and hw.peak_flops["fp16"] == hw.peak_flops.get("bf16")
    return "fp16" if same else None


def _batch(row: dict[str, Any]) -> tuple[int, int] | str:
    """(micro-batch, grad-accum); grad-accum derived from the global batch when null."""
    b, dp = row["batch"], row["parallel"]["dp"]
    missing = [key for key in ("micro_batch", "seq_len") if not b[key]]
    if missing:
        return f"batch {' and '.join(missing)} not given"
    gas = b["grad_accum"]
    if gas is None and b["global_batch"] and dp:
        gas, rest = divmod(b["global_batch"], b["micro_batch"] * dp)
        gas = gas if not rest else None
    return (int(b["micro_batch"]), int(gas)) if gas else "batch grad_accum not given nor derivable"


def _cluster(row: dict[str, Any], hw: HardwareSpec) -> ClusterSpec | str:
    total, per_node, par = row["num_gpus_total"], row["num_gpus_per_node"], row["parallel"]
    if par["dp"] is None or par["dp"] * par["tp"] * par["pp"] != total:
        return (f"dp {par['dp']} x tp {par['tp']} x pp {par['pp']} != num_gpus_total {total} "
                f"(another parallel dimension)")
    per_node = min(per_node or hw.num_devices_per_node, total)
    if total % per_node:
        return f"num_gpus_total {total} is not a multiple of num_gpus_per_node {per_node}"
    return ClusterSpec(hw, total // per_node, per_node)


def _grad_accum_dtype(row: dict[str, Any], precision: Precision) -> Precision | None:
    """The gradient accumulation dtype a row's DeepSpeed ran with, in DeepSpeed 0.19's terms. BigScience's Megatron-
    DeepSpeed fork trained bf16 under pipeline parallelism with DeepSpeed's BF16_Optimizer (2022), which partitions
    the fp32 master weights and optimizer states over data parallelism and accumulates gradients in an fp32 buffer of
    the whole stage: fp32 was its only accumulation dtype until DeepSpeed PR #4713 (2023-11) made bf16 an option,
    and it ran whatever zero_optimization.stage said (DeepSpeed PR #2566, 2022-12: "bf16_optimizer is activated with
    zero_stage=0 even though it provides optimizer state partitioning"). DeepSpeed 0.19 picks the same optimizer for
    bf16, ZeRO stage 1 and data_types.grad_accum_dtype fp32 (engine.py:2305-2310). Other rows: the model's dtype."""
    if precision == "bf16" and "bigscience" in str(row.get("framework") or "").lower():
        return "fp32"
    return None


def row_case(row: dict[str, Any], row_id: str) -> Case | Skip:
    """The row as (Job, DSConfig), or why zerotune cannot express it."""
    reason = _unsupported(row)
    if reason:
        return Skip(row_id, reason)
    hw = hardware(row["hardware"])
    precision = precision_of(row, hw)
    batch, cluster = _batch(row), _cluster(row, hw)
    if precision is None:
        return Skip(row_id, f"precision {row['precision']!r} not given or not supported by {hw.name}")
    for problem in (batch, cluster):
        if isinstance(problem, str):
            return Skip(row_id, problem)
    model = model_spec(row["model"], row["batch"]["seq_len"], row["source"], str(row["framework"]))
    if isinstance(model, str):
        return Skip(row_id, model)
    if "flash attention" in str(row.get("notes", "")).lower():
        model = dataclasses.replace(model, attention="flash")  # the source says so; eager otherwise
    micro, gas = batch  # type: ignore[misc]
    cfg = DSConfig(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas, precision=precision,
                   grad_accum_dtype=_grad_accum_dtype(row, precision),
                   zero=ZeroConfig(stage=row["parallel"]["zero_stage"] or 0),
                   activation_checkpointing=ActivationCheckpointing(enabled=row["recompute"] == "full"),
                   mp_size=row["parallel"]["tp"], pp_size=row["parallel"]["pp"])
    try:
        return Case(row_id, row, Job(model, cluster, int(row["batch"]["seq_len"])), cfg)  # type: ignore[arg-type]
    except ValueError as exc:
        return Skip(row_id, str(exc))


MEGATRON_WRAPPER_BYTES_PER_PARAM = 4 + 8 + 6
"""Memory traffic per parameter of Megatron's mixed-precision optimizer around the Adam update
(Megatron-DeepSpeed megatron/optimizer/optimizer.py Float16OptimizerWithFloat16Params.step): the gradient norm
(read 4), the fused unscale and inf/nan check (read 4, write 4) and the copy of the fp32 main parameters back
into the 16-bit ones (read 4, write 2). The gradients already sit in fp32 main_grad buffers, where Megatron's
DistributedDataParallel accumulates them (megatron/model/distributed.py), and the multi-tensor kernels work on
lists of tensors, so there is no cast to fp32 and no flattening, unlike DeepSpeed's FP16_Optimizer
(zero_mechanics.wrapper_bytes_per_param)."""


def framework_efficiency(row: dict[str, Any], eff: Efficiency, config: DSConfig | None = None) -> Efficiency:
    """The runtime a row ran under. PyTorch FSDP shards like ZeRO-3 but gathers one flat parameter per wrapped
    block in C++ (torch/distributed/fsdp/_flat_param.py), with none of DeepSpeed's per-module Python hooks,
    per-tensor fetches or per-tensor gradient hooks (predictor/zero_mechanics.py), so those costs are not
    charged to FSDP rows. A Megatron row without a ZeRO stage runs Megatron's own data-parallel all-reduce and
    mixed-precision optimizer (Float16OptimizerWithFloat16Params), whose inf/nan test is one multi-tensor
    kernel and one all-reduce of a flag (megatron/optimizer/optimizer.py _unscale_main_grads_and_check_for_nan:
    torch._amp_foreach_non_finite_check_and_unscale_), not DeepSpeed FP16_Optimizer's synchronising test of
    every gradient (runtime/utils.py:291-295), so that per-tensor cost is not charged either, nor the per-tensor walk
    of DeepSpeed's wrappers (Efficiency.optimizer_tensor_s; FSDP neither); given the row's
    configuration, its optimizer moves MEGATRON_WRAPPER_BYTES_PER_PARAM around Adam instead of DeepSpeed's
    wrapper's bytes (the difference comes off optimizer_bytes_per_param, the one knob the step model reads)."""
    framework = str(row.get("framework") or "").lower()
    if framework.startswith("megatron"):
        # Megatron's fused kernels (megatron/model/fused_softmax.py, fused_bias_gelu.py, fused_layer_norm.py) run
        # the memory-bound work at a copy's pace, not at eager PyTorch's share of it (HardwareSpec.eager_bandwidth_share)
        share = load_hardware(str(row["hardware"])).eager_bandwidth_share
        eff = dataclasses.replace(eff, memory_bandwidth_efficiency=eff.memory_bandwidth_efficiency / share)
    if framework.startswith("megatron") and row["parallel"]["zero_stage"] is None:
        saved = 0.0
        if config is not None and config.precision != "fp32":
            saved = max(0.0, wrapper_bytes_per_param(config) - MEGATRON_WRAPPER_BYTES_PER_PARAM)
        return dataclasses.replace(eff, tensor_sync_check_s=0.0, optimizer_tensor_s=0.0,
                                   optimizer_bytes_per_param=eff.optimizer_bytes_per_param - saved)
    if "fsdp" not in framework:
        return eff
    return dataclasses.replace(eff, zero3_module_hook_s=0.0, zero3_param_fetch_s=0.0, zero3_gather_s=0.0,
                               grad_hook_s=0.0, optimizer_tensor_s=0.0, zero3_gathers_per_block=1.0)


def read_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(file:line, row) pairs of one published JSONL file, checked against the README's key set."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        row_id = f"{path.name}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{row_id}: not valid JSON ({exc.msg}); fix the line") from None
        if not isinstance(row, dict) or set(row) != ROW_KEYS:
            raise ValueError(f"{row_id}: keys must be exactly {', '.join(sorted(ROW_KEYS))}; see the README")
        rows.append((row_id, row))
    return rows


def model_half(model_names: Sequence[str], name: str) -> Half:
    """'fit' or 'test': a data set's distinct model names, sorted, alternate between the halves (the first
    fits). A model's rows all land in one half, so no model is both fitted and tested on."""
    return "fit" if sorted(set(model_names)).index(name) % 2 == 0 else "test"


def split_rows(rows: Sequence[tuple[str, dict[str, Any]]], half: Half | Literal["all"]
               ) -> list[tuple[str, dict[str, Any]]]:
    """The rows of one data set in `half` ('all' keeps every row), split by model, never by row."""
    if half == "all":
        return list(rows)
    names = [str(row["model"]["name"]) for _, row in rows]
    return [(rid, row) for rid, row in rows if model_half(names, str(row["model"]["name"])) == half]
