"""Floating-point work of one micro-batch: matmuls, attention and logits (Narayanan et al. 2021, sec. 5.1).

Per block, forward: 2*b*s*h*(h + 2*kv) (QKV) + 4*b*s^2*h (scores and weighted values) + 2*b*s*h^2
(output) + 2*b*s*h*f*(3 if gated else 2) (MLP); logits 2*b*s*h*V. Backward costs twice the forward and
full recomputation one more forward of the blocks. With f = 4h and kv = h this is their
96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) for a step with recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerotune.predictor.model import ModelSpec

__all__ = ["MicroBatchFlops", "micro_batch_flops", "layer_forward_flops", "logits_forward_flops"]

BACKWARD_PER_FORWARD = 2.0


def layer_forward_flops(model: ModelSpec, micro_batch: int, seq_len: int) -> float:
    h, f, kv, q = model.hidden_size, model.mlp_width, model.kv_dim, model.q_dim
    tokens = micro_batch * seq_len
    qkv = 2 * tokens * h * (q + 2 * kv)
    attention = 4 * tokens * seq_len * q
    out = 2 * tokens * q * h
    mlp = 2 * tokens * h * f * (3 if model.gated_mlp else 2)
    # cross-attention: q, k, v and o of the full heads and the scores, as one more attention
    cross = model.cross_attention_share * (2 * tokens * h * 3 * q + attention + out)
    return float(qkv + attention + out + mlp + cross)


def logits_forward_flops(model: ModelSpec, micro_batch: int, seq_len: int) -> float:
    """The GEMMs outside the blocks: the vocabulary projection (from the embedding's width), the masked-LM head's
    transform before it when there is one (h x embedding width), and a factorized embedding's projection up to the
    hidden width (ModelSpec.embedding_size)."""
    tokens, h, e = micro_batch * seq_len, model.hidden_size, model.embedding_width
    project = 2 * tokens * e * h if model.factorized_embedding else 0
    if model.head != "lm":
        return float(project)
    return float(2 * tokens * e * model.vocab_size + (2 * tokens * h * e if model.head_transform else 0) + project)


@dataclass(frozen=True)
class MicroBatchFlops:
    forward_flops: float
    backward_flops: float
    recompute_flops: float

    @property
    def total_flops(self) -> float:
        return self.forward_flops + self.backward_flops + self.recompute_flops

    @property
    def model_flops(self) -> float:
        """What MFU counts: forward and backward, no recomputation (Chowdhery et al. 2022, app. B)."""
        return self.forward_flops + self.backward_flops


def micro_batch_flops(model: ModelSpec, micro_batch: int, seq_len: int, recompute: bool) -> MicroBatchFlops:
    blocks = model.num_layers * layer_forward_flops(model, micro_batch, seq_len)
    forward = blocks + logits_forward_flops(model, micro_batch, seq_len)
    return MicroBatchFlops(forward, BACKWARD_PER_FORWARD * forward, blocks if recompute else 0.0)
