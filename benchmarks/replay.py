"""Replay `tune`'s search against measured grids: no launcher, each experiment answered by its measurement.

    python -m benchmarks.replay [--budget N] [--seed S] [--markdown FILE]

Each comparable group of a measured data set is "the cluster" (the group key of zerotune.validate.accuracy: same model,
hardware, GPU count, sequence length, precision, global batch and kind of figure). The search space is the group's rows, and
only them: a configuration that was not measured cannot be run, so it is not a candidate (the replay's
Candidates are built from the rows; the space's generator is not used). Running an experiment returns its
measured step time, or OOM / failure where that was recorded. The decisions are zerotune.validate.search.run_search, the
code `tune` runs; only the experiment is a look-up. Predictions come from zerotune.predictor.estimate with the
calibration profile `tune` would load for the hardware (zerotune.validate.tune.load_profile_for). As in `tune`, the
search starts from the profiling run's measurement where the group measured its configuration (profiling_row).

Scored per data set: the share of groups whose choice (the measured best of the experiments run) is within 3% of
the group's measured best, the mean choice / best, the mean and maximum experiments; then the same with a
deliberately wrong model: per group, each ZeRO stage's, each offload family's and each checkpointing family's
predicted step time multiplied by a seeded factor log-uniform in [0.5, 2], and the memory model shifted by +15%
or -15% (seeded sign).

Adding a grid: a published JSONL file -> one entry in PUBLISHED; a zerotune measurement grid
(data/measurements/*_grid_*.jsonl, zerotune.calibrate.measurement records) is picked up by its name.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable, Literal, Sequence

import numpy as np

from zerotune.calibrate.measurement import Measurement, Status, read_jsonl
from zerotune.predictor import DSConfig, Job, estimate, experiment_name
from zerotune.predictor.catalog import data_dir
from zerotune.validate.published import (DEFAULT_DATA_DIR, Case, Half, Skip, framework_efficiency, read_rows,
                                        row_case, split_rows)
from zerotune.validate.accuracy import _group_key, _speed  # the accuracy report's own grouping and unit handling
from zerotune.validate.plan import build_job
from zerotune.validate.search import (Candidates, Choice, Observation, candidate_memory_bounds, family_of,
                                      larger_batch_better, measured_memory_ratio, metric_gain, run_search)
from zerotune.validate.settings import DEFAULT_TOP_K
from zerotune.validate.calibration import load_profile_for

__all__ = ["GridRow", "Group", "Wrong", "GroupOutcome", "DataSetReplay", "MemoryBandCheck", "PUBLISHED", "data_sets",
           "memory_band_check",
           "published_groups", "measurement_groups", "error_shares", "profiling_row", "replay_group", "replay",
           "format_table", "main",
           "WITHIN", "WRONG_FACTOR", "WRONG_MEMORY", "MIN_WRONG_OUTCOMES"]

WITHIN = 0.03
"""A choice counts when its measured throughput is within 3% of the group's best (issue 13)."""
WRONG_FACTOR = 2.0
"""The wrong model's factors lie in [1/WRONG_FACTOR, WRONG_FACTOR], log-uniform."""
WRONG_MEMORY = 0.15
DRAWS = 10
"""Wrong models drawn per group: one draw per group says little on data sets of a few groups."""
MIN_WRONG_OUTCOMES = 100
"""At least this many wrong-model replays per data set (more draws per group on data sets of few groups): ten
draws of the CPU grid's one group put its share anywhere from 40% to 80% depending on the seed."""
PUBLISHED = ("vtrain_single", "bloom_tr11", "llmfoundry_mpt_fsdp", "ds_autotuning_hf_v100")
"""data/measurements/published/<name>.jsonl files with comparable groups of configurations."""
MEASUREMENTS_DIR = data_dir() / "measurements"
GPU_GRID_DIR = MEASUREMENTS_DIR / "gpu_grid"
_profile = lru_cache(maxsize=None)(load_profile_for)


