"""Read a transformer's architecture from its torch module: what `zerotune tune`'s profiling run learns about the
user's model (calibrate/profiling_site/sitecustomize.py calls `describe` once DeepSpeed's engine exists).

Returns plain data, the fields of zerotune.predictor.model.ModelSpec plus what was read and what was assumed, so the
tuner side never imports torch. A Hugging Face model's `config` is used directly when present (the same keys
zerotune.predictor.catalog reads from a config.json); otherwise the structure is read from the modules:

- the token embedding is the nn.Embedding with the most rows (vocabulary x hidden); positions and token types
  are the other embeddings of the same width, told apart by name; a model with none (a ViT's patches, audio
  frames) has vocabulary 0 and the width of its blocks;
- the repeated block is the nn.ModuleList (or nn.Sequential) of identical modules holding the most parameters;
  its length is the depth;
- inside one block, nn.Linear shapes give the attention projections (h -> h, fused h -> 3h, or h -> kv for
  grouped K/V), the MLP width (h -> f) and a gated MLP (two h -> f projections); nn.MultiheadAttention gives
  its heads, otherwise an attribute named like num_heads / n_head on the attention module does;
- the LM head is a Linear h -> vocabulary; tied when its weight is the embedding's tensor; an h -> h Linear outside
  the blocks (not a pooler) beside it is a masked-LM transform (BERT);
- what trains: parameters with requires_grad False are frozen (inside the blocks or outside), and adapters (LoRA and
  peft's other tuners, by their name prefixes) are trainable parameters beside the architecture, left out of the
  block's linear shapes.

This file imports only torch: the profiling hook loads it by path so no zerotune package name enters the
user's process.
"""

from __future__ import annotations

import math

import json
from typing import Any

import torch
from torch import nn

__all__ = ["describe", "find_blocks", "readable", "moe_layers", "HEAD_DIM_ASSUMED", "HF_WIDTH_KEYS"]

ADAPTER_PREFIXES = ("lora_", "ia3_", "hada_", "lokr_", "oft_", "boft_", "vera_")
"""Name prefixes of parameter-efficient adapters' modules and parameters: peft's tuner layers (the `prefix` of
peft/tuners/{lora,ia3,loha,lokr,oft,boft,vera}/model.py; LoRA's lora_A / lora_B, also loralib's parameters)."""
HEAD_DIM_ASSUMED = 64
"""Heads of 64 (GPT-2, BERT, Llama) when no module states its head count."""
_HEAD_ATTRS = ("num_heads", "n_head", "num_attention_heads", "n_heads", "nhead", "num_head")
_KV_HEAD_ATTRS = ("num_kv_heads", "num_key_value_heads", "n_kv_heads", "n_kv_head", "num_kv_head")


def _numel(p: torch.Tensor) -> int:
    return int(getattr(p, "ds_numel", 0) or p.numel())  # ZeRO-3 partitions leave numel() at 0


def _shape(p: torch.Tensor) -> tuple[int, ...]:
    shape = getattr(p, "ds_shape", None)  # the full shape of a ZeRO-3 partitioned parameter
    return tuple(int(d) for d in (shape if shape is not None and _numel(p) != p.numel() else p.shape))


def _params(module: nn.Module) -> int:
    return sum(_numel(p) for p in module.parameters())


