"""Hardware and model catalogs in data/, and Hugging Face config.json files read offline.

Every catalog entry is one YAML file with a `source`. Keys are checked strictly: an unknown or
missing key is an error that names the file, the key and the nearest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from zerotune.predictor.hardware import HardwareSpec
from zerotune.predictor.model import ModelSpec
from zerotune.predictor.units import GIB, GIGA, MICRO, NANO, TERA

__all__ = ["data_dir", "load_model", "load_hardware", "list_models", "list_hardware",
           "model_from_hf_config", "model_from_hf_dict", "nearest", "safe_name", "MODEL_LIMITS", "HARDWARE_LIMITS",
           "HF_WIDTH_KEYS"]

_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def safe_name(name: str, where: str) -> str:
    """A name read from an input that will become part of a file name: letters, digits, '.', '_', '+', '-',
    starting with a letter or digit, so that '../..' or '/etc' can never steer a write elsewhere."""
    if not _SAFE_NAME.fullmatch(name) or ".." in name:
        raise ValueError(f"{where} {name!r}: use letters, digits, '.', '_', '+' and '-' only (it names files), "
                         f"e.g. {re.sub(r'[^A-Za-z0-9._+-]+', '-', name).strip('.-') or 'my-gpu'!r}")
    return name


def data_dir() -> Path:
    """The repository's data/ folder (ZEROTUNE_DATA overrides it, e.g. for a site-wide catalog)."""
    override = os.environ.get("ZEROTUNE_DATA")
    return Path(override) if override else Path(__file__).resolve().parent.parent / "data"


