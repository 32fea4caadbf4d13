"""How far `zerotune tune`'s first predictions land from what the user's script then runs at, script by script.

    python -m benchmarks.first_prediction --out /tmp/first [--scripts encoder,decoder] [--timeout_s 900]

For each script of tests/fixtures/scripts (the styles users write: DeepSpeedExamples-style loops, a script that
takes its micro-batch as its own flag, Hugging Face Trainer scripts with "auto" values), `zerotune tune --num_gpus 2
--hardware cpu --top_k 1` runs in OUT/<script>/ with a ds_config of stages 0 and 1, micro-batch cap 32, and nothing
DeepSpeed's autotuner is not given (no --model, no --seq_len). Its log says two things this reads back:

- the profiling run (the script at micro-batch 1): measured and predicted samples/s and the band the prediction
  was given (the calibration profile's, widened for a model it was not fitted on);
- the first experiment: its prediction after the profiling run's correction, the band the search gave it, and
  what it measured.

Prints one row per script and the share of each inside its band; writes OUT/first_prediction.json. CPU timings on a
shared VM move between runs (the profiling run's matmul check read 41-85 GFLOP/s on 2026-11-27): compare runs made
the same hour, and read a single row as one draw.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from benchmarks.tools import ROOT, with_root

SCRIPTS = ROOT / "tests" / "fixtures" / "scripts"
_AUTOTUNING = {"enabled": True, "start_profile_step": 2, "end_profile_step": 6,
               "max_train_micro_batch_size_per_gpu": 32}
_TRAINER_FLAGS = ("--output_dir", "out", "--use_cpu", "--per_device_train_batch_size", "4", "--report_to", "none",
                  "--save_strategy", "no", "--max_steps", "12")


@dataclass(frozen=True)
class Script:
    name: str
    file: str
    style: str
    """"loop" (--deepspeed --deepspeed_config), "flag" (its own --batch_size, arg_mappings) or "trainer"."""
    ds_optimizer: bool = False
    """The script takes its optimizer from the ds_config's optimizer section."""
    script_args: tuple[str, ...] = ()
    """More of the script's own arguments (the Trainer's --gradient_checkpointing)."""


SCRIPT_LIST = (
    Script("encoder", "encoder_mlm.py", "loop"), Script("decoder", "decoder_lm.py", "flag"),
    Script("hfloop", "hf_causal_lm_loop.py", "loop"), Script("neox", "neox_loop.py", "loop"),
    Script("vit", "vit_classifier.py", "loop"), Script("lora", "lora_finetune.py", "loop", ds_optimizer=True),
    Script("bert_trainer", "hf_trainer_mlm.py", "trainer"), Script("gpt2_trainer", "gpt2_trainer_clm.py", "trainer"),
    Script("t5_trainer", "t5_seq2seq_trainer.py", "trainer"),
    Script("bert_cls_ckpt", "bert_cls_trainer.py", "trainer", script_args=("--gradient_checkpointing",)),
    Script("moe", "mixtral_moe_loop.py", "loop"), Script("seq2seq", "seq2seq_transformer.py", "loop"),
    Script("albert", "albert_mlm_loop.py", "loop", ds_optimizer=True),
    Script("mlp", "mlp_regression.py", "loop", ds_optimizer=True), Script("nanogpt", "nanogpt_loop.py", "loop"),
    Script("gru_trainer", "gru_classifier_trainer.py", "trainer"),
)
_NUMBER = r"([0-9.]+(?:e[+-]?[0-9]+)?)"
_PROFILE = re.compile(rf"profiling run (\S+): measured {_NUMBER} samples/s, predicted {_NUMBER} \(band {_NUMBER}-"
                      rf"{_NUMBER}\)")
_FIRST = re.compile(rf"experiment 1 \(at most \d+\) (\S+) \(predicted throughput {_NUMBER}, band {_NUMBER}-{_NUMBER}")
_OUTCOME = re.compile(r"^  -> (.*)$", re.MULTILINE)
_OK = re.compile(rf"ok: throughput {_NUMBER}")


@dataclass(frozen=True)
class Landing:
    """One prediction against its measurement (samples/s)."""

    config: str
    measured: float
    predicted: float
    low: float
    high: float

    @property
    def inside(self) -> bool:
        return self.low <= self.measured <= self.high

    @property
    def log_error(self) -> float:
        return math.log(self.measured / self.predicted)


@dataclass(frozen=True)
class Row:
    script: str
    profiling: Landing | None
    first: Landing | None
    error: str = ""