def _block_lists(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, container) of every stack of repeated blocks: an nn.ModuleList of one class, or an nn.Sequential of at
    least two modules of one class, each with linear layers inside it; a list of bare nn.Linear layers is not one.
    An encoder-decoder has two (T5's encoder.block and decoder.block)."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList):
            if len(mod) < 1 or not any(True for _ in mod[0].children()):  # a list of bare linears is no block
                continue
        elif not isinstance(mod, nn.Sequential) or len(mod) < 2 or not any(True for _ in mod[0].children()):
            continue
        if len({type(m) for m in mod}) == 1 and len({_width_or_none(m) for m in mod}) == 1 \
                and any(isinstance(m, (nn.Linear, nn.MultiheadAttention)) for m in mod[0].modules()):
            out.append((name, mod))  # modules of one class and one width (Swin's stages widen: not repeated blocks)
    return out


def _width_or_none(block: nn.Module) -> int | None:
    try:
        return _block_width(block)
    except LookupError:
        return None


def _hierarchical(model: nn.Module) -> list[tuple[str, int]] | None:
    """(name, width) of each stack where the model's stacks of repeated blocks run at different widths (Swin's stages
    halve the tokens and double the width between them: transformers models/swin SwinStage), which no one block and
    sequence describe; None otherwise. Stacks inside another stack's blocks (an MLP's list of layers) are not
    counted, nor stacks whose width cannot be read; nn.Transformer's encoder and decoder share theirs."""
    lists = _block_lists(model)
    inside = {id(m) for _, stack in lists for block in stack for m in block.modules() if m is not block}
    widths = [(name, _width_or_none(stack[0])) for name, stack in lists if id(stack) not in inside]
    widths = [(name, width) for name, width in widths if width is not None]
    return widths if len({w for _, w in widths}) > 1 else None


def find_blocks(model: nn.Module) -> tuple[str, nn.Module] | None:
    """(name, container) of the repeated transformer block: of _block_lists, the one with the most parameters
    (timm's VisionTransformer.blocks, many users' own models; an encoder-decoder's decoder, larger by its
    cross-attention)."""
    lists = _block_lists(model)
    return max(lists, key=lambda item: _params(item[1])) if lists else None


def _hf_config(model: nn.Module) -> dict[str, Any] | None:
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return None
    doc = to_dict()
    doc["_attn_implementation"] = getattr(config, "_attn_implementation", None)
    return {k: v for k, v in doc.items() if isinstance(v, (int, float, str, bool, type(None), list)) or _plain(v)}


def _plain(value: Any) -> bool:
    """A dict JSON can carry (transformers 5's rope_parameters, MPT's attn_config)."""
    try:
        return isinstance(value, dict) and bool(json.dumps(value))
    except (TypeError, ValueError):
        return False


def _embeddings(model: nn.Module, blocks: nn.Module) -> tuple[nn.Embedding | None, dict[str, nn.Embedding]]:
    """(token embedding or None when the inputs are not tokens, {'positions' | 'token_types': embedding})."""
    inside = {id(m) for m in blocks.modules()}
    embs = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Embedding) and id(m) not in inside]
    if not embs:
        return None, {}
    name, tokens = max(embs, key=lambda e: e[1].num_embeddings)
    others: dict[str, nn.Embedding] = {}
    for n, m in embs:
        if m is tokens or m.weight is tokens.weight or m.embedding_dim != tokens.embedding_dim:
            continue  # the token table again (T5's encoder.embed_tokens and decoder.embed_tokens share `shared`)
        kind = "token_types" if any(w in n.lower() for w in ("type", "segment")) else "positions"
        others.setdefault(kind, m)
    return tokens, others


def _bare_positions(model: nn.Module, blocks: nn.Module, h: int) -> tuple[str, int] | None:
    """(name, positions) of a position table a token model holds as a parameter of its own, outside the blocks and
    named for positions (`self.pos = nn.Parameter(torch.zeros(1, S, h))`: 32,768 parameters left out of a script's
    description), the largest such; None without. Other modules' weights (nn.MultiheadAttention's in_proj_weight
    is (3h, h) too) are not taken for one."""
    inside = {id(p) for p in blocks.parameters()}
    found = []
    for module_name, module in model.named_modules():
        if isinstance(module, (nn.Embedding, nn.Linear, nn.MultiheadAttention)):
            continue
        for name, param in module.named_parameters(recurse=False):
            shape = _shape(param)  # ZeRO-3 (deepspeed.zero.Init) leaves the tensor empty, its full shape in ds_shape
            rows = _numel(param) // h if len(shape) >= 2 and shape[-1] == h else 0
            if rows >= 2 and shape[-2] == rows and id(param) not in inside and "pos" in name.lower():
                found.append((f"{module_name}.{name}".lstrip("."), rows))  # (S, h) or (1, S, h): a row a position
    return max(found, key=lambda f: f[1]) if found else None