@dataclass(frozen=True)
class GridRow:
    """One measured configuration: what running it returns."""

    job: Job
    config: DSConfig
    status: Status
    step_s: float | None
    """Measured seconds per optimizer step (None unless ok)."""
    source: str
    framework: dict | None = None
    """A published row's fields that name its runtime (`framework`, `parallel`, `hardware`): its predictions take the
    efficiency the accuracy report gives that runtime (validate.published.framework_efficiency)."""
    memory_bytes: float | None = None
    """Measured peak device memory per rank (torch.cuda.max_memory_allocated): what `tune` reads from an
    experiment (validate.runs), None where the grid has none."""


@dataclass(frozen=True)
class Group:
    name: str
    rows: tuple[GridRow, ...]


@dataclass(frozen=True)
class Wrong:
    """A deliberately wrong model: step-time factors per ZeRO stage, offload devices and checkpointing."""

    stage: dict[int, float]
    offload: dict[tuple[str, str], float]
    checkpointing: dict[bool, float]
    memory_scale: float

    def step_factor(self, cfg: DSConfig) -> float:
        _, opt, param, ckpt, _, _ = family_of(cfg)
        return self.stage[cfg.zero.stage] * self.offload[(opt, param)] * self.checkpointing[ckpt]


def wrong_model(rows: Sequence[GridRow], seed: int) -> Wrong:
    rng = random.Random(seed)
    draw = lambda: math.exp(rng.uniform(-math.log(WRONG_FACTOR), math.log(WRONG_FACTOR)))  # noqa: E731
    families = [family_of(r.config) for r in rows]
    return Wrong({s: draw() for s in sorted({f[0] for f in families})},
                 {o: draw() for o in sorted({(f[1], f[2]) for f in families})},
                 {c: draw() for c in sorted({f[3] for f in families})},
                 1.0 + WRONG_MEMORY * rng.choice((-1.0, 1.0)))


# -- data sets -> groups ---------------------------------------------------------------------------------------

def _measured_step_s(case: Case) -> float | None:
    """The row's measured step time: its speed metric, in whatever unit, against the prediction in that unit
    (at a fixed global batch every unit is inversely proportional to step time)."""
    est = estimate(case.job, case.config)
    speed = _speed(case, est)
    if isinstance(speed, Skip):
        return None
    return est.time.step_s * speed.predicted / speed.measured


def published_groups(path: Path, half: Half | Literal["all"] = "all") -> list[Group]:
    """A published data set's comparable groups with at least two distinct configurations (of one half of its
    models on request, zerotune.validate.published.split_rows)."""
    groups: dict[tuple, list[GridRow]] = {}
    for row_id, row in split_rows(read_rows(path), half):
        case = row_case(row, row_id)
        if isinstance(case, Skip):
            continue
        try:
            step_s = _measured_step_s(case)
        except ValueError:
            continue
        if step_s is None:
            continue
        key = _group_key(case, "speed")
        runtime = {"framework": row.get("framework"), "parallel": row["parallel"], "hardware": row["hardware"]}
        groups.setdefault(key, []).append(GridRow(case.job, case.config, "ok", step_s, row_id, runtime))
    return [Group(f"{path.stem}#{i}", tuple(rows)) for i, rows in enumerate(groups.values())
            if len({repr(r.config) for r in rows}) >= 2]


def measurement_groups(path: Path, measurements: Sequence[Measurement] | None = None) -> list[Group]:
    """A zerotune measurement grid (zerotune.calibrate.measurement JSONL) grouped by job and global batch."""
    groups: dict[tuple, list[GridRow]] = {}
    for m in read_jsonl(path) if measurements is None else measurements:
        job = build_job(m.model, m.hardware, m.num_nodes, m.num_gpus_per_node, m.seq_len)
        key = (m.model, m.hardware, m.num_nodes, m.num_gpus_per_node, m.seq_len)
        groups.setdefault(key, []).append(GridRow(job, m.config, m.status, m.measured_step_s
                                                  if m.status == "ok" else None, m.source,
                                                  memory_bytes=m.peak_memory_bytes))
    return [Group(f"{path.stem}#{i}", tuple(rows)) for i, rows in enumerate(groups.values())
            if len({repr(r.config) for r in rows}) >= 2]


