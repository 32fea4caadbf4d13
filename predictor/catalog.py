"""Hardware and model catalogs in data/ (Hugging Face config.json files: zerotune.predictor.hf_config).

Every catalog entry is one YAML file with a `source`. Keys are checked strictly: an unknown or
missing key is an error that names the file, the key and the nearest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml

from zerotune.predictor.hardware import HardwareSpec
from zerotune.predictor.model import ModelSpec
from zerotune.predictor.units import GIB, GIGA, MICRO, NANO, TERA

__all__ = ["data_dir", "load_model", "load_hardware", "list_models", "list_hardware", "nearest", "safe_name",
           "read_user_text", "MODEL_LIMITS", "HARDWARE_LIMITS"]

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


def read_user_text(path: Path | str) -> str:
    """A file the user gave, as text: UTF-8, a byte-order mark allowed; ValueError (one line) naming the file where
    it is not UTF-8 (a UTF-16 file, as some Windows editors save)."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x}); save the file "
                         f"as UTF-8") from None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(read_user_text(path))
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
    "dispatched_forward_ops": 10**8,
}
"""Largest accepted value of each integer model field: several times the largest published transformer
(126 layers, hidden 25,600, vocabulary 256k, 10M positions), small enough that the per-tensor and per-size
arrays stay in memory. A larger value is a typo or a different unit (a parameter count where layers go)."""
_MODEL_MIN_ZERO = {"vocab_size", "type_vocab_size", "relative_position_buckets", "conv_kernel_size",
                   "published_num_params", "attention_head_dim", "frozen_layer_params", "frozen_outer_params",
                   "adapter_params", "num_adapter_tensors", "num_experts", "cross_attention_layers",
                   "shared_expert_ffn_size", "distinct_layers", "dispatched_forward_ops"}


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
        from zerotune.predictor.hf_config import model_from_hf_config  # it reads the catalog's checks of a model
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


_WHOLE_NUMBERS = frozenset({"gpus_per_node", "gemm_tile_elems", "num_compute_units", "flash_kv_block_elems"})
"""Hardware counts: 1.5 compute units had been truncated to 1 without a word."""


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
    if key in _WHOLE_NUMBERS and not float(value).is_integer():
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