def _block_width(block: nn.Module) -> int:
    """The hidden size of a block whose model has no token embedding: nn.MultiheadAttention's embed_dim, else the
    width of the block's norms (they normalise the residual stream)."""
    for mod in block.modules():
        if isinstance(mod, nn.MultiheadAttention):
            return int(mod.embed_dim)
    widths = [_shape(m.weight)[-1] for m in block.modules()  # the full shapes under ZeRO-3 (_shape)
              if _is_norm(m) and m is not block and getattr(m, "weight", None) is not None
              and len(_shape(m.weight)) == 1]
    if not widths:
        raise LookupError("no token embedding and no norm or nn.MultiheadAttention in the block to read its width")
    return max(set(widths), key=widths.count)


def _heads(block: nn.Module, hidden: int, notes: dict[str, list[str]]) -> tuple[int, int | None]:
    """(heads, kv heads or None) from nn.MultiheadAttention or an attribute of the block's modules."""
    for mod in block.modules():
        if isinstance(mod, nn.MultiheadAttention):
            notes["read"].append(f"heads {mod.num_heads} from nn.MultiheadAttention")
            return int(mod.num_heads), None
    for mod in block.modules():
        for attr in _HEAD_ATTRS:
            value = getattr(mod, attr, None)
            if isinstance(value, int) and value > 0 and hidden % value == 0:
                kv = next((getattr(mod, a) for a in _KV_HEAD_ATTRS if isinstance(getattr(mod, a, None), int)), None)
                notes["read"].append(f"heads {value} from {type(mod).__name__}.{attr}")
                return value, kv
    notes["assumed"].append(f"heads of {HEAD_DIM_ASSUMED} ({hidden // HEAD_DIM_ASSUMED} heads): no module states them")
    notes.setdefault("assumed_fields", []).append("num_heads")  # the first forward's attention shapes may say
    return max(1, hidden // HEAD_DIM_ASSUMED), None


def _mha_linears(block: nn.Module) -> list[tuple[str, int, int, bool]]:
    out = []
    for mod in block.modules():
        if isinstance(mod, nn.MultiheadAttention) and mod.in_proj_weight is not None:
            n_out, n_in = _shape(mod.in_proj_weight)
            out.append(("attn.in_proj", n_in, n_out, mod.in_proj_bias is not None))
    return out


def _block_linears(block: nn.Module) -> list[tuple[str, int, int, bool]]:
    """(name, in, out, bias) of every linear map of one block, nn.MultiheadAttention's fused in-projection included;
    of a DeepSpeed MoE layer, one expert's (a token runs through its top-k experts, not through every local one)
    and not the gate's h -> experts scores."""
    out = _mha_linears(block)
    for name, mod in block.named_modules():
        if isinstance(mod, nn.Linear) and not _is_adapter(name) and not _other_expert(name):
            n_out, n_in = _shape(mod.weight)  # a LoRA's own h -> r, r -> out maps are not the block's
            out.append((name, n_in, n_out, mod.bias is not None))
    return out


def _attention_and_mlp(linears: list[tuple[str, int, int, bool]], h: int, head_dim: int,
                       notes: dict[str, list[str]], attention: bool = False) -> dict[str, Any]:
    """Attention projections and MLP from the block's linear shapes (`attention`: the block holds an
    nn.MultiheadAttention, whose input projection is no nn.Linear)."""
    # the MLP's down map is the widest map into h (heads wider than h / heads make the attention output one too)
    down = sorted((l for l in linears if l[2] == h and l[1] != h), key=lambda l: -l[1])
    ffn = down[0][1] if down else 0
    up = [l for l in linears if l[1] == h and l[2] == ffn]
    if not up:
        raise LookupError(f"no MLP (h -> f, f -> h linears) among the block's linears {[l[:3] for l in linears]}")
    square = [l for l in linears if l[1] == h and l[2] == h]
    fused = [l for l in linears if l[1] == h and h < l[2] <= 3 * h and l[2] != ffn and (l[2] - h) % (2 * head_dim) == 0]
    narrow = [l for l in linears if l[1] == h and l[2] < h and l[2] % head_dim == 0]
    gated = sum(1 for l in up if l[2] == ffn) >= 2
    if not (square or fused or narrow or attention):
        width = _attention_width(linears, h, ffn)
        if width is None:
            # Blocks of MLPs alone (a residual MLP over feature vectors): no attention to read, none to invent (read
            # so, a 6-block MLP of 50M parameters was described with 4 h x h projections a block, 75M); the model's
            # measured costs describe it instead (zerotune.validate.profiled._stand_in)
            raise LookupError(f"the block has no attention: its linears {[l[:3] for l in linears]} are an MLP's "
                              f"alone")
        d, kv_dim, qkv_bias, out_bias = width
        notes["read"].append(f"block linears: {', '.join(f'{n} {i}->{o}' for n, i, o, _ in linears)}")
        notes["read"].append(f"MLP width {ffn}{' (gated)' if gated else ''}, attention width {d} (not the hidden "
                             f"{h}), K/V width {kv_dim}")
        return {"ffn_hidden_size": ffn, "gated_mlp": gated, "kv_dim": kv_dim, "qkv_bias": qkv_bias,
                "out_bias": out_bias, "mlp_bias": bool(down[0][3]), "attention_width": d}
    if fused:
        kv_dim = (fused[0][2] - h) // 2
        qkv_bias = fused[0][3]
    elif narrow:
        kv_dim, qkv_bias = narrow[0][2], narrow[0][3]
    else:
        kv_dim, qkv_bias = h, (square[0][3] if square else True)
    out_proj = [l for l in square if "out" in l[0] or "o_proj" in l[0] or "proj" == l[0].split(".")[-1]] or square[-1:]
    notes["read"].append(f"block linears: {', '.join(f'{n} {i}->{o}' for n, i, o, _ in linears)}")
    notes["read"].append(f"MLP width {ffn}{' (gated)' if gated else ''}, K/V width {kv_dim}")
    return {"ffn_hidden_size": ffn, "gated_mlp": gated, "kv_dim": kv_dim, "qkv_bias": bool(qkv_bias),
            "out_bias": bool(out_proj[0][3]) if out_proj else True, "mlp_bias": bool(down[0][3])}


def _attention_width(linears: list[tuple[str, int, int, bool]], h: int, ffn: int
                     ) -> tuple[int, int, bool, bool] | None:
    """(attention width d, K/V width, qkv bias, output bias) of attention narrower or wider than the hidden size
    (heads x head width != h: GPT-J-style 5 heads of 48 in a 320-wide block, 2026-11-30): an output projection
    d -> h that is not the MLP's, and a fused q, k, v projection h -> d + 2 kv or a q projection h -> d; None where
    there is none."""
    for _, d, _, out_bias in (l for l in linears if l[2] == h and l[1] not in (h, ffn)):
        fused = [l for l in linears if l[1] == h and l[2] != ffn and d < l[2] <= 3 * d and (l[2] - d) % 2 == 0]
        if fused:
            return d, (fused[0][2] - d) // 2, fused[0][3], out_bias
        query = [l for l in linears if l[1] == h and l[2] == d]
        if query:
            kv = [l for l in linears if l[1] == h and l[2] < d and l[2] != ffn]
            return d, kv[0][2] if kv else d, query[0][3], out_bias
    return None


def _is_norm(mod: nn.Module) -> bool:
    return isinstance(mod, (nn.LayerNorm, getattr(nn, "RMSNorm", nn.LayerNorm))) or "norm" in type(mod).__name__.lower()


def _norm_kind(block: nn.Module) -> str:
    norms = [m for m in block.modules() if _is_norm(m) and m is not block]
    rms = any("rms" in type(m).__name__.lower() for m in norms)
    return "rmsnorm" if rms else "layernorm"


def _outside_norms(model: nn.Module, blocks: nn.Module) -> tuple[bool, bool]:
    """(embedding norm, final norm): norms outside the blocks, by name."""
    inside = {id(m) for m in blocks.modules()}
    names = [n.lower() for n, m in model.named_modules() if _is_norm(m) and id(m) not in inside and n]
    emb = any("emb" in n for n in names)
    # a head's norm (BERT's cls.predictions.transform.LayerNorm) is not the stack's final norm; nanoGPT's
    # transformer.ln_f is (a module path whose part is "transform", not a part containing it)
    final = any(not any(w in n for w in ("emb", "head", "cls", "pred", "pooler")) and "transform" not in n.split(".")
                for n in names)
    return emb, final


def _head(model: nn.Module, blocks: nn.Module, tokens: nn.Embedding | None, hidden: int) -> dict[str, Any]:
    """head ('lm' | 'pooler' | 'none'), tied, and for an LM head its bias and a transform before it (BERT's
    masked-LM head: dense h -> h + norm, transformers BertPredictionHeadTransform; with a factorized embedding
    h -> the embedding's width, ElectraGeneratorPredictions, AlbertMLMHead). Without a token embedding there is no
    vocabulary to project onto: a classifier's head (h -> classes) is one row per sample, left out."""
    if tokens is None:
        return {"head": "none", "tied_embeddings": False}
    inside = {id(m) for _, stack in _block_lists(model) for m in stack.modules()}  # `blocks` is one of them
    e, vocab = tokens.embedding_dim, tokens.num_embeddings
    outside = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and id(m) not in inside]
    lm = [m for _, m in outside if _shape(m.weight) == (vocab, e)]
    square = [n for n, m in outside if _shape(m.weight) == (e, hidden)]
    if lm:
        transform = any("pool" not in n.lower() for n in square)
        return {"head": "lm", "tied_embeddings": lm[0].weight is tokens.weight, "head_bias": lm[0].bias is not None,
                "head_transform": transform}
    return {"head": "pooler" if square else "none", "tied_embeddings": False}


