"""The `zerotune` command: dispatches the verbs. The only module that names more than one package.

User mistakes (ValueError, a missing or malformed file) print one line and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn, Sequence

from predictor import (ClusterSpec, DSConfig, Estimate, Job, estimate, experiment_name, load_hardware, load_model,
                       parse_ds_config, to_ds_config)
from predictor.dsconfig import OffloadConfig
from predictor.units import GIB

__all__ = ["main"]

EXIT_USAGE = 2
DEFAULT_MAX_SEQ_LEN = 2048


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        self.exit(EXIT_USAGE, f"zerotune: error: {message}; see {self.prog} --help\n")


def _positive(flag: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{flag} must be at least 1, got {value}")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="zerotune", description="Predict the DeepSpeed configuration to run.")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    p = verbs.add_parser("predict", help="memory per GPU of a configuration, broken down, and whether it fits")
    p.add_argument("--model", default="gpt2", help="catalog name (see data/models) or a config.json path")
    p.add_argument("--hardware", default="v100-32gb", help="catalog name (see data/hardware) or a YAML path")
    p.add_argument("--num_gpus", type=_positive("--num_gpus"), default=1, help="GPUs per node, as deepspeed's")
    p.add_argument("--num_nodes", type=_positive("--num_nodes"), default=1)
    p.add_argument("--deepspeed", metavar="DS_CONFIG", help="a ds_config.json; the flags below override it")
    p.add_argument("--zero_stage", type=int, choices=(0, 1, 2, 3))
    p.add_argument("--micro_batch", type=_positive("--micro_batch"), help="train_micro_batch_size_per_gpu")
    p.add_argument("--grad_accum", type=_positive("--grad_accum"), help="gradient_accumulation_steps")
    p.add_argument("--seq_len", type=_positive("--seq_len"),
                   help=f"tokens per sample (default: the model's positions, at most {DEFAULT_MAX_SEQ_LEN})")
    p.add_argument("--precision", choices=("fp16", "bf16", "fp32"))
    p.add_argument("--activation_checkpointing", action="store_true", help="recompute activations in backward")
    p.add_argument("--offload_optimizer", choices=("none", "cpu", "nvme"))
    p.add_argument("--offload_param", choices=("none", "cpu", "nvme"))
    p.add_argument("--mp_size", type=_positive("--mp_size"), help="tensor (model) parallel degree")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return parser


def _read_json(path: str, flag: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{flag} {path}: no such file; give the path of an existing ds_config.json")
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} {path}: malformed JSON at line {exc.lineno} column {exc.colno} "
                         f"({exc.msg}); fix the file") from None


def _apply_flags(doc: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Flags override the ds_config, the way DeepSpeed's autotuner overrides keys per experiment."""
    doc = dict(doc)
    zero = dict(doc.get("zero_optimization") or {})
    if args.zero_stage is not None:
        zero["stage"] = args.zero_stage
    for flag in ("offload_optimizer", "offload_param"):
        if getattr(args, flag) is not None:
            zero[flag] = {**(zero.get(flag) or {}), "device": getattr(args, flag)}
    doc["zero_optimization"] = zero
    if args.micro_batch is not None or args.grad_accum is not None:
        doc.pop("train_batch_size", None)  # re-derived from the overridden pair
    if args.micro_batch is not None:
        doc["train_micro_batch_size_per_gpu"] = args.micro_batch
    if args.grad_accum is not None:
        doc["gradient_accumulation_steps"] = args.grad_accum
    if args.precision is not None:
        doc["fp16"] = {**(doc.get("fp16") or {}), "enabled": args.precision == "fp16"}
        doc["bf16"] = {**(doc.get("bf16") or {}), "enabled": args.precision == "bf16"}
    if args.activation_checkpointing:
        doc.setdefault("activation_checkpointing", {})
    if args.mp_size is not None:
        doc["autotuning"] = {**(doc.get("autotuning") or {}), "mp_size": args.mp_size}
    return doc


def _setup(args: argparse.Namespace) -> tuple[Job, DSConfig]:
    model = load_model(args.model)
    hardware = load_hardware(args.hardware)
    cluster = ClusterSpec(hardware, args.num_nodes, args.num_gpus)
    doc = _read_json(args.deepspeed, "--deepspeed") if args.deepspeed else {}
    if not isinstance(doc, dict):
        raise ValueError(f"--deepspeed {args.deepspeed}: a ds_config must be a JSON object")
    cfg = parse_ds_config(_apply_flags(doc, args), world_size=cluster.world_size, hidden_size=model.hidden_size)
    seq_len = args.seq_len or min(model.max_position_embeddings, DEFAULT_MAX_SEQ_LEN)
    return Job(model, cluster, seq_len), cfg


