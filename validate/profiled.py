"""What `zerotune tune`'s profiling run read from the user's process, turned into a model YAML and a measurement.

The run (zerotune.validate.profiling_run.profile_model) is the user's script under DeepSpeed's launcher with
calibrate/profiling_site first on PYTHONPATH: its sitecustomize wraps deepspeed.initialize and writes
<prefix>.model.json (the engine module's structure, calibrate/inspect_model.py) and <prefix>.rank<R>.json (the
first micro-batch's input shapes, block forward calls, attention kernel calls, step times and peak memory).
This module reads those files; it imports no torch.

model_profiled.yaml carries only ModelSpec keys (zerotune.predictor.catalog.load_model reads it); what was read and what
was assumed are its leading comment lines.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import yaml

from zerotune.predictor.activations import layer_activation_bytes
from zerotune.predictor.hf_config import HF_WIDTH_KEYS, model_from_hf_dict
from zerotune.predictor.dsconfig import OptimizerImpl
from zerotune.predictor.hardware import Precision
from zerotune.predictor.model import ModelSpec
from zerotune.validate.profiled_inputs import Tokens, expected_longest, padded_per_batch, run_positions, token_input

__all__ = ["MatmulPace", "ProfiledRun", "read_profiled", "step_rel_error", "steps_rel_error", "expected_longest",
           "model_yaml", "precision_of_dtype"]

RECOMPUTED_CALLS = 2
"""Forward calls of the first block, or of its first module with parameters (a script that checkpoints a method of
its block), per micro-step when activation checkpointing recomputes it in backward."""
_HEAD_KEYS = ("head", "tied_embeddings", "head_transform", "head_bias", "hooked_modules_per_layer",
              "hooked_outer_modules")
"""What a Hugging Face config cannot say and the modules can: the head (BertModel, BertForMaskedLM and
BertForPreTraining share one config; calibrate/inspect_model.py _head) and the modules ZeRO-3 hooks (_hooked_modules)."""


class MatmulPace(NamedTuple):
    """A square matmul timed on the device: its dtype, its edge and the FLOP/s it ran at."""

    dtype: str
    edge_elems: int
    flops_per_s: float


@dataclass(frozen=True)
class ProfiledRun:
    """What one profiling run read and measured."""

    model: ModelSpec
    read: tuple[str, ...]
    assumed: tuple[str, ...]
    seq_len: int | None
    """The input's second dimension (tokens per sample), None when no 2-D integer input was seen."""
    micro_batch: int | None
    num_params: int
    params_by_kind: Mapping[str, int]
    dtype: str
    activation_checkpointing: bool
    step_s: tuple[float, ...]
    """Wall seconds per optimizer step on rank 0, the first (warm-up) included."""
    peak_memory_bytes: float | None
    """The largest rank's peak (CPU: peak resident set size; accelerators: max_memory_allocated)."""
    optimizer_impl: OptimizerImpl | None = None
    """How the optimizer the engine stepped runs its update (DSConfig.optimizer_impl); None when not an Adam the
    model knows (e.g. an 8-bit or Lion optimizer) or not recorded."""
    matmul: MatmulPace | None = None
    """The square matmul rank 0 timed before the first step; None when not timed."""
    copy_bytes_per_s: float | None = None
    """The tensor copy rank 0 timed before the first step (read + write bytes per second); None when not timed."""
    engine_micro_batch: int | None = None
    """train_micro_batch_size_per_gpu of the engine the script built (its config's, which may not be the one it was
    given); None when no step was recorded."""
    native_moe: bool = False
    """Whether the model has DeepSpeed's own MoE layers (deepspeed.moe.layer.MoE), which ZeRO-3 refuses."""
    measured_seq_len: int | None = None
    """Positions per sample the run's steps were paced by, where that differs from seq_len (a collator that pads
    each batch to its longest sample: seq_len is then the longest seen; the run's steps went at the expected
    longest of its ranks' batches, expected_longest); None where every input had seq_len."""
    copy_curve: tuple[tuple[float, float], ...] = ()
    """(bytes a copy moved, read + write; its bytes per second) of rank 0's copies from cache-sized to the large
    one (copy_bytes_per_s), on a CPU; () where not timed (an accelerator: a small copy times its launch)."""
    input_lengths: tuple[int, ...] = ()
    """Positions of each forward's padded batch, every rank's, where they varied (micro_batch samples each); ()
    where every input had seq_len."""
    fresh_copy_bytes_per_s: float | None = None
    """rank 0's copy of copy_bytes_per_s's size into a fresh tensor, read + write per second, on a CPU: against the
    copy into a kept tensor, what writing a tensor the allocator maps anew costs (ops.fresh_s); None where not
    timed."""
    dropout_s_per_element: float | None = None
    """rank 0's dropout (p 0.1) on a few MiB beyond a clone of the same tensor, seconds an element, on a CPU: the
    mask's random numbers drawn on the rank's thread (HardwareSpec.dropout_rng_s_per_element); None where not
    timed."""
    engine_config: Mapping[str, Any] | None = None
    """The engine's ZeRO stage, gradient accumulation and whether its autotuning section is on (zero_stage,
    gradient_accumulation_steps, autotuning), as the script built it; None when no step was recorded."""