def data_sets() -> list[tuple[str, Callable[[], list[Group]]]]:
    """(name, loader) of every grid the replay scores: the published list, then every measurement grid."""
    sets: list[tuple[str, Callable[[], list[Group]]]] = [
        (name, lambda name=name: published_groups(DEFAULT_DATA_DIR / f"{name}.jsonl")) for name in PUBLISHED]
    sets += [(p.stem, lambda p=p: measurement_groups(p)) for p in sorted(MEASUREMENTS_DIR.glob("*_grid_*.jsonl"))]
    sets += [(f"gpu_grid/{p.stem}", lambda p=p: gpu_grid_groups(p)) for p in sorted(GPU_GRID_DIR.glob("*_grid.jsonl"))]
    return sets


def gpu_grid_groups(path: Path) -> list[Group]:
    """A GPU grid of benchmarks.gpu_grid (its model files resolved), grouped as any measurement grid."""
    from benchmarks.gpu_grid import read_grid
    return measurement_groups(path, [m for _, m in read_grid(path)])


# -- one group ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupOutcome:
    group: str
    num_configs: int
    num_experiments: int
    choice_over_best: float
    """Measured throughput of the choice over the group's best (0 when no experiment finished)."""
    choice: str
    best: str
    stop_reason: str
    profiled: bool = False
    """Whether the search started from the profiling run's measurement (replay_group)."""

    @property
    def within(self) -> bool:
        return self.choice_over_best >= 1.0 - WITHIN


def _distinct(rows: Sequence[GridRow]) -> list[GridRow]:
    """One row per configuration; repeated measurements of one configuration become their median. Keys the
    model does not read (DSConfig.passthrough, e.g. `steps_per_print`) do not split a configuration, so two
    passes over one grid that logged differently still merge."""
    by_config: dict[str, list[GridRow]] = {}
    for row in rows:
        by_config.setdefault(repr((row.job, replace(row.config, passthrough={}))), []).append(row)
    merged = []
    for same in by_config.values():
        ok = [r.step_s for r in same if r.status == "ok" and r.step_s]
        first = same[0]
        peaks = [r.memory_bytes for r in same if r.status == "ok" and r.memory_bytes]
        merged.append(GridRow(first.job, first.config, "ok", statistics.median(ok), first.source, first.framework,
                              statistics.median(peaks) if peaks else None) if ok else first)
    return merged


def _candidates(rows: Sequence[GridRow], wrong: Wrong | None) -> tuple[Candidates, np.ndarray, np.ndarray]:
    """The search's Candidates for the rows (predictions with the profile `tune` would use, made wrong on
    request), and each row's measured goodness (log samples/s; -inf where it did not run)."""
    families, family, mbs, steps, ratios, samples, measured, used = [], [], [], [], [], [], [], []
    for row in rows:
        eff, _ = _profile(row.job.cluster.hardware.name)
        if row.framework is not None:
            eff = framework_efficiency(row.framework, eff, row.config)
        est = estimate(row.job, row.config, eff)
        mem = est.memory
        ratio = max(mem.total_bytes / mem.capacity_bytes, mem.host_bytes_per_node / max(mem.host_capacity_bytes_per_node, 1.0))
        key = family_of(row.config)
        families += [key] if key not in families else []
        family.append(families.index(key))
        mbs.append(row.config.train_micro_batch_size_per_gpu)
        steps.append(est.time.step_s * (wrong.step_factor(row.config) if wrong else 1.0))
        ratios.append(ratio * (wrong.memory_scale if wrong else 1.0))
        samples.append(est.samples_per_step)
        measured.append(math.log(est.samples_per_step / row.step_s) if row.status == "ok" and row.step_s else -math.inf)
        used.append(measured_memory_ratio(mem, row.job.cluster.hardware.kind, row.memory_bytes) or 0.0
                    if row.status == "ok" else 0.0)
    gain = metric_gain("throughput", np.array(samples, dtype=float), np.zeros(len(rows)))
    bound = larger_batch_better("throughput", rows[0].job.cluster.hardware.kind)
    return Candidates(tuple(families), np.array(family), np.array(mbs), np.array(steps), np.array(ratios),
                      gain, larger_batch_better=bound), np.array(measured), np.array(used)


