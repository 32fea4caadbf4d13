"""The `zerotune` command: dispatches the verbs. The only module that names more than one package.

User mistakes (ValueError, a missing or malformed file) print one line and exit with status 2. Anything else
is zerotune's fault: one line saying so and where to report it, also exit 2; `--debug` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, NoReturn, Sequence

from zerotune.calibrate import run as calibration
from zerotune.calibrate.ingest import read_measurements
from zerotune.calibrate.launch import terminate_as_interrupt
from zerotune.calibrate.profiles import check_writable, default_profile_path, load_profile
from zerotune.predictor import Efficiency, experiment_name, load_hardware
from zerotune.predictor.ds_json import refuse_non_objects
from zerotune.predictor.rank import Uncertainty, evaluate_space
from zerotune.predictor.space import EXPLORABLE, space_from_ds_config
from zerotune.predictor.units import GIB
from zerotune.validate import plan as planning
from zerotune.validate.args import explore_items, non_negative_float, positive_float, positive_int, positive_int_list
from zerotune.validate.experiments import read_ds_config
from zerotune.validate.plots import plot_predicted_vs_measured, plot_space
from zerotune.validate.settings import add_tune_arguments
from zerotune.validate.tune import run_tune
from zerotune.validate.report import (format_estimate, format_ranking, format_whatif, prediction_dict, ranking_dict,
                             whatif_dict)

__all__ = ["main"]

EXIT_USAGE = 2
REPORT_TO = "the zerotune issue tracker (with the command, and its output with --debug)"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not argparse's usage block
        self.exit(EXIT_USAGE, f"zerotune: error: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="zerotune", description="Predict the DeepSpeed configuration to run.")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    verbs = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    p = verbs.add_parser("predict", help="memory per GPU of a configuration, broken down, and whether it fits")
    p.add_argument("--model", default="gpt2", help="catalog name (see data/models) or a config.json path")
    p.add_argument("--hardware", default="v100-32gb", type=_names,
                   help="catalog name (see data/hardware) or a YAML path; a comma list compares GPUs side by side")
    p.add_argument("--num_gpus", type=positive_int("--num_gpus"), default=1, help="GPUs per node, as deepspeed's")
    p.add_argument("--num_nodes", type=positive_int_list("--num_nodes"), default=[1],
                   help="nodes; a comma list (1,2,4,8) predicts throughput and scaling efficiency per size")
    p.add_argument("--deepspeed", metavar="DS_CONFIG", type=_nonempty_path("--deepspeed"),
                   help="a ds_config.json; the flags below override it")
    p.add_argument("--zero_stage", type=int, choices=(0, 1, 2, 3))
    p.add_argument("--micro_batch", type=positive_int("--micro_batch"), help="train_micro_batch_size_per_gpu")
    p.add_argument("--grad_accum", type=positive_int("--grad_accum"), help="gradient_accumulation_steps")
    p.add_argument("--seq_len", type=positive_int("--seq_len"),
                   help=f"tokens per sample (default: the model's positions, at most {planning.DEFAULT_MAX_SEQ_LEN})")
    p.add_argument("--precision", choices=("fp16", "bf16", "fp32"))
    p.add_argument("--attention", choices=("eager", "flash"),
                   help="how the model runs attention (default: the model file's, eager for catalog models): "
                        "flash (FlashAttention / PyTorch SDPA) stores no s x s scores")
    p.add_argument("--activation_checkpointing", action="store_true", help="recompute activations in backward")
    p.add_argument("--offload_optimizer", choices=("none", "cpu", "nvme"))
    p.add_argument("--offload_param", choices=("none", "cpu", "nvme"))
    p.add_argument("--mp_size", type=positive_int("--mp_size"), help="tensor (model) parallel degree")
    p.add_argument("--pp_size", type=positive_int("--pp_size"),
                   help="pipeline stages (the ds_config's pipeline.stages; DeepSpeed pipelines run ZeRO 0-1)")
    p.add_argument("--rank", action="store_true",
                   help="rank every configuration of the tuning space (lists in the ds_config, DeepSpeed's "
                        "per-stage spaces, offload, checkpointing, every micro-batch) instead of predicting one")
    p.add_argument("--top", type=positive_int("--top"), help="rows of the ranking to show (default 10)")
    p.add_argument("--metric", choices=("throughput", "latency", "flops"),
                   help="what to rank by (default: the ds_config's autotuning.metric, else throughput); "
                        "latency is minimised")
    p.add_argument("--headroom_gib", type=non_negative_float("--headroom_gib"),
                   help="memory to keep free per GPU when ranking (default 0)")
    p.add_argument("--explore", type=_explore,
                   help="what --rank may add that the ds_config does not set: offload,checkpointing (default) "
                        "or none")
    p.add_argument("--profile", type=_nonempty_path("--profile"),
                   help="a calibration profile (data/profiles/*.json) to predict with")
    p.add_argument("--plot", metavar="FILE.png", type=_plot_path, help="with --rank: throughput per micro-batch and stage, and "
                                                       "memory of each stage's best, as a PNG")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    _add_calibrate(verbs)
    add_tune_arguments(verbs.add_parser(
        "tune", help="run only the top-k predicted configurations as real DeepSpeed experiments and write "
                     "ds_config_optimal.json (a drop-in for deepspeed --autotuning tune)"))
    for verb in verbs.choices.values():  # --debug after the verb too (before a tuned script's own arguments)
        verb.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                          help="show the traceback of an unexpected error")
    return parser


def _add_calibrate(verbs: Any) -> None:
    c = verbs.add_parser("calibrate", help="fit this cluster's profile from microbenchmarks and a few real "
                                           "DeepSpeed runs, or from measurements made elsewhere (--from)")
    c.add_argument("--hardware", required=True, help="catalog name (see data/hardware) or a YAML path")
    c.add_argument("--num_gpus", type=positive_int("--num_gpus"), help="devices per node, as deepspeed's")
    c.add_argument("--num_nodes", type=positive_int("--num_nodes"), help="nodes (needs --hostfile), as deepspeed's")
    c.add_argument("--hostfile", help="DeepSpeed hostfile for multi-node runs")
    c.add_argument("--model", help="probe model: catalog name or path (default: the built-in zt-gpt-small); "
                                   "with --from, the model the measurements trained")
    c.add_argument("--seq_len", type=positive_int("--seq_len"), help="tokens per sample (probe default: 128)")
    c.add_argument("--from", dest="source", metavar="PATH", type=_nonempty_path("--from"),
                   help="fit from a DeepSpeed autotuning folder, a CSV / JSONL table or zerotune measurements "
                        "instead of running anything")
    c.add_argument("--out", type=_nonempty_path("--out"),
                   help="profile to write (default: <hardware>.json in the user profile folder, "
                        "$ZEROTUNE_HOME/profiles or ~/.local/share/zerotune/profiles)")
    c.add_argument("--force", action="store_true", help="replace the profile at --out if it exists")
    c.add_argument("--quick", action="store_true", help="fewest sizes and steps (CI)")
    c.add_argument("--max_probes", type=positive_int("--max_probes"), default=6, help="real probe runs (at most 6)")
    c.add_argument("--timeout_s", type=positive_float("--timeout_s"), default=900.0, help="time limit per run")
    c.add_argument("--plot", metavar="FILE.png", type=_plot_path, help="step time predicted against measured, before and after")
    c.add_argument("--json", action="store_true", help="print the profile as JSON instead of the table")


def _names(text: str) -> list[str]:
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))  # a name given twice runs once
    if not names:
        raise argparse.ArgumentTypeError("give at least one name")
    return names


def _nonempty_path(flag: str) -> Any:
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"empty: give a file path, or leave {flag} out")
        return text
    return parse


PLOT_FORMATS = ("png", "pdf", "svg")


def _plot_path(text: str) -> str:
    """An image file to write: checked before anything is predicted or measured, not after."""
    path = Path(text)
    if not text.strip() or path.is_dir() or text.endswith(("/", "\\")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a file name: give one such as plot.png")
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise argparse.ArgumentTypeError(f"{text!r}: the file name must end in "
                                         f"{', '.join('.' + f for f in PLOT_FORMATS)}")
    if not path.resolve().parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: its folder {str(path.parent)!r} does not exist")
    return text


def _explore(text: str) -> tuple[str, ...]:
    try:
        return explore_items(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _apply_flags(doc: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Flags override the ds_config, the way DeepSpeed's autotuner overrides keys per experiment."""
    doc = dict(doc)
    refuse_non_objects(doc)  # the sections the flags write into among them
    zero = dict(doc.get("zero_optimization") or {})
    if args.zero_stage is not None:
        zero["stage"] = args.zero_stage
    for flag in ("offload_optimizer", "offload_param"):
        if getattr(args, flag) is not None:
            section = zero.get(flag) or {}
            if not isinstance(section, dict):
                raise ValueError(f"ds_config zero_optimization.{flag} must be an object, e.g. {{\"device\": \"cpu\"}}, "
                                 f"got {json.dumps(section)[:40]}; fix it or drop --{flag}")
            zero[flag] = {**section, "device": getattr(args, flag)}
    doc["zero_optimization"] = zero
    if args.micro_batch is not None and args.grad_accum is not None:
        doc.pop("train_batch_size", None)  # re-derived from the pair given
    elif "train_batch_size" in doc:  # DeepSpeed's rule: the global batch stays and the other of the pair follows
        if args.micro_batch is not None:
            doc.pop("gradient_accumulation_steps", None)
        if args.grad_accum is not None:
            doc.pop("train_micro_batch_size_per_gpu", None)
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
    if args.pp_size is not None:
        doc["pipeline"] = {**(doc.get("pipeline") or {}), "stages": args.pp_size}
    return doc


