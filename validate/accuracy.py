"""How close zerotune's uncalibrated predictions come to published training measurements.

Reads data/measurements/published/*.jsonl (schema in that folder's README.md), turns each row into a
(Job, DSConfig) or a skip reason, predicts it with the default Efficiency, and reports per data set:
  speed      MAPE of throughput. Each row's first metric in SPEED_METRICS is compared in its own unit:
             step_time_s as samples/s (global batch / step time), tokens_per_s_per_gpu as tokens/s per GPU,
             tflops_per_gpu as FLOP/s per GPU counting the recompute forward pass only where the row's notes
             say the source counts it (hardware FLOPs), mfu as model FLOP/s over the dense peak.
  verdicts   a row with a measured run metric trained, so zerotune's memory.fits should say so; the ZeRO
             paper's largest trainable model (max_model_params, no architecture given) is checked by its
             model states alone, the only part the row determines.
  memory     MAPE of peak_memory_bytes against memory.total_bytes, and of Korthikanti's Fig. 1 parts
             (model_state_memory_bytes, activation_memory_bytes) against the matching breakdown terms.
  ranking    rows with the same model, hardware, GPU count, sequence length, precision and global batch
             but different configurations: does zerotune's fastest prediction pick the measured fastest?
Data discipline: each data set's models are split in two halves (model_half); the report covers the test
half unless --half says otherwise, and default constants are chosen on the fit half only.
Rows zerotune cannot express are skipped with their reason (pipeline parallelism is modelled as 1F1B stages
paced by the busiest): fp8, sequence parallelism, selective recompute, missing fields.
Filled gaps: a null precision becomes fp16 only where the GPU's fp16 and bf16 peaks are equal (the
prediction is then the same for both); a null zero_stage is 0 (Megatron's data-parallel all-reduce,
which the vTrain notes name) and a null offload is none; a model whose dimensions match a catalog entry
(Llama 3.1 = Llama 3) takes that entry's architecture, else a GPT-style ModelSpec with num_kv_heads =
num_heads and learned positions of seq_len rows.
"""

from __future__ import annotations

import dataclasses

import argparse
import json
import re
import statistics
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Sequence

from zerotune.predictor import ClusterSpec, DSConfig, Efficiency, Estimate, Job, ModelSpec, estimate, load_hardware
from zerotune.predictor.catalog import data_dir, list_hardware, list_models, load_model
from zerotune.predictor.dsconfig import ActivationCheckpointing, ZeroConfig
from zerotune.predictor.flops import micro_batch_flops
from zerotune.predictor.hardware import HardwareSpec
from zerotune.predictor.memory import model_states, state_bytes
from zerotune.predictor.zero_mechanics import wrapper_bytes_per_param
from zerotune.predictor.units import TERA

__all__ = ["Half", "model_half", "split_rows", "model_spec", "framework_efficiency", "MEGATRON_WRAPPER_BYTES_PER_PARAM", "Case", "Skip", "Comparison", "Verdict", "GroupRanking", "DataSetScore", "row_case", "read_rows",
           "score_rows", "score_dir", "format_markdown", "main", "SPEED_METRICS", "DEFAULT_DATA_DIR"]

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
MODEL_DIMS = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size")
_COUNTS_RECOMPUTE = re.compile(r"counts (the |activation )?recompute")
_EXCLUDES_RECOMPUTE = re.compile(r"excludes recompute")
_CAPACITY_DIFFERS = re.compile(r"memory capacity .*differ")


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


@dataclass(frozen=True)
class Comparison:
    row_id: str
    metric: str
    """What was compared, e.g. 'samples/s (step_time_s)'."""
    measured: float
    predicted: float

    @property
    def abs_pct_error(self) -> float:
        return abs(self.predicted - self.measured) / self.measured * 100.0


@dataclass(frozen=True)
class Verdict:
    row_id: str
    measured_fits: bool
    predicted_fits: bool
    basis: str
    """'full estimate' or 'model states only'."""

    @property
    def agrees(self) -> bool:
        return self.measured_fits == self.predicted_fits


@dataclass(frozen=True)
class GroupRanking:
    """Comparable rows: the measured fastest, zerotune's predicted fastest, and what its pick achieved."""

    row_ids: tuple[str, ...]
    best_measured: str
    best_predicted: str
    picked_best: bool
    """zerotune's first-ranked configuration is the measured best's configuration."""
    pick_share_of_best: float
    """Measured speed of zerotune's pick / the measured best (1.0 when it picked the best)."""


