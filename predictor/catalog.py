"""Hardware and model catalogs in data/, and Hugging Face config.json files read offline.

Every catalog entry is one YAML file with a `source`. Keys are checked strictly: an unknown or
missing key is an error that names the file, the key and the nearest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from pathlib import Path
from typing import Any

import yaml

from zerotune.predictor.hardware import HardwareSpec
from zerotune.predictor.model import ModelSpec
from zerotune.predictor.units import GIB, GIGA, MICRO, TERA

__all__ = ["data_dir", "load_model", "load_hardware", "list_models", "list_hardware",
           "model_from_hf_config", "model_from_hf_dict", "nearest"]


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


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name, a zerotune model YAML, or a Hugging Face config.json path."""
    path = _resolve("models", name_or_path, "--model")
    if path.suffix == ".json":
        return model_from_hf_config(path)
    doc = _read_yaml(path)
    _check_keys(path, doc, _MODEL_FIELDS, _MODEL_REQUIRED)
    doc.setdefault("num_kv_heads", doc["num_heads"])
    try:
        return ModelSpec(**doc)
    except TypeError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _hf(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    if default is None:
        raise ValueError(f"config.json: none of {', '.join(keys)} is set; it is needed to describe the model")
    return default


def model_from_hf_config(path: Path) -> ModelSpec:
    """Read a Hugging Face config.json offline (no hub access) into a ModelSpec."""
    try:
        cfg = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    name = str(cfg.get("_name_or_path") or Path(path).parent.name or cfg.get("model_type", ""))
    return model_from_hf_dict(cfg, name, f"Hugging Face config.json at {path}")


def model_from_hf_dict(cfg: dict[str, Any], name: str, source: str) -> ModelSpec:
    """A ModelSpec from a Hugging Face config's keys (config.json, or a live model's config.to_dict())."""
    model_type = str(cfg.get("model_type", ""))
    hidden = int(_hf(cfg, "hidden_size", "n_embd", "d_model", "dim"))
    heads = int(_hf(cfg, "num_attention_heads", "n_head", "num_heads", "n_heads"))
    common: dict[str, Any] = dict(
        name=name,
        num_layers=int(_hf(cfg, "num_hidden_layers", "n_layer", "num_layers", "n_layers")),
        hidden_size=hidden, num_heads=heads,
        num_kv_heads=int(_hf(cfg, "num_key_value_heads", default=heads)),
        ffn_hidden_size=int(_hf(cfg, "intermediate_size", "n_inner", "hidden_dim", "ffn_dim", default=4 * hidden)),
        vocab_size=int(_hf(cfg, "vocab_size")),
        max_position_embeddings=int(_hf(cfg, "max_position_embeddings", "n_positions", "n_ctx", default=2048)),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        activation="gelu_new" if "gelu_new" in (cfg.get("activation_function"), cfg.get("hidden_act")) else "gelu",
        source=source,
    )
    return ModelSpec(**{**common, **_hf_family(model_type, cfg)})


def _hf_family(model_type: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """Architecture traits that config.json implies through model_type rather than states."""
    if model_type in ("llama", "mistral", "qwen2", "gemma"):
        return dict(position_embedding="rotary", gated_mlp=True, norm="rmsnorm",
                    qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
                    out_bias=bool(cfg.get("attention_bias", False)), mlp_bias=bool(cfg.get("mlp_bias", False)),
                    dropout=False, tied_embeddings=bool(cfg.get("tie_word_embeddings", False)))
    if model_type == "gpt_neo":
        return dict(qkv_bias=False)
    if model_type in ("bert", "roberta"):
        return dict(type_vocab_size=int(cfg.get("type_vocab_size", 2)), embedding_norm=True,
                    final_norm=False, head="pooler")
    if model_type == "distilbert":
        return dict(embedding_norm=True, final_norm=False, head="none")
    if model_type == "deberta-v2":
        buckets = int(cfg.get("position_buckets", -1))
        rel = buckets if buckets > 0 else int(cfg.get("max_relative_positions", -1))
        rel = rel if rel > 0 else int(cfg.get("max_position_embeddings", 512))
        return dict(position_embedding="learned" if cfg.get("position_biased_input", True) else "relative",
                    type_vocab_size=int(cfg.get("type_vocab_size", 0)), embedding_norm=True, final_norm=False,
                    head="none", relative_position_buckets=rel if cfg.get("relative_attention") else 0,
                    conv_kernel_size=int(cfg.get("conv_kernel_size", 0)))
    return {}


# -- hardware ------------------------------------------------------------------------------------------

_HW_KEYS = {"name", "description", "kind", "memory_gib", "runtime_reserved_gib", "fp32_tflops", "fp16_tflops",
            "bf16_tflops", "memory_bandwidth_gb_per_s", "intra_node_bandwidth_gb_per_s", "intra_node_latency_us",
            "inter_node_bandwidth_gb_per_s", "inter_node_latency_us", "host_to_device_gb_per_s",
            "gpus_per_node", "host_memory_gib", "source", "fp32_matmul_tflops", "fp16_matmul_tflops",
            "bf16_matmul_tflops", "achievable_memory_bandwidth_gb_per_s", "kernel_launch_us", "num_compute_units",
            "achievable_source"}
_HW_OPTIONAL = {"bf16_tflops", "fp16_tflops", "bf16_matmul_tflops", "fp16_matmul_tflops"}


def _number(path: Path, doc: dict[str, Any], key: str) -> float:
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{path}: {key} must be a number, got {value!r} (YAML reads '989e12' as a string; "
                         f"write 989 or 9.89e+14)")
    return float(value)


def load_hardware(name_or_path: str) -> HardwareSpec:
    """A catalog accelerator by name (e.g. 'a100-80gb') or a hardware YAML path."""
    path = _resolve("hardware", name_or_path, "--hardware")
    doc = _read_yaml(path)
    _check_keys(path, doc, _HW_KEYS, _HW_KEYS - _HW_OPTIONAL)
    if doc["kind"] not in ("gpu", "hpu", "cpu"):
        raise ValueError(f"{path}: kind must be gpu, hpu or cpu, got {doc['kind']!r}")
    peak = {p: _number(path, doc, f"{p}_tflops") * TERA
            for p in ("fp32", "fp16", "bf16") if doc.get(f"{p}_tflops") is not None}
    matmul = {p: _number(path, doc, f"{p}_matmul_tflops") * TERA
              for p in ("fp32", "fp16", "bf16") if doc.get(f"{p}_matmul_tflops") is not None}
    if set(matmul) != set(peak):
        raise ValueError(f"{path}: <precision>_matmul_tflops must be given for exactly the precisions with a peak "
                         f"({', '.join(sorted(peak))}), got {', '.join(sorted(matmul)) or 'none'}")
    gbps = lambda key: _number(path, doc, key) * GIGA  # noqa: E731 - decimal GB/s as datasheets state it
    return HardwareSpec(
        name=str(doc["name"]), description=str(doc["description"]), kind=doc["kind"],
        memory_bytes=_number(path, doc, "memory_gib") * GIB,
        runtime_reserved_bytes=_number(path, doc, "runtime_reserved_gib") * GIB,
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
    )