def nearest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """' (did you mean X?)' for the closest valid choice, or '' when nothing is close."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _entries(kind: str) -> dict[str, Path]:
    return {p.stem: p for p in sorted((data_dir() / kind).glob("*.yaml"))}


def list_models() -> list[str]:
    return list(_entries("models"))


def list_hardware() -> list[str]:
    return list(_entries("hardware"))


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({str(exc).splitlines()[0]}); fix the syntax") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping of keys to values")
    return doc


def _check_keys(path: Path | str, doc: dict[str, Any], allowed: set[str], required: set[str]) -> None:
    for key in doc:
        if key not in allowed:
            raise ValueError(f"{path}: unknown key {key!r}{nearest(key, sorted(allowed))}; "
                             f"valid keys: {', '.join(sorted(allowed))}")
    for key in sorted(required - set(doc)):
        raise ValueError(f"{path}: missing key {key!r}; add it with a value and its source")


def _resolve(kind: str, name_or_path: str, flag: str) -> Path:
    path = Path(name_or_path)
    if kind == "models" and path.is_dir() and (path / "config.json").is_file():
        return path / "config.json"  # a Hugging Face model folder, as from_pretrained takes it
    if path.is_dir():
        raise ValueError(f"{flag} {name_or_path}: a folder{' without a config.json' if kind == 'models' else ''}; "
                         f"give a catalog name or a file")
    if path.suffix in (".json", ".yaml", ".yml") or os.sep in name_or_path:
        if not path.is_file():
            raise ValueError(f"{flag} {name_or_path}: no such file; give a catalog name or an existing path")
        return path
    entries = _entries(kind)
    key = name_or_path.lower()
    if key not in entries:
        raise ValueError(f"{flag} {name_or_path!r}: unknown {kind[:-1] if kind.endswith('s') else kind}"
                         f"{nearest(key, list(entries))}; known: {', '.join(entries)}")
    return entries[key]


# -- models --------------------------------------------------------------------------------------------

_MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelSpec)}
_MODEL_REQUIRED = {"name", "num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size",
                   "max_position_embeddings", "source"}


MODEL_LIMITS: dict[str, int] = {
    "num_layers": 4096, "hidden_size": 2**20, "num_heads": 2**14, "num_kv_heads": 2**14, "ffn_hidden_size": 2**22,
    "vocab_size": 2**24, "max_position_embeddings": 2**30, "type_vocab_size": 2**16,
    "relative_position_buckets": 2**20, "conv_kernel_size": 64, "published_num_params": 10**15,
    "attention_head_dim": 2**16, "frozen_layer_params": 10**15, "frozen_outer_params": 10**15,
    "adapter_params": 10**15, "num_adapter_tensors": 2**24, "num_experts": 2**12, "experts_per_token": 2**12,
    "cross_attention_layers": 4096, "shared_expert_ffn_size": 2**22, "distinct_layers": 4096,
}
"""Largest accepted value of each integer model field: several times the largest published transformer
(126 layers, hidden 25,600, vocabulary 256k, 10M positions), small enough that the per-tensor and per-size
arrays stay in memory. A larger value is a typo or a different unit (a parameter count where layers go)."""
_MODEL_MIN_ZERO = {"vocab_size", "type_vocab_size", "relative_position_buckets", "conv_kernel_size",
                   "published_num_params", "attention_head_dim", "frozen_layer_params", "frozen_outer_params",
                   "adapter_params", "num_adapter_tensors", "num_experts", "cross_attention_layers",
                   "shared_expert_ffn_size", "distinct_layers"}


def _model_integers(where: Path | str, doc: dict[str, Any]) -> dict[str, Any]:
    """The integer fields of a model description checked: integers (5e8 written as a float is fine), in range."""
    out = dict(doc)
    for key, maximum in MODEL_LIMITS.items():
        if key not in doc:
            continue
        value, minimum = doc[key], 0 if key in _MODEL_MIN_ZERO else 1
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (isinstance(value, float) and not (math.isfinite(value) and value.is_integer()))):
            raise ValueError(f"{where}: {key} must be a whole number, got {value!r}; fix the value")
        if not minimum <= value <= maximum:
            raise ValueError(f"{where}: {key} {value:g} is outside {minimum}..{maximum}; fix the value "
                             f"(a count, not a parameter total or bytes)")
        out[key] = int(value)
    return out


_MODEL_TYPES = {f.name: str(f.type) for f in dataclasses.fields(ModelSpec)}
MODEL_COUNT_MAX = 2**24
"""Largest accepted value of an integer model field MODEL_LIMITS does not name (module counts per layer)."""


def _model_types(where: Path | str, doc: dict[str, Any]) -> None:
    """Each field of a model YAML of its declared type: true or false where a flag goes (YAML reads "no" in
    quotes as text, which Python takes as true), a finite number where a number goes, a count where a count goes."""
    for key, value in doc.items():
        kind = _MODEL_TYPES.get(key)
        if kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"{where}: {key} must be true or false, got {value!r}; fix the value")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind == "float" and not (number and math.isfinite(value)):
            raise ValueError(f"{where}: {key} must be a finite number, got {value!r}; fix the value")
        if kind == "int" and key not in MODEL_LIMITS and not (
                number and math.isfinite(value) and float(value).is_integer() and 0 <= value <= MODEL_COUNT_MAX):
            raise ValueError(f"{where}: {key} must be a whole number from 0 to {MODEL_COUNT_MAX:,}, got {value!r}; "
                             f"fix the value")
        if kind == "int" and key not in MODEL_LIMITS:
            doc[key] = int(value)


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, a zerotune model YAML, or a Hugging Face config.json path."""
    path = _resolve("models", name_or_path, "--model")
    if path.suffix == ".json":
        return model_from_hf_config(path)
    doc = _read_yaml(path)
    _check_keys(path, doc, _MODEL_FIELDS, _MODEL_REQUIRED)
    doc = _model_integers(path, doc)
    _model_types(path, doc)
    doc["name"] = str(doc["name"])
    doc.setdefault("num_kv_heads", doc["num_heads"])
    try:
        return ModelSpec(**doc)
    except TypeError as exc:
        raise ValueError(f"{path}: {exc}") from None


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
    try:
        cfg = json.loads(path.read_text())
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
        return ModelSpec(**{**common, **_hf_family(model_type, cfg), **_hf_experts(cfg, path)})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None


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
        encoder = get("encoder_layers", 0) or get("num_layers")
        decoder = get("decoder_layers", encoder)
        return encoder + decoder, decoder
    return get("num_layers"), 0


_ROTARY_KEYS = ("rope_parameters", "rope_theta", "rope_scaling", "rotary_dim", "rotary_pct", "rotary_emb_base",
                "partial_rotary_factor", "rotary_value")
"""Keys only rotary-position configs carry (transformers 5 rope_parameters, GPT-NeoX rotary_pct, GPT-J rotary_dim,
Llama-style rope_theta, RoFormer's rotary_value: its sinusoidal table is a frozen head_dim-wide buffer-like
parameter, 0.1% of roformer-base, not a learned hidden-wide one)."""


