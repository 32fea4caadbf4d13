"""What of a user's model trains and how its parameters split: the profiling run's reading of parameters by kind,
frozen weights, parameter-efficient adapters and DeepSpeed MoE layers (calibrate/inspect_model.py `describe` puts them
in its document).

This file imports only torch: calibrate/inspect_model.py loads it by path, as the profiling hook loads that one, so
no zerotune package name enters the user's process.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["numel", "params_by_kind", "other_expert", "moe_layers", "is_adapter", "training", "ADAPTER_PREFIXES"]

ADAPTER_PREFIXES = ("lora_", "ia3_", "hada_", "lokr_", "oft_", "boft_", "vera_")
"""Name prefixes of parameter-efficient adapters' modules and parameters: peft's tuner layers (the `prefix` of
peft/tuners/{lora,ia3,loha,lokr,oft,boft,vera}/model.py; LoRA's lora_A / lora_B, also loralib's parameters)."""


def numel(p: torch.Tensor) -> int:
    return int(getattr(p, "ds_numel", 0) or p.numel())  # ZeRO-3 partitions leave numel() at 0


def params_by_kind(model: nn.Module, blocks: nn.Module) -> dict[str, int]:
    inside = {id(p) for p in blocks.parameters()}
    emb = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    kinds = {"blocks": 0, "embeddings": 0, "other": 0}
    for p in model.parameters():
        kind = "blocks" if id(p) in inside else "embeddings" if id(p) in emb else "other"
        kinds[kind] += numel(p)
    return kinds


def other_expert(name: str) -> bool:
    """A linear of DeepSpeed MoE's gate (deepspeed/moe/sharded_moe.py TopKGate.wg) or of a local expert after the first
    (deepspeed/moe/experts.py Experts.deepspeed_experts: copies of the one expert module)."""
    parts = name.split(".")
    if "gate" in parts and "deepspeed_moe" in parts:
        return True
    at = parts.index("deepspeed_experts") if "deepspeed_experts" in parts else -1
    return 0 <= at < len(parts) - 1 and parts[at + 1] != "0"


def moe_layers(model: nn.Module) -> dict[str, int] | None:
    """DeepSpeed's own MoE layers (deepspeed.moe.layer.MoE): {'layers', 'num_experts', 'ep_size', 'local_experts',
    'top_k'}, None without any. ZeRO-3 refuses them (runtime/engine.py:2197-2216 _validate_zero3_moe_compatibility:
    'Native DeepSpeed MoE is not supported with ZeRO Stage 3')."""
    layers = [m for m in model.modules()
              if type(m).__name__ == "MoE" and type(m).__module__.startswith("deepspeed.moe")]
    if not layers:
        return None
    first = layers[0]
    gate = getattr(getattr(first, "deepspeed_moe", None), "gate", None)
    return {"layers": len(layers), "num_experts": int(first.num_experts), "ep_size": int(first.ep_size),
            "local_experts": int(first.num_local_experts), "top_k": int(getattr(gate, "k", 1))}


def is_adapter(name: str) -> bool:
    return any(part.startswith(ADAPTER_PREFIXES) for part in name.split("."))


def training(model: nn.Module, blocks: nn.Module | None) -> dict[str, int]:
    """What trains: frozen elements inside the blocks (per block) and outside them, and the adapters' elements and
    tensors (trainable, beside the architecture). A tied weight is counted once, as model.parameters() yields it."""
    inside = {id(p) for p in blocks.parameters()} if blocks is not None else set()
    out = {"trainable_params": 0, "frozen_block_params": 0, "frozen_outer_params": 0, "adapter_params": 0,
           "adapter_tensors": 0}
    for name, p in model.named_parameters():
        if is_adapter(name):
            out["adapter_params"] += numel(p)
            out["adapter_tensors"] += 1
        elif not p.requires_grad:
            out["frozen_block_params" if id(p) in inside else "frozen_outer_params"] += numel(p)
        out["trainable_params"] += numel(p) if p.requires_grad else 0
    return out