@dataclass(frozen=True)
class DataSetScore:
    name: str
    num_rows: int
    speed: tuple[Comparison, ...]
    memory: tuple[Comparison, ...]
    verdicts: tuple[Verdict, ...]
    rankings: tuple[GroupRanking, ...]
    skipped: tuple[Skip, ...]
    """Rows with nothing scored, with the reason; every other row has a comparison or a verdict."""
    metric_skips: tuple[Skip, ...]
    """Metrics of scored rows that could not be compared, with the reason."""

    @property
    def num_scored(self) -> int:
        return self.num_rows - len(self.skipped)

    @property
    def speed_mape_pct(self) -> float | None:
        return _mape(self.speed)

    def memory_mape_pct(self, metric: str) -> float | None:
        return _mape([c for c in self.memory if c.metric == metric])

    @property
    def verdict_agreement(self) -> float | None:
        return sum(v.agrees for v in self.verdicts) / len(self.verdicts) if self.verdicts else None

    @property
    def ranked_first_share(self) -> float | None:
        return sum(g.picked_best for g in self.rankings) / len(self.rankings) if self.rankings else None


def _mape(comparisons: Sequence[Comparison]) -> float | None:
    return statistics.fmean(c.abs_pct_error for c in comparisons) if comparisons else None


# -- row -> (Job, DSConfig) ------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _hardware(name: str) -> HardwareSpec:
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


def _precision(row: dict[str, Any], hw: HardwareSpec) -> str | None:
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


def row_case(row: dict[str, Any], row_id: str) -> Case | Skip:
    """The row as (Job, DSConfig), or why zerotune cannot express it."""
    reason = _unsupported(row)
    if reason:
        return Skip(row_id, reason)
    hw = _hardware(row["hardware"])
    precision = _precision(row, hw)
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
                   zero=ZeroConfig(stage=row["parallel"]["zero_stage"] or 0),
                   activation_checkpointing=ActivationCheckpointing(enabled=row["recompute"] == "full"),
                   mp_size=row["parallel"]["tp"], pp_size=row["parallel"]["pp"])
    try:
        return Case(row_id, row, Job(model, cluster, int(row["batch"]["seq_len"])), cfg)  # type: ignore[arg-type]
    except ValueError as exc:
        return Skip(row_id, str(exc))


# -- comparisons -----------------------------------------------------------------------------------------

def _hardware_flops_per_gpu(case: Case, est: Estimate) -> float:
    """Model FLOP/s per GPU scaled up by the recompute forward pass, as Megatron's TFLOPs counts it."""
    flops = micro_batch_flops(case.job.model, case.config.train_micro_batch_size_per_gpu, case.job.seq_len,
                              case.config.activation_checkpointing.enabled)
    return est.flops_per_gpu * flops.total_flops / flops.model_flops


def _speed(case: Case, est: Estimate) -> Comparison | Skip:
    """The row's first SPEED_METRICS entry against the prediction in the same unit."""
    metrics, world = case.row["metrics"], case.job.cluster.world_size
    name = next((m for m in SPEED_METRICS if m in metrics), None)
    if name is None:
        return Skip(case.row_id, "no time metric")
    value = metrics[name]
    if name == "step_time_s":
        return Comparison(case.row_id, "samples/s (step_time_s)", est.samples_per_step / value,
                          est.throughput_samples_per_s)
    if name == "throughput_samples_per_s":
        return Comparison(case.row_id, "samples/s", value, est.throughput_samples_per_s)
    if name == "tokens_per_s_per_gpu":
        return Comparison(case.row_id, "tokens/s per GPU", value, est.tokens_per_s / world)
    if name == "mfu":
        return Comparison(case.row_id, "MFU", value, est.mfu)
    if _COUNTS_RECOMPUTE.search(case.row["notes"]):
        return Comparison(case.row_id, "FLOP/s per GPU (hardware, with recompute)", value * TERA,
                          _hardware_flops_per_gpu(case, est))
    if _EXCLUDES_RECOMPUTE.search(case.row["notes"]):
        return Comparison(case.row_id, "FLOP/s per GPU (model)", value * TERA, est.flops_per_gpu)
    return Skip(case.row_id, "tflops_per_gpu: the notes do not say whether it counts recompute")


def _memory(case: Case, est: Estimate) -> list[Comparison]:
    """Peak memory, and Korthikanti's parts: the activations of the peak's breakdown, and the model states as
    the model holds them (the peak phase may hold less of them: gradients are not alive yet at the forward /
    backward turn, predictor/memory.py _gradients_at_turn)."""
    metrics = case.row["metrics"]
    states = model_states(case.job, case.config)
    parts = {**est.memory.breakdown_bytes, "parameters": states.parameters, "gradients": states.gradients,
             "optimizer_states": states.optimizer_states}
    found = []
    if "peak_memory_bytes" in metrics:
        found.append(Comparison(case.row_id, "peak memory", metrics["peak_memory_bytes"], est.memory.total_bytes))
    for name, terms in MEMORY_PARTS.items():
        if name in metrics:
            found.append(Comparison(case.row_id, name, metrics[name], sum(parts.get(t, 0.0) for t in terms)))
    return found