def _hf_traits(cfg: dict[str, Any]) -> dict[str, Any]:
    """Traits any family's config states through its keys: rotary, ALiBi (BLOOM) or T5's bucketed relative
    positions (no position table in any), a gated MLP (SiLU's SwiGLU in the Llama lineage, T5's gated-gelu)."""
    out: dict[str, Any] = {}
    model_type = cfg.get("model_type")
    if any(cfg.get(k) is not None for k in _ROTARY_KEYS) or cfg.get("position_embedding_type") == "rotary":
        out["position_embedding"] = "rotary"
    elif cfg.get("alibi") or (cfg.get("attn_config") or {}).get("alibi") or model_type == "bloom":
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
        return {**_hf_traits(cfg), **dict(type_vocab_size=int(cfg.get("type_vocab_size", 2)), embedding_norm=True,
                                          final_norm=False, head="pooler")}
    if model_type in ("electra", "albert"):
        # BERT's embeddings (token types, a norm) at their own width, projected up to the blocks' (embedding_size);
        # ElectraModel has no pooler, AlbertModel a pooler and blocks that share their weights (_albert_layers).
        width = int(cfg.get("embedding_size") or cfg.get("hidden_size") or 0)
        return {**_hf_traits(cfg), **dict(type_vocab_size=int(cfg.get("type_vocab_size", 2)), embedding_norm=True,
                                          final_norm=False, head="pooler" if model_type == "albert" else "none",
                                          embedding_size=width if width != cfg.get("hidden_size") else 0),
                **(_albert_layers(cfg) if model_type == "albert" else {})}
    if model_type == "distilbert":
        return {**_hf_traits(cfg), **dict(embedding_norm=True, final_norm=False, head="none")}
    if model_type == "deberta-v2":
        buckets = int(cfg.get("position_buckets", -1))
        rel = buckets if buckets > 0 else int(cfg.get("max_relative_positions", -1))
        rel = rel if rel > 0 else int(cfg.get("max_position_embeddings", 512))
        positions = "learned" if cfg.get("position_biased_input", True) else "relative"
        return {**_hf_traits(cfg), **dict(
            position_embedding=positions, type_vocab_size=int(cfg.get("type_vocab_size", 0)), embedding_norm=True,
            final_norm=False, head="none", relative_position_buckets=rel if cfg.get("relative_attention") else 0,
            conv_kernel_size=int(cfg.get("conv_kernel_size", 0)))}
    return {}


# -- hardware ------------------------------------------------------------------------------------------

_HW_KEYS = {"name", "description", "kind", "memory_gib", "runtime_reserved_gib", "fp32_tflops", "fp16_tflops",
            "bf16_tflops", "memory_bandwidth_gb_per_s", "intra_node_bandwidth_gb_per_s", "intra_node_latency_us",
            "inter_node_bandwidth_gb_per_s", "inter_node_latency_us", "host_to_device_gb_per_s",
            "gpus_per_node", "host_memory_gib", "source", "fp32_matmul_tflops", "fp16_matmul_tflops",
            "bf16_matmul_tflops", "achievable_memory_bandwidth_gb_per_s", "kernel_launch_us", "num_compute_units",
            "achievable_source", "comm_compute_overlap", "comm_compute_overlap_source",
            "heap_retained_activation_fraction", "heap_retained_source", "gemm_tile_elems", "gemm_tile_source",
            "eager_bandwidth_share", "eager_bandwidth_source", "kernel_launch_source", "dropout_rng_ns_per_element",
            "dropout_rng_source", "subnormal_gemm_slowdown", "subnormal_gemm_source", "flash_attention_tflops",
            "flash_attention_source", "fresh_map_mib", "fresh_page_ns_per_byte", "fresh_page_source",
            "flash_score_ns_forward", "flash_score_ns_backward", "flash_kv_block_elems", "flash_score_source"}
_HW_OPTIONAL = {"bf16_tflops", "fp16_tflops", "bf16_matmul_tflops", "fp16_matmul_tflops", "comm_compute_overlap",
                "comm_compute_overlap_source", "heap_retained_activation_fraction", "heap_retained_source",
                "gemm_tile_elems", "gemm_tile_source", "eager_bandwidth_share", "eager_bandwidth_source",
                "kernel_launch_source", "dropout_rng_ns_per_element", "dropout_rng_source", "subnormal_gemm_slowdown",
                "subnormal_gemm_source", "flash_attention_tflops", "flash_attention_source", "fresh_map_mib",
                "fresh_page_ns_per_byte", "fresh_page_source", "flash_score_ns_forward", "flash_score_ns_backward",
                "flash_kv_block_elems", "flash_score_source"}