def _observed(cands: Candidates, rows: Sequence[GridRow], used: np.ndarray, i: int,
              measure_memory: bool = True) -> Observation:
    """Running candidate i: what its row measured (and its measured memory ratio, `used`, unless hidden)."""
    row = rows[i]
    return Observation(cands.families[cands.family[i]], int(cands.micro_batch[i]), float(cands.step_s[i]),
                       float(cands.memory_ratio[i]), row.status, row.step_s if row.status == "ok" else None, i,
                       measured_memory_ratio=(float(used[i]) or None) if measure_memory else None)


def profiling_row(cands: Candidates, rows: Sequence[GridRow]) -> int | None:
    """The row `tune`'s profiling run stands for (zerotune.validate.profiling_run.profile_model: the script's own
    ds_config at the space's smallest micro-batch, before any experiment): the lowest ZeRO stage's family without
    offload, tensor or pipeline parallelism (which `tune` does not run), at its smallest measured micro-batch, where
    it finished; None where the group has no such row."""
    families = [cands.families[k] for k in cands.family]
    plain = [i for i, f in enumerate(families) if f[1] == f[2] == "none" and f[4] == f[5] == 1]
    if not plain:
        return None
    stage = min(families[i][0] for i in plain)
    first = min((i for i in plain if families[i][0] == stage), key=lambda i: (cands.micro_batch[i], i))
    return first if rows[first].status == "ok" and rows[first].step_s else None


def replay_group(group: Group, budget: int = DEFAULT_TOP_K, wrong_seed: int | None = None,
                 measure_memory: bool = True, profiling_run: bool = True) -> GroupOutcome:
    """The search on one group; wrong_seed draws a deliberately wrong model (None: the real one); measure_memory
    False hides the runs' measured peaks from the search (only fit or out of memory). profiling_run: the search
    starts, as `tune` does, from the profiling run's measurement (profiling_row, where the group has it), which
    corrects the predictions but is not an experiment; a configuration chosen from it is measured already
    (`tune` reruns it, validate.tune._profiling_rerun)."""
    rows = _distinct(group.rows)
    wrong = wrong_model(rows, wrong_seed) if wrong_seed is not None else None
    cands, measured, used = _candidates(rows, wrong)
    _, uncertainty = _profile(rows[0].job.cluster.hardware.name)

    def run(choice: Choice) -> Observation:
        assert choice.index is not None
        return _observed(cands, rows, used, choice.index, measure_memory)

    first = profiling_row(cands, rows) if profiling_run else None
    done = np.zeros(len(cands), dtype=bool)
    initial = []
    if first is not None:  # a measurement given beforehand, as tune's validate.candidates.observation_of makes it
        initial.append(replace(_observed(cands, rows, used, first, measure_memory), index=None))
        done[first] = True
    ran, reason = run_search(cands, uncertainty, budget, run, initial, done)
    best = int(np.argmax(measured))
    ok = [o.index for o in ran if o.status == "ok"] + ([first] if first is not None else [])
    chosen = max(ok, key=lambda i: measured[i]) if ok else None
    share = math.exp(measured[chosen] - measured[best]) if chosen is not None else 0.0
    return GroupOutcome(group.name, len(rows), len(ran), share, _label(rows[chosen]) if chosen is not None else "-",
                        _label(rows[best]), reason or f"budget of {budget} spent", first is not None)