def _params_by_kind(model: nn.Module, blocks: nn.Module) -> dict[str, int]:
    inside = {id(p) for p in blocks.parameters()}
    emb = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    kinds = {"blocks": 0, "embeddings": 0, "other": 0}
    for p in model.parameters():
        kind = "blocks" if id(p) in inside else "embeddings" if id(p) in emb else "other"
        kinds[kind] += _numel(p)
    return kinds


def _other_expert(name: str) -> bool:
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


def _is_adapter(name: str) -> bool:
    return any(part.startswith(ADAPTER_PREFIXES) for part in name.split("."))


def _training(model: nn.Module, blocks: nn.Module | None) -> dict[str, int]:
    """What trains: frozen elements inside the blocks (per block) and outside them, and the adapters' elements and
    tensors (trainable, beside the architecture). A tied weight is counted once, as model.parameters() yields it."""
    inside = {id(p) for p in blocks.parameters()} if blocks is not None else set()
    out = {"trainable_params": 0, "frozen_block_params": 0, "frozen_outer_params": 0, "adapter_params": 0,
           "adapter_tensors": 0}
    for name, p in model.named_parameters():
        if _is_adapter(name):
            out["adapter_params"] += _numel(p)
            out["adapter_tensors"] += 1
        elif not p.requires_grad:
            out["frozen_block_params" if id(p) in inside else "frozen_outer_params"] += _numel(p)
        out["trainable_params"] += _numel(p) if p.requires_grad else 0
    return out


