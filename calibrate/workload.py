"""zerotune's built-in training workload: a GPT-style model built from a ModelSpec, trained on random tokens.

Run under the DeepSpeed launcher (it imports torch and deepspeed at the top, so nothing in `calibrate`
imports it; probe.py and launch.py only name its path):

    deepspeed --num_gpus 2 calibrate/workload.py --deepspeed_config cfg.json --model zt-gpt-small \
        --seq_len 128 --steps 4 --warmup 2 [--metrics_out metrics.json]

The model has exactly the parameter tensors ModelSpec.tensors() lists (tests assert the count), so a
probe measures the model the predictor models. Pre-LN blocks, causal attention with grouped K/V heads,
tied or separate LM head. Rotary and relative position encodings have no parameters of their own here and
are left out: they cost a few elementwise operations, nothing the step time or memory model counts.

Measured: seconds per optimizer step (accelerator synchronised, median after warm-up), peak memory per
rank (GPU: max_memory_allocated / max_memory_reserved; CPU: the process's peak resident set size from
getrusage, which includes the Python interpreter, torch and DeepSpeed themselves, nothing subtracted),
DeepSpeed's wall_clock_breakdown fwd / bwd / step timers as means. Rank 0 writes one metrics JSON.
With autotuning.enabled DeepSpeed's engine writes its own metrics at end_profile_step and exits; the
script lets it (it writes its own file only if it reaches the end of its steps).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from zerotune.calibrate.launch import write_json_atomic
from zerotune.predictor import ModelSpec, load_model
from zerotune.predictor.flops import micro_batch_flops

__all__ = ["GPT", "build_model", "parse_args", "main"]

KIB = 1024  # ru_maxrss is in KiB on Linux (getrusage(2))
DROPOUT_P = 0.1  # GPT-2's resid_pdrop / attn_pdrop
INIT_STD = 0.02  # GPT-2's initializer_range


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.norm == "rmsnorm":
        return nn.RMSNorm(spec.hidden_size)
    return nn.LayerNorm(spec.hidden_size)


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh-approximated GELU as Hugging Face writes it (transformers activations.py NewGELUActivation):
    eight eager ops, which the predictor times and whose saved tensors it counts (ModelSpec.activation)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Block(nn.Module):
    """One pre-LN transformer block with the tensors ModelSpec.layer_tensors names."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f, kv = spec.hidden_size, spec.ffn_hidden_size, spec.kv_dim
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.norm1, self.norm2 = _norm(spec), _norm(spec)
        self.q = nn.Linear(h, spec.q_dim, bias=spec.qkv_bias)
        self.k = nn.Linear(h, kv, bias=spec.qkv_bias)
        self.v = nn.Linear(h, kv, bias=spec.qkv_bias)
        self.out = nn.Linear(spec.q_dim, h, bias=spec.out_bias)
        self.gate = nn.Linear(h, f, bias=spec.mlp_bias) if spec.gated_mlp else None
        self.up = nn.Linear(h, f, bias=spec.mlp_bias)
        self.down = nn.Linear(f, h, bias=spec.mlp_bias)
        self.dropout_p = DROPOUT_P if spec.dropout else 0.0
        self.flash = spec.attention == "flash"  # the predictor's activation model follows this field
        self.gelu_new = spec.activation == "gelu_new"  # so do its time and activation models

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.num_kv_heads != self.num_heads:  # grouped-query attention: share each K/V head
            repeat = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        p = self.dropout_p if self.training else 0.0
        attend = F.scaled_dot_product_attention if self.flash else _eager_attention
        y = attend(q, k, v, dropout_p=p, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, -1))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:  # SwiGLU (Shazeer 2020), as Llama
            return self.down(F.silu(self.gate(x)) * self.up(x))
        if self.gelu_new:
            return self.down(_gelu_new(self.up(x)))
        return self.down(F.gelu(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.dropout_p if self.training else 0.0
        x = x + F.dropout(self._attention(self.norm1(x)), p, self.training)
        return x + F.dropout(self._mlp(self.norm2(x)), p, self.training)


def _eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
                     is_causal: bool) -> torch.Tensor:
    """Attention that materialises the s x s scores, softmax and its dropout, as Hugging Face's 'eager'
    attention does, so a probe of an attention: eager model keeps Korthikanti's 5as^2b bytes for backward
    (predictor/activations.py); scaled_dot_product_attention would keep none of them."""
    s = q.shape[-2]
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # scaling q first saves no s x s tensor
    if is_causal:
        future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return F.dropout(scores.softmax(dim=-1), dropout_p, dropout_p > 0) @ v


def _init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation, N(0, 0.02) weights and zero biases (Radford et al. 2019; HF GPT2 _init_weights),
    so that losses and 16-bit activations have the magnitudes of real training."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class GPT(nn.Module):
    """Embeddings, blocks, final norm and head as ModelSpec.tensors() lists them; loss on next tokens."""

    def __init__(self, spec: ModelSpec, checkpoint_blocks: bool = False) -> None:
        super().__init__()
        if spec.relative_position_buckets or spec.conv_kernel_size:
            raise ValueError(f"--model {spec.name}: relative-position (DeBERTa) models are not supported by the "
                             f"built-in workload; use a GPT, Llama or BERT-style model")
        h = spec.hidden_size
        self.tokens = nn.Embedding(spec.vocab_size, h)
        learned = spec.position_embedding == "learned"
        self.positions = nn.Embedding(spec.max_position_embeddings, h) if learned else None
        self.token_types = nn.Embedding(spec.type_vocab_size, h) if spec.type_vocab_size else None
        self.embed_norm = _norm(spec) if spec.embedding_norm else None
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.held_layers))
        # ALBERT's order over shared blocks (ModelSpec.distinct_layers): pass i runs block i x held // passes
        self.passes = [i * spec.held_layers // spec.num_layers for i in range(spec.num_layers)]
        self.final_norm = _norm(spec) if spec.final_norm else None
        untied = spec.head == "lm" and not spec.tied_embeddings
        self.lm_head = nn.Linear(h, spec.vocab_size, bias=False) if untied else None
        self.pooler = nn.Linear(h, h) if spec.head == "pooler" else None
        self.checkpoint_blocks = checkpoint_blocks
        self.dropout_p = DROPOUT_P if spec.dropout else 0.0
        self.apply(_init_weights)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids)
        if self.positions is not None:
            x = x + self.positions(torch.arange(ids.shape[1], device=ids.device))
        if self.token_types is not None:
            x = x + self.token_types(torch.zeros_like(ids))
        if self.embed_norm is not None:
            x = self.embed_norm(x)
        return F.dropout(x, self.dropout_p, self.training)

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        ids, targets = batch[:, :-1], batch[:, 1:]
        x = self._embed(ids)
        for block in (self.blocks[i] for i in self.passes):
            # torch's non-reentrant checkpoint recomputes each block in backward (HF gradient checkpointing)
            x = checkpoint(block, x, use_reentrant=False) if self.checkpoint_blocks and self.training else block(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.pooler is not None:  # BERT's pooler runs on the first token; its output joins the loss
            x = x + torch.tanh(self.pooler(x[:, :1]))
        # Without an LM head of its own the input embedding projects to the vocabulary (tied, as GPT-2).
        weight = self.lm_head.weight if self.lm_head is not None else self.tokens.weight
        logits = F.linear(x, weight)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(spec: ModelSpec, checkpoint_blocks: bool = False) -> GPT:
    return GPT(spec, checkpoint_blocks)


def _init_partitioned(model: nn.Module) -> None:
    """Under zero.Init each module's parameters are partitioned as soon as it is built, so GPT's own
    initialisation saw empty shards: gather each module's tensors, initialise them on rank 0, re-partition."""
    import deepspeed
    import deepspeed.comm as dist
    for module in model.modules():
        params = list(module.parameters(recurse=False))
        if params:
            with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
                if dist.get_rank() == 0:
                    _init_weights(module)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="zerotune's built-in DeepSpeed training workload")
    p.add_argument("--deepspeed_config", required=True, type=Path)
    p.add_argument("--model", default="zt-gpt-small", help="catalog name, model YAML or HF config.json path")
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--steps", type=int, default=4, help="measured optimizer steps")
    p.add_argument("--warmup", type=int, default=2, help="optimizer steps run before measuring")
    p.add_argument("--metrics_out", type=Path, default=None,
                   help="default: the config's autotuning.metric_path, else ./metrics.json")
    p.add_argument("--local_rank", type=int, default=-1, help="set by the DeepSpeed launcher")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.seq_len < 2:
        p.error("--steps must be >= 1, --warmup >= 0 and --seq_len >= 2")
    return args