def ds_config(script: Script) -> dict[str, Any]:
    doc: dict[str, Any] = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": [0, 1]},
                           "autotuning": dict(_AUTOTUNING)}
    if script.ds_optimizer:
        doc["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}
    if script.style == "flag":
        doc["autotuning"]["arg_mappings"] = {"train_micro_batch_size_per_gpu": "--batch_size"}
    if script.style == "trainer":
        doc.update(train_micro_batch_size_per_gpu="auto", gradient_accumulation_steps="auto", train_batch_size="auto",
                   optimizer={"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}})
        doc["autotuning"]["arg_mappings"] = {"train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
                                             "gradient_accumulation_steps": "--gradient_accumulation_steps"}
    return doc


def tune_command(script: Script, config: Path) -> list[str]:
    path = str(SCRIPTS / script.file)
    base = [sys.executable, "-m", "zerotune.cli", "tune", "--num_gpus", "2", "--hardware", "cpu", "--top_k", "1", path]
    if script.style == "trainer":
        return base + ["--deepspeed", str(config), *_TRAINER_FLAGS, *script.script_args]
    if script.style == "flag":
        return base + ["--deepspeed_config", str(config), "--steps", "7", *script.script_args]
    return base + ["--deepspeed", "--deepspeed_config", str(config), *script.script_args]


def read_log(text: str) -> tuple[Landing | None, Landing | None]:
    """(the profiling run, the first experiment) as the tune's log states them; None where it does not."""
    profiling = first = None
    if m := _PROFILE.search(text):
        profiling = Landing(m.group(1), *(float(m.group(i)) for i in range(2, 6)))
    outcome = _OUTCOME.search(text, m.end()) if (m := _FIRST.search(text)) else None
    if m and outcome and (ok := _OK.match(outcome.group(1))):  # its own outcome: the next "->" line
        first = Landing(m.group(1), float(ok.group(1)), *(float(m.group(i)) for i in range(2, 5)))
    return profiling, first


def run_one(script: Script, out: Path, timeout_s: float) -> Row:
    folder = out / script.name
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "ds_config.json"
    config.write_text(json.dumps(ds_config(script), indent=1))
    env = {**os.environ, "PYTHONPATH": with_root(os.environ.get("PYTHONPATH", ""))}
    try:
        done = subprocess.run(tune_command(script, config), cwd=folder, env=env, capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Row(script.name, None, None, f"timed out after {timeout_s:.0f} s")
    (folder / "tune.log").write_text(done.stdout + done.stderr)
    profiling, first = read_log(done.stdout)
    error = "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]
    return Row(script.name, profiling, first, error[:300])


def _cell(landing: Landing | None) -> str:
    if landing is None:
        return "-"
    mark = "in" if landing.inside else "OUT"
    return (f"{landing.config}: {landing.measured:.4g} vs {landing.predicted:.4g} ({landing.low:.4g}-"
            f"{landing.high:.4g}) {mark}, {100 * math.expm1(landing.log_error):+.0f}%")


def table(rows: Sequence[Row]) -> str:
    lines = ["| script | profiling run: measured vs predicted (band) | first experiment: measured vs predicted (band) |",
             "|---|---|---|"]
    lines += [f"| {r.script} | {_cell(r.profiling)} | {_cell(r.first)}{' ' + r.error if r.error else ''} |"
              for r in rows]
    for label, pick in (("profiling run", lambda r: r.profiling), ("first experiment", lambda r: r.first)):
        landed = [pick(r) for r in rows if pick(r) is not None]
        if landed:
            inside = sum(x.inside for x in landed)
            rms = math.sqrt(sum(x.log_error ** 2 for x in landed) / len(landed))
            lines.append(f"\n{label}: {inside}/{len(landed)} inside the band; RMS log error {rms:.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.first_prediction", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for each script's tune and the JSON")
    parser.add_argument("--scripts", default=",".join(s.name for s in SCRIPT_LIST),
                        help="comma list of: " + ", ".join(s.name for s in SCRIPT_LIST))
    parser.add_argument("--timeout_s", type=float, default=900.0, help="limit per script's tune")
    args = parser.parse_args(argv)
    known = {s.name: s for s in SCRIPT_LIST}
    wanted = [n.strip() for n in args.scripts.split(",") if n.strip()]
    if unknown := [n for n in wanted if n not in known]:
        print(f"first_prediction: error: --scripts {','.join(unknown)}: unknown; choose from {', '.join(known)}",
              file=sys.stderr)
        return 2
    rows = []
    for name in wanted:
        rows.append(run_one(known[name], args.out, args.timeout_s))
        row = rows[-1]
        print(f"{name}: {_cell(row.profiling)} | {_cell(row.first)} {row.error}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "first_prediction.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