def _doc(args: argparse.Namespace) -> dict[str, Any]:
    doc = read_ds_config(Path(args.deepspeed)) if args.deepspeed else {}
    return _apply_flags(doc, args)


def _plan_for(args: argparse.Namespace, hardware: str, doc: dict[str, Any]) -> tuple[planning.Plan, bool]:
    """(how to predict, whether a calibration profile applies) for one GPU type."""
    eff, unc, calibrated = Efficiency(), Uncertainty(), False
    if args.profile:
        profile = load_profile(Path(args.profile))
        if profile.hardware == hardware:
            eff, unc, calibrated = profile.efficiency, profile.uncertainty.bands(), True
        else:
            warnings.warn(f"--profile {args.profile} was fitted on {profile.hardware}, not {hardware}; "
                          f"predicting {hardware} uncalibrated")
    metric = args.metric or str((doc.get("autotuning") or {}).get("metric", "throughput")).lower()
    if metric not in ("throughput", "latency", "flops"):
        raise ValueError(f"ds_config autotuning.metric {metric!r}: use throughput, latency or FLOPS")
    plan = planning.Plan(eff, unc, metric, args.headroom_gib * GIB, args.explore, args.top)  # type: ignore[arg-type]
    return plan, calibrated


def _predict(args: argparse.Namespace) -> int:
    if len(args.num_nodes) > 1 and len(args.hardware) > 1:
        raise ValueError("--num_nodes and --hardware are both lists; sweep one at a time")
    if args.plot and not args.rank:
        raise ValueError("--plot draws the ranked space; add --rank")
    if args.plot and (len(args.num_nodes) > 1 or len(args.hardware) > 1):
        raise ValueError("--plot draws one ranked space; sweep --num_nodes or --hardware without it")
    ranking_only = [flag for flag in ("top", "headroom_gib", "explore") if getattr(args, flag) is not None]
    if ranking_only and not args.rank:  # a single prediction reads none of them
        raise ValueError(f"--{ranking_only[0]} shapes the ranking of the space; add --rank, or drop it")
    args.top = 10 if args.top is None else args.top
    args.headroom_gib = 0.0 if args.headroom_gib is None else args.headroom_gib
    args.explore = EXPLORABLE if args.explore is None else args.explore
    doc = _doc(args)
    def job_of(hardware: str, nodes: int) -> Any:
        job = planning.build_job(args.model, hardware, nodes, args.num_gpus, args.seq_len, args.attention)
        planning.check_parallelism(job, doc)
        return job
    if len(args.num_nodes) > 1:
        plan, calibrated = _plan_for(args, args.hardware[0], doc)
        jobs = [(f"{n} node(s)", job_of(args.hardware[0], n)) for n in args.num_nodes]
        points = planning.scaling_sweep(jobs, doc, plan, args.rank)
        _some_fit(points, "at any of the --num_nodes sizes", "more nodes, offload, checkpointing or a shorter --seq_len")
        title = f"scaling {args.model} on {args.hardware[0]} x {args.num_gpus} per node" + (
            f", best of the ranked space at each size by {plan.metric}" if args.rank else "")
        return _emit(args, whatif_dict(points, "scaling", calibrated), lambda: format_whatif(points, title))
    if len(args.hardware) > 1:
        sweeps = [(hw, job_of(hw, args.num_nodes[0]), *_plan_for(args, hw, doc)) for hw in args.hardware]
        points = planning.hardware_sweep([(hw, job, plan) for hw, job, plan, _ in sweeps], doc, args.rank)
        _some_fit(points, "on any of the --hardware GPUs", "more GPUs or nodes, offload, checkpointing or a shorter "
                  "--seq_len")
        title = f"{args.model} on {args.num_nodes[0]} node(s) x {args.num_gpus} of each GPU" + (
            " (best of the ranked space)" if args.rank else "")
        return _emit(args, whatif_dict(points, "hardware_comparison", any(c for *_, c in sweeps)),
                     lambda: format_whatif(points, title))
    job = job_of(args.hardware[0], args.num_nodes[0])
    plan, calibrated = _plan_for(args, args.hardware[0], doc)
    if not args.rank:
        est = planning.single(job, doc, plan)
        return _emit(args, prediction_dict(est, calibrated), lambda: format_estimate(est, calibrated))
    ranking = planning.ranking(job, doc, plan)
    if not ranking.entries:
        least = ranking.least_memory
        raise ValueError(f"no configuration of the space fits {job.cluster.hardware.name} "
                         f"({least.memory.capacity_bytes / GIB:.1f} GiB): the least memory is "
                         f"{least.memory.total_bytes / GIB:.1f} GiB ({experiment_name(least.config)}); add GPUs or nodes, offload, checkpointing "
                         f"or a shorter --seq_len")
    if args.plot:
        space = space_from_ds_config(doc, world_size=job.cluster.world_size, hidden_size=job.model.hidden_size,
                                     explore=plan.explore)
        plot_space(job, evaluate_space(job, space, plan.efficiency), Path(args.plot), plan.efficiency)
    return _emit(args, ranking_dict(ranking, calibrated),
                 lambda: format_ranking(ranking, plan.headroom_bytes, calibrated))


