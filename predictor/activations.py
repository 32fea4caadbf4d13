"""Activation memory of one micro-batch: Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", arXiv:2205.05198, sec. 4), generalised to any element size, grouped-query
attention and gated MLPs.

With 16-bit activations, dropout and tensor parallel degree t, one block stores
    s*b*h*(10 + 24/t + 5*a*s/(h*t)) bytes      (their eq. 2; t = 1 gives 34*s*b*h + 5*a*s^2*b).
The terms below are the same tensors counted element by element, so that fp32, GQA and SwiGLU change
only the tensors they change.
"""

from __future__ import annotations

from zerotune.predictor.model import ModelSpec

__all__ = ["layer_activation_bytes", "checkpoint_bytes_per_layer", "logits_bytes", "embedding_activation_bytes"]

MASK_BYTES = 1  # dropout masks are stored as one byte per element
FP32_BYTES = 4


def layer_activation_bytes(model: ModelSpec, micro_batch: int, seq_len: int, act_bytes: int,
                           tp: int = 1, cross_share: float | None = None, cross_seq_len: int | None = None) -> float:
    """Bytes one transformer block keeps for backward (no recomputation), times the model's measured
    activation_scale (1 unless a profiling run measured the user's block). Cross-attention sub-blocks count
    `cross_share` times (the model's mean per block unless given: 1 for a decoder block); their keys and values
    span `cross_seq_len` positions (the encoder's; seq_len unless given)."""
    h, f, kv = model.hidden_size, model.mlp_width, model.kv_dim
    d, s = act_bytes, seq_len
    mask = MASK_BYTES if model.dropout else 0
    # Not split by tensor parallelism: two norm inputs, the QKV and MLP inputs, two output dropout masks. Attention
    # and MLP side by side (ModelSpec.parallel_residual) share the norms' input, and with one norm its output.
    inputs = {"none": 4, "two_norms": 3, "one_norm": 2}[model.parallel_residual]
    replicated = inputs * h * d + 2 * h * mask
    if model.norm == "rmsnorm" and d < FP32_BYTES:
        # transformers' RMSNorm (LlamaRMSNorm: x.to(float32), pow, x * rsqrt(var + eps), .to(dtype), weight * x,
        # the ops predictor/ops.py _norm times) keeps the fp32 copy for pow and the product, and the normalised
        # 16-bit x for the weight's product, instead of one 16-bit input: 4 more bytes an element, each norm
        replicated += model.num_block_norms * h * FP32_BYTES
    # Split: Q, K, V, attention-output input; softmax output (+ its dropout mask and output); the MLP: the
    # activation's input and the down projection's input, SwiGLU's gate and up outputs and their SiLU and
    # product, or, for GPT-2's tanh-approximated GELU as eager ops (transformers activations.py
    # NewGELUActivation: 0.5 * x * (1 + tanh(c (x + 0.044715 x^3)))), what autograd saves of them: x for pow,
    # tanh's output, and both factors of the last product, then the down projection's input: five tensors of
    # the MLP's width where torch's fused GELU keeps two (measured on one H200, data/measurements/gpu_grid:
    # GPT-2's peaks 5-23% above the two-tensor count).
    scores = _score_bytes(model, d, s)
    # eager attention repeats grouped K and V to every head before its matmuls (transformers' repeat_kv in
    # eager_attention_forward), which keep the repeated copies
    kept_kv = model.q_dim if model.attention == "eager" else kv
    attention = (model.q_dim + 2 * kept_kv + model.q_dim) * d + scores
    if model.eager_upcast(d) == "scores":
        attention += (model.q_dim + kv) * (FP32_BYTES - d)  # the score matmul keeps fp32 copies of Q and K
    # ReLU's backward reads its output, which is also the down projection's input: one tensor of the MLP's width
    plain = {"gelu_new": 5 * f, "relu": f}.get(model.activation, 2 * f)
    mlp = (4 * f if model.gated_mlp else plain) * d
    attention += _disentangled_bytes(model, d, s)
    per_token = replicated + (attention + mlp) / tp
    # cross-attention: its norm's input and output dropout mask, and Q, K, V, the output projection's input and
    # the scores as self-attention keeps them, of the full heads
    share = model.cross_attention_share if cross_share is None else cross_share
    if share:
        span = (cross_seq_len or s) / s  # source positions per target position
        # the keys' and values' input is the encoder's output, h per source position (one tensor every decoder
        # block shares, held here by each)
        cross = h * d * (1 + span) + h * mask
        cross += (2 * model.q_dim * d * (1 + span) + _score_bytes(model, d, cross_seq_len or s)) / tp
        per_token += share * cross
    return float(per_token * s * micro_batch * model.activation_scale)


