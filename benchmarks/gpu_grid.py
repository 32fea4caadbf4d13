"""A measured grid of real DeepSpeed runs on one GPU: the plan, the predictions made before measuring, and the report.

    python -m benchmarks.gpu_grid plan --out data/measurements/gpu_grid/plan.json
    python -m benchmarks.gpu_grid predict --plan ... --hardware h200 --profile data/profiles/h100-80gb.json --out F
    (on the GPU machine) python benchmarks/gpu_grid_worker.py --plan plan.json --out rows.jsonl --deadline T
    python -m benchmarks.gpu_grid ingest --plan ... --rows rows.jsonl --env env.json --hardware h200 --out F.jsonl
    python -m benchmarks.gpu_grid report --grid F.jsonl [--predictions P.jsonl] [--fit_on calibration]

The plan holds Hugging Face models (GPT-2 small to XL, BERT-large for sequence classification, a Llama-3.2-1B
shape), ZeRO stages 0-3 at a base micro-batch per model, micro-batch doubling at ZeRO-1 until the first
out-of-memory (`chain`: the worker skips a chain's larger sizes after its first OOM), bf16 and fp16, Hugging Face
gradient checkpointing, eager and SDPA attention, gradient accumulation 4, and ZeRO-Offload of the optimizer. The
six probes `zerotune calibrate` chooses for GPT-2 medium (`calibrate.probe.select_probes`) are runs of the plan
(`calibration` in their `role`), so the profile is fitted on the runs calibrate itself picks and scored on the rest.
Runs are in priority order: when the device time runs out, the tail is what is lost.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from zerotune.calibrate.measurement import Measurement, from_record, to_record
from zerotune.calibrate.probe import select_probes
from zerotune.predictor import ClusterSpec, DSConfig, Efficiency, Job, estimate, load_hardware, load_model, \
    parse_ds_config, to_ds_config
from zerotune.predictor.dsconfig import ActivationCheckpointing, OffloadConfig, experiment_name
from zerotune.validate.published import model_half

ROOT = Path(__file__).resolve().parent.parent
GRID_DIR = ROOT / "data" / "measurements" / "gpu_grid"
CALIBRATION_MODEL = "gpt2-medium"
MAX_MICRO_BATCH = 512
FP16_SCALE_POWER = 8
STEPS_PER_RUN = 14  # the worker's warm-up, timed and phase-timed steps (offload runs: fewer)
RUN_OVERHEAD_S = 5.0  # model build and deepspeed.initialize, per run
OPTIMIZER = {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}
"""Every run's optimizer section. On the device: torch's AdamW ("torch_adam": true, DeepSpeed's engine builds
torch.optim.AdamW, runtime/engine.py _configure_basic_optimizer) so no CUDA extension is compiled inside the
lease; with offload, DeepSpeedCPUAdam (what an offloading user gets; compiled once at the start)."""


@dataclasses.dataclass(frozen=True)
class GridModel:
    arch: str
    """The worker's model builder (benchmarks/gpu_grid_worker.py hf_model)."""
    attn: str
    """transformers' attn_implementation: 'eager' or 'sdpa'."""
    model: str
    """What zerotune predicts: a catalog name, or a file under data/measurements/gpu_grid/models/."""
    seq_len: int
    base_micro: int


