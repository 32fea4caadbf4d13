"""Hugging Face config.json files read offline into a ModelSpec: the dimensions under each family's key names, the
family's traits (activation, norm, attention's upcast, position embedding, tied head, experts) and the layers of
an encoder-decoder. zerotune.predictor.catalog.load_model reads a config.json given as --model through it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from zerotune.predictor.catalog import _model_integers, read_user_text
from zerotune.predictor.model import ModelSpec

__all__ = ["model_from_hf_config", "model_from_hf_dict", "HF_WIDTH_KEYS"]

_HF_KEYS = {"num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
            "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
            "num_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads", "encoder_attention_heads"),
            "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
            "ffn_hidden_size": ("intermediate_size", "n_inner", "hidden_dim", "ffn_dim", "d_ff", "encoder_ffn_dim"),
            "encoder_layers": ("encoder_layers",), "decoder_layers": ("decoder_layers", "num_decoder_layers"),
            "vocab_size": ("vocab_size",),
            "max_position_embeddings": ("max_position_embeddings", "n_positions", "n_ctx")}
HF_WIDTH_KEYS = _HF_KEYS["hidden_size"]
"""The keys a Hugging Face config states its width under (DistilBERT's `dim`)."""


_HF_CONFIG = "Hugging Face config"


def _hf_flag(cfg: dict[str, Any], key: str, default: bool) -> bool:
    """A Hugging Face config's boolean; text such as "false" would read as true, so it is refused."""
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{_HF_CONFIG} {key} must be true or false, got {value!r}; fix the value")
    return value


class _NamedIntegers:
    """config.json's integers, each checked under the key the file uses (n_layer, not num_layers)."""

    def __init__(self, cfg: dict[str, Any], where: Path):
        self.cfg, self.where = cfg, where

    def __call__(self, field: str, default: int | None = None) -> int:
        for key in _HF_KEYS[field]:
            value = self.cfg.get(key)
            if value is not None:
                try:
                    return _model_integers(self.where, {field: value})[field]
                except ValueError as exc:
                    raise ValueError(str(exc).replace(f": {field} ", f": {key} ", 1)) from None
        if default is None:
            raise ValueError(f"{self.where}: none of {', '.join(_HF_KEYS[field])} is set; add the one your model's "
                             f"config uses")
        return default


def _hf_label(cfg: dict[str, Any], path: Path) -> str:
    """The model's name: the hub id the file records, else the file's stem, else model_type and its folder
    (a config.json in models/ is not the model 'models')."""
    if cfg.get("_name_or_path"):
        return str(cfg["_name_or_path"])
    if path.stem != "config":
        return path.stem
    model_type = str(cfg.get("model_type") or "model")
    return f"{model_type}-{path.resolve().parent.name}" if path.resolve().parent.name else model_type


def model_from_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face config.json offline (no hub access) into a ModelSpec."""
    path = Path(path)
    text = read_user_text(path)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except (ValueError, RecursionError) as exc:  # past the decoder's limits (nesting, 4300+ digit integers)
        raise ValueError(f"{path}: not a config.json that could be read ({str(exc).split(':')[0]}); fix the "
                         f"file") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a Hugging Face config.json is a JSON object, got {type(cfg).__name__}")
    try:
        return model_from_hf_dict(cfg, _hf_label(cfg, path), f"Hugging Face config.json at {path}", path)
    except ValueError as exc:
        text = str(exc)
        if text.startswith(_HF_CONFIG):
            raise ValueError(f"{path}:{text[len(_HF_CONFIG):]}") from None
        raise


def model_from_hf_dict(cfg: dict[str, Any], name: str, source: str, path: Path | str = "Hugging Face config"
                       ) -> ModelSpec:
    """A ModelSpec from a Hugging Face config's keys (config.json, or a live model's config.to_dict()); `path`
    names it in errors."""
    model_type = str(cfg.get("model_type", ""))
    get = _NamedIntegers(cfg, path)
    hidden, heads = get("hidden_size"), get("num_heads")
    layers, cross = _hf_layers(cfg, get)
    common: dict[str, Any] = dict(
        name=name, num_layers=layers, cross_attention_layers=cross, hidden_size=hidden, num_heads=heads,
        num_kv_heads=get("num_kv_heads", heads), ffn_hidden_size=get("ffn_hidden_size", 4 * hidden),
        vocab_size=get("vocab_size"), max_position_embeddings=get("max_position_embeddings", 2048),
        tied_embeddings=_hf_flag(cfg, "tie_word_embeddings", True),
        attention_head_dim=_stated_head_dim(cfg, hidden, heads, path),
        activation=_hf_activation(cfg),
        source=source,
    )
    try:
        fields = {**common, **_hf_family(model_type, cfg), **_hf_experts(cfg, path)}
        return ModelSpec(**_model_integers(path, fields))  # each integer in the catalog's range
    except (TypeError, ValueError) as exc:
        text = str(exc)
        raise ValueError(text if text.startswith(str(path)) else f"{path}: {text}") from None


def _opt_projection(cfg: dict[str, Any]) -> dict[str, Any]:
    """OPT's narrower token table (word_embed_proj_dim: opt-350m's 512 under blocks 1024 wide, DeepSpeed-Chat's
    reward model): project_in widens the embeddings to the blocks, project_out narrows the last block's output back
    to the tied vocabulary projection (transformers models/opt/modeling_opt.py OPTDecoder), as a factorized embedding
    and its head's transform describe them; a post-LN OPT (do_layer_norm_before false, opt-350m) has no final norm.
    Their biases and the transform's norm (neither in OPT: 2.5k of opt-350m's 331M parameters) and OPT's position
    table at the blocks' width ((2048 + 2) x 512 more than the model counts, 0.3%) are not told apart."""
    width, proj = cfg.get("hidden_size"), cfg.get("word_embed_proj_dim")
    out: dict[str, Any] = {"final_norm": _hf_flag(cfg, "do_layer_norm_before", True)
                           and not cfg.get("_remove_final_layer_norm", False)}
    if isinstance(proj, int) and isinstance(width, int) and 0 < proj != width:
        out.update(embedding_size=proj, head_transform=True)
    return out