_ACTIVATIONS = ((nn.ReLU, "relu"), (nn.SiLU, "silu"), (nn.GELU, "gelu"))


def _activation(block: nn.Module) -> str | None:
    """The block's activation where a module or nn.TransformerEncoderLayer's flag says (activation_relu_or_gelu: 1
    ReLU, 2 GELU, torch/nn/modules/transformer.py); None: a function the modules do not show (costed as GELU)."""
    for mod in block.modules():
        for cls, name in _ACTIVATIONS:
            if isinstance(mod, cls):
                return name
    flag = getattr(block, "activation_relu_or_gelu", None)
    return {1: "relu", 2: "gelu"}.get(flag) if isinstance(flag, int) else None


READ_BLOCK_SHARE = 0.9
"""The share of a repeated block's parameters that must sit in what a transformer block is read from (linear
layers, nn.MultiheadAttention, embedding tables, and 1-D scales and biases such as norms'); below it the block does
something else with the rest (a Conformer block held 13% of its parameters in its convolution module's Conv1d
layers; reading its linears alone described 2.37M of the model's 3.63M parameters, its two feed-forward modules as
one gated MLP), and the model's measured costs stand in for it."""


def _check_block_is_read(block: nn.Module) -> None:
    """LookupError naming the modules that hold too much of the block (READ_BLOCK_SHARE) to be left out."""
    total, unread, kinds = 0, 0, set()
    for module in block.modules():
        for param in module.parameters(recurse=False):
            total += _numel(param)
            if len(_shape(param)) > 1 and not isinstance(module, (nn.Linear, nn.MultiheadAttention, nn.Embedding)):
                unread += _numel(param)
                kinds.add(type(module).__name__)
    if total and unread > (1 - READ_BLOCK_SHARE) * total:
        raise LookupError(f"the repeated block holds {unread / total:.0%} of its parameters in "
                          f"{', '.join(sorted(kinds))}, which a transformer block has not")