def error_shares(groups: Sequence[Group]) -> dict[str, float]:
    """How the model's log step-time errors split over the groups: the mean square of each group's mean error
    (common), of each family's mean about its group's (specific) and of each row about its family's
    (within-family), as shares of their sum: the check of zerotune.validate.errors.SHARES."""
    parts: dict[str, list[float]] = {"common": [], "specific": [], "within": []}
    for group in groups:
        rows = _distinct(group.rows)
        cands, measured, _ = _candidates(rows, None)
        ok = np.isfinite(measured)
        errors = (cands.gain - np.log(cands.step_s) - measured)[ok]  # log(measured / predicted step time)
        family = cands.family[ok]
        mean = float(np.mean(errors))
        parts["common"].append(mean ** 2)
        for f in set(family.tolist()):
            mine = errors[family == f]
            if len(set(family.tolist())) > 1:
                parts["specific"].append((float(np.mean(mine)) - mean) ** 2)
            parts["within"] += [float(e - np.mean(mine)) ** 2 for e in mine] if len(mine) > 1 else []
    squares = {k: statistics.fmean(v) if v else 0.0 for k, v in parts.items()}
    return {k: v / sum(squares.values()) for k, v in squares.items()}


@dataclass(frozen=True)
class MemoryBandCheck:
    pairs: int
    """Ordered pairs (a run that fitted with its peak recorded, another run of the same model)."""
    outside: tuple[tuple[str, str], ...]
    """(run, other) where the other fitted at a scale outside the run's band."""
    oom_sure_to_fit: tuple[tuple[str, str], ...]
    """(run, other) where the other ran out of memory though the run's band said it fits whatever the scale."""


def memory_band_check(groups: Sequence[Group]) -> MemoryBandCheck:
    """The check of zerotune.validate.errors' measured-peak bands (MEASURED_MEMORY_REL, _OTHER_REL, _ABS) on grids
    that recorded each run's peak: from every run that fitted, the band its peak gives every other run of the same
    model (candidate_memory_bounds with that one run measured), against what the other measured or ran out of."""
    pairs, outside, oom = 0, [], []
    for group in groups:
        rows = _distinct(group.rows)
        cands, _, used = _candidates(rows, None)
        _, uncertainty = _profile(rows[0].job.cluster.hardware.name)
        for i, row in enumerate(rows):
            if not used[i]:
                continue
            low, high = candidate_memory_bounds(cands, [_observed(cands, rows, used, i)], uncertainty)
            for j, other in enumerate(rows):
                if j == i or not (used[j] or other.status == "oom"):
                    continue
                pairs += 1
                if other.status == "oom" and high[j] * cands.memory_ratio[j] < 1.0:
                    oom.append((_label(row), _label(other)))
                elif used[j] and not low[j] - 1e-9 <= used[j] / cands.memory_ratio[j] <= high[j] + 1e-9:
                    outside.append((_label(row), _label(other)))
    return MemoryBandCheck(pairs, tuple(outside), tuple(oom))


def _label(row: GridRow) -> str:
    cfg = row.config
    layout = f"_tp{cfg.mp_size}_pp{cfg.pp_size}" if cfg.model_parallel_size > 1 else ""
    return experiment_name(cfg) + layout


# -- data sets ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataSetReplay:
    name: str
    model: str
    """"real" or "wrong"."""
    outcomes: tuple[GroupOutcome, ...]

    @property
    def within_share(self) -> float:
        return sum(o.within for o in self.outcomes) / len(self.outcomes)

    @property
    def mean_choice_over_best(self) -> float:
        return statistics.fmean(o.choice_over_best for o in self.outcomes)

    @property
    def mean_experiments(self) -> float:
        return statistics.fmean(o.num_experiments for o in self.outcomes)

    @property
    def max_experiments(self) -> int:
        return max(o.num_experiments for o in self.outcomes)