def _verdict(case: Case, est: Estimate) -> Verdict | Skip | None:
    if not set(case.row["metrics"]) & RUN_METRICS:
        return None  # e.g. Korthikanti Fig. 1: memory a configuration needs, not a run that trained
    if _CAPACITY_DIFFERS.search(case.row["notes"]):
        return Skip(case.row_id, "fit verdict: the GPU's memory capacity differs from its catalog entry")
    return Verdict(case.row_id, True, est.memory.fits, "full estimate")


def max_size_verdict(row: dict[str, Any], row_id: str) -> Verdict | Skip:
    """ZeRO Table 2's largest trained model fitted, so its model states (all the row determines) must fit."""
    if row["hardware"] not in list_hardware():
        return Skip(row_id, f"hardware {row['hardware']!r} not in the catalog")
    hw, par = _hardware(row["hardware"]), row["parallel"]
    precision = _precision(row, hw)
    if precision is None or par["tp"] is None or par["zero_stage"] is None:
        return Skip(row_id, "max_model_params: precision, tp or zero_stage not given")
    cfg = DSConfig(precision=precision, zero=ZeroConfig(stage=par["zero_stage"]), mp_size=par["tp"])
    states = state_bytes(row["metrics"]["max_model_params"], row["num_gpus_total"], cfg)
    total = (states.parameters + states.gradients + states.optimizer_states + states.master_gradients
             + hw.runtime_reserved_bytes)
    return Verdict(row_id, True, total <= hw.memory_bytes, "model states only")


# -- data sets -------------------------------------------------------------------------------------------

def _group_key(case: Case, metric: str) -> tuple[Any, ...]:
    m, b = case.job.model, case.row["batch"]
    return (tuple(getattr(m, d) for d in MODEL_DIMS), case.row["hardware"], case.job.cluster.world_size,
            case.job.seq_len, case.config.precision, b["global_batch"], metric)


def rank_groups(cases: Sequence[Case], speeds: Sequence[Comparison]) -> tuple[GroupRanking, ...]:
    """Groups of comparable rows with at least two distinct configurations: predicted vs measured best."""
    groups: dict[tuple[Any, ...], list[tuple[Case, Comparison]]] = {}
    for case, speed in zip(cases, speeds):
        groups.setdefault(_group_key(case, speed.metric), []).append((case, speed))
    rankings = []
    for members in groups.values():
        if len({repr(case.config) for case, _ in members}) < 2:  # DSConfig holds a dict: unhashable
            continue
        best = max(members, key=lambda cs: cs[1].measured)
        pick = max(members, key=lambda cs: cs[1].predicted)
        hit = pick[0].config == best[0].config
        rankings.append(GroupRanking(tuple(c.row_id for c, _ in members), best[0].row_id, pick[0].row_id, hit,
                                     1.0 if hit else pick[1].measured / best[1].measured))
    return tuple(rankings)


@dataclass(frozen=True)
class _RowScore:
    speed: Comparison | None
    memory: tuple[Comparison, ...]
    verdict: Verdict | None
    metric_skips: tuple[Skip, ...]


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
                               grad_hook_s=0.0, optimizer_tensor_s=0.0)


def _score_row(row_id: str, row: dict[str, Any], eff: Efficiency) -> tuple[Case | None, _RowScore] | Skip:
    """Everything one row can be scored on, or why nothing can."""
    if "max_model_params" in row["metrics"]:
        verdict = max_size_verdict(row, row_id)
        return verdict if isinstance(verdict, Skip) else (None, _RowScore(None, (), verdict, ()))
    case = row_case(row, row_id)
    if isinstance(case, Skip):
        return case
    try:
        est = estimate(case.job, case.config, framework_efficiency(row, eff, case.config))
    except ValueError as exc:
        return Skip(row_id, str(exc))
    ran = bool(set(row["metrics"]) & RUN_METRICS)
    speed, verdict = (_speed(case, est), _verdict(case, est)) if ran else (None, None)
    skips = tuple(item for item in (speed, verdict) if isinstance(item, Skip))
    speed = speed if isinstance(speed, Comparison) else None
    verdict = verdict if isinstance(verdict, Verdict) else None
    memory = tuple(_memory(case, est))
    if speed is None and verdict is None and not memory:
        return Skip(row_id, "; ".join(s.reason for s in skips) or "no comparable metric")
    return case, _RowScore(speed, memory, verdict, skips)