def _structure(model: nn.Module, notes: dict[str, list[str]]) -> dict[str, Any]:
    found = find_blocks(model)
    if found is None:
        raise LookupError("no repeated block (an nn.ModuleList or nn.Sequential of identical modules with linear "
                          "layers)")
    stages = _hierarchical(model)
    if stages:
        raise LookupError("stacks of repeated blocks at different widths (" + ", ".join(
            f"{name} {width}" for name, width in stages) + "): a hierarchical model no one block describes")
    name, blocks = found
    _check_block_is_read(blocks[0])
    tokens, others = _embeddings(model, blocks)
    notes["read"].append(f"{len(blocks)} x {type(blocks[0]).__name__} at {name or 'the model'}")
    factorized = 0
    if tokens is not None:
        h = tokens.embedding_dim
        notes["read"].append(f"token embedding {tokens.num_embeddings} x {h}")
        try:
            width = _block_width(blocks[0])
        except LookupError:
            width = h
        if width != h:  # ELECTRA's and ALBERT's factorized embedding: narrow tables, a projection up to the blocks
            factorized, h = h, width
            notes["read"].append(f"factorized embedding: tables {factorized} wide, the blocks {h}")
    else:
        h = _block_width(blocks[0])
        notes["read"].append(f"no token embedding: the inputs enter as vectors of width {h} (the block's width); "
                             "vocabulary 0, no vocabulary head")
        notes["assumed"].append("the script's own input projection (patches, frames) and its classifier head are "
                                "left out of time and memory (one GEMM each, small next to the blocks)")
    heads, kv_heads = _heads(blocks[0], h, notes)
    mlp = _attention_and_mlp(_block_linears(blocks[0]), h, h // heads, notes,
                             any(isinstance(m, nn.MultiheadAttention) for m in blocks[0].modules()))
    width = mlp.pop("attention_width", None)
    if width is not None:  # heads x head width != hidden
        heads = heads if width % heads == 0 else max(1, math.gcd(width, heads))
        mlp["attention_head_dim"] = width // heads
    kv_heads = kv_heads or max(1, mlp.pop("kv_dim") // ((width or h) // heads))
    mlp.pop("kv_dim", None)
    head = _head(model, blocks, tokens, h)
    emb_norm, final_norm = _outside_norms(model, blocks)
    doc: dict[str, Any] = {"num_layers": len(blocks), "hidden_size": h, "num_heads": heads, "num_kv_heads": kv_heads,
                           "vocab_size": tokens.num_embeddings if tokens is not None else 0, **mlp,
                           "norm": _norm_kind(blocks[0]), **head, "embedding_norm": emb_norm, "final_norm": final_norm,
                           "dropout": any(isinstance(m, nn.Dropout) and m.p > 0 for m in blocks[0].modules())}
    if factorized:
        doc["embedding_size"] = factorized
    if "positions" in others:
        doc.update(position_embedding="learned", max_position_embeddings=others["positions"].num_embeddings)
        notes["read"].append(f"learned positions {others['positions'].num_embeddings}")
    elif tokens is not None and (bare := _bare_positions(model, blocks, h)) is not None:
        name_p, positions = bare
        doc.update(position_embedding="learned", max_position_embeddings=positions)
        notes["read"].append(f"learned positions {positions} ({name_p}, a parameter of its own)")
    else:
        rotary = any("rotary" in type(m).__name__.lower() or hasattr(m, "inv_freq") for m in model.modules())
        doc["position_embedding"] = "rotary" if rotary else "none"
        notes["assumed"].append(f"no position table: {doc['position_embedding']} positions")
    if "token_types" in others:
        doc["type_vocab_size"] = others["token_types"].num_embeddings
    activation = _activation(blocks[0])
    if activation is not None:
        doc["activation"] = activation
    mha = [m for m in blocks[0].modules() if isinstance(m, nn.MultiheadAttention)]
    if mha:  # its eager layout copies (predictor/ops.py MHA_RW_ELEMS)
        layout = "batch_first" if mha[0].batch_first else "sequence_first"
        doc["torch_multihead_attention"] = layout
        notes["read"].append(f"attention is torch.nn.MultiheadAttention ({layout.replace('_', '-')} input): its packed "
                             "projection's layout copies costed")
        doc.update(_cross_attention_stacks(model, name, blocks, h, notes))
    doc.update(_hooked_modules(model, blocks))
    return doc


def _cross_attention_stacks(model: nn.Module, name: str, blocks: nn.Module, h: int, notes: dict[str, list[str]]
                            ) -> dict[str, int]:
    """num_layers and cross_attention_layers where blocks have a second nn.MultiheadAttention
    (nn.TransformerDecoderLayer: self-attention, then attention over a memory), each a cross-attention sub-block; {}
    where none has. A stack of the same width beside them (nn.Transformer's encoder.layers and decoder.layers,
    whichever find_blocks chose) is one stack with them, the encoder's blocks without cross-attention, the way the
    catalog describes T5 and BART (predictor/hf_config.py _hf_layers)."""
    def attentions(stack: nn.Module) -> int:
        return sum(isinstance(m, nn.MultiheadAttention) for m in stack[0].modules())

    def width(stack: nn.Module) -> int | None:
        found = next((m for m in stack[0].modules() if isinstance(m, nn.MultiheadAttention)), None)
        return found.embed_dim if found is not None else None
    stacks = [(name, blocks)] + [(n, m) for n, m in _block_lists(model) if n != name and width(m) == h]
    decoders = [(n, m) for n, m in stacks if attentions(m) >= 2]
    encoders = [(n, m) for n, m in stacks if attentions(m) == 1]
    if not decoders:
        return {}
    dec_name, decoder = max(decoders, key=lambda item: (item[0] == name, len(item[1])))  # the hooked one first
    notes["read"].append(f"cross-attention in each of the {len(decoder)} blocks at {dec_name} (a second "
                         "nn.MultiheadAttention)")
    if not encoders:
        notes["assumed"].append("the cross-attention's memory is as long as the blocks' own input")
        return {"num_layers": len(decoder), "cross_attention_layers": len(decoder)}
    enc_name, encoder = max(encoders, key=lambda item: (item[0] == name, len(item[1])))
    notes["read"].append(f"encoder stack: {len(encoder)} x {type(encoder[0]).__name__} at {enc_name}, costed as "
                         "blocks without cross-attention in one stack with the decoder's")
    notes["assumed"].append("one stack of both at the layer-weighted mean of the lengths the profiling run sees (the "
                            "first token input's, the hooked block's input's), the memory as long")
    return {"num_layers": len(decoder) + len(encoder), "cross_attention_layers": len(decoder)}


def _hooked_modules(model: nn.Module, blocks: nn.Module) -> dict[str, int]:
    """ModelSpec.hooked_modules_per_layer / hooked_outer_modules: the modules of one block and those outside the
    blocks, containers that are never called (ModuleList, ModuleDict) left out: ZeRO-3 hooks every module, and
    a hook fires when its module runs."""
    def called(root: nn.Module) -> list[nn.Module]:
        return [m for m in root.modules() if not isinstance(m, (nn.ModuleList, nn.ModuleDict))]
    inside = {id(m) for block in blocks for m in called(block)}
    per_layer = len(called(blocks[0]))
    outer = sum(1 for m in called(model) if id(m) not in inside)
    return {"hooked_modules_per_layer": per_layer, "hooked_outer_modules": outer}


def _checkpointing(model: nn.Module) -> bool:
    """A Hugging Face model's own switch (transformers 5 renamed is_gradient_checkpointing, which now warns)."""
    attr = next((a for a in ("is_activation_checkpointing", "is_gradient_checkpointing") if hasattr(type(model), a)), None)
    return bool(getattr(model, attr, False)) if attr else False


def _num_weight_layers(model: nn.Module) -> int:
    """Modules whose own weight is a matrix or a kernel (linear, convolution), embeddings left out: the layers a
    model without a repeated block runs its GEMMs in."""
    return sum(1 for m in model.modules() if not isinstance(m, nn.Embedding)
               and isinstance(getattr(m, "weight", None), torch.Tensor) and len(_shape(m.weight)) >= 2)


HF_WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "dim")
"""A Hugging Face config with one of these (DistilBERT's `dim` among them) describes a transformer
zerotune.predictor.catalog can build: its HF_WIDTH_KEYS, repeated here because this file runs in the user's process
without the zerotune package (a test holds them equal)."""