HARDWARE_LIMITS: dict[str, tuple[float, float, str]] = {
    "memory_gib": (0.0, 16384.0, "GiB"), "runtime_reserved_gib": (0.0, 1024.0, "GiB"),
    "fp32_tflops": (0.0, 100_000.0, "TFLOP/s"), "fp16_tflops": (0.0, 100_000.0, "TFLOP/s"),
    "bf16_tflops": (0.0, 100_000.0, "TFLOP/s"),
    "memory_bandwidth_gb_per_s": (0.0, 1e6, "GB/s"), "intra_node_bandwidth_gb_per_s": (0.0, 1e6, "GB/s"),
    "inter_node_bandwidth_gb_per_s": (0.0, 1e6, "GB/s"), "host_to_device_gb_per_s": (0.0, 1e6, "GB/s"),
    "intra_node_latency_us": (0.0, 1_000_000.0, "us"), "inter_node_latency_us": (0.0, 1_000_000.0, "us"),
    "gpus_per_node": (1.0, 4096.0, "devices"), "host_memory_gib": (0.0, 1_048_576.0, "GiB"),
    "fp32_matmul_tflops": (0.0, 100_000.0, "TFLOP/s"), "fp16_matmul_tflops": (0.0, 100_000.0, "TFLOP/s"),
    "bf16_matmul_tflops": (0.0, 100_000.0, "TFLOP/s"),
    "achievable_memory_bandwidth_gb_per_s": (0.0, 1e6, "GB/s"),
    "kernel_launch_us": (0.0, 1_000_000.0, "us"), "num_compute_units": (1.0, 1_000_000.0, "units"),
    "heap_retained_activation_fraction": (0.0, 1.0, "of the activations"),
    "gemm_tile_elems": (1.0, 1024.0, "elements"), "eager_bandwidth_share": (0.0, 1.0, "of the copy bandwidth"),
    "dropout_rng_ns_per_element": (0.0, 1_000_000.0, "ns"),
    "subnormal_gemm_slowdown": (0.0, 100_000.0, "per unit share of subnormal operands"),
    "flash_attention_tflops": (0.0, 100_000.0, "TFLOP/s"),
    "fresh_map_mib": (0.0, 1_048_576.0, "MiB"), "fresh_page_ns_per_byte": (0.0, 1000.0, "ns"),
    "flash_score_ns_forward": (0.0, 1000.0, "ns"), "flash_score_ns_backward": (0.0, 1000.0, "ns"),
    "flash_kv_block_elems": (1.0, 1_048_576.0, "elements"),
}
"""(low, high, unit) of each hardware key, in the key's own unit. Memory, FLOP/s and bandwidth must be above
low, latency and runtime_reserved_gib may be 0 (gpus_per_node 1). The highs are ~50x today's largest device (H200: 141 GiB,
989 TFLOP/s, 4.8 TB/s), so that a figure in base units (FLOP/s where TFLOP/s goes, bytes where GiB goes) or
in milliseconds where microseconds go is caught rather than predicted with."""
_LOW_INCLUSIVE = {"runtime_reserved_gib", "intra_node_latency_us", "inter_node_latency_us", "gpus_per_node",
                  "num_compute_units", "kernel_launch_us", "heap_retained_activation_fraction",
                  "dropout_rng_ns_per_element", "subnormal_gemm_slowdown", "fresh_page_ns_per_byte",
                  "flash_score_ns_forward", "flash_score_ns_backward"}


def _number(path: Path, doc: dict[str, Any], key: str) -> float:
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{path}: {key} must be a number, got {value!r} (YAML reads '989e12' as a string; "
                         f"write 989 or 9.89e+14)")
    low, high, unit = HARDWARE_LIMITS[key]
    above_low = value >= low if key in _LOW_INCLUSIVE else value > low
    if not (math.isfinite(value) and above_low and value <= high):
        bound = ">=" if key in _LOW_INCLUSIVE else ">"
        raise ValueError(f"{path}: {key} {value!r} is not a finite number {bound} {low:g} and <= {high:g} "
                         f"{unit}; write it in {unit}, as the key's name says")
    if key in ("gpus_per_node", "gemm_tile_elems") and not float(value).is_integer():
        raise ValueError(f"{path}: {key} must be a whole number, got {value!r}")
    return float(value)


def _overlap(path: Path, doc: dict[str, Any]) -> bool:
    """comm_compute_overlap: true (the default, devices with streams) or false; anything else is refused: a quoted
    'false' is a non-empty string, which Python would take as true."""
    value = doc.get("comm_compute_overlap", True)
    if not isinstance(value, bool):
        raise ValueError(f"{path}: comm_compute_overlap must be true or false, got {value!r} (false: the device "
                         f"cannot run communication beside compute, e.g. a CPU rank under gloo)")
    return value


