"""How much the profiling run's forward timer improves GPU step-time predictions (zerotune.validate.calibration.
host_paced), replayed on this project's GPU grids.

    python -m benchmarks.host_pace

For each model of each grid (data/measurements/gpu_grid/*_grid.jsonl) the micro-batch-1 run at ZeRO-0 or -1 with
accumulation 1 stands for `tune`'s profiling run: its measured forward (DeepSpeed's fwd timer, the grid's forward_s)
paces the host's seconds per kernel exactly as `tune` does. The model's other rows are then predicted, uncalibrated,
with and without that pace; printed: per model the pace, per grid the median and mean absolute step-time error of
those rows before and after. The profiling run's own row is left out of the scores.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from zerotune.predictor import Efficiency, estimate
from zerotune.predictor.rank import Uncertainty
from zerotune.validate.calibration import Calibration, host_paced
from zerotune.validate.experiments import UserCommand
from zerotune.validate.plan import build_job
from zerotune.validate.settings import BUILTIN_SCRIPT, TuneSettings

GRID_DIR = Path(__file__).resolve().parent.parent / "data" / "measurements" / "gpu_grid"


def _grid(path: Path) -> dict[str, list[tuple[object, float]]]:
    """model -> [(measurement, its forward seconds)] of the grid's finished runs."""
    from benchmarks.gpu_grid import read_grid
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    forward = {r["source"]: r.get("forward_s") for r in records}
    by_model: dict[str, list[tuple[object, float]]] = {}
    for _, m in read_grid(path):
        if m.status == "ok":
            by_model.setdefault(m.model, []).append((m, forward.get(m.source) or 0.0))
    return by_model


def replay_grid(path: Path, log=print) -> tuple[list[float], list[float]]:
    """(|error| before, |error| after) over the rows of every model with a profiling-run stand-in."""
    before, after = [], []
    for name, rows in _grid(path).items():
        profiled = next(((m, f) for m, f in rows if m.config.train_micro_batch_size_per_gpu == 1 and f > 0
                         and m.config.zero.stage in (0, 1) and m.config.gradient_accumulation_steps == 1), None)
        if profiled is None:
            continue
        m0, forward = profiled
        job = build_job(m0.model, m0.hardware, m0.num_nodes, m0.num_gpus_per_node, m0.seq_len)
        base = Calibration(Efficiency(), Uncertainty())
        settings = TuneSettings(UserCommand(BUILTIN_SCRIPT, (), "--deepspeed_config", Path("ds.json")), {}, m0.model,
                                m0.hardware, m0.num_gpus_per_node, profiled_forward_s=forward)
        said: list[str] = []
        paced = host_paced(base, job, [m0], settings, said.append)
        log(f"  {name.rsplit('/', 1)[-1].removesuffix('.yaml')}: {said[0].split(': ', 1)[1] if said else 'unchanged'}")
        for m, _ in rows:
            if m is m0:
                continue
            j = build_job(m.model, m.hardware, m.num_nodes, m.num_gpus_per_node, m.seq_len)
            for scores, calibration in ((before, base), (after, paced)):
                scores.append(abs(estimate(j, m.config, calibration.efficiency).time.step_s / m.measured_step_s - 1))
    return before, after


def main() -> int:
    for path in sorted(GRID_DIR.glob("*_grid.jsonl")):
        print(path.name)
        before, after = replay_grid(path)
        if before:
            print(f"{path.name}: {len(before)} rows, step-time error median {statistics.median(before):.1%} -> "
                  f"{statistics.median(after):.1%}, mean {statistics.fmean(before):.1%} -> "
                  f"{statistics.fmean(after):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