def _load(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _attention(rank0: Mapping[str, Any], read: list[str], assumed: list[str]) -> str:
    """'flash' when the model called scaled_dot_product_attention without dropout (or on an accelerator), where
    PyTorch picks a fused kernel that keeps no s x s scores; else 'eager'."""
    calls, dropout = int(rank0.get("sdpa_calls", 0)), float(rank0.get("sdpa_dropout_p", 0.0))
    if calls == 0:
        assumed.append("attention materialises its scores (no scaled_dot_product_attention call seen)")
        return "eager"
    cpu = "RSS" in str(rank0.get("peak_memory_kind", ""))
    kind = "flash" if dropout == 0.0 or not cpu else "eager"
    read.append(f"scaled_dot_product_attention called {calls} times, dropout {dropout:g}: {kind} attention")
    return kind


def _spec(model_doc: Mapping[str, Any], rank0: Mapping[str, Any], name: str, seq_len: int | None, read: list[str],
          assumed: list[str]) -> ModelSpec:
    hf = model_doc.get("hf_config")
    structure = model_doc.get("structure")
    # a config without a vocabulary (ViTConfig) cannot describe a model the modules show has no token embedding
    tokenless = bool(structure) and structure.get("vocab_size") == 0 and not (hf or {}).get("vocab_size")
    # a config describes the model with a vocabulary, or with the modules' structure beside it (inspect_model.readable)
    if hf and any(hf.get(k) for k in HF_WIDTH_KEYS) and not tokenless \
            and (structure or hf.get("vocab_size")):
        read.insert(0, f"Hugging Face config (model_type {hf.get('model_type', '?')}) of the engine's module")
        assumed.clear()  # what the module reading had to assume (heads, positions), the config states
        spec = model_from_hf_dict(hf, name, "")
        if spec.distinct_layers:
            read.append(f"{spec.num_layers} block passes over the weights of {spec.distinct_layers} (the config's "
                        f"shared layer groups): every pass costed, the weights held once")
        if structure and structure.get("hidden_size") == spec.hidden_size:  # the config names the family, the
            head = {k: structure[k] for k in _HEAD_KEYS if k in structure}  # modules the head class built on it
            read.append(f"from the modules: {', '.join(f'{k} {v}' for k, v in head.items())}")
            spec = spec.replace(**head)
            same_width = structure.get("ffn_hidden_size") == spec.ffn_hidden_size
            if structure.get("gated_mlp") and not spec.gated_mlp and same_width:
                # a config states gating only through its activation's name (SiLU, "gated-gelu"); the block's
                # linears show it whatever the activation (Gemma 2's GeGLU: gelu_pytorch_tanh, two h -> f maps of
                # the config's MLP width)
                read.append("gated MLP from the block's linears (two h -> f maps)")
                spec = spec.replace(gated_mlp=True)
        return spec
    if not structure:
        raise LookupError(model_doc.get("error") or "no structure recorded")
    if hf:
        read.insert(0, f"Hugging Face config (model_type {hf.get('model_type', '?')}) without a vocabulary: the "
                       "structure is read from the modules")
    doc = _observed_heads(dict(structure), model_doc.get("assumed_fields") or [], rank0, read, assumed)
    moe = model_doc.get("moe") or {}
    if moe:  # DeepSpeed MoE: the rank holds its local experts; a token runs top-k of them (inspect_model.moe_layers)
        doc.update(num_experts=int(moe["local_experts"]), experts_per_token=min(int(moe["top_k"]),
                                                                                  int(moe["local_experts"])))
    if "max_position_embeddings" not in doc:
        doc["max_position_embeddings"] = seq_len or 2048
        assumed.append(f"max_position_embeddings {doc['max_position_embeddings']} (the input's length)")
    return ModelSpec(name=name, **doc)


def _head_width(rank0: Mapping[str, Any]) -> tuple[int, int | None, int | None] | None:
    """(head width, query heads, key/value heads) from the first forward's attention: the first
    scaled_dot_product_attention call's query and key, (..., heads, s, d), or else the first scores matmul
    q @ k^T, (..., s, d) (calibrate/profiling_site); None when neither was seen."""
    shapes = rank0.get("sdpa_shapes")
    if isinstance(shapes, list) and len(shapes) == 2 and all(len(x) == 4 for x in shapes):
        (_, heads, _, width), (_, kv_heads, _, _) = shapes
        return int(width), int(heads), int(kv_heads)
    scores = rank0.get("attention_matmul")
    if isinstance(scores, list) and len(scores) >= 3:
        return int(scores[-1]), (int(scores[-3]) if len(scores) == 4 else None), None
    return None


def _observed_heads(doc: dict[str, Any], assumed_fields: Sequence[str], rank0: Mapping[str, Any], read: list[str],
                    assumed: list[str]) -> dict[str, Any]:
    """The structure with its heads from the first forward's attention where no module stated them (a hand-written
    attention keeping them in attributes of its own naming): the head width d the kernels ran, so heads = hidden / d
    and key/value heads = their projections' width / d (the width the module reading found, kv heads x its
    assumed head width)."""
    seen = _head_width(rank0)
    hidden, heads, kv_heads = int(doc["hidden_size"]), int(doc["num_heads"]), int(doc["num_kv_heads"])
    if "num_heads" not in assumed_fields or seen is None:
        return doc
    width, seen_heads, seen_kv = seen
    if width <= 0 or hidden % width or (seen_heads is not None and seen_heads * width != hidden):
        return doc
    kv_width = kv_heads * (hidden // heads)
    new_kv = seen_kv if seen_kv and seen_kv < hidden // width else max(1, kv_width // width)
    assumed[:] = [a for a in assumed if not a.startswith("heads of ")]
    read.append(f"heads {hidden // width} of width {width}, key/value heads {new_kv}, from the first forward's "
                f"attention ({'scaled_dot_product_attention' if rank0.get('sdpa_shapes') else 'q @ k^T'})")
    return {**doc, "num_heads": hidden // width, "num_kv_heads": new_kv}


def _functional_head(spec: ModelSpec, rank0: Mapping[str, Any], read: list[str]) -> ModelSpec:
    """A model whose modules show no LM head but whose forward projected onto the token embedding's table
    (calibrate/profiling_site: F.linear with the embedding's weight) has a tied LM head: its logits GEMM and loss
    are most of a small model's FLOPs."""
    if spec.head != "none" or not int(rank0.get("embedding_projections") or 0):
        return spec
    read.append("the forward projects onto the token embedding's table (a matmul with its weight): tied LM head")
    return spec.replace(head="lm", tied_embeddings=True, head_bias=False)


def _training(spec: ModelSpec, doc: Any, read: list[str]) -> ModelSpec:
    """Frozen parameters (requires_grad False) and adapters beside the architecture (LoRA): per block, outside the
    blocks, and the adapters' size and tensors, as the process counted them (calibrate/inspect_model._training)."""
    if not isinstance(doc, dict):
        return spec
    frozen_blocks, frozen_outer = int(doc.get("frozen_block_params") or 0), int(doc.get("frozen_outer_params") or 0)
    adapters, adapter_tensors = int(doc.get("adapter_params") or 0), int(doc.get("adapter_tensors") or 0)
    if not (frozen_blocks or frozen_outer or adapters):
        return spec
    per_block = min(spec.num_layer_params, round(frozen_blocks / spec.held_layers))
    spec = spec.replace(frozen_layer_params=per_block, frozen_outer_params=min(frozen_outer, spec.num_outer_params),
                        adapter_params=adapters, num_adapter_tensors=adapter_tensors)
    read.append(f"trainable parameters {int(doc.get('trainable_params') or 0):,}: frozen {frozen_blocks:,} in the blocks "
                f"and {frozen_outer:,} outside them; adapters {adapters:,} in {adapter_tensors} tensors")
    return spec


def _activation_scale(rank0: Mapping[str, Any], spec: ModelSpec, tokens: tuple[int, int] | None, dtype: str,
                      read: list[str], source_len: int | None = None) -> float:
    """Measured over formula bytes the first block kept for backward at the first micro-batch (1.0 when nothing
    was measured: no token input, or checkpointing ran the block without gradients)."""
    saved = float(rank0.get("block_saved_bytes") or 0)
    if not saved or tokens is None:
        return 1.0
    act_bytes = 2 if any(t in dtype for t in ("bfloat16", "float16")) else 4
    # an encoder-decoder's hooked block is a decoder block (the larger, calibrate/inspect_model.find_blocks): with
    # its cross-attention, whose keys, values and scores span the source's positions (`source_len`)
    formula = layer_activation_bytes(spec.replace(activation_scale=1.0), tokens[0], tokens[1], act_bytes,
                                     cross_share=1.0 if spec.cross_attention_layers else None,
                                     cross_seq_len=source_len)
    read.append(f"the first block kept {saved / 2**20:.3g} MiB for backward at {tokens[0]} x {tokens[1]} tokens, "
                f"the formula {formula / 2**20:.3g} MiB: activations x {saved / formula:.3g}")
    return saved / formula


def _stand_in(model_doc: Mapping[str, Any], rank0: Mapping[str, Any], name: str, why: str, read: list[str],
              assumed: list[str]) -> tuple[ModelSpec, Tokens]:
    """A model with no repeated transformer block (a CNN, an RNN, an unusual architecture) described by what it
    was measured to cost: a stack of MLP blocks (two GEMMs h -> f -> h, attention reduced to one head of width 1)
    holding its parameter count, run over as many positions per sample as make its forward FLOPs (counted by
    torch's FlopCounterMode in the first forward), keeping the bytes it kept for backward (activation_scale).
    Parameters set what ZeRO partitions, reduces and updates; FLOPs and saved bytes set compute and activation
    memory per sample; the ops its forward dispatched (ModelSpec.dispatched_forward_ops) set the host's launches.
    Returns the spec and (micro-batch, positions); LookupError when nothing was measured."""
    flops, saved = float(rank0.get("model_forward_flops") or 0), float(rank0.get("model_saved_bytes") or 0)
    batch, params = int(rank0.get("train_micro_batch_size_per_gpu") or 0), int(model_doc.get("num_params") or 0)
    if not (flops and saved and batch and params):
        raise LookupError(why)
    layers = max(1, int(model_doc.get("num_weight_layers") or 2) // 2)
    hidden = max(1, round(math.sqrt(params / (8 * layers))))
    base = dict(name=name, num_layers=layers, hidden_size=hidden, num_heads=1, num_kv_heads=1, attention_head_dim=1,
                vocab_size=0, max_position_embeddings=1, position_embedding="none", tied_embeddings=False,
                dropout=False, attention="flash", head="none", final_norm=False)
    per_ffn = 2 * hidden + 1  # fc1 h x f and its bias f, fc2 f x h
    fixed = ModelSpec(ffn_hidden_size=1, **base).num_layer_params - per_ffn
    ffn = max(1, round((params / layers - fixed) / per_ffn))
    gemm_params = layers * (2 * hidden * ffn + 4 * hidden)  # the stand-in's GEMM weights per position
    positions = max(1, round(flops / batch / (2 * gemm_params)))
    spec = ModelSpec(ffn_hidden_size=ffn, **{**base, "max_position_embeddings": positions})
    act_bytes = 2 if any(t in str(model_doc.get("dtype", "")) for t in ("bfloat16", "float16")) else 4
    formula = layers * layer_activation_bytes(spec, batch, positions, act_bytes)
    ops = int(rank0.get("model_forward_ops") or 0)  # the forward's dispatched ATen ops (0: not counted)
    spec = spec.replace(dispatched_forward_ops=ops)
    read.append(f"no repeated transformer block ({why}): described by a stand-in of what it was measured to cost: "
                f"{params:,} parameters, {flops / batch:.4g} forward FLOPs and {saved / batch / 2**20:.3g} MiB kept "
                f"for backward per sample (micro-batch {batch})"
                + (f", {ops:,} ops dispatched a forward" if ops else ""))
    assumed.append(f"the stand-in runs {layers} MLP blocks {hidden} -> {ffn} -> {hidden} over {positions} positions "
                   f"per sample: its GEMM shapes, kernel count and memory-bound kernels are the stand-in's, not the "
                   f"model's own layers'")
    return spec.replace(activation_scale=round(saved / formula, 4)), (batch, positions)


def _described(model_doc: Mapping[str, Any], rank0: Mapping[str, Any], name: str, tokens: Tokens | None,
               read: list[str], assumed: list[str]) -> tuple[ModelSpec, Tokens | None, bool]:
    """(spec, positions, whether it is a stand-in): the structure or config read, else the stand-in of the
    model's measured costs where the site measured them; ValueError (one line) when neither."""
    try:
        return _spec(model_doc, rank0, name, tokens[1] if tokens else None, read, assumed), tokens, False
    except (LookupError, ValueError, TypeError) as exc:
        if not rank0.get("stand_in"):  # the site measured a stand-in's costs only where nothing else describes it
            raise ValueError(f"cannot read this model's structure ({exc})") from None
        try:
            spec, tokens = _stand_in(model_doc, rank0, name, str(exc), read, assumed)
        except (LookupError, ValueError) as missing:
            raise ValueError(f"cannot read this model's structure ({missing}), and its forward's FLOPs and saved "
                             "bytes were not measured") from None
        return spec, tokens, True


def read_profiled(prefix: Path, name: str, world_size: int) -> ProfiledRun:
    """The profiling run's files read back; ValueError (one line) when the model's structure could not be read."""
    model_doc = _load(Path(f"{prefix}.model.json"))
    ranks = [d for d in (_load(Path(f"{prefix}.rank{r}.json")) for r in range(world_size)) if d]
    if model_doc is None:
        raise ValueError("the profiling run did not reach deepspeed.initialize")
    rank0 = next((d for d in ranks if d.get("rank") == 0), {})
    read, assumed = list(model_doc.get("read", [])), list(model_doc.get("assumed", []))
    tokens, saved_at = run_positions(model_doc, rank0, read)
    measured_len, input_lengths = None, ()
    if tokens is not None:
        tokens, measured_len, input_lengths = padded_per_batch([rank0, *(d for d in ranks if d is not rank0)],
                                                                tokens, read)
    spec, tokens, stand_in = _described(model_doc, rank0, name, tokens, read, assumed)
    training = model_doc.get("training")
    if stand_in and isinstance(training, dict):  # the stand-in is all blocks: what is frozen is frozen in them
        training = {**training, "frozen_block_params": int(training.get("frozen_block_params") or 0)
                    + int(training.get("frozen_outer_params") or 0), "frozen_outer_params": 0}
    spec = _training(spec if stand_in else _functional_head(spec, rank0, read), training, read)
    per_step = int(rank0.get("forward_calls") or 0)
    calls = max(int(rank0.get("block_calls") or 0), int(rank0.get("inner_calls") or 0))
    in_forward = max(int(rank0.get("block_forward_calls") or 0), int(rank0.get("inner_forward_calls") or 0))
    if in_forward and per_step:  # a site that tells the model's forward from backward's recomputes
        # at least half the forward's calls run again in backward: the site's saved-tensor count of the first
        # block's first call stores that call's tensors itself, so torch's non-reentrant checkpoint does not
        # recompute it (one call short in the first step)
        recompute = 2 * (calls - in_forward) >= in_forward
        if not stand_in:
            spec = _shared_blocks(spec, in_forward / per_step, read)
    else:
        recompute = per_step > 0 and calls >= RECOMPUTED_CALLS * per_step
    if not stand_in:
        spec = spec.replace(attention=_attention(rank0, read, assumed))
    if recompute:  # the block kept only its input for backward: the formula's full block is what it recomputes
        read.append("activation checkpointing: on (the first block's modules run again in backward): every "
                    "configuration is costed with the blocks recomputed")
    elif not stand_in:
        source = (token_input(rank0.get("inputs"), int(rank0.get("train_micro_batch_size_per_gpu") or 0))
                  if spec.cross_attention_layers else None)
        spec = spec.replace(activation_scale=round(_activation_scale(rank0, spec, saved_at,
                                                                     str(model_doc.get("dtype", "")), read,
                                                                     source[1] if source else None), 4))
    spec = _subnormal_logits(spec, rank0, read)
    peaks = _training_peaks(ranks)
    impl = _optimizer_impl(rank0.get("optimizer"), read, assumed)
    return ProfiledRun(spec, tuple(read), tuple(assumed), tokens[1] if tokens else None, tokens[0] if tokens else None,
                       int(model_doc.get("num_params") or 0), dict(model_doc.get("params_by_kind") or {}),
                       str(model_doc.get("dtype", "")), recompute, tuple(float(s) for s in rank0.get("step_s", [])),
                       max(peaks) if peaks else None, impl, _matmul(rank0.get("matmul")), _figure(rank0.get("copy")),
                       int(rank0["train_micro_batch_size_per_gpu"]) if rank0.get("train_micro_batch_size_per_gpu")
                       else None, bool(model_doc.get("moe")), measured_len, _copy_curve(rank0.get("copy")),
                       input_lengths=input_lengths, engine_config=rank0.get("engine_config"),
                       fresh_copy_bytes_per_s=_figure(rank0.get("copy"), "fresh_bytes_per_s"),
                       dropout_s_per_element=_figure(rank0.get("copy"), "dropout_s_per_element", zero=True))


def _shared_blocks(spec: ModelSpec, passes: float, read: list[str]) -> ModelSpec:
    """The model with its blocks run `passes` times each a forward where the first block ran more than once inside
    the model's forward (a loop over shared weights, ModelSpec.distinct_layers), unless its config said so already
    (ALBERT's num_hidden_groups)."""
    if spec.distinct_layers or spec.cross_attention_layers or round(passes) < 2:
        return spec
    layers = round(spec.num_layers * passes)
    read.append(f"the first block ran {passes:g} times a forward: {layers} block passes over the weights of "
                f"{spec.num_layers} (shared weights)")
    return spec.replace(num_layers=layers, distinct_layers=spec.num_layers)


def _subnormal_logits(spec: ModelSpec, rank0: Mapping[str, Any], read: list[str]) -> ModelSpec:
    """The model with the median share of subnormal values its profiling run read in the logits' gradient (the CPU
    only: calibrate/profiling_site; ModelSpec.logits_grad_subnormal_share), said in `read` when there are any."""
    shares = [float(s) for s in rank0.get("logits_grad_subnormal_shares") or [] if isinstance(s, (int, float))]
    if spec.head != "lm" or not shares:
        return spec
    share = float(statistics.median(shares))
    factor = _subnormal_factor(rank0.get("subnormal"), share) if share > 0 else None
    if share > 0:
        cost = ("on the CPU its backward GEMMs run through microcode assists and are costed slower" if factor is None
                else f"a GEMM with that share of subnormal operands took x{factor:.3g} its normal time on this host, "
                     f"so its backward GEMMs are costed x{factor:.3g}")
        slower = factor is None or factor > 1.05
        spare = "; torch.set_flush_denormal(True) in the script would spare it" if slower else ""
        read.append(f"the logits' gradient held {share:.2%} subnormal values (median of {len(shares)} backward "
                    f"passes): {cost}{spare}")
    return spec.replace(logits_grad_subnormal_share=round(share, 6),
                        logits_grad_subnormal_factor=round(factor, 4) if factor is not None else 0.0)


def _subnormal_factor(doc: Any, share: float) -> float | None:
    """The slowdown of a GEMM whose operand holds `share` of subnormal values on the profiling run's host: its
    subnormal check's times over the faster normal one (calibrate/site_paces.py subnormal_rate), interpolated
    linearly in the share, flat beyond the largest share timed (an assist per vector instruction with any subnormal
    lane: the cost saturates as the share grows); at least 1. None when the check did not run or failed."""
    if not isinstance(doc, dict):
        return None
    shares, seconds = doc.get("shares"), doc.get("seconds")
    if not (isinstance(shares, list) and isinstance(seconds, list) and len(shares) == len(seconds)) or not all(
            isinstance(v, (int, float)) and v >= 0 for v in shares + seconds):
        return None
    normal = [t for s, t in zip(shares, seconds) if s == 0 and t > 0]
    points = sorted((float(s), float(t)) for s, t in zip(shares, seconds) if s > 0)
    if not normal or not points:
        return None
    xs = [0.0] + [s for s, _ in points]
    ys = [1.0] + [max(1.0, t / min(normal)) for _, t in points]
    return float(max(1.0, np.interp(share, xs, ys)))


def _training_peaks(ranks: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each rank's peak memory over its steps; on the CPU a rank whose peak is the one its own speed checks reached
    before the first step (rank 0's matmul and copy, checks_peak_memory_bytes) says nothing about training, and is
    left out where another rank says more (three different models' rank 0 peaked at 824-826 MB, their rank 1 at
    777-813)."""
    peaks = [(float(d["peak_memory_bytes"]), float(d.get("checks_peak_memory_bytes") or 0.0)) for d in ranks
             if d.get("peak_memory_bytes")]
    trained = [peak for peak, checks in peaks if peak > checks]
    return trained or [peak for peak, _ in peaks]


def _matmul(doc: Any) -> MatmulPace | None:
    if not isinstance(doc, dict) or not isinstance(doc.get("flops_per_s"), (int, float)) or doc["flops_per_s"] <= 0:
        return None
    return MatmulPace(str(doc.get("dtype")), int(doc.get("m") or 0), float(doc["flops_per_s"]))


def _figure(doc: Any, key: str = "bytes_per_s", zero: bool = False) -> float | None:
    """A check's positive figure under `key` (or 0 where `zero`); None where absent or not a number."""
    rate = doc.get(key) if isinstance(doc, dict) else None
    return float(rate) if isinstance(rate, (int, float)) and (rate > 0 or zero and rate == 0) else None


def _copy_curve(doc: Any) -> tuple[tuple[float, float], ...]:
    points = doc.get("cache_curve") if isinstance(doc, dict) else None
    if not isinstance(points, list):
        return ()
    curve = [(float(p[0]), float(p[1])) for p in points
             if isinstance(p, list) and len(p) == 2 and all(isinstance(v, (int, float)) and v > 0 for v in p)]
    return tuple(sorted(curve)) if len(curve) == len(points) and len(curve) >= 2 else ()


def _optimizer_impl(doc: Any, read: list[str], assumed: list[str]) -> OptimizerImpl | None:
    """'fused' for DeepSpeed's FusedAdam or a torch Adam(W) built with fused=True, 'torch' for torch's unfused
    Adam(W) (for-each or per-tensor), None for anything else."""
    if not isinstance(doc, dict) or not doc.get("class"):
        return None
    name = str(doc["class"])
    short = name.rsplit(".", 1)[-1]
    if name.startswith("torch.optim.") and short in ("Adam", "AdamW"):
        impl: OptimizerImpl = "fused" if doc.get("fused") else "torch"
    elif short == "FusedAdam":
        impl = "fused"
    else:
        assumed.append(f"optimizer {name}: its update is costed as a fused Adam's")
        return None
    read.append(f"optimizer {short} ({'fused' if impl == 'fused' else 'unfused: one pass over the tensors per op'})")
    return impl


def precision_of_dtype(dtype: str) -> Precision | None:
    """The ds_config precision an engine's parameter dtypes (ProfiledRun.dtype, e.g. 'bfloat16' or
    'float32,bfloat16') show: DeepSpeed casts the module to fp16 / bf16 when the section enables it
    (runtime/engine.py _configure_distributed_model); None when no dtype was recorded."""
    names = set(dtype.split(",")) if dtype else set()
    return "bf16" if "bfloat16" in names else "fp16" if "float16" in names else "fp32" if "float32" in names else None


MEDIAN_EFFICIENCY = 1.2533
"""Standard error of a median over the mean's, for normal samples (sqrt(pi / 2))."""


def step_rel_error(run: ProfiledRun) -> float | None:
    """Standard error of the run's median step relative to it, from the spread of the log step times after the first;
    None with fewer than three."""
    return steps_rel_error(run.step_s[1:])


def steps_rel_error(step_s: Sequence[float]) -> float | None:
    """Standard error of the median of these step times relative to it, from the spread of their logs; None with
    fewer than three."""
    steps = [s for s in step_s if s > 0]
    if len(steps) < 3:
        return None
    return MEDIAN_EFFICIENCY * statistics.stdev(math.log(s) for s in steps) / math.sqrt(len(steps))


def model_yaml(run: ProfiledRun, source: str) -> str:
    """model_profiled.yaml: the ModelSpec's keys, preceded by comment lines saying what was read and assumed."""
    spec = run.model.replace(source=source)
    lines = [f"# read: {r}" for r in run.read] + [f"# assumed: {a}" for a in run.assumed]
    kinds = ", ".join(f"{k} {v:,}" for k, v in run.params_by_kind.items())
    lines.append(f"# parameters counted in the process: {run.num_params:,} ({kinds or 'by kind unknown'}), dtype "
                 f"{run.dtype or '?'}; this description holds {spec.num_params:,}")
    if run.activation_checkpointing:
        lines.append("# the script checkpoints activations itself: every configuration is costed with its blocks "
                     "recomputed in backward (zerotune does not switch the script's checkpointing)")
    doc = {f.name: getattr(spec, f.name) for f in dataclasses.fields(ModelSpec)}
    return "\n".join(lines) + "\n" + yaml.safe_dump(doc, sort_keys=False)