def _albert_layers(cfg: dict[str, Any]) -> dict[str, int]:
    """ALBERT's blocks a token passes through and those holding weights (ModelSpec.distinct_layers): AlbertTransformer
    runs num_hidden_layers groups, group int(i / (num_hidden_layers / num_hidden_groups)) at step i, and each group
    call runs its inner_group_num layers (transformers models/albert/modeling_albert.py AlbertTransformer.forward,
    AlbertLayerGroup); the model holds num_hidden_groups groups of inner_group_num layers each."""
    def count(key: str) -> int:
        value = cfg.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}; fix the value")
        return value
    inner = count("inner_group_num")
    layers, groups = count("num_hidden_layers") * inner, count("num_hidden_groups") * inner
    return {"num_layers": layers, "distinct_layers": groups if groups < layers else 0}


def _hf_activation(cfg: dict[str, Any]) -> str:
    """The MLP's activation as the config names it (GPT-2's activation_function, most families' hidden_act, Gemma's
    hidden_activation, T5's feed_forward_proj "relu" / "gated-gelu"); GELU's other forms (gelu_pytorch_tanh, "gelu")
    are torch's one fused kernel."""
    named = next((str(cfg[k]) for k in ("activation_function", "hidden_act", "hidden_activation", "feed_forward_proj")
                  if isinstance(cfg.get(k), str)), "gelu").lower().removeprefix("gated-")
    if named == "gelu_new":
        return "gelu_new"
    return "relu" if named == "relu" else "silu" if named in ("silu", "swish") else "gelu"


def _hf_experts(cfg: dict[str, Any], path: Path | str) -> dict[str, Any]:
    """A sparse MoE's experts (Mixtral's num_local_experts, Qwen-MoE's and OLMoE's num_experts; each of
    intermediate_size, or moe_intermediate_size where the config has one) and the experts a token is routed to
    (num_experts_per_tok) and a shared expert every token runs (Qwen2-MoE's shared_expert_intermediate_size);
    nothing for a dense MLP."""
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if not experts:
        return {}
    out = {"num_experts": experts, "experts_per_token": cfg.get("num_experts_per_tok") or 1}
    if cfg.get("moe_intermediate_size"):
        out["ffn_hidden_size"] = cfg["moe_intermediate_size"]
    if cfg.get("shared_expert_intermediate_size"):
        out["shared_expert_ffn_size"] = cfg["shared_expert_intermediate_size"]
    return _model_integers(path, out)


def _stated_head_dim(cfg: dict[str, Any], hidden: int, heads: int, path: Path | str) -> int:
    """config.json's head_dim (T5's d_kv) where it differs from hidden / heads (Qwen3-0.6B: 128 against 1024 / 16;
    flan-t5-small: d_kv 64 against 512 / 6), else 0."""
    value = cfg.get("head_dim", cfg.get("d_kv"))
    if value is None:
        return 0
    dim = _model_integers(path, {"attention_head_dim": value})["attention_head_dim"]
    return 0 if hidden % heads == 0 and dim == hidden // heads else dim


