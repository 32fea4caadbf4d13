"""Transformer architectures as data, and the parameter tensors they imply.

A model is described by its architecture (layers, hidden size, heads, ...), never by a parameter
count typed in by hand: the count, the tensor sizes ZeRO-3 partitions and the activation shapes all
follow from the same description, so they cannot disagree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache, cached_property, lru_cache
from typing import Literal, get_args, get_type_hints

__all__ = ["ModelSpec", "Tensor", "PositionEmbedding", "Norm", "Head", "busiest_stage_params"]

PositionEmbedding = Literal["learned", "rotary", "relative", "none"]
Norm = Literal["layernorm", "rmsnorm"]
Head = Literal["lm", "pooler", "none"]


@dataclass(frozen=True)
class Tensor:
    """One parameter tensor: ZeRO-3 gathers, partitions and persists parameters tensor by tensor."""

    name: str
    num_elems: int
    layer: int  # -1 for tensors outside the transformer blocks (embeddings, head)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder, encoder or encoder-decoder-free transformer, as its Hugging Face config describes it."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    """Key/value heads (grouped-query attention); equal to num_heads for multi-head attention."""
    ffn_hidden_size: int
    """Inner size of the MLP (4 * hidden for GPT-2/BERT; the gate/up width for gated MLPs)."""
    vocab_size: int
    """Rows of the token embedding; 0 for a model whose inputs arrive as vectors through the script's own projection
    (a ViT's patches, audio frames): no token table and no vocabulary head."""
    max_position_embeddings: int
    position_embedding: PositionEmbedding = "learned"
    tied_embeddings: bool = True
    """Output projection shares the input embedding matrix (GPT-2) or has its own (Llama)."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with gate, up and down projections (Llama) instead of fc1/fc2."""
    norm: Norm = "layernorm"
    qkv_bias: bool = True
    out_bias: bool = True
    mlp_bias: bool = True
    dropout: bool = True
    """Whether dropout layers run in training; their masks are stored for backward (Korthikanti 2022)."""
    activation: Literal["gelu", "gelu_new", "relu", "silu"] = "gelu"
    """The MLP's activation (of the gate, for a gated MLP). 'gelu', 'relu' and 'silu' are one fused kernel each
    (torch's), costed alike; 'gelu_new' is GPT-2's tanh approximation as Hugging Face writes it, eight elementwise
    torch ops each run as its own kernel in eager mode (transformers activations.py NewGELUActivation / gelu_new)."""
    attention: Literal["eager", "flash"] = "eager"
    """How attention runs: 'eager' materialises the s x s scores, softmax and its dropout mask per head
    (Korthikanti's 5as^2b term); 'flash' (FlashAttention, PyTorch's scaled_dot_product_attention) keeps only the
    row-wise log-sum-exp and regenerates the rest in backward (Dao et al. 2022, sec. 3.1)."""
    attention_upcast: Literal["none", "softmax", "scores"] = "none"
    """Where eager attention leaves the activations' precision (16-bit models; nothing changes in fp32 or under
    flash): 'none' keeps scores and softmax in it (transformers models/gpt2, bert, t5, bart: softmax(attn_weights,
    dim=-1)); 'softmax' computes the softmax in fp32 and casts its output back (softmax(attn_weights, dim=-1,
    dtype=torch.float32).to(query.dtype): llama, mistral, qwen2, gemma, opt, gpt_neox, bloom and most decoders'
    eager_attention_forward), so backward keeps the fp32 probabilities beside the cast ones; 'scores' casts query
    and key to fp32 first, so the score matmul and its gradients run at the fp32 matmul rate and the mask and
    softmax over fp32 scores (models/gpt_neo/modeling_gpt_neo.py GPTNeoSelfAttention._attn, gptj, codegen)."""
    torch_multihead_attention: Literal["none", "batch_first", "sequence_first"] = "none"
    """The block's attention is torch.nn.MultiheadAttention (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer),
    with batch_first or with the (sequence, batch, width) layout of its default. In training it runs
    F.multi_head_attention_forward's eager layout work beyond the split-projection attention the other models are
    costed as (ops.MHA_RW_ELEMS): its packed in-projection's output is copied into a (3, sequence, batch, width)
    layout and backward zero-fills, sums and copies the three slices' gradients back (torch/nn/functional.py
    multi_head_attention_forward, _in_projection_packed); a batch-first input is first copied to the sequence-first
    layout, on which F.linear adds the bias apart from its GEMM. The profiling run reads it from the block's modules
    (calibrate/inspect_model.py). 'none': another attention."""
    parallel_residual: Literal["none", "one_norm", "two_norms"] = "none"
    """Attention and MLP side by side on the block's input, their outputs added to it (GPT-J, Phi, CodeGen: one
    norm feeding both, transformers models/gptj GPTJBlock ln_1; GPT-NeoX's use_parallel_residual and Falcon's new
    decoder architecture: two norms of the same input, gpt_neox GPTNeoXLayer, falcon ln_attn / ln_mlp); 'none':
    one after the other. Backward keeps one input for both branches' norms (and one normalised input for both
    branches' first GEMMs with one norm)."""
    cross_entropy: Literal["eager", "fused"] = "eager"
    """How a vocabulary head's loss runs: 'eager' as Hugging Face's models compute it (the logits cast to fp32,
    shifted into a contiguous copy, a log-softmax whose fp32 output backward keeps, an fp32 gradient); 'fused' one
    kernel each way over the 16-bit logits that keeps only each row's log-sum-exp and writes the logits' gradient
    in their own dtype (flash-attn's losses/cross_entropy.py CrossEntropyLoss, the default loss of llm-foundry's
    MPT: llmfoundry/models/mpt/modeling_mpt.py ComposerMPTCausalLM loss_fn='fused_crossentropy')."""
    type_vocab_size: int = 0
    """BERT token-type (segment) embeddings."""
    embedding_size: int = 0
    """Width of a factorized embedding (ELECTRA's and ALBERT's embedding_size, Lan et al. 2020 sec. 3.1): the token,
    position and type tables and the embeddings' norm are this wide, a linear (with bias) projects them up to the
    hidden width before the first block (transformers models/electra/modeling_electra.py ElectraModel.
    embeddings_project; albert AlbertTransformer.embedding_hidden_mapping_in), and a masked-LM head's transform
    projects back down to it before the vocabulary projection (ElectraGeneratorPredictions, AlbertMLMHead).
    0: the hidden width, no projection."""
    embedding_norm: bool = False
    """A norm right after the embeddings (BERT family)."""
    final_norm: bool = True
    """A norm after the last block (pre-LN models: GPT-2, Llama)."""
    head: Head = "lm"
    """'lm': vocabulary projection (its own matrix unless tied); 'pooler': BERT's h x h pooler; 'none'."""
    head_transform: bool = False
    """A dense h x h (with bias) and a norm between the last block and the vocabulary projection: BERT's masked-LM
    head (transformers BertLMPredictionHead.transform); only with head 'lm'."""
    head_bias: bool = False
    """The vocabulary projection has a bias of vocab_size (BERT's masked-LM decoder); only with head 'lm'."""
    relative_position_buckets: int = 0
    """DeBERTa-v2 relative position embeddings: 2 * buckets rows of width hidden, plus their norm."""
    conv_kernel_size: int = 0
    """DeBERTa-v2 convolution beside the first block (kernel * hidden * hidden weights)."""
    attention_head_dim: int = 0
    """Width of one attention head when the config states its own (Qwen3, Gemma 2/3: head_dim 128 with hidden 1024 and
    16 heads); 0: hidden_size / num_heads. Q and the attention output are num_heads x this wide, K and V num_kv_heads
    x this (transformers models/qwen3/modeling_qwen3.py Qwen3Attention: q_proj hidden -> heads * head_dim)."""
    activation_scale: float = 1.0
    """Bytes a block keeps for backward, measured over zerotune.predictor.activations' formula: 1 for the implementations
    the formula describes; zerotune tune's profiling run measures it for the user's own code (saved-tensor hooks on
    the first block, validate/profiled.py)."""
    logits_grad_subnormal_share: float = 0.0
    """Share of the logits' gradient values that are subnormal floats (nonzero, below the dtype's smallest normal),
    as zerotune tune's profiling run reads it on the CPU at each backward (the median; validate/profiled.py). A model
    trained from scratch whose tied embedding keeps nn.Embedding's N(0, 1) initialisation puts logits tens of units
    apart, so softmax probabilities underflow: tests/fixtures/scripts/encoder_mlm.py read 3.3% at its first
    backward and 1.5% six AdamW steps later. The logits' backward GEMMs slow with it on a CPU
    (HardwareSpec.subnormal_gemm_slowdown). 0 in the catalog: a pretrained model's, or a GPU's, costs nothing."""
    logits_grad_subnormal_factor: float = 0.0
    """How many times longer the logits' backward GEMMs take at logits_grad_subnormal_share on the host that runs the
    job, as zerotune tune's profiling run timed it there (GEMMs with subnormal operands, interpolated to the share:
    calibrate/site_paces.py subnormal_rate, validate/profiled.py); at least 1. 0: the hardware catalog's linear
    term (1 + HardwareSpec.subnormal_gemm_slowdown x the share). How slow a subnormal operand is depends on the core:
    an Intel Xeon host ran 7x slower at 3%, an AMD EPYC host not slower at all at 3% or 17%."""
    hooked_modules_per_layer: int = 0
    """Modules one block runs: the block, every submodule whose forward is called (linears, norms, the attention
    and MLP wrappers, activation and dropout modules, dropouts of rate 0 included), for ZeRO-3's hooks, which
    DeepSpeed registers on every module and which fire on each call (runtime/zero/parameter_offload.py:337-528).
    0: the built-in workload's tree, each module owning parameters and the block. Hugging Face blocks run more:
    GPT-2's 12 (6 own parameters), BERT's 17 (8), DeBERTa-v2's 21 calls (8; two projections run twice), GPT-Neo's
    16 (8), Llama's 13 (9), counted with forward hooks in transformers 5 (the catalog's values); the profiling run
    counts the modules of the user's block (calibrate/inspect_model.py _hooked_modules)."""
    hooked_outer_modules: int = 0
    """Modules outside the blocks whose forward runs (the root, embeddings, their norm and dropout, the final norm,
    the head; containers such as ModuleList are never called). 0: the built-in workload's tree."""
    frozen_layer_params: int = 0
    """Elements of one block's parameters that do not train (requires_grad False: a LoRA fine-tune's base weights,
    frozen lower layers averaged over the blocks); 0: every block parameter trains. DeepSpeed builds its optimizer's
    groups, gradient buckets and fp32 partitions from trainable parameters only (deepspeed 0.19
    runtime/zero/stage_1_and_2.py:428-434, zero/stage3.py:726-735 _get_trainable_parameter_groups,
    bf16_optimizer.py:162, fp16/fused_optimizer.py:91; engine.py:3848-3850 skips them in ZeRO-0's all-reduce), so a
    frozen parameter costs its 16-bit weight (partitioned under ZeRO-3) and no gradient, master copy or optimizer
    state; autograd skips its weight-gradient GEMM."""
    frozen_outer_params: int = 0
    """Frozen elements outside the blocks (embeddings, final norm, head)."""
    adapter_params: int = 0
    """Trainable elements beside the architecture's tensors (LoRA's A and B matrices; peft's tuner layers), counted
    in num_params."""
    num_adapter_tensors: int = 0
    """Parameter tensors of the adapters: each passes through DeepSpeed's gradient hooks like any other."""
    num_experts: int = 0
    """MoE: expert MLPs per block, each ffn_hidden_size wide (Mixtral's num_local_experts, DeepSpeed MoE's local
    experts); 0: one dense MLP. Every expert's parameters are held, reduced and updated; a token runs only
    experts_per_token of them (mlp_width)."""
    experts_per_token: int = 1
    """MoE: the experts each token is routed to (top-k: Mixtral's num_experts_per_tok 2, DeepSpeed MoE's k)."""
    shared_expert_ffn_size: int = 0
    """MoE: the width of a dense MLP every token runs beside its routed experts, gated like them where gated_mlp,
    with a one-output gate of its own (Qwen2-MoE's shared_expert_intermediate_size and shared_expert_gate,
    transformers models/qwen2_moe/modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock); 0: none."""
    cross_attention_layers: int = 0
    """Blocks with a cross-attention sub-block over the encoder's output: an encoder-decoder's decoder layers (T5's
    T5LayerCrossAttention, BART's encoder_attn; transformers models/t5/modeling_t5.py, models/bart/modeling_bart.py),
    the last of num_layers. Each adds a norm and q, k, v, o projections of the full heads, held and updated like
    any block's; it runs as one more attention (projections, scores, softmax, residual) at the stack's positions,
    on average over the blocks, as the one-stack description runs the encoder's and the decoder's blocks at their
    layer-weighted mean length (validate/profiled.py _encoder_decoder_tokens)."""
    distinct_layers: int = 0
    """Blocks with weights of their own where fewer than num_layers hold them and the rest run them again: ALBERT's
    cross-layer sharing (Lan et al. 2020, sec. 3.1; transformers models/albert/modeling_albert.py AlbertTransformer
    runs albert_layer_groups[int(i / (num_hidden_layers / num_hidden_groups))] for each of num_hidden_layers, every
    group's inner_group_num layers each time), or a script's own loop over one block. num_layers counts the blocks
    a token passes through (FLOPs, kernels, saved activations, ZeRO-3's hooks fire on every call); parameters,
    gradients, optimizer states and their traffic are those of distinct_layers blocks. A shared weight's gradient
    sums over its passes before autograd's AccumulateGrad runs once for it, so its hook fires, and its reduction
    can start, only when backward has passed its first use. 0: every block holds its own."""
    dispatched_forward_ops: int = 0
    """ATen ops the model's forward was counted dispatching, where its structure is not read (a stand-in's, from the
    profiling run's first forward, calibrate/site_counts.py op_counter); 0: its kernels are counted from the
    structure (ops.py). Each costs the host a launch (HardwareSpec.kernel_launch_us), however small its tensors:
    torch 2.13's CPU nn.GRU runs about 9,800 ops a forward and 13,900 a backward at any batch size (2 layers, both
    directions, 128 positions: forward and backward took 165 ms at micro-batch 1 on one core, 2026-11-30), which a
    stand-in of two GEMMs per block does not dispatch. Backward runs BACKWARD_OPS_PER_FORWARD times as many."""
    vocab_padding_multiple: int = 0
    """A framework that pads the vocabulary's rows before splitting them over tensor-parallel ranks: Megatron-LM and
    Megatron-DeepSpeed pad vocab_size up to a multiple of make_vocab_size_divisible_by (default 128) x the
    tensor-parallel degree (megatron/tokenizer/tokenizer.py _vocab_size_with_padding), so that the head's GEMMs stay
    aligned (ops.TENSOR_CORE_ALIGN_BYTES). 0: no padding (Hugging Face models run vocab_size rows as given;
    a script's own padded table is read as its real size)."""
    published_num_params: int = 0
    """The parameter count the model's authors publish (0 if none); a catalog test compares it."""
    source: str = ""

    def __post_init__(self) -> None:
        for field, choices in _choices().items():
            if getattr(self, field) not in choices:
                raise ValueError(f"model {self.name!r}: {field} must be one of {', '.join(choices)}, got "
                                 f"{getattr(self, field)!r}")
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size"):
            if getattr(self, field) <= 0:
                raise ValueError(f"model {self.name!r}: {field} must be positive, got {getattr(self, field)}")
        if self.vocab_size < 0 or (self.vocab_size == 0 and self.head == "lm"):
            raise ValueError(f"model {self.name!r}: vocab_size must be positive for a vocabulary head (head: lm), or 0 "
                             f"with head: none or pooler for inputs that are not tokens, got {self.vocab_size}")
        if self.logits_grad_subnormal_factor and self.logits_grad_subnormal_factor < 1.0:
            raise ValueError(f"model {self.name!r}: logits_grad_subnormal_factor must be 0 (the catalog's) or at "
                             f"least 1, got {self.logits_grad_subnormal_factor}")
        if not 0.0 <= self.logits_grad_subnormal_share <= 1.0:
            raise ValueError(f"model {self.name!r}: logits_grad_subnormal_share must be a share from 0 to 1, got "
                             f"{self.logits_grad_subnormal_share}")
        if not self.activation_scale > 0:
            raise ValueError(f"model {self.name!r}: activation_scale must be positive, got {self.activation_scale}")
        if self.num_experts < 0 or not 1 <= self.experts_per_token <= max(self.num_experts, 1):
            raise ValueError(f"model {self.name!r}: num_experts {self.num_experts} and experts_per_token "
                             f"{self.experts_per_token}: give 0 experts (a dense MLP) or at least as many as a token "
                             f"is routed to")
        for field in ("frozen_layer_params", "frozen_outer_params", "adapter_params", "num_adapter_tensors",
                      "dispatched_forward_ops"):
            if getattr(self, field) < 0:
                raise ValueError(f"model {self.name!r}: {field} must be 0 or positive, got {getattr(self, field)}")
        if not 0 <= self.cross_attention_layers <= self.num_layers:
            raise ValueError(f"model {self.name!r}: cross_attention_layers must be 0 to num_layers "
                             f"({self.num_layers}), got {self.cross_attention_layers}")
        if not 0 <= self.distinct_layers <= self.num_layers or (self.distinct_layers and self.cross_attention_layers):
            raise ValueError(f"model {self.name!r}: distinct_layers must be 0 (every block holds its own weights) or 1 "
                             f"to num_layers ({self.num_layers}), without cross_attention_layers, got "
                             f"{self.distinct_layers}")
        if self.embedding_size < 0:
            raise ValueError(f"model {self.name!r}: embedding_size must be 0 (the hidden width) or positive, got "
                             f"{self.embedding_size}")
        if self.vocab_padding_multiple < 0:
            raise ValueError(f"model {self.name!r}: vocab_padding_multiple must be 0 (no padding) or positive, got "
                             f"{self.vocab_padding_multiple}")
        if self.attention_head_dim < 0:
            raise ValueError(f"model {self.name!r}: attention_head_dim must be 0 (hidden_size / num_heads) or "
                             f"positive, got {self.attention_head_dim}")
        if not self.attention_head_dim and self.hidden_size % self.num_heads:
            raise ValueError(f"model {self.name!r}: hidden_size {self.hidden_size} is not a multiple of "
                             f"num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model {self.name!r}: num_heads {self.num_heads} is not a multiple of "
                             f"num_kv_heads {self.num_kv_heads}")

    def padded_vocab(self, tp: int = 1) -> int:
        """Rows of the vocabulary head as the framework runs them on tp ranks (vocab_padding_multiple)."""
        if not self.vocab_padding_multiple:
            return self.vocab_size
        multiple = self.vocab_padding_multiple * tp
        return -(-self.vocab_size // multiple) * multiple

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_heads

    @property
    def q_dim(self) -> int:
        """Width of the queries and of the attention output's input: hidden_size unless attention_head_dim says."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_block_norms(self) -> int:
        """Norms in one block: two, or one feeding attention and MLP side by side (parallel_residual)."""
        return 1 if self.parallel_residual == "one_norm" else 2

    def eager_upcast(self, element_bytes: int) -> Literal["none", "softmax", "scores"]:
        """attention_upcast where it changes anything: eager attention over activations narrower than fp32."""
        return self.attention_upcast if self.attention == "eager" and element_bytes < 4 else "none"

    @property
    def held_layers(self) -> int:
        """Blocks whose weights the model holds (distinct_layers where they are shared, else num_layers)."""
        return self.distinct_layers or self.num_layers

    def replace(self, **changes: object) -> "ModelSpec":
        return dataclasses.replace(self, **changes)

    # -- parameter tensors ---------------------------------------------------------------------------

    @property
    def embedding_width(self) -> int:
        """Width of the embedding tables and of the vocabulary projection's input (embedding_size)."""
        return self.embedding_size or self.hidden_size

    @property
    def factorized_embedding(self) -> bool:
        """Whether a projection joins embeddings narrower (or wider) than the blocks to them."""
        return self.embedding_width != self.hidden_size

    def _norm(self, name: str, layer: int, width: int = 0) -> list[Tensor]:
        h = width or self.hidden_size
        tensors = [Tensor(f"{name}.weight", h, layer)]
        if self.norm == "layernorm":
            tensors.append(Tensor(f"{name}.bias", h, layer))
        return tensors

    def _linear(self, name: str, n_in: int, n_out: int, bias: bool, layer: int) -> list[Tensor]:
        tensors = [Tensor(f"{name}.weight", n_in * n_out, layer)]
        if bias:
            tensors.append(Tensor(f"{name}.bias", n_out, layer))
        return tensors

    def layer_tensors(self, layer: int) -> list[Tensor]:
        """Parameters of one transformer block: attention, MLP and two norms (one: parallel_residual 'one_norm')."""
        h, f, kv, q = self.hidden_size, self.ffn_hidden_size, self.kv_dim, self.q_dim
        p = f"layers.{layer}"
        t = self._norm(f"{p}.norm1", layer)
        t += self._linear(f"{p}.attn.q", h, q, self.qkv_bias, layer)
        t += self._linear(f"{p}.attn.k", h, kv, self.qkv_bias, layer)
        t += self._linear(f"{p}.attn.v", h, kv, self.qkv_bias, layer)
        t += self._linear(f"{p}.attn.out", q, h, self.out_bias, layer)
        if layer >= self.num_layers - self.cross_attention_layers:
            t += self._norm(f"{p}.cross_norm", layer)
            for proj in ("q", "k", "v"):
                t += self._linear(f"{p}.cross.{proj}", h, q, self.qkv_bias, layer)
            t += self._linear(f"{p}.cross.out", q, h, self.out_bias, layer)
        if self.num_block_norms == 2:
            t += self._norm(f"{p}.norm2", layer)
        experts = [f"{p}.mlp"] if not self.num_experts else [f"{p}.mlp.experts.{e}" for e in range(self.num_experts)]
        if self.num_experts:  # the router: h -> one score per expert
            t.append(Tensor(f"{p}.mlp.router.weight", h * self.num_experts, layer))
        widths = [(mlp, f) for mlp in experts]
        if self.num_experts and self.shared_expert_ffn_size:
            widths.append((f"{p}.mlp.shared_expert", self.shared_expert_ffn_size))
            t.append(Tensor(f"{p}.mlp.shared_expert_gate.weight", h, layer))
        for mlp, width in widths:
            if self.gated_mlp:
                t += self._linear(f"{mlp}.gate", h, width, self.mlp_bias, layer)
            t += self._linear(f"{mlp}.up", h, width, self.mlp_bias, layer)
            t += self._linear(f"{mlp}.down", width, h, self.mlp_bias, layer)
        return t

    @property
    def mlp_width(self) -> int:
        """The MLP width a token's GEMMs and activations run over: the dense MLP's, or its top-k experts' together
        (each token's k expert MLPs cost k times one expert's FLOPs and saved activations)."""
        if not self.num_experts:
            return self.ffn_hidden_size
        return self.ffn_hidden_size * self.experts_per_token + self.shared_expert_ffn_size

    def embedding_tensors(self) -> list[Tensor]:
        h, e = self.hidden_size, self.embedding_width
        t = [Tensor("embed.tokens", self.vocab_size * e, -1)] if self.vocab_size else []
        if self.position_embedding == "learned":
            t.append(Tensor("embed.positions", self.max_position_embeddings * e, -1))
        if self.type_vocab_size:
            t.append(Tensor("embed.token_types", self.type_vocab_size * e, -1))
        if self.embedding_norm:
            t += self._norm("embed.norm", -1, e)
        if self.factorized_embedding:
            t += self._linear("embed.project", e, h, True, -1)
        if self.relative_position_buckets:
            t.append(Tensor("encoder.rel_embeddings", 2 * self.relative_position_buckets * h, -1))
            t += self._norm("encoder.rel_norm", -1)
        if self.conv_kernel_size:
            t.append(Tensor("encoder.conv.weight", self.conv_kernel_size * h * h, -1))
            t.append(Tensor("encoder.conv.bias", h, -1))
            t += self._norm("encoder.conv_norm", -1)
        return t

    def head_tensors(self) -> list[Tensor]:
        h = self.hidden_size
        t = self._norm("final_norm", -1) if self.final_norm else []
        e = self.embedding_width
        if self.head == "lm" and self.head_transform:
            t += self._linear("lm_head.transform", h, e, True, -1) + self._norm("lm_head.transform_norm", -1, e)
        if self.head == "lm" and not self.tied_embeddings:
            t.append(Tensor("lm_head.weight", self.vocab_size * e, -1))
        if self.head == "lm" and self.head_bias:
            t.append(Tensor("lm_head.bias", self.vocab_size, -1))
        elif self.head == "pooler":
            t += self._linear("pooler", h, h, True, -1)
        return t

    def tensors(self) -> list[Tensor]:
        """Every trainable parameter tensor, shared (tied) tensors counted once."""
        t = self.embedding_tensors()
        for layer in range(self.held_layers):
            t += self.layer_tensors(layer)
        return t + self.head_tensors()

    @cached_property
    def num_params(self) -> int:
        """Every parameter the model holds: the architecture's tensors and the adapters beside them."""
        return sum(t.num_elems for t in self.tensors()) + self.adapter_params

    @cached_property
    def num_trainable_params(self) -> int:
        """Parameters with gradients, master copies and optimizer states: all but the frozen ones."""
        return (self.held_layers * self.num_trained_layer_params + self.num_trained_outer_params
                + self.adapter_params)

    @property
    def num_trained_layer_params(self) -> int:
        """Parameters of one block that train (frozen_layer_params clipped to the block)."""
        return self.num_layer_params - min(self.frozen_layer_params, self.num_layer_params)

    @property
    def num_trained_outer_params(self) -> int:
        """Parameters outside the blocks that train (frozen_outer_params clipped to them)."""
        return self.num_outer_params - min(self.frozen_outer_params, self.num_outer_params)

    @cached_property
    def num_trainable_tensors(self) -> int:
        """Tensors through DeepSpeed's gradient hooks and buckets: the architecture's, in the share of its elements
        that train (a block frozen whole has none), plus the adapters'."""
        architecture = self.num_params - self.adapter_params
        share = (self.num_trainable_params - self.adapter_params) / architecture if architecture else 1.0
        return round(self.num_tensors * share) + self.num_adapter_tensors

    @property
    def layer_weight_grad_share(self) -> float:
        """Share of a block's weights whose gradient GEMM runs (1 unless frozen)."""
        return self.num_trained_layer_params / self.num_layer_params

    @property
    def outer_weight_grad_share(self) -> float:
        """Share of the parameters outside the blocks (embeddings, head) that train: the logits' weight-gradient
        GEMM runs only if the head (or the embedding tied to it) trains."""
        return self.num_trained_outer_params / self.num_outer_params if self.num_outer_params else 1.0

    @cached_property
    def num_outer_params(self) -> int:
        """Parameters outside the blocks: embeddings, final norm, head."""
        return sum(t.num_elems for t in self.embedding_tensors() + self.head_tensors())

    @cached_property
    def num_tensors(self) -> int:
        return len(self.tensors())

    @cached_property
    def num_layer_params(self) -> int:
        """Parameters of one transformer block: their mean over the blocks where some carry cross-attention."""
        if not self.cross_attention_layers:
            return sum(t.num_elems for t in self.layer_tensors(0))
        return round(sum(t.num_elems for layer in range(self.num_layers) for t in self.layer_tensors(layer))
                     / self.num_layers)

    @cached_property
    def largest_layer_params(self) -> int:
        """Parameters of the largest block (a decoder block with its cross-attention)."""
        return sum(t.num_elems for t in self.layer_tensors(self.num_layers - 1))

    @property
    def cross_attention_share(self) -> float:
        """Cross-attention sub-blocks per block, on average."""
        return self.cross_attention_layers / self.num_layers


@cache
def _choices() -> dict[str, tuple[str, ...]]:
    """ModelSpec's fields that take one of a few strings, with those strings (their Literal types): a model YAML
    that misspells one is refused, not read as the default's neighbour."""
    hints = get_type_hints(ModelSpec)
    return {f.name: get_args(hints[f.name]) for f in dataclasses.fields(ModelSpec)
            if getattr(hints[f.name], "__origin__", None) is Literal}


@lru_cache(maxsize=256)
def busiest_stage_params(model: ModelSpec, pp: int) -> tuple[float, float]:
    """(parameters, trainable parameters) of the pipeline stage that holds the most, times pp: what the whole model
    would hold if every stage held as many (state_bytes divides by the stages). DeepSpeed's PipelineModule
    partitions the blocks alone ('type:transformer', runtime/pipe/module.py:412-417; the first stages take the
    L mod pp extra blocks, step_time.pipeline_stages) and places everything else with the stage its layer spec
    falls in: the embedding before the first block, the final norm and head after the last. A tied embedding
    is a TiedLayerSpec held whole by both the first and the last stage (module.py _index_tied_modules; Megatron-
    DeepSpeed GPTModelPipe ties EmbeddingPipe there), its gradients all-reduced between them. So the first
    stage holds ceil(L / pp) blocks and the embedding, the last floor(L / pp) blocks, the head and, when tied,
    the embedding again; a per-GPU peak is the larger. One stage: the model."""
    if pp == 1:
        return float(model.num_params), float(model.num_trainable_params)
    layers = model.num_layers
    embed = sum(t.num_elems for t in model.embedding_tensors())
    head = sum(t.num_elems for t in model.head_tensors()) + (embed if model.head == "lm" and model.tied_embeddings
                                                              else 0)
    outer_trained = model.num_trained_outer_params / model.num_outer_params if model.num_outer_params else 1.0
    adapters = model.adapter_params / layers
    stages = [(-(-layers // pp), embed), (layers // pp, head)]
    params = max(blocks * (model.num_layer_params + adapters) + outer for blocks, outer in stages)
    trained = max(blocks * (model.num_trained_layer_params + adapters) + outer * outer_trained
                  for blocks, outer in stages)
    return pp * params, pp * trained