def _some_fit(points: Sequence[Any], where: str, fix: str) -> None:
    """A sweep where nothing fits anywhere is the single prediction's error, not a table of dashes (exit 2)."""
    if all(p.estimate is None for p in points):
        notes = "; ".join(dict.fromkeys(p.note for p in points if p.note and p.note != "nothing fits"))
        raise ValueError(f"no configuration fits {where}" + (f" ({notes})" if notes else "") + f"; try {fix}")


def _emit(args: argparse.Namespace, doc: dict[str, Any], text: Any) -> int:
    if not args.json:
        print(text())
        return 0
    try:
        print(json.dumps(doc, indent=2, allow_nan=False))
    except ValueError as exc:  # a NaN or infinity in a prediction is zerotune's bug: never printed as non-JSON
        raise ArithmeticError(f"the prediction holds a NaN or infinity ({exc})") from None
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    hardware = load_hardware(args.hardware).name
    out = Path(args.out) if args.out else default_profile_path(hardware)
    check_writable(out, args.force)  # before anything is measured
    if args.source:
        run_flags = (("--num_gpus", args.num_gpus, None), ("--num_nodes", args.num_nodes, None),
                     ("--hostfile", args.hostfile, None), ("--quick", args.quick, False),
                     ("--max_probes", args.max_probes, 6), ("--timeout_s", args.timeout_s, 900.0))
        ignored = [flag for flag, value, default in run_flags if value != default]
        if ignored:
            warnings.warn(f"{', '.join(ignored)}: no effect with --from (nothing is run; the table says how its "
                          f"runs were made)")
        measurements = calibration.on_hardware(
            read_measurements(args.source, model=args.model, hardware=args.hardware, seq_len=args.seq_len), hardware)
        environment = {"source": str(args.source)}
    else:
        measured = calibration.measure(
            hardware=args.hardware, num_gpus=args.num_gpus, num_nodes=args.num_nodes, hostfile=args.hostfile,
            model=args.model, seq_len=args.seq_len, quick=args.quick, max_probes=args.max_probes,
            timeout_s=args.timeout_s, progress=lambda line: print(line, file=sys.stderr, flush=True))
        measurements, environment = list(measured.measurements), measured.environment
    cal = calibration.fit_and_save(measurements, environment, out,
                                   base=calibration.starting_efficiency(environment, hardware))
    if args.plot:
        calibration.plot_fit(cal, Path(args.plot), plot_predicted_vs_measured)
    if args.json:
        print(cal.path.read_text())
    else:
        print(calibration.format_fit(cal))
    return 0