def _hf_layers(cfg: dict[str, Any], get: _NamedIntegers) -> tuple[int, int]:
    """(blocks a token passes through, those with cross-attention): an encoder-decoder's (T5's num_layers +
    num_decoder_layers, BART's encoder_layers + decoder_layers, transformers' is_encoder_decoder) counted as one
    stack of both, its decoder blocks with their cross-attention (ModelSpec.cross_attention_layers)."""
    if cfg.get("is_encoder_decoder") or "encoder_layers" in cfg:
        encoder = get("encoder_layers") if cfg.get("encoder_layers") is not None else get("num_layers")
        if encoder < 1:
            raise ValueError(f"{get.where}: encoder_layers must be at least 1 for an encoder-decoder, got {encoder}")
        decoder = get("decoder_layers", encoder)
        return encoder + decoder, decoder
    return get("num_layers"), 0


_ROTARY_KEYS = ("rope_parameters", "rope_theta", "rope_scaling", "rotary_dim", "rotary_pct", "rotary_emb_base",
                "partial_rotary_factor", "rotary_value")
"""Keys only rotary-position configs carry (transformers 5 rope_parameters, GPT-NeoX rotary_pct, GPT-J rotary_dim,
Llama-style rope_theta, RoFormer's rotary_value: its sinusoidal table is a frozen head_dim-wide buffer-like
parameter, 0.1% of roformer-base, not a learned hidden-wide one)."""


def _int_key(cfg: dict[str, Any], key: str, default: int) -> int:
    """A family's own integer key (token types, DeBERTa's buckets); ValueError naming the key where it is not a whole
    number. Ranges are the catalog's (model_from_hf_dict checks the fields they fill)."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not float(value).is_integer():
        raise ValueError(f"config key {key} must be a whole number, got {json.dumps(value)[:40]}")
    return int(value)


def _section(cfg: dict[str, Any], key: str) -> dict[str, Any]:
    """A nested config object (MPT's attn_config); {} where absent; ValueError naming the key where not an object."""
    value = cfg.get(key) or {}
    if not isinstance(value, dict):
        raise ValueError(f"config key {key} must be an object, e.g. {{\"alibi\": true}}, got {json.dumps(value)[:40]}")
    return value


def _hf_traits(cfg: dict[str, Any]) -> dict[str, Any]:
    """Traits any family's config states through its keys: rotary, ALiBi (BLOOM) or T5's bucketed relative
    positions (no position table in any), a gated MLP (SiLU's SwiGLU in the Llama lineage, T5's gated-gelu)."""
    out: dict[str, Any] = {}
    model_type = cfg.get("model_type")
    if any(cfg.get(k) is not None for k in _ROTARY_KEYS) or cfg.get("position_embedding_type") == "rotary":
        out["position_embedding"] = "rotary"
    elif cfg.get("alibi") or _section(cfg, "attn_config").get("alibi") or model_type == "bloom":
        out["position_embedding"] = "none"
    elif cfg.get("relative_attention_num_buckets"):
        out["position_embedding"] = "relative"  # T5's bias table: buckets x heads, a few hundred values
    if cfg.get("multi_query") and not cfg.get("new_decoder_architecture"):
        out["num_kv_heads"] = 1  # Falcon's and GPT-BigCode's single shared key/value head
    if model_type == "bloom":
        out["embedding_norm"] = True  # transformers models/bloom/modeling_bloom.py word_embeddings_layernorm
    if model_type in ("gptj", "codegen", "phi") or (model_type == "falcon" and cfg.get("parallel_attn", True)):
        two = model_type == "falcon" and cfg.get("new_decoder_architecture") and cfg.get("num_ln_in_parallel_attn") != 1
        out["parallel_residual"] = "two_norms" if two else "one_norm"
    elif model_type == "gpt_neox" and cfg.get("use_parallel_residual", True):
        out["parallel_residual"] = "two_norms"
    if model_type in _SOFTMAX_UPCAST:
        out["attention_upcast"] = "softmax"
    elif model_type in ("gptj", "codegen"):
        out["attention_upcast"] = "scores"  # query.to(torch.float32) before the score matmul, as GPT-Neo
    if cfg.get("hidden_act") in ("silu", "swiglu") or str(cfg.get("feed_forward_proj", "")).startswith("gated"):
        out["gated_mlp"] = True
    rates = [cfg[k] for k in _DROPOUT_KEYS if isinstance(cfg.get(k), (int, float)) and not isinstance(cfg[k], bool)]
    if rates:  # dropout kernels and masks only where a rate is above 0 (GPT-NeoX, Mixtral and Llama say 0.0)
        out["dropout"] = any(r > 0 for r in rates)
    return out


_DROPOUT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "hidden_dropout", "attention_dropout",
                 "resid_pdrop", "attn_pdrop", "embd_pdrop", "dropout", "dropout_rate", "dropout_prob",
                 "embed_dropout", "resid_dropout")