def replay(groups: Sequence[Group], name: str, budget: int = DEFAULT_TOP_K, seed: int | None = None,
           draws: int = 1, profiling_run: bool = True) -> DataSetReplay:
    """Every group with the real model (seed None), or `draws` times with wrong models (seeds from `seed`)."""
    if seed is None:
        return DataSetReplay(name, "real", tuple(replay_group(g, budget, profiling_run=profiling_run) for g in groups))
    outcomes = tuple(replay_group(g, budget, seed + draws * i + d, profiling_run=profiling_run)
                     for i, g in enumerate(groups) for d in range(draws))
    return DataSetReplay(name, "wrong", outcomes)


def format_table(results: Sequence[DataSetReplay]) -> str:
    lines = ["| data set | model | groups (x draws) | from a profiling run | configs per group (mean) | "
             "choice within 3% of best | mean choice / best | experiments mean | experiments max |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        configs = statistics.fmean(o.num_configs for o in r.outcomes)
        profiled = sum(o.profiled for o in r.outcomes)
        lines.append(f"| {r.name} | {r.model} | {len(r.outcomes)} | {profiled} | {configs:.1f} | "
                     f"{r.within_share * 100:.1f}% | {r.mean_choice_over_best * 100:.1f}% | {r.mean_experiments:.2f} | "
                     f"{r.max_experiments} |")
    return "\n".join(lines) + "\n"


def _misses(results: Sequence[DataSetReplay]) -> str:
    lines = []
    for r in results:
        for o in r.outcomes:
            if not o.within:
                lines.append(f"{r.name} ({r.model}) {o.group}: chose {o.choice} at {o.choice_over_best * 100:.1f}% "
                             f"of {o.best} after {o.num_experiments} experiments; {o.stop_reason}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay", description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=int, default=DEFAULT_TOP_K, help="--top_k of the replayed tune (a ceiling)")
    parser.add_argument("--seed", type=int, default=13, help="seed of the deliberately wrong models")
    parser.add_argument("--draws", type=int, default=DRAWS, help="wrong models drawn per group (at least "
                        f"{MIN_WRONG_OUTCOMES} per data set)")
    parser.add_argument("--markdown", type=Path, help="also write the table to this file")
    parser.add_argument("--misses", action="store_true", help="list the groups whose choice is not within 3%%")
    parser.add_argument("--no_profiling_run", action="store_true", help="start every search from no measurement, "
                        "not from the profiling run's (replay_group)")
    parser.add_argument("--error_shares", action="store_true", help="only print how the model's errors split "
                        "(common / family-specific / within-family) on the fit half of each published data set")
    parser.add_argument("--memory_check", action="store_true", help="only print how the bands a measured peak gives "
                        "hold on the grids that recorded each run's peak memory")
    args = parser.parse_args(argv)
    if args.memory_check:
        for name, load in data_sets():
            check = memory_band_check(load())
            if check.pairs:
                print(f"{name}: {check.pairs} pairs of runs of one model; outside the band: "
                      f"{len(check.outside)} {list(check.outside)}; out of memory where the band said it fits: "
                      f"{len(check.oom_sure_to_fit)} {list(check.oom_sure_to_fit)}")
        return 0
    if args.error_shares:
        for name in PUBLISHED:
            groups = published_groups(DEFAULT_DATA_DIR / f"{name}.jsonl", "fit")
            if groups:
                shares = error_shares(groups)
                print(f"{name} (fit half, {len(groups)} groups): " + ", ".join(f"{k} {v:.2f}" for k, v in shares.items()))
        return 0
    results = []
    for name, load in data_sets():
        groups = load()
        if not groups:
            print(f"replay: {name}: no group with two or more configurations; skipped", file=sys.stderr)
            continue
        draws = max(args.draws, math.ceil(MIN_WRONG_OUTCOMES / len(groups)))
        first = not args.no_profiling_run
        results += [replay(groups, name, args.budget, profiling_run=first),
                    replay(groups, name, args.budget, args.seed, draws, profiling_run=first)]
    text = format_table(results)
    if args.markdown:
        args.markdown.write_text(text)
    print(text, end="")
    if args.misses:
        print(_misses(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