def readable(doc: dict[str, Any]) -> bool:
    """Whether describe's output describes a transformer: its structure was read, or its config has a width and a
    vocabulary (a config without one, a ViT's or Swin's, describes a model only through the structure of its
    modules: zerotune.validate.profiled)."""
    config = doc.get("hf_config") or {}
    return bool(doc.get("structure")) or (any(config.get(k) for k in HF_WIDTH_KEYS) and bool(config.get("vocab_size")))


def describe(model: nn.Module) -> dict[str, Any]:
    """What the module says about itself: {'hf_config', 'structure', 'error', 'read', 'assumed', 'assumed_fields'
    (structure keys guessed, not read: 'num_heads' where no module states the heads), 'num_params',
    'params_by_kind', 'training', 'dtype', 'gradient_checkpointing', 'num_weight_layers', and 'moe' (moe_layers) where
    DeepSpeed MoE layers are present}; 'structure' is None when it cannot be read."""
    notes: dict[str, list[str]] = {"read": [], "assumed": []}
    out: dict[str, Any] = {"hf_config": _hf_config(model), "structure": None, "error": ""}
    try:
        out["structure"] = _structure(model, notes)
    except LookupError as exc:
        out["error"] = str(exc)
        notes = {"read": [], "assumed": []}  # what the reading had noted describes no structure that was kept
    found = find_blocks(model)
    if found is not None and out["structure"] is not None:
        out["params_by_kind"] = _params_by_kind(model, found[1])
    out["training"] = _training(model, found[1] if found is not None else None)
    moe = moe_layers(model)
    if moe is not None:
        out["moe"] = moe
        notes["read"].append(f"DeepSpeed MoE in {moe['layers']} blocks: {moe['num_experts']} experts ("
                             f"{moe['local_experts']} per rank, ep_size {moe['ep_size']}), top-{moe['top_k']} gate: the "
                             "rank's experts are held, a token runs top-k of them (MLP read from one expert); ZeRO-3 "
                             "refuses native MoE")
        notes["assumed"].append("MoE: the gate's dispatch and combine and the expert-parallel all-to-alls are not "
                                "costed, and the local experts' gradients are reduced as if data-parallel")
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()})
    out.update(read=notes["read"], assumed=notes["assumed"], assumed_fields=notes.get("assumed_fields", []),
               num_params=_params(model), dtype=",".join(dtypes),
               gradient_checkpointing=_checkpointing(model), num_weight_layers=_num_weight_layers(model))
    return out