def score_rows(name: str, rows: Sequence[tuple[str, dict[str, Any]]], eff: Efficiency = Efficiency()
               ) -> DataSetScore:
    """Score (row_id, row) pairs of one data set."""
    results = [_score_row(row_id, row, eff) for row_id, row in rows]
    scored = [r for r in results if not isinstance(r, Skip)]
    timed = [(case, score.speed) for case, score in scored if case is not None and score.speed is not None]
    return DataSetScore(
        name, len(rows), speed=tuple(speed for _, speed in timed),
        memory=tuple(c for _, score in scored for c in score.memory),
        verdicts=tuple(score.verdict for _, score in scored if score.verdict is not None),
        rankings=rank_groups([case for case, _ in timed], [speed for _, speed in timed]),
        skipped=tuple(r for r in results if isinstance(r, Skip)),
        metric_skips=tuple(s for _, score in scored for s in score.metric_skips))


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


def score_dir(directory: Path = DEFAULT_DATA_DIR, eff: Efficiency = Efficiency(),
              half: Half | Literal["all"] = "test") -> tuple[DataSetScore, ...]:
    """Score every data set of a folder on one half of its models (the test half unless told)."""
    paths = sorted(Path(directory).glob("*.jsonl"))
    if not paths:
        raise ValueError(f"--data {directory}: no *.jsonl files; point it at data/measurements/published")
    return tuple(score_rows(p.stem, split_rows(read_rows(p), half), eff) for p in paths)


# -- report ----------------------------------------------------------------------------------------------

def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _mape_cell(comparisons: Sequence[Comparison]) -> str:
    mape = _mape(comparisons)
    return "-" if mape is None else f"{mape:.1f}% (n={len(comparisons)})"


def _summary_row(s: DataSetScore) -> str:
    metrics = sorted({c.metric for c in s.speed})
    memory = "; ".join(f"{m}: {_mape_cell([c for c in s.memory if c.metric == m])}"
                       for m in sorted({c.metric for c in s.memory})) or "-"
    verdicts = f"{sum(v.agrees for v in s.verdicts)}/{len(s.verdicts)}" if s.verdicts else "-"
    partial = sorted({v.basis for v in s.verdicts} - {"full estimate"})
    verdicts += f" ({', '.join(partial)})" if partial else ""
    ranked = f"{sum(g.picked_best for g in s.rankings)}/{len(s.rankings)}" if s.rankings else "-"
    pick = statistics.fmean(g.pick_share_of_best for g in s.rankings) if s.rankings else None
    return (f"| {s.name} | {s.num_rows} | {s.num_scored} | {len(s.skipped)} | {', '.join(metrics) or '-'} | "
            f"{_mape_cell(s.speed)} | {verdicts} | {memory} | {ranked} | {_pct(pick)} |")


def _skip_lines(scores: Sequence[DataSetScore]) -> list[str]:
    lines = ["", "| data set | skipped rows | reason |", "|---|---:|---|"]
    for s in scores:
        counts: dict[str, int] = {}
        for skip in s.skipped:
            counts[skip.reason] = counts.get(skip.reason, 0) + 1
        for skip in s.metric_skips:
            counts[f"(metric only) {skip.reason}"] = counts.get(f"(metric only) {skip.reason}", 0) + 1
        lines += [f"| {s.name} | {n} | {reason} |" for reason, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return lines


def format_markdown(scores: Sequence[DataSetScore]) -> str:
    """Per data set: the summary table, then the skip reasons with their counts."""
    lines = ["| data set | rows | scored | skipped | speed metric | speed MAPE | fits verdicts agree | "
             "memory MAPE | best ranked first | pick / best measured |",
             "|---|---:|---:|---:|---|---:|---:|---|---:|---:|"]
    lines += [_summary_row(s) for s in scores]
    return "\n".join(lines + _skip_lines(scores)) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerotune.validate.accuracy",
                                     description="Score zerotune's uncalibrated predictions against published "
                                                 "training measurements.")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA_DIR, help="folder of published *.jsonl files")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--half", choices=("test", "fit", "all"), default="test",
                        help="which models of each data set to score: the held-out test half (default), the "
                             "half defaults may be chosen on (fit), or all")
    args = parser.parse_args(argv)
    try:
        text = f"Models scored: {args.half} half\n\n" + format_markdown(score_dir(args.data, half=args.half))
        if args.markdown:
            args.markdown.write_text(text)
    except (ValueError, OSError) as exc:
        print(f"accuracy: error: {exc}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