def load_hardware(name_or_path: str) -> HardwareSpec:
    """A catalog accelerator by name (e.g. 'a100-80gb') or a hardware YAML path."""
    path = _resolve("hardware", name_or_path, "--hardware")
    doc = _read_yaml(path)
    _check_keys(path, doc, _HW_KEYS, _HW_KEYS - _HW_OPTIONAL)
    if doc["kind"] not in ("gpu", "hpu", "cpu"):
        raise ValueError(f"{path}: kind must be gpu, hpu or cpu, got {doc['kind']!r}")
    name = safe_name(str(doc["name"]), f"{path}: name")
    peak = {p: _number(path, doc, f"{p}_tflops") * TERA
            for p in ("fp32", "fp16", "bf16") if doc.get(f"{p}_tflops") is not None}
    matmul = {p: _number(path, doc, f"{p}_matmul_tflops") * TERA
              for p in ("fp32", "fp16", "bf16") if doc.get(f"{p}_matmul_tflops") is not None}
    if set(matmul) != set(peak):
        raise ValueError(f"{path}: <precision>_matmul_tflops must be given for exactly the precisions with a peak "
                         f"({', '.join(sorted(peak))}), got {', '.join(sorted(matmul)) or 'none'}")
    gbps = lambda key: _number(path, doc, key) * GIGA  # noqa: E731 - decimal GB/s as datasheets state it
    memory_gib, reserved_gib = _number(path, doc, "memory_gib"), _number(path, doc, "runtime_reserved_gib")
    if reserved_gib >= memory_gib:
        raise ValueError(f"{path}: runtime_reserved_gib {reserved_gib:g} leaves nothing of memory_gib "
                         f"{memory_gib:g}; make it the runtime's share (CUDA context, communicator buffers)")
    return HardwareSpec(
        name=name, description=str(doc["description"]), kind=doc["kind"],
        memory_bytes=memory_gib * GIB, runtime_reserved_bytes=reserved_gib * GIB,
        peak_flops=peak,
        memory_bandwidth_bytes_per_s=gbps("memory_bandwidth_gb_per_s"),
        intra_node_bandwidth_bytes_per_s=gbps("intra_node_bandwidth_gb_per_s"),
        intra_node_latency_s=_number(path, doc, "intra_node_latency_us") * MICRO,
        inter_node_bandwidth_bytes_per_s=gbps("inter_node_bandwidth_gb_per_s"),
        inter_node_latency_s=_number(path, doc, "inter_node_latency_us") * MICRO,
        host_to_device_bandwidth_bytes_per_s=gbps("host_to_device_gb_per_s"),
        num_devices_per_node=int(_number(path, doc, "gpus_per_node")),
        host_memory_bytes=_number(path, doc, "host_memory_gib") * GIB,
        matmul_flops=matmul,
        achievable_memory_bandwidth_bytes_per_s=gbps("achievable_memory_bandwidth_gb_per_s"),
        kernel_launch_s=_number(path, doc, "kernel_launch_us") * MICRO,
        num_compute_units=int(_number(path, doc, "num_compute_units")),
        achievable_source=str(doc["achievable_source"]),
        source=str(doc["source"]),
        comm_compute_overlap=_overlap(path, doc),
        heap_retained_activation_fraction=(_number(path, doc, "heap_retained_activation_fraction")
                                           if "heap_retained_activation_fraction" in doc else 0.0),
        gemm_tile_elems=(int(_number(path, doc, "gemm_tile_elems")) if "gemm_tile_elems" in doc
                         else HardwareSpec.gemm_tile_elems),
        eager_bandwidth_share=(_number(path, doc, "eager_bandwidth_share") if "eager_bandwidth_share" in doc
                               else HardwareSpec.eager_bandwidth_share),
        dropout_rng_s_per_element=(_number(path, doc, "dropout_rng_ns_per_element") * NANO
                                   if "dropout_rng_ns_per_element" in doc else 0.0),
        subnormal_gemm_slowdown=(_number(path, doc, "subnormal_gemm_slowdown")
                                 if "subnormal_gemm_slowdown" in doc else 0.0),
        flash_attention_flops_per_s=(_number(path, doc, "flash_attention_tflops") * TERA
                               if "flash_attention_tflops" in doc else 0.0),
        fresh_map_bytes=_number(path, doc, "fresh_map_mib") * 2**20 if "fresh_map_mib" in doc else 0.0,
        flash_score_s=tuple(_number(path, doc, k) * NANO if k in doc else 0.0  # type: ignore[arg-type]
                            for k in ("flash_score_ns_forward", "flash_score_ns_backward")),
        flash_kv_block_elems=int(_number(path, doc, "flash_kv_block_elems")) if "flash_kv_block_elems" in doc else 0,
        fresh_page_s_per_byte=(_number(path, doc, "fresh_page_ns_per_byte") * NANO
                               if "fresh_map_mib" in doc and "fresh_page_ns_per_byte" in doc else 0.0),
    )