def prediction_dict(est: Estimate) -> dict[str, Any]:
    """The JSON edge of a prediction: one object per configuration."""
    job, cfg, mem, time = est.job, est.config, est.memory, est.time
    cluster = job.cluster
    return {
        "name": experiment_name(cfg),
        "model": {"name": job.model.name, "num_params": job.model.num_params},
        "hardware": cluster.hardware.name, "num_nodes": cluster.num_nodes, "num_gpus": cluster.num_gpus_per_node,
        "seq_len": job.seq_len, "precision": cfg.precision,
        "config": to_ds_config(cfg, cluster.world_size),
        "memory": {
            "total_bytes": mem.total_bytes, "capacity_bytes": mem.capacity_bytes, "fits": mem.fits,
            "headroom_bytes": mem.headroom_bytes, "peak_phase": mem.peak_phase,
            "breakdown": {f"{term}_bytes": value for term, value in mem.breakdown_bytes.items()},
            "phase_totals": {f"{phase}_bytes": value for phase, value in mem.phase_totals_bytes.items()},
            "host_bytes_per_node": mem.host_bytes_per_node,
            "host_capacity_bytes_per_node": mem.host_capacity_bytes_per_node,
            "nvme_bytes_per_node": mem.nvme_bytes_per_node,
        },
        "time": {"step_s": time.step_s, "breakdown": {f"{term}_s": v for term, v in time.breakdown_s.items()},
                 "comm_total_s": time.comm_total_s},
        "throughput_samples_per_s": est.throughput_samples_per_s, "latency_ms": est.latency_ms,
        "tflops_per_gpu": est.flops_per_gpu / 1e12, "tokens_per_s": est.tokens_per_s, "mfu": est.mfu,
        "calibrated": False,
    }


def _offload_text(off: OffloadConfig) -> str:
    return off.device if off.device != "none" else "-"


def format_estimate(est: Estimate) -> str:
    job, cfg, mem = est.job, est.config, est.memory
    c, z = job.cluster, cfg.zero
    lines = [
        f"{job.model.name} ({job.model.num_params / 1e6:,.1f}M parameters) on {c.world_size} x {c.hardware.name} "
        f"({c.num_nodes} node(s) x {c.num_gpus_per_node}), seq {job.seq_len}, {cfg.precision}",
        f"ZeRO {z.stage}, micro-batch {cfg.train_micro_batch_size_per_gpu}, grad-accum "
        f"{cfg.gradient_accumulation_steps}, mp {cfg.mp_size}, offload optimizer {_offload_text(z.offload_optimizer)}"
        f" / params {_offload_text(z.offload_param)}, activation checkpointing "
        f"{'on' if cfg.activation_checkpointing.enabled else 'off'}   [{experiment_name(cfg)}]",
        "",
        f"{'memory per GPU (' + mem.peak_phase + ' peak)':<44}{'GiB':>9}{'share':>8}",
    ]
    for term, value in mem.breakdown_bytes.items():
        lines.append(f"  {term:<42}{value / GIB:>9.2f}{value / mem.total_bytes:>8.1%}")
    lines += [f"  {'total':<42}{mem.total_bytes / GIB:>9.2f}",
              f"  {'capacity':<42}{mem.capacity_bytes / GIB:>9.2f}", ""]
    verdict = "FITS" if mem.fits else "DOES NOT FIT"
    lines.append(f"{verdict}: headroom {mem.headroom_bytes / GIB:+.2f} GiB per GPU "
                 f"({mem.headroom_bytes / mem.capacity_bytes:+.1%} of capacity)")
    if mem.host_bytes_per_node or mem.nvme_bytes_per_node:
        lines.append(f"host memory per node for offload: {mem.host_bytes_per_node / GIB:.2f} GiB of "
                     f"{mem.host_capacity_bytes_per_node / GIB:.0f} GiB; NVMe {mem.nvme_bytes_per_node / GIB:.2f} GiB")
    lines += ["", f"{'time per optimizer step (uncalibrated)':<44}{'ms':>9}{'share':>8}"]
    for term, value in est.time.breakdown_s.items():
        lines.append(f"  {term:<42}{value * 1e3:>9.1f}{value / est.time.step_s:>8.1%}")
    lines += [f"  {'step':<42}{est.time.step_s * 1e3:>9.1f}", "",
              f"throughput {est.throughput_samples_per_s:,.1f} samples/s ({est.tokens_per_s:,.0f} tokens/s), "
              f"{est.flops_per_gpu / 1e12:.1f} TFLOP/s per GPU, MFU {est.mfu:.1%}"]
    return "\n".join(lines)


def _predict(args: argparse.Namespace) -> int:
    est = estimate(*_setup(args))
    print(json.dumps(prediction_dict(est), indent=2) if args.json else format_estimate(est))
    return 0


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    print(f"zerotune: warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.showwarning = _show_warning
    try:
        return {"predict": _predict}[args.verb](args)
    except ValueError as exc:
        print(f"zerotune: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        if isinstance(exc, BrokenPipeError):  # output piped into `head`: not an error
            sys.stderr.close()
            return 0
        print(f"zerotune: error: {exc.filename or ''}: {exc.strerror}; check the path and its permissions",
              file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