def _disentangled_bytes(model: ModelSpec, act_bytes: int, seq_len: int) -> float:
    """Bytes per position that DeBERTa-v2's disentangled attention keeps beyond the content scores (transformers
    models/deberta_v2 disentangled_attention_bias): torch.gather keeps its whole input for backward (PyTorch
    tools/autograd/derivatives.yaml, gather: gather_backward(grad, self, dim, index, sparse_grad)), so the
    content-to-position and position-to-content scores stay, heads x 2 buckets wide each per position; and the
    two batched matmuls keep the projected relative embeddings repeated per sample (heads x 2 buckets x head
    width each, spread over the sample's positions). Read from autograd's saved tensors of one DebertaV2Layer
    (1536 wide, 24 heads, 256 buckets): (48, s, 512) twice and (48, 64, 512) twice at batch 2; on one H200 the
    peak grew 1.99 GiB a sample at sequence 512 against 1.37 without them (data/measurements/gpu_grid)."""
    if not model.relative_position_buckets:
        return 0.0
    wide = model.num_heads * 2 * model.relative_position_buckets
    return 2 * wide * act_bytes + 2 * wide * model.head_dim * act_bytes / seq_len


def _score_bytes(model: ModelSpec, act_bytes: int, keys: int) -> float:
    """Bytes per query position that attention keeps of its scores over `keys` positions, all heads: the softmax
    output (and its dropout mask and output) eagerly, the fp32 log-sum-exp of each query row under flash."""
    if model.attention == "flash":
        return model.num_heads * FP32_BYTES
    if model.eager_upcast(act_bytes) != "none":
        # softmax keeps its fp32 output; the context matmul keeps the probabilities cast back (or their dropout's
        # output, beside its mask)
        return model.num_heads * keys * (FP32_BYTES + act_bytes + (MASK_BYTES if model.dropout else 0))
    return model.num_heads * keys * (act_bytes + (MASK_BYTES + act_bytes if model.dropout else 0))


def checkpoint_bytes_per_layer(model: ModelSpec, micro_batch: int, seq_len: int, act_bytes: int) -> float:
    """Full recomputation keeps only each block's input (Korthikanti et al. 2022, sec. 4.3: 2*s*b*h*L)."""
    return float(model.hidden_size * act_bytes * seq_len * micro_batch)


def embedding_activation_bytes(model: ModelSpec, micro_batch: int, seq_len: int, act_bytes: int) -> float:
    """The embedding dropout mask and the final norm's input: small next to the blocks, counted anyway."""
    mask = MASK_BYTES if model.dropout else 0
    final = act_bytes if model.final_norm else 0
    return float(model.hidden_size * (mask + final) * seq_len * micro_batch)


def logits_bytes(model: ModelSpec, micro_batch: int, seq_len: int, act_bytes: int, tp: int = 1) -> float:
    """Logits and loss at the start of backward, which dominate small-vocabulary-heavy models (GPT-2).

    The model returns logits (16-bit in mixed precision), the loss upcasts them to fp32 (Hugging Face
    casts logits.float() before cross-entropy), log-softmax keeps its fp32 output for backward, and the
    first backward op allocates the fp32 gradient of the logits: d + 4 + 4 + 4 bytes per element in mixed
    precision, 4 + 4 + 4 in fp32 (the upcast is a no-op there). A fused cross-entropy (ModelSpec.cross_entropy)
    keeps the logits and writes their gradient in the same dtype: d + d.
    """
    if model.cross_entropy == "fused":
        return float(model.vocab_size * 2 * act_bytes * seq_len * micro_batch / tp)
    per_elem = (act_bytes if act_bytes < FP32_BYTES else 0) + 3 * FP32_BYTES
    return float(model.vocab_size * per_elem * seq_len * micro_batch / tp)