"""Dropout rates as Hugging Face configs name them (BERT's *_prob, GPT-2's *_pdrop, GPT-NeoX's and Llama's
attention_dropout / hidden_dropout, T5's dropout_rate, DistilBERT's dropout, GPT-Neo's embed / resid_dropout)."""


_LLAMA_LINEAGE = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
                  "gemma3_text")
"""Rotary, RMSNorm, gated-MLP families; Gemma's gate runs under a GELU (hidden_activation gelu_pytorch_tanh,
transformers models/gemma2/modeling_gemma2.py Gemma2MLP: gate_proj, up_proj, down_proj), so its config's
activation does not say it is gated."""


_SOFTMAX_UPCAST = ("opt", "gpt_neox", "bloom", "phi", "phi3", "olmo", "olmo2", "starcoder2", "stablelm",
                   "gpt_bigcode", "granite", "cohere", "deepseek_v2", "deepseek_v3", "vit", "modernbert")
"""Families outside the Llama lineage whose eager attention computes the softmax in fp32 and casts it back
(transformers 5: softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype) in their modeling files)."""

_T5_LINEAGE = ("t5", "mt5", "umt5")
"""T5's layers have no biases and a norm without mean or bias (transformers models/t5/modeling_t5.py: T5LayerNorm,
T5Attention's q/k/v/o and T5DenseActDense's wi/wo built with bias=False); `feed_forward_proj` "gated-gelu" (T5
v1.1, mT5) is a gated MLP (T5DenseGatedActDense: wi_0, wi_1, wo)."""


def _hf_family(model_type: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Architecture traits that config.json implies through model_type rather than states."""
    if model_type in _T5_LINEAGE:
        return {**_hf_traits(cfg), "norm": "rmsnorm", "qkv_bias": False, "out_bias": False, "mlp_bias": False,
                "gated_mlp": str(cfg.get("feed_forward_proj", "relu")).startswith("gated"),
                "tied_embeddings": _hf_flag(cfg, "tie_word_embeddings", True)}
    if model_type == "opt":
        return {**_hf_traits(cfg), **_opt_projection(cfg)}
    if model_type not in (*_LLAMA_LINEAGE, "gpt_neo", "bert", "roberta", "distilbert", "deberta-v2", "electra",
                          "albert"):
        return _hf_traits(cfg)
    if model_type in _LLAMA_LINEAGE:
        return dict(position_embedding="rotary", gated_mlp=True, norm="rmsnorm",
                    qkv_bias=_hf_flag(cfg, "attention_bias", model_type in ("qwen2", "qwen2_moe")),
                    out_bias=_hf_flag(cfg, "attention_bias", False), mlp_bias=_hf_flag(cfg, "mlp_bias", False),
                    dropout=False, tied_embeddings=_hf_flag(cfg, "tie_word_embeddings", False),
                    attention_upcast="softmax")
    if model_type == "gpt_neo":
        return {**_hf_traits(cfg), "qkv_bias": False, "attention_upcast": "scores"}
    if model_type in ("bert", "roberta"):
        return {**_hf_traits(cfg), **dict(type_vocab_size=_int_key(cfg, "type_vocab_size", 2), embedding_norm=True,
                                          final_norm=False, head="pooler")}
    if model_type in ("electra", "albert"):
        # BERT's embeddings (token types, a norm) at their own width, projected up to the blocks' (embedding_size);
        # ElectraModel has no pooler, AlbertModel a pooler and blocks that share their weights (_albert_layers).
        width = _int_key(cfg, "embedding_size", 0) or _int_key(cfg, "hidden_size", 0)
        return {**_hf_traits(cfg), **dict(type_vocab_size=_int_key(cfg, "type_vocab_size", 2), embedding_norm=True,
                                          final_norm=False, head="pooler" if model_type == "albert" else "none",
                                          embedding_size=width if width != cfg.get("hidden_size") else 0),
                **(_albert_layers(cfg) if model_type == "albert" else {})}
    if model_type == "distilbert":
        return {**_hf_traits(cfg), **dict(embedding_norm=True, final_norm=False, head="none")}
    if model_type == "deberta-v2":
        buckets = _int_key(cfg, "position_buckets", -1)
        rel = buckets if buckets > 0 else _int_key(cfg, "max_relative_positions", -1)
        rel = rel if rel > 0 else _int_key(cfg, "max_position_embeddings", 512)
        positions = "learned" if cfg.get("position_biased_input", True) else "relative"
        return {**_hf_traits(cfg), **dict(
            position_embedding=positions, type_vocab_size=_int_key(cfg, "type_vocab_size", 0), embedding_norm=True,
            final_norm=False, head="none", relative_position_buckets=rel if cfg.get("relative_attention") else 0,
            conv_kernel_size=_int_key(cfg, "conv_kernel_size", 0))}
    return {}