MODELS = {
    "gpt2": GridModel("gpt2", "eager", "gpt2", 1024, 16),
    "gpt2-medium": GridModel("gpt2-medium", "eager", "gpt2-medium", 1024, 8),
    "gpt2-medium-sdpa": GridModel("gpt2-medium", "sdpa", "models/gpt2-medium-sdpa.yaml", 1024, 8),
    "gpt2-large": GridModel("gpt2-large", "eager", "gpt2-large", 1024, 8),
    "gpt2-xl": GridModel("gpt2-xl", "eager", "gpt2-xl", 1024, 4),
    "bert-large": GridModel("bert-large", "eager", "bert-large", 512, 32),
    "llama-3.2-1b": GridModel("llama-3.2-1b", "sdpa", "models/llama-3.2-1b.yaml", 2048, 4),
    # the second plan's shapes (`plan --set shapes`): none of them informed a default
    "bert-base": GridModel("bert-base", "eager", "bert-base", 512, 64),
    "distilbert-base": GridModel("distilbert-base", "eager", "models/distilbert-base-cls.yaml", 512, 64),
    "deberta-v2-xlarge": GridModel("deberta-v2-xlarge", "eager", "models/deberta-v2-xlarge-cls.yaml", 512, 8),
    "gpt-neo-1.3b": GridModel("gpt-neo-1.3b", "eager", "gpt-neo-1.3b", 2048, 4),
    "qwen2-250m": GridModel("qwen2-250m", "sdpa", "models/qwen2-250m.yaml", 1024, 16),
}
SHAPES = ("qwen2-250m", "bert-base", "gpt-neo-1.3b", "deberta-v2-xlarge", "distilbert-base")
"""The second plan's models: encoders and decoders of widths, depths, vocabularies and attention kernels the first
plan lacks (a DistilBERT, DeBERTa-v2's disentangled attention, GPT-Neo's alternating local attention, the Qwen2
shape of the head-to-head's script)."""


def model_arg(model: str) -> str:
    """A grid model field as --model takes it: catalog names as they are, grid files as absolute paths."""
    return str(GRID_DIR / model) if model.startswith("models/") else model


def _config(stage: int, micro: int, gas: int = 1, precision: str = "bf16", ckpt: bool = False,
            offload: bool = False) -> DSConfig:
    cfg = DSConfig(train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=gas, precision=precision,
                   optimizer_impl="fused" if offload else "torch")
    cfg = cfg.replace_zero(stage=stage, overlap_comm=stage == 3)
    if offload:
        cfg = cfg.replace_zero(offload_optimizer=OffloadConfig(device="cpu"))
    if ckpt:
        cfg = cfg.replace(activation_checkpointing=ActivationCheckpointing(enabled=True))
    return cfg


def _run(name: str, cfg: DSConfig, role: str, seq_len: int | None = None, chain: str = "") -> dict[str, Any]:
    gm = MODELS[name]
    seq = seq_len or gm.seq_len
    ds = to_ds_config(cfg, 1)
    ds.pop("activation_checkpointing", None)  # the worker switches HF gradient checkpointing on instead
    offload = cfg.zero.offload_optimizer.device != "none"
    params = {**OPTIMIZER["params"], **({} if offload else {"torch_adam": True})}
    ds.update(optimizer={"type": OPTIMIZER["type"], "params": params}, steps_per_print=1_000_000,
              wall_clock_breakdown=False)
    if cfg.precision == "fp16":  # a random model overflows at 2^16 for several steps; skipped steps are not timed
        ds["fp16"] = {**ds["fp16"], "initial_scale_power": FP16_SCALE_POWER}
    suffix = "".join([f"_seq{seq}" if seq != gm.seq_len else "", "_ckpt" if cfg.activation_checkpointing.enabled
                      else "", "_offload" if offload else "", f"_{cfg.precision}" if cfg.precision != "bf16" else ""])
    return {"id": f"{name}_{experiment_name(cfg)}{suffix}", "name": name, "arch": gm.arch, "attn": gm.attn,
            "model": gm.model, "seq_len": seq, "micro_batch": cfg.train_micro_batch_size_per_gpu,
            "checkpointing": cfg.activation_checkpointing.enabled, "offload": offload, "role": role,
            "chain": chain, "ds_config": ds}


def _doubling(name: str, start: int, role: str, **kw: Any) -> list[dict[str, Any]]:
    """ZeRO-1 from `start` doubling to MAX_MICRO_BATCH; the worker stops the chain at its first OOM."""
    out, micro = [], start
    while micro <= MAX_MICRO_BATCH:
        cfg = _config(1, micro, **kw)
        out.append(_run(name, cfg, role, chain=f"{name}_z1{'_ckpt' if kw.get('ckpt') else ''}"))
        micro *= 2
    return out


def calibration_runs(hardware: str = "h200") -> list[dict[str, Any]]:
    """The probes `zerotune calibrate` itself chooses for the calibration model on this GPU."""
    gm = MODELS[CALIBRATION_MODEL]
    job = Job(load_model(gm.model), ClusterSpec(load_hardware(hardware), 1, 1), gm.seq_len)
    probes = select_probes(job, DSConfig(precision="bf16", optimizer_impl="torch"))
    return [_run(CALIBRATION_MODEL, p.config, "calibration", seq_len=p.seq_len) for p in probes]


