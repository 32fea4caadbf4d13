"""A micro-step as the kernels it runs: GEMMs on a roofline with a shape curve, memory-bound ops as bytes moved.

Per transformer block (Megatron's tensor-parallel split: heads and MLP width / tp; norms, dropouts and residual
adds replicated on every tp rank, Shoeybi et al. 2019 sec. 3), forward:
  GEMMs    QKV (T x h -> h + 2kv), attention out (h/tp -> h), MLP up (h -> f, twice when gated) and down
           (f/tp -> h), with T = micro-batch x seq tokens; attention as two batched matmuls per head
           (s x d x s scores, s x s x d context) or one fused SDPA/flash kernel (Dao et al. 2022)
  memory   two norms, the activation, two dropout + residual-add pairs, the head merge; eager attention adds
           scale, mask, softmax and dropout over b x heads x s x s scores (Korthikanti et al. 2022, sec. 4.1)
Outside the blocks: the embedding gather (+ positions, + BERT token types and norm), the final norm, the
logits GEMM and its cross-entropy (a copy and a log-softmax over T x V, HF's shift-and-flatten).
Backward runs each forward GEMM as two GEMMs of the same FLOPs (input and weight gradient, their own shapes),
flash attention 2.5x its forward (it recomputes the scores), and each memory-bound op reading its saved
inputs and the incoming gradient. Activation checkpointing recomputes the blocks' forward.

Each kernel is timed by zerotune.predictor.kernels (a GEMM on a roofline with tile and wave quantization, a
memory-bound op as the bytes it moves). Each kernel costs the host a launch; a phase takes the longer of its
kernels' device time and their launches (the host-bound regime of small models).

Everything is vectorised over an array of micro-batch sizes (ranking evaluates whole spaces at once).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from zerotune.predictor.flops import BACKWARD_PER_FORWARD
from zerotune.predictor.kernels import (ELEMENT_BYTES, MISALIGNED_GEMM_SLOWDOWN, TENSOR_CORE_ALIGN_BYTES, TILE_ELEMS,
                                       Batch, DeviceRates, _elementwise, _mask_draws, _memory_bytes_per_s,
                                       cold_weight_s, device_rates, fresh_s, fresh_write_s, gemm_flops, gemm_s)
from zerotune.predictor.model import ModelSpec

__all__ = ["DeviceRates", "device_rates", "gemm_s", "gemm_flops", "cold_weight_s", "fresh_s", "fresh_write_s",
           "PhaseTimes", "layer_times",
           "outer_times", "FLASH_BACKWARD_PER_FORWARD", "TILE_ELEMS", "ELEMENT_BYTES", "MHA_RW_ELEMS",
           "MHA_CROSS_RW_ELEMS", "TENSOR_CORE_ALIGN_BYTES", "MISALIGNED_GEMM_SLOWDOWN", "BACKWARD_OPS_PER_FORWARD"]

BACKWARD_OPS_PER_FORWARD = 1.4
"""ATen ops autograd dispatches in backward per op of the forward, for a model whose forward's ops were counted
(ModelSpec.dispatched_forward_ops): counted under a dispatch mode in torch 2.13 on the CPU, a 2-layer bidirectional
nn.GRU 1.42 (4,897 and 6,954), a conv-batchnorm-ReLU stack 1.42, a 4-layer nn.TransformerEncoder 1.38; a fused
nn.LSTM 1.15, a linear-GELU-LayerNorm stack 3.4 (2026-11-30)."""
FLASH_BLOCK_ELEMS = 128
"""Query block of a flash attention kernel (FlashAttention-2's forward tiles of 128 rows on Ampere / Hopper)."""
FLASH_BACKWARD_PER_FORWARD = 2.5
"""Flash attention's backward recomputes the scores: 5 matmuls against the forward's 2 (Dao et al. 2022,
sec. 3.1 and app. B)."""
MHA_RW_ELEMS = {"batch_first": ((7.0, 7.0, 3), (22.0, 23.0, 9)),
                "sequence_first": ((3.0, 3.0, 1), (20.0, 22.0, 8))}
"""((reads, writes, kernels) forward, the same backward) that torch.nn.MultiheadAttention adds per element of a
block's hidden state (ModelSpec.torch_multihead_attention) beyond what the split-projection attention is costed as,
counted op by op under a TorchDispatchMode in torch 2.13 (fp32, self-attention, need_weights False; the GEMMs and the
attention kernel left out; tests/test_ops.py counts them again). Forward, sequence-first input: the (3, L, N, E)
contiguous copy of the packed in-projection's output (3 reads, 3 writes); batch-first adds the input's transposed
copy (1 and 1) and the in-projection's bias added apart from its GEMM on that non-contiguous input (3 and 3). A
Hugging Face-style block (q, k, v and out linears on contiguous input, scaled_dot_product_attention) runs none of
them. Backward, sequence-first: 52 element reads and writes (the three slices' zero-filled select_backward, 12; the
sums of their gradients into the packed one, 18; seven copies back to contiguous layouts, 18; the in- and
out-projections' bias gradients, 4), batch-first 55 (a copy back to the batch-first layout, 3), where the
split-projection block ran 10 (the four bias gradients, 4; the sums of the q, k and v input gradients, 6), which the
step model leaves to its calibration in every model alike."""
MHA_CROSS_RW_ELEMS = {"batch_first": ((7.0, 7.0, 5), (16.8, 15.8, 12)),
                      "sequence_first": ((2.0, 2.0, 1), (12.8, 13.8, 10))}
"""The same for nn.MultiheadAttention over a memory (nn.TransformerDecoderLayer's multihead_attn: query from the
block, key and value one memory tensor), against a split-projection cross-attention (q from the block, k and v from
the memory, scaled_dot_product_attention), counted alike with as many memory positions as query positions, in
elements of the hidden state per query token. The packed projection runs as q's linear and one k-v linear
(_in_projection_packed's key-is-value branch), so forward copies only the k-v output into its (2, S, N, E) layout
(sequence-first, 2 and 2), batch-first also the two inputs' transposed copies and the biases added apart; backward
zero-fills, sums and copies the slices' gradients back as for self-attention, over two slices, not three."""


@dataclass(frozen=True)
class PhaseTimes:
    """Device seconds, kernel count and FLOPs of one part of a micro-step, forward and backward."""

    forward_s: Batch
    backward_s: Batch
    forward_kernels: int
    backward_kernels: int
    forward_flops: Batch
    backward_flops: Batch


def _linear(tokens: Batch, n_in: float, n_out: float, rates: DeviceRates, weight_grad: float = 1.0
            ) -> tuple[Batch, Batch, Batch]:
    """(forward s, backward s, forward FLOPs) of y = x W for x of tokens x n_in: backward is the input
    gradient (tokens x n_out -> n_in) and the weight gradient (n_in x n_out, reduced over tokens), which autograd
    runs only for a weight that requires grad (`weight_grad`: the share that does)."""
    fwd = gemm_s(tokens, n_out, n_in, 1, rates)
    if rates.packs_weights:
        # F.linear's x W^T on a CPU: the BLAS (MKL / oneDNN sgemm, Goto & van de Geijn 2008 sec. 4) first copies the
        # transposed weight into its packed panels on the thread that then computes, whatever the rows. Measured on
        # this project's CPU VM (one thread, fp32, 2026-11-27): the forward's time beyond its FLOPs at the 2048^3
        # pace was 0.92 of one copy of the weight at the copy pace of its size (least squares over 48 shapes, 32-1024
        # rows, weights 256^2 to 768 x 3072); the backward's dY W and dY^T x ran at full pace (165-185 GFLOP/s at
        # 128 rows) and are charged no pack. Timed alone their operands were in cache; in a model all three GEMMs
        # also pay cold_weight_s.
        fwd = fwd + _elementwise(n_in * n_out, 1, 1, 0, rates, fresh=False)  # the BLAS's own packing buffer
    bwd = gemm_s(tokens, n_in, n_out, 1, rates) + weight_grad * gemm_s(n_in, n_out, tokens, 1, rates)
    cold = cold_weight_s(n_in, n_out, rates)
    fwd, bwd = fwd + cold, bwd + cold * (1 + weight_grad)
    return fwd, bwd, gemm_flops(tokens, n_out, n_in)


def _adapters(model: ModelSpec, tokens: Batch, tp: int, rates: DeviceRates) -> tuple[Batch, Batch, int, int]:
    """(forward s, backward s, forward kernels, backward kernels) of one block's low-rank adapters (LoRA, Hu et al.
    2021, eq. 3: h = W0 x + B A x): per adapted linear, x A (h -> r) and (x A) B (r -> h), the scaling and the add
    onto the frozen projection's output (peft tuners/lora/layer.py Linear.forward); backward both GEMMs' input and
    weight gradients. Adapted linears and their rank come from the adapters' count and size, as h -> h maps."""
    adapted = model.num_adapter_tensors / 2 / model.num_layers
    if not adapted:
        return 0 * tokens, 0 * tokens, 0, 0
    h = model.hidden_size
    rank = max(1.0, model.adapter_params / (model.num_adapter_tensors * h))  # pairs of r x h and h x r
    down, up = _linear(tokens, h, rank, rates), _linear(tokens, rank, h / tp, rates)
    add_f = _elementwise(tokens * h / tp, 2, 1, 0, rates)
    fwd = adapted * (down[0] + up[0] + add_f)
    bwd = adapted * (down[1] + up[1] + _elementwise(tokens * h / tp, 1, 1, 0, rates))
    return fwd, bwd, round(4 * adapted), round(6 * adapted)


def _attention(model: ModelSpec, b: Batch, s: int, tp: int, rates: DeviceRates) -> tuple[Batch, Batch, Batch]:
    """(forward s, backward s, forward FLOPs) of the score and context matmuls of the local heads."""
    heads, d = b * model.num_heads / tp, model.head_dim
    scores, context = gemm_s(s, s, d, heads, rates), gemm_s(s, d, s, heads, rates)
    flops = gemm_flops(s, s, d, heads) + gemm_flops(s, d, s, heads)
    if model.attention == "flash" and any(rates.flash_score_s):
        # PyTorch's CPU kernel: per score its GEMM FLOPs (4d forward, 10d backward: the scores again, dP, dS and the
        # three gradients) at the fp32 rate, whatever the precision (it accumulates and exponentiates in fp32), and
        # the online softmax's per-score work; blocks of keys above a causal diagonal are skipped
        computed = causal_flash_share(model, s, rates.flash_block_elems) * heads * s * s
        fp32 = rates.fp32_matmul_flops_per_s or rates.matmul_flops_per_s
        forward, backward = rates.flash_score_s
        return computed * (forward + 4 * d / fp32), computed * (backward + 10 * d / fp32), flops
    if model.attention == "flash":
        # one fused kernel: the same tensor-core work, but the s x s scores never reach memory; a causal model's
        # kernel skips the score tiles above the diagonal
        rate = min(rates.matmul_flops_per_s, rates.flash_flops_per_s or rates.matmul_flops_per_s)
        on_chip = dataclasses.replace(rates, memory_bytes_per_s=np.inf, gemm_memory_bytes_per_s=np.inf,
                                      matmul_flops_per_s=rate)
        fused = causal_flash_share(model, s) * (gemm_s(s, s, d, heads, on_chip) + gemm_s(s, d, s, heads, on_chip))
        return fused, FLASH_BACKWARD_PER_FORWARD * fused, flops
    # d(probs) = d(context) V^T and dV = probs^T d(context); dQ = d(scores) K and dK = d(scores)^T Q
    score_grads = 2 * gemm_s(s, d, s, heads, rates)
    if model.eager_upcast(rates.element_bytes) == "scores":  # Q K^T and both its gradients on fp32 operands
        fp32 = dataclasses.replace(rates, matmul_flops_per_s=rates.fp32_matmul_flops_per_s or rates.matmul_flops_per_s,
                                   element_bytes=4)
        scores, score_grads = gemm_s(s, s, d, heads, fp32), 2 * gemm_s(s, d, s, heads, fp32)
    backward = gemm_s(s, s, d, heads, rates) + gemm_s(s, d, s, heads, rates) + score_grads
    return scores + context, backward, flops


def causal_flash_share(model: ModelSpec, s: int, block: int = 0) -> float:
    """Share of the s x s score tiles a flash kernel computes: all for an encoder; for a causal language model
    (head "lm") the tiles on and below the diagonal, (n + 1) / 2n of them for n = s / 128 query blocks
    (FlashAttention-2, Dao 2023, sec. 3.1.1: blocks whose column indices all exceed the row indices are skipped,
    about 1.7-1.8x faster; torch's SDPA runs it for is_causal, transformers' sdpa_attention_forward passes
    is_causal when there is no padding mask). A model that adds a bias to the scores (ALiBi: position_embedding
    "none") is charged every tile: llm-foundry's MPT rows measure so (at 16-65k tokens the skip predicted them
    1.4-1.8x fast, where the full count is within 8%). `block`: the kernel's key block where it is not
    FLASH_BLOCK_ELEMS (HardwareSpec.flash_kv_block_elems)."""
    if model.head != "lm" or model.position_embedding not in ("learned", "rotary"):
        return 1.0
    blocks = max(1.0, s / (block or FLASH_BLOCK_ELEMS))
    return (blocks + 1) / (2 * blocks)


def _norm(elems: Batch, model: ModelSpec, rates: DeviceRates) -> tuple[Batch, Batch, int, int]:
    """(forward s, backward s, forward kernels, backward kernels) of one norm over `elems`. LayerNorm is one fused
    kernel each way (read x, write y; backward reads x, dy and the statistics, writes dx, then reduces dgamma /
    dbeta). RMSNorm as transformers writes it (LlamaRMSNorm, Qwen2RMSNorm, T5LayerNorm: x.to(float32),
    pow(2).mean(-1), x * rsqrt(var + eps), .to(dtype), weight * x) runs in fp32 as separate kernels; counted op by
    op under a dispatch mode in torch 2.13 on 4096 x 1024: 16-bit forward reads 20 and writes 16 bytes per element
    (fp32: 16, 12), backward reads 58 and writes 38 (fp32: 60, 36); 8 aten ops forward and 16 backward, two casts
    fewer each way for an fp32 model."""
    if model.norm != "rmsnorm":
        return _elementwise(elems, 1, 1, 0, rates), _elementwise(elems, 3, 1, 0, rates), 1, 2
    sixteen_bit = rates.element_bytes < 4
    fwd_bytes, bwd_bytes = (36.0, 96.0) if sixteen_bit else (28.0, 96.0)
    kernels_f, kernels_b = (8, 16) if sixteen_bit else (6, 14)
    bandwidth = _memory_bytes_per_s(elems, rates)
    # written bytes (fwd 16 or 12 a element, bwd 38 or 36) as new tensors of the element size: fresh_s
    fwd_new, bwd_new = ((16.0, 38.0) if sixteen_bit else (12.0, 36.0))
    return (elems * fwd_bytes / bandwidth + fresh_s(elems, fwd_new / rates.element_bytes, rates),
            elems * bwd_bytes / bandwidth + fresh_s(elems, bwd_new / rates.element_bytes, rates), kernels_f, kernels_b)


def _rotary(model: ModelSpec, tokens: Batch, tp: int, rates: DeviceRates) -> tuple[Batch, Batch, int, int]:
    """(forward s, backward s, forward kernels, backward kernels) of rotary position embeddings on the local q and k
    heads as transformers applies them (apply_rotary_pos_emb: q * cos + rotate_half(q) * sin, rotate_half a neg
    and a cat): counted under a dispatch mode, forward reads 5.5 and writes 4.5 elements per element of q and k,
    backward reads 8.5 and writes 7.5 (slice_backward's zero-filled halves and the adds that sum three gradients);
    mul, neg, cat, mul, add each forward, two muls, a neg, two slice_backwards and two adds each backward."""
    if model.position_embedding != "rotary":
        return 0 * tokens, 0 * tokens, 0, 0
    elems = tokens * (model.q_dim + model.kv_dim) / tp  # q and k (v is not rotated)
    return _elementwise(elems, 5.5, 4.5, 0, rates), _elementwise(elems, 8.5, 7.5, 0, rates), 10, 14


def _block_memory_ops(model: ModelSpec, b: Batch, s: int, tp: int, rates: DeviceRates
                      ) -> tuple[Batch, Batch, int, int]:
    """(forward s, backward s, forward kernels, backward kernels) of a block's memory-bound ops."""
    tokens = b * s
    hidden, inner = tokens * model.hidden_size, tokens * model.mlp_width / tp
    drop = 1 if model.dropout else 0
    # the block's norms (ModelSpec.num_block_norms) and the rotary embedding of q and k
    norms = model.num_block_norms
    norm_f, norm_b, nk_f, nk_b = _norm(hidden, model, rates)
    rope_f, rope_b, rk_f, rk_b = _rotary(model, tokens, tp, rates)
    fwd, bwd = norms * norm_f + rope_f, norms * norm_b + rope_b
    kernels_f, kernels_b = norms * nk_f + rk_f, norms * nk_b + rk_b
    # merging the heads is a copy; the activation is GELU, or SwiGLU's SiLU and product
    fwd += _elementwise(hidden / tp, 1, 1, 0, rates)
    bwd += _elementwise(hidden / tp, 1, 1, 0, rates)
    if model.gated_mlp:
        fwd += _elementwise(inner, 3, 2, 0, rates)
        bwd += _elementwise(inner, 5, 2, 0, rates)
        kernels_f, kernels_b = kernels_f + 3, kernels_b + 4
    elif model.activation == "gelu_new":
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as eight eager ops: 10 reads and 8 writes of the
        # MLP width forward; autograd runs each op's backward and sums x's three gradients (~14 reads, 10 writes)
        fwd += _elementwise(inner, 10, 8, 0, rates)
        bwd += _elementwise(inner, 14, 10, 0, rates)
        kernels_f, kernels_b = kernels_f + 9, kernels_b + 13
    else:
        fwd += _elementwise(inner, 1, 1, 0, rates)
        bwd += _elementwise(inner, 2, 1, 0, rates)
        kernels_f, kernels_b = kernels_f + 2, kernels_b + 2
    # after attention and after the MLP: dropout (a 1-byte mask) and the residual add
    pair = _elementwise(hidden, 2, 1, 0, rates) + drop * _elementwise(hidden, 1, 1, hidden, rates)
    fwd, bwd = fwd + 2 * pair + drop * _mask_draws(2 * hidden, rates), bwd + 2 * pair
    kernels_f, kernels_b = kernels_f + 2 * (1 + drop), kernels_b + 2 * (1 + drop)
    if model.torch_multihead_attention != "none":  # nn.MultiheadAttention's layout copies (MHA_RW_ELEMS)
        (r_f, w_f, k_f), (r_b, w_b, k_b) = MHA_RW_ELEMS[model.torch_multihead_attention]
        fwd = fwd + _elementwise(hidden / tp, r_f, w_f, 0, rates)
        bwd = bwd + _elementwise(hidden / tp, r_b, w_b, 0, rates)
        kernels_f, kernels_b = kernels_f + k_f, kernels_b + k_b
    s_f, s_b, s_k = _eager_scores(model, b, s, tp, rates)
    return fwd + s_f, bwd + s_b, kernels_f + s_k + 2, kernels_b + s_k + 2  # + bias adds the GEMM epilogue does not fuse


def _eager_scores(model: ModelSpec, b: Batch, s: int, tp: int, rates: DeviceRates) -> tuple[Batch, Batch, int]:
    """(forward s, backward s, kernels each way) of eager attention's passes over the s x s scores of the local
    heads: scale, mask (causal for a decoder, padding for an encoder), softmax and dropout; none under flash."""
    if model.attention != "eager":
        return 0 * b, 0 * b, 0
    drop = 1 if model.dropout else 0
    scores, passes = b * model.num_heads / tp * s * s, 3 + drop
    fwd = _elementwise(scores, passes, passes, drop * scores, rates) + drop * _mask_draws(scores, rates)
    bwd = _elementwise(scores, passes + 1, passes, drop * scores, rates)
    upcast = model.eager_upcast(rates.element_bytes)
    if upcast == "none":
        return fwd, bwd, passes
    # in bytes beyond those passes: softmax writes fp32 and a cast reads it back (forward); the cast's gradient
    # widens to fp32 and softmax's backward reads its fp32 output and gradient
    e = rates.element_bytes
    extra_f_bytes, extra_b_bytes = (4 - e) + (4 + e), (e + 4) + (8 - 2 * e)  # per score element
    if upcast == "scores":  # the scale and mask passes (each way) over fp32 scores as well
        extra_f_bytes, extra_b_bytes = extra_f_bytes + 2 * 2 * (4 - e), extra_b_bytes + 2 * 2 * (4 - e)
    return (fwd + _elementwise(scores, 0, 0, scores * extra_f_bytes, rates),
            bwd + _elementwise(scores, 0, 0, scores * extra_b_bytes, rates), passes + 1)


def _disentangled_attention(model: ModelSpec, b: Batch, s: int, tp: int, rates: DeviceRates
                            ) -> tuple[Batch, Batch, int, int]:
    """(forward s, backward s, forward kernels, backward kernels) of DeBERTa-v2's disentangled attention beyond
    the content scores (He et al. 2021, eq. 2-4; transformers models/deberta_v2 DisentangledSelfAttention and
    disentangled_attention_bias, share_att_key): the 2 x buckets relative embeddings projected by the key and
    query weights and repeated per sample, content-to-position and position-to-content batched matmuls (s x 2k
    per head), each gathered back to s x s, divided by sqrt(3 d) and added to the scores; the probabilities'
    StableDropout draws its mask as four more passes (bernoulli, 1 - x, bool, scale). Backward: the matmuls'
    two GEMMs each, the gathers as zero-fill + scatter-add over s x 2k, the repeats as sums. These matmuls are
    not in flops.py's model FLOPs (what MFU counts)."""
    if not model.relative_position_buckets:
        return 0 * b, 0 * b, 0, 0
    h, d, rows = model.hidden_size, model.head_dim, 2 * model.relative_position_buckets
    heads = b * model.num_heads / tp
    proj_f = 2 * gemm_s(rows, h / tp, h, 1, rates)
    proj_b = 2 * (gemm_s(rows, h, h / tp, 1, rates) + gemm_s(h, h / tp, rows, 1, rates))
    mm_f = 2 * gemm_s(s, rows, d, heads, rates)
    mm_b = 2 * (gemm_s(s, d, rows, heads, rates) + gemm_s(rows, d, s, heads, rates))
    repeats, scores, wide = heads * rows * d, heads * s * s, heads * s * rows
    fwd = (proj_f + mm_f + 2 * _elementwise(repeats, 1, 1, 0, rates)
           + _elementwise(scores, 8 + 3, 6 + 3.5, 0, rates))  # gathers, divisions, adds; dropout's mask passes
    bwd = (proj_b + mm_b + 2 * _elementwise(repeats, 1, 1, 0, rates)
           + 2 * _elementwise(wide, 0, 1, 0, rates) + _elementwise(scores, 2 + 2, 2 + 2, 0, rates))
    kernels_f, kernels_b = 19 + 4, 16
    return fwd, bwd, kernels_f, kernels_b


def _cross_attention(model: ModelSpec, b: Batch, s: int, tp: int, rates: DeviceRates, weight_grad: float
                     ) -> tuple[Batch, Batch, int, int, Batch]:
    """(forward s, backward s, forward kernels, backward kernels, forward FLOPs) of one cross-attention sub-block
    (ModelSpec.cross_attention_layers): its norm, q, k and v projections of the full heads, the scores, the output
    projection, its residual add and dropout, all at the stack's positions."""
    tokens, h, q = b * s, model.hidden_size, model.q_dim
    parts = [_linear(tokens, h, 3 * q / tp, rates, weight_grad), _linear(tokens, q / tp, h, rates, weight_grad),
             _attention(model, b, s, tp, rates)]
    hidden, drop = tokens * h, 1 if model.dropout else 0
    norm_f, norm_b, nk_f, nk_b = _norm(hidden, model, rates)
    fwd = norm_f + _elementwise(hidden / tp, 1, 1, 0, rates)
    bwd = norm_b + _elementwise(hidden / tp, 1, 1, 0, rates)
    pair = _elementwise(hidden, 2, 1, 0, rates) + drop * _elementwise(hidden, 1, 1, hidden, rates)
    gemms = 2 + (1 if model.attention == "flash" else 2)
    s_f, s_b, s_k = _eager_scores(model, b, s, tp, rates)
    # the norm, the heads' merge, the residual add and dropout; the GEMMs' input and weight gradients
    kernels_f, kernels_b = gemms + 2 + nk_f + drop + s_k, 2 * gemms + 2 + nk_b + drop + s_k
    fwd += pair + drop * _mask_draws(hidden, rates)
    if model.torch_multihead_attention != "none":  # nn.MultiheadAttention's layout copies (MHA_CROSS_RW_ELEMS)
        (r_f, w_f, k_f), (r_b, w_b, k_b) = MHA_CROSS_RW_ELEMS[model.torch_multihead_attention]
        fwd = fwd + _elementwise(hidden / tp, r_f, w_f, 0, rates)
        bwd = bwd + _elementwise(hidden / tp, r_b, w_b, 0, rates)
        kernels_f, kernels_b = kernels_f + k_f, kernels_b + k_b
    return (sum(x[0] for x in parts) + fwd + s_f, sum(x[1] for x in parts) + bwd + pair + s_b, kernels_f,
            kernels_b, sum(x[2] for x in parts))


def layer_times(model: ModelSpec, b: Batch, s: int, tp: int, rates: DeviceRates) -> PhaseTimes:
    """One transformer block on one tensor-parallel rank."""
    h, f, kv, q = model.hidden_size, model.mlp_width, model.kv_dim, model.q_dim
    tokens = b * s
    ups, wg = 2 if model.gated_mlp else 1, model.layer_weight_grad_share
    parts = [_linear(tokens, h, (q + 2 * kv) / tp, rates, wg), _linear(tokens, q / tp, h, rates, wg),
             _linear(tokens, h, ups * f / tp, rates, wg), _linear(tokens, f / tp, h, rates, wg),
             _attention(model, b, s, tp, rates)]
    mem_f, mem_b, kernels_f, kernels_b = _block_memory_ops(model, b, s, tp, rates)
    rel_f, rel_b, rel_kf, rel_kb = _disentangled_attention(model, b, s, tp, rates)
    ad_f, ad_b, ad_kf, ad_kb = _adapters(model, tokens, tp, rates)
    flops = sum(p[2] for p in parts)
    gemm_kernels = 4 + (1 if model.attention == "flash" else 2)
    backward_gemm_kernels = 2 * gemm_kernels - round(4 * (1 - wg))  # frozen weights: no weight-gradient GEMM
    fwd = sum(p[0] for p in parts) + mem_f + rel_f + ad_f
    bwd = sum(p[1] for p in parts) + mem_b + rel_b + ad_b
    kernels_f, kernels_b = gemm_kernels + kernels_f + rel_kf + ad_kf, backward_gemm_kernels + kernels_b + rel_kb + ad_kb
    if model.cross_attention_layers:  # the blocks' mean: cross_attention_share sub-blocks per block
        share = model.cross_attention_share
        x_f, x_b, x_kf, x_kb, x_flops = _cross_attention(model, b, s, tp, rates, wg)
        fwd, bwd, flops = fwd + share * x_f, bwd + share * x_b, flops + share * x_flops
        kernels_f, kernels_b = kernels_f + round(share * x_kf), kernels_b + round(share * x_kb)
    return PhaseTimes(fwd, bwd, kernels_f, kernels_b, flops, BACKWARD_PER_FORWARD * flops)


def outer_times(model: ModelSpec, b: Batch, s: int, tp: int, rates: DeviceRates, embedding: bool
                ) -> PhaseTimes:
    """Final norm, logits and loss (and the embedding when `embedding`): what runs outside the blocks."""
    tokens = b * s
    hidden = tokens * model.hidden_size
    gathers = 1 + int(model.position_embedding == "learned") + int(model.type_vocab_size > 0)
    norms = int(model.embedding_norm and embedding) + int(model.final_norm)
    fwd, bwd = 0 * hidden, 0 * hidden  # two arrays: += below must not alias them
    trained = model.outer_weight_grad_share  # frozen embeddings / head: no scatter-add, no weight-gradient GEMM
    narrow = tokens * model.embedding_width  # the embeddings' width (ModelSpec.embedding_size)
    if embedding:  # gathers, the adds that sum them, their backward scatter-adds
        fwd = _elementwise(narrow, 1, gathers, 0, rates) + _elementwise(narrow, 2 * (gathers - 1), gathers - 1, 0, rates)
        bwd = trained * _elementwise(narrow, gathers, gathers, 0, rates)
        # the token table's gradient: embedding_dense_backward zero-fills a new vocab x width tensor before adding
        # the tokens' rows into it (aten/src/ATen/native/Embedding.cpp, at::zeros); a tied head's weight gradient
        # (the logits' dW, already a new tensor) is then added into it or it into that, in place
        table = model.vocab_size * model.embedding_width
        bwd = bwd + trained * _elementwise(table, 0, 1, 0, rates)
        if model.head == "lm" and model.tied_embeddings:
            bwd = bwd + trained * _elementwise(table, 2, 1, 0, rates, fresh=False)
    norm_f, norm_b, nk_f, nk_b = _norm(hidden, model, rates)
    fwd += int(model.final_norm) * norm_f
    bwd += int(model.final_norm) * norm_b
    kernels_f = (2 * gathers - 1) * int(embedding) + norms * nk_f
    kernels_b = gathers * int(embedding) + norms * nk_b
    flops = 0 * hidden
    narrow_f, narrow_b, narrow_kf, narrow_kb = _norm(narrow, model, rates)  # a norm at the embeddings' width
    if model.embedding_norm and embedding:
        fwd, bwd = fwd + narrow_f, bwd + narrow_b
    if model.factorized_embedding and embedding:  # the projection up to the blocks' width
        p_f, p_b, p_flops = _linear(tokens, model.embedding_width, model.hidden_size, rates, trained)
        fwd, bwd, flops = fwd + p_f, bwd + p_b, flops + p_flops
        kernels_f, kernels_b = kernels_f + 1, kernels_b + 2
    if model.head == "lm" and model.head_transform:  # dense, GELU and norm before the vocabulary projection
        t_f, t_b, t_flops = _linear(tokens, model.hidden_size, model.embedding_width, rates, trained)
        fwd = fwd + t_f + _elementwise(narrow, 1, 1, 0, rates) + narrow_f
        bwd = bwd + t_b + _elementwise(narrow, 2, 1, 0, rates) + narrow_b
        flops = flops + t_flops
        kernels_f, kernels_b = kernels_f + 2 + narrow_kf, kernels_b + 3 + narrow_kb
    if model.head == "lm":
        vocab = model.padded_vocab(tp)
        logits = tokens * vocab / tp
        f_s, b_s, l_flops = _linear(tokens, model.embedding_width, vocab / tp, rates, trained)
        flops = flops + l_flops
        # both backward GEMMs take the logits' gradient as an operand (dX = dY W, dW = dY^T X); where some of its
        # values are subnormal, a CPU runs them through microcode assists (HardwareSpec.subnormal_gemm_slowdown)
        if rates.subnormal_gemm_slowdown:  # a device whose FMA units take subnormal operands at full pace: none
            b_s = b_s * (model.logits_grad_subnormal_factor
                         or 1.0 + rates.subnormal_gemm_slowdown * model.logits_grad_subnormal_share)
        if model.cross_entropy == "fused":  # one kernel reads the logits; backward reads them, writes the gradient
            fwd += f_s + _elementwise(logits, 1, 0, 0, rates)
            bwd += b_s + _elementwise(logits, 1, 1, 0, rates)
            kernels_f, kernels_b = kernels_f + 1, kernels_b + 1
        else:  # a contiguous copy of the shifted logits and a log-softmax; backward the reverse
            fwd += f_s + _elementwise(logits, 2, 2, 0, rates)
            bwd += b_s + _elementwise(logits, 3, 2, 0, rates)
            kernels_f, kernels_b = kernels_f + 4, kernels_b + 5
    return PhaseTimes(fwd, bwd, kernels_f, kernels_b, flops, BACKWARD_PER_FORWARD * flops)