_SHOWN: set[str] = set()
"""Warnings already shown: the ds_config is parsed once per space, variant and experiment, and each parse may
warn the same thing (an "auto" precision); the user reads it once."""
_PENDING: list[str] = []
"""Warnings not printed yet: each waits for the verb's next line of output (or its successful end), so that a
mistake found after a warning is the one line the user reads (a ds_config with an unknown key and a stage 9 had
printed the key's warning, then the stage's error)."""


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    text = f"zerotune: warning: {message}"
    if text not in _SHOWN:
        _SHOWN.add(text)
        _PENDING.append(text)


def _flush_warnings() -> None:
    while _PENDING:
        print(_PENDING.pop(0), file=sys.stderr)


class _WarningsFirst:
    """Standard output that prints the pending warnings to stderr before its own text."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        _flush_warnings()
        return int(self._stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _one_line(exc: BaseException) -> str:
    """The error on one line, cut at a word past 800 characters (an error that long had been cut mid-word at 500)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= 800 else text[:800].rsplit(" ", 1)[0] + " ..."


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    warnings.showwarning = _show_warning
    stdout, sys.stdout = sys.stdout, _WarningsFirst(sys.stdout)
    try:
        with terminate_as_interrupt():
            code = {"predict": _predict, "calibrate": _calibrate, "tune": run_tune}[args.verb](args)
        _flush_warnings()
        return code
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM or SIGHUP: the launcher has stopped every rank it started
        print("zerotune: interrupted; every rank it started was stopped", file=sys.stderr)
        return 128 + getattr(exc, "signum", signal.SIGINT)
    except (ValueError, RuntimeError) as exc:  # RuntimeError: a run that could not be measured, said in one line
        _PENDING.clear()  # the error is the line to read
        if args.debug:
            traceback.print_exc()
        print(f"zerotune: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        _PENDING.clear()
        if isinstance(exc, BrokenPipeError):  # output piped into `head`: not an error
            sys.stderr.close()
            return 0
        if args.debug:
            traceback.print_exc()
        name = str(exc.filename or "").replace("\n", "\\n")  # a path with a newline stays one line
        print(f"zerotune: error: {name}: {exc.strerror or _one_line(exc)}; check the path and its "
              f"permissions", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # a bug, not the user's mistake: one line, where to report it, the trace on --debug
        _PENDING.clear()
        if args.debug:
            traceback.print_exc()
        print(f"zerotune: internal error: {type(exc).__name__}: {_one_line(exc)}; please report it to {REPORT_TO}",
              file=sys.stderr)
        return EXIT_USAGE
    finally:
        sys.stdout = stdout
        _flush_warnings()  # an interrupted run's


if __name__ == "__main__":
    sys.exit(main())