def _unique(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs without repeats of an id, first occurrence kept."""
    seen: set[str] = set()
    return [r for r in runs if not (r["id"] in seen or seen.add(r["id"]))]


def plan(hardware: str = "h200") -> list[dict[str, Any]]:
    runs = calibration_runs(hardware)
    for name in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-large", "llama-3.2-1b"):
        runs += [_run(name, _config(stage, MODELS[name].base_micro), "stages") for stage in (0, 1, 2, 3)]
    for name in ("gpt2-xl", "llama-3.2-1b"):
        runs += [_run(name, _config(stage, 1), "stages") for stage in (1, 3)]
    for name in ("gpt2-xl", "llama-3.2-1b", "gpt2-large", "bert-large", "gpt2-medium", "gpt2"):
        runs += _doubling(name, 2 * MODELS[name].base_micro, "largest")
    runs += [_run("gpt2-medium", _config(s, 8, precision="fp16"), "fp16") for s in (0, 1, 2)]
    runs += [_run("gpt2-xl", _config(1, 4, precision="fp16"), "fp16")]
    runs += [_run("gpt2-medium-sdpa", _config(s, 8), "attention") for s in (0, 1, 2, 3)]
    runs += _doubling("gpt2-medium-sdpa", 16, "attention")
    runs += [_run("gpt2-large", _config(1, 8, ckpt=True), "checkpointing"),
             _run("gpt2-xl", _config(3, 4, ckpt=True), "checkpointing")]
    runs += _doubling("llama-3.2-1b", 16, "checkpointing", ckpt=True)
    runs += [_run("gpt2-large", _config(3, 4, gas=2), "accumulation")]
    runs += [_run(name, _config(s, MODELS[name].base_micro, offload=True), "offload")
             for name, s in (("gpt2-large", 2), ("gpt2-xl", 2), ("llama-3.2-1b", 3))]
    unique = _unique(runs)
    for run, pred in zip(unique, predict_rows(unique, hardware, Efficiency())):
        run["budget_s"] = round(STEPS_PER_RUN * pred["step_s"] + RUN_OVERHEAD_S, 1)
    return unique


def plan_shapes(hardware: str = "h200") -> list[dict[str, Any]]:
    """The second plan, in priority order: ZeRO 0-3 at each model's base micro-batch, ZeRO 0, 1 and 3 at
    micro-batch 1 (the profiling run's size, where the host bounds the step), ZeRO-1 doubling to the first
    out-of-memory, then ZeRO-1 with gradient checkpointing for the two decoders."""
    runs = [_run(name, _config(stage, MODELS[name].base_micro), "stages") for name in SHAPES for stage in (0, 1, 2, 3)]
    runs += [_run(name, _config(stage, 1), "stages") for name in SHAPES for stage in (0, 1, 3)]
    for name in SHAPES:
        runs += _doubling(name, 2 * MODELS[name].base_micro, "largest")
    runs += [_run(name, _config(1, MODELS[name].base_micro, ckpt=True), "checkpointing")
             for name in ("qwen2-250m", "gpt-neo-1.3b")]
    for run, pred in zip(runs, predict_rows(runs, hardware, Efficiency())):
        run["budget_s"] = round(STEPS_PER_RUN * pred["step_s"] + RUN_OVERHEAD_S, 1)
    return runs


def plan_all(hardware: str) -> list[dict[str, Any]]:
    """Both plans as one, for a GPU with one session's device time: every model's ZeRO stages first, then the
    largest micro-batch chains, then precision, attention, checkpointing, accumulation and offload, and the
    calibration probes last (a profile's probes may already have been measured on that GPU)."""
    order = ("stages", "largest", "fp16", "attention", "checkpointing", "accumulation", "offload", "calibration")
    return sorted(_unique(plan(hardware) + plan_shapes(hardware)), key=lambda r: order.index(r["role"]))


def run_config(run: dict[str, Any]) -> DSConfig:
    """The DSConfig zerotune predicts for a planned run (its checkpointing as the worker runs it)."""
    cfg = parse_ds_config(run["ds_config"])
    if run["checkpointing"]:
        cfg = cfg.replace(activation_checkpointing=ActivationCheckpointing(enabled=True))
    return cfg


def run_job(run: dict[str, Any], hardware: str) -> Job:
    return Job(load_model(model_arg(run["model"])), ClusterSpec(load_hardware(hardware), 1, 1), run["seq_len"])


def predict_rows(runs: Sequence[dict[str, Any]], hardware: str, eff: Efficiency) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        est = estimate(run_job(run, hardware), run_config(run), eff)
        out.append({"id": run["id"], "hardware": hardware, "step_s": est.time.step_s,
                    "peak_memory_bytes": est.memory.total_bytes, "fits": est.memory.fits})
    return out


def to_measurement(run: dict[str, Any], row: dict[str, Any], hardware: str, rows_file: str = "") -> Measurement | None:
    """A worker row as a Measurement (None for runs the worker skipped); `rows_file` names the stored rows
    (default HARDWARE_rows.jsonl)."""
    status = row["status"]
    if status == "skipped":
        return None
    ok = status == "ok"
    cfg = run_config(run)
    step = row.get("step_s") if ok else None
    return Measurement(
        model=run["model"], hardware=hardware, num_nodes=1, num_gpus_per_node=1, seq_len=run["seq_len"], config=cfg,
        status=status, step_s=step, throughput_samples_per_s=cfg.samples_per_step(1) / step if step else None,
        step_s_rel_error=row.get("step_s_rel_error") if ok else None,
        peak_memory_bytes=row.get("peak_memory_bytes") if ok else None,
        reserved_memory_bytes=row.get("reserved_memory_bytes") if ok else None,
        forward_s=row.get("forward_s"), backward_s=row.get("backward_s"), optimizer_s=row.get("optimizer_s"),
        source=f"data/measurements/gpu_grid/{rows_file or hardware + '_rows.jsonl'}#{run['id']}", reason=row.get("reason", ""))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_grid(path: Path) -> list[tuple[str, Measurement]]:
    """(run id, Measurement) pairs of an ingested grid file, model paths resolved."""
    out = []
    for rec in _read_jsonl(path):
        run_id = rec["source"].rsplit("#", 1)[1]
        rec = {**rec, "model": model_arg(rec["model"])}
        out.append((run_id, from_record(rec)))
    return out


@dataclasses.dataclass(frozen=True)
class Scored:
    run: dict[str, Any]
    m: Measurement
    predicted: dict[str, Any]
    """Efficiency label -> (step seconds, live bytes, fits)."""

    @property
    def half(self) -> str:
        """The grid's split by model, as validate.accuracy splits published data: sorted architectures alternate
        between the fitting half (bert-large, gpt2-large, gpt2-xl) and the test half (gpt2, gpt2-medium with both
        attentions, llama-3.2-1b). Defaults fitted on this grid use the fitting half only."""
        return _half(self.run)


FIRST = ("gpt2", "gpt2-medium", "gpt2-medium-sdpa", "gpt2-large", "gpt2-xl", "bert-large", "llama-3.2-1b")
"""The first plan's models: the only ones split into a fitting and a test half (the second plan's shapes are
all test: no default was fitted on them)."""
MODELS_BY_ARCH = sorted({MODELS[name].arch for name in FIRST})


def _half(run: dict[str, Any]) -> str:
    return model_half(MODELS_BY_ARCH, run["arch"]) if run["arch"] in MODELS_BY_ARCH else "test"


def score(runs: Sequence[dict[str, Any]], grid: Sequence[tuple[str, Measurement]], hardware: str,
          effs: dict[str, Efficiency]) -> list[Scored]:
    by_id = {r["id"]: r for r in runs}
    out = []
    for run_id, m in grid:
        run = by_id[run_id]
        job, cfg = run_job(run, hardware), run_config(run)
        pred = {}
        for label, eff in effs.items():
            est = estimate(job, cfg, eff)
            pred[label] = (est.time.step_s, est.memory.live_bytes, est.memory.fits)
        out.append(Scored(run, m, pred))
    return out


def _rel(pred: float, meas: float) -> float:
    return abs(pred - meas) / meas


def _summary(errors: list[float]) -> str:
    if not errors:
        return "-"
    return f"median {100 * statistics.median(errors):.1f}%, worst {100 * max(errors):.1f}% (n={len(errors)})"


def _group(run: dict[str, Any], precision: str) -> tuple[str, int, str]:
    return run["name"], run["seq_len"], precision


def report_lines(scored: Sequence[Scored], labels: Sequence[str]) -> list[str]:
    """The figures issue-style: peak memory, step time, largest micro-batch, ZeRO-3 / ZeRO-1, best ranked first,
    each on the runs not used for fitting (role != calibration)."""
    held = [s for s in scored if s.run["role"] != "calibration"]
    ok = [s for s in held if s.m.status == "ok"]
    lines = [f"runs: {len(scored)} measured ({sum(s.m.status == 'ok' for s in scored)} ok, "
             f"{sum(s.m.status == 'oom' for s in scored)} oom); scored: {len(held)} not used for fitting"]
    for label in labels:
        for half in ("test", "fit"):
            part = [s for s in ok if s.half == half]
            mem = [_rel(s.predicted[label][1], s.m.peak_memory_bytes) for s in part if s.m.peak_memory_bytes]
            step = [_rel(s.predicted[label][0], s.m.step_s) for s in part]
            lines += [f"[{label}] {half} half: peak memory error {_summary(mem)}; step time error {_summary(step)}"]
        verdicts = sum(s.predicted[label][2] == (s.m.status == "ok") for s in held)
        lines += [f"[{label}] fit / out-of-memory verdicts agreeing: {verdicts} / {len(held)}"]
        lines += _largest(scored, label) + _ratios(scored, label) + _ranking(scored, label)
    return lines


def _largest(scored: Sequence[Scored], label: str) -> list[str]:
    chains: dict[str, list[Scored]] = {}
    for s in scored:
        if s.run["chain"]:
            chains.setdefault(s.run["chain"], []).append(s)
    out = []
    for chain, members in chains.items():
        if not any(s.m.status == "oom" for s in members):
            continue  # the chain ended before memory did: no measured limit
        measured = max((s.run["micro_batch"] for s in members if s.m.status == "ok"), default=0)
        predicted = max((s.run["micro_batch"] for s in members if s.predicted[label][2]), default=0)
        steps = abs((predicted or 1).bit_length() - (measured or 1).bit_length())
        out.append(f"[{label}] largest micro-batch {chain}: predicted {predicted}, measured {measured} "
                   f"({'exact' if steps == 0 else f'{steps} doubling(s) off'})")
    return out


def _ratios(scored: Sequence[Scored], label: str) -> list[str]:
    def key(s: Scored, stage: int) -> tuple:
        c = s.m.config
        return (s.run["name"], s.run["seq_len"], c.precision, c.train_micro_batch_size_per_gpu,
                c.gradient_accumulation_steps, c.activation_checkpointing.enabled,
                c.zero.offload_optimizer.device, stage)
    ok = {key(s, s.m.config.zero.stage): s for s in scored if s.m.status == "ok"}
    out = []
    for k, z3 in ok.items():
        z1 = ok.get(k[:-1] + (1,)) if k[-1] == 3 else None
        if z1 is None:
            continue
        meas = z3.m.step_s / z1.m.step_s
        pred = z3.predicted[label][0] / z1.predicted[label][0]
        out.append(f"[{label}] ZeRO-3 / ZeRO-1 {k[0]} mb{k[3]}: predicted {pred:.2f}, measured {meas:.2f} "
                   f"({100 * (pred - meas) / meas:+.0f}%)")
    return out


def _ranking(scored: Sequence[Scored], label: str) -> list[str]:
    groups: dict[tuple, list[Scored]] = {}
    for s in scored:
        if s.m.status == "ok":
            groups.setdefault(_group(s.run, s.m.config.precision), []).append(s)
    out, hits, total = [], 0, 0
    for g, members in sorted(groups.items()):
        if len(members) < 2:
            continue
        def thr(s: Scored, step: float) -> float:
            return s.m.config.samples_per_step(1) / step
        best = max(members, key=lambda s: thr(s, s.m.step_s))
        pick = max(members, key=lambda s: thr(s, s.predicted[label][0]))
        total += 1
        hits += pick is best
        out.append(f"[{label}] {g[0]} {g[2]}: measured best {best.run['id']}, ranked first {pick.run['id']} "
                   f"(pick / best {thr(pick, pick.m.step_s) / thr(best, best.m.step_s):.3f})")
    return out + [f"[{label}] measured best ranked first: {hits} / {total} models"]


def stored_lines(path: Path, grid: Sequence[tuple[str, Measurement]], runs: dict[str, dict[str, Any]]) -> list[str]:
    """Predictions written before the runs were measured (`predict`), scored as they were: step time against
    the measured step, per half of the models."""
    pred = {r["id"]: r for r in _read_jsonl(path)}
    ok = [(runs[i], m) for i, m in grid if m.status == "ok" and i in pred and runs[i]["role"] != "calibration"]
    lines = []
    for half in ("test", "fit"):
        step = [_rel(pred[run["id"]]["step_s"], m.step_s) for run, m in ok if _half(run) == half]
        lines.append(f"[stored {path.name}] {half} half: step time error {_summary(step)}")
    return lines


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))


PLANS = {"first": plan, "shapes": plan_shapes, "all": plan_all}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_grid", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("plan")
    a.add_argument("--hardware", default="h200")
    a.add_argument("--set", choices=("first", "shapes", "all"), default="first",
                   help="first: GPT-2, BERT-large, Llama-3.2-1B; shapes: the second plan's models (plan_shapes); "
                        "all: both, every model's stages first (plan_all)")
    a.add_argument("--out", type=Path, required=True)
    a = sub.add_parser("predict")
    a.add_argument("--plan", type=Path, required=True)
    a.add_argument("--hardware", required=True)
    a.add_argument("--profile", type=Path)
    a.add_argument("--out", type=Path, required=True)
    a = sub.add_parser("report")
    a.add_argument("--plan", type=Path, default=GRID_DIR / "plan.json")
    a.add_argument("--grid", type=Path, default=GRID_DIR / "h200_grid.jsonl")
    a.add_argument("--hardware", default="h200")
    a.add_argument("--profile", type=Path, action="append", default=[],
                   help="also score predictions with this profile's efficiency (repeatable)")
    a.add_argument("--predictions", type=Path, action="append", default=[],
                   help="also score predictions stored before measuring (`predict --out`; repeatable)")
    a = sub.add_parser("ingest")
    a.add_argument("--plan", type=Path, required=True)
    a.add_argument("--rows", type=Path, required=True)
    a.add_argument("--hardware", required=True)
    a.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.cmd == "plan":
        args.out.parent.mkdir(parents=True, exist_ok=True)
        planned = {"hardware": args.hardware, "runs": PLANS[args.set](args.hardware)}
        args.out.write_text(json.dumps(planned, indent=1) + "\n")
        return 0
    runs = json.loads(args.plan.read_text())["runs"]
    if args.cmd == "report":
        from zerotune.calibrate.fit import fit
        from zerotune.calibrate.profiles import load_profile
        grid = read_grid(args.grid)
        roles = {r["id"]: r["role"] for r in runs}
        calibration = [m for run_id, m in grid if roles[run_id] == "calibration"]
        effs = {"uncalibrated": Efficiency()}
        if calibration:
            effs["calibrated on the 6 probes"] = fit(calibration).efficiency
        effs.update({f"profile {p.name}": load_profile(p).efficiency for p in args.profile})
        print("\n".join(report_lines(score(runs, grid, args.hardware, effs), list(effs))))
        for path in args.predictions:
            print("\n".join(stored_lines(path, grid, {r["id"]: r for r in runs})))
        return 0
    if args.cmd == "predict":
        from zerotune.calibrate.profiles import load_profile
        eff = load_profile(args.profile).efficiency if args.profile else Efficiency()
        _write_jsonl(args.out, predict_rows(runs, args.hardware, eff))
        return 0
    by_id = {r["id"]: r for r in runs}
    measured = [to_measurement(by_id[row["id"]], row, args.hardware, args.rows.name) for row in _read_jsonl(args.rows)]
    _write_jsonl(args.out, (to_record(m) for m in measured if m is not None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