def _metrics_path(args: argparse.Namespace, cfg: dict[str, Any]) -> Path:
    if args.metrics_out is not None:
        return args.metrics_out
    return Path((cfg.get("autotuning") or {}).get("metric_path") or "metrics.json")


def _peak_memory_bytes(device: str) -> tuple[float, float | None]:
    """(peak, reserved) of this rank: allocator peaks on an accelerator, peak RSS on the CPU."""
    from deepspeed.accelerator import get_accelerator
    if device == "cpu":
        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB), None
    acc = get_accelerator()
    return float(acc.max_memory_allocated()), float(acc.max_memory_reserved())


def _max_over_ranks(value: float, device_name: str) -> float:
    import deepspeed.comm as dist
    t = torch.tensor([value], dtype=torch.float64, device=device_name)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _timer_means_s(samples: list[dict[str, float]], gas: int) -> dict[str, float | None]:
    """DeepSpeed's global timers (ms, summed over the gas micro-steps of a step) as mean seconds:
    forward and backward per micro-step, the optimizer step per optimizer step."""
    def mean(name: str, per: int) -> float | None:
        values = [s[name] for s in samples if name in s]
        return statistics.fmean(values) / 1e3 / per if values else None
    return {"forward_s": mean("fwd", gas), "backward_s": mean("bwd", gas), "optimizer_s": mean("step", 1)}


def _train(engine: Any, spec: ModelSpec, args: argparse.Namespace) -> tuple[list[float], list[dict[str, float]]]:
    from deepspeed.accelerator import get_accelerator
    acc, gas = get_accelerator(), engine.gradient_accumulation_steps()
    micro = engine.train_micro_batch_size_per_gpu()
    gen = torch.Generator().manual_seed(1234 + engine.global_rank)
    step_s, timers = [], []
    for step in range(args.warmup + args.steps):
        acc.synchronize()
        start = time.perf_counter()
        for _ in range(gas):
            batch = torch.randint(0, spec.vocab_size, (micro, args.seq_len + 1), generator=gen)
            loss = engine(batch.to(engine.device))
            engine.backward(loss)
            engine.step()
        acc.synchronize()
        if step >= args.warmup:
            step_s.append(time.perf_counter() - start)
            timers.append(dict(engine.get_wall_clock_timers()))
    return step_s, timers


def _metrics(engine: Any, spec: ModelSpec, args: argparse.Namespace, step_s: list[float],
             timers: list[dict[str, float]], device: str) -> dict[str, Any]:
    from deepspeed.accelerator import get_accelerator
    gas, micro = engine.gradient_accumulation_steps(), engine.train_micro_batch_size_per_gpu()
    median_s = statistics.median(step_s)
    peak, reserved = _peak_memory_bytes(device)
    name = get_accelerator().current_device_name()
    peak = _max_over_ranks(peak, name)
    reserved = _max_over_ranks(reserved, name) if reserved is not None else None
    samples = engine.train_batch_size()
    flops = micro_batch_flops(spec, micro, args.seq_len, recompute=False).model_flops * gas
    return {
        "step_s": median_s, "step_s_all": step_s, "throughput_samples_per_s": samples / median_s,
        "samples_per_step": samples, "peak_memory_bytes": peak, "reserved_memory_bytes": reserved,
        "peak_memory_kind": "peak RSS of the rank's process (getrusage), nothing subtracted" if device == "cpu"
        else "max_memory_allocated", **_timer_means_s(timers, gas),
        "num_params": sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in engine.module.parameters()),
        "device": device, "world_size": engine.world_size, "micro_batch": micro, "gradient_accumulation_steps": gas,
        "seq_len": args.seq_len, "model": spec.name,
        # DeepSpeed autotuner's metric keys in its units: latency in microseconds per optimizer step, as the
        # engine writes it (runtime/engine.py: throughput = train_batch_size * 1e6 / latency)
        "throughput": samples / median_s, "latency": median_s * 1e6, "FLOPS_per_gpu": flops / median_s,
    }



def main(argv: list[str] | None = None) -> None:
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    args = parse_args(argv)
    cfg = json.loads(args.deepspeed_config.read_text())
    cfg.setdefault("wall_clock_breakdown", True)  # the fwd / bwd / step timers are read each step
    spec = load_model(args.model)
    if get_accelerator().device_name() != "cpu":  # one device per rank before anything is allocated
        get_accelerator().set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend=get_accelerator().communication_backend_name())
    stage = int((cfg.get("zero_optimization") or {}).get("stage", 0))
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=cfg, enabled=stage == 3):
        model = build_model(spec, checkpoint_blocks="activation_checkpointing" in cfg)
    if stage == 3:
        _init_partitioned(model)
    optimizer = None if "optimizer" in cfg else torch.optim.AdamW(model.parameters(), lr=1e-4)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, model_parameters=model.parameters(),
                                      config=cfg)
    engine.train()
    device = get_accelerator().device_name()
    step_s, timers = _train(engine, spec, args)
    metrics = _metrics(engine, spec, args, step_s, timers, device)
    if engine.global_rank == 0:
        write_json_atomic(_metrics_path(args, cfg), metrics)
        print(f"zerotune workload: step {metrics['step_s']:.3f} s, peak {metrics['peak_memory_bytes'] / 2**20:.0f} "
              f"MiB, metrics in {_metrics_path(args, cfg)}", flush=True)
    # Leave together and tear the process group down before the interpreter does: a gloo or shared-memory
    # communication thread still joinable at exit aborts the rank ("terminate called without an active exception").
    deepspeed.comm.barrier()
    deepspeed.comm.destroy_process_group()


if __name__ == "__main__":
    main()
