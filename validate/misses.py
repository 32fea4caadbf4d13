"""Where the ranking misses: the groups of a published data set whose measured best is not ranked first.

    python -m zerotune.validate.misses [--half fit|test|all] [--data-set vtrain_single] [--all-groups]
    python -m zerotune.validate.misses --accumulation [--half fit] [--data-set vtrain_single]

For each group of comparable rows (validate.accuracy's grouping: same model, hardware, GPUs, sequence length,
precision and global batch) whose measured fastest configuration is not zerotune's first pick, prints every
configuration of the group, fastest measured first: its layout (tp, pp, dp), micro-batch and accumulation,
measured and predicted speed, the error, and the predicted step time split into step_time.TIME_TERMS (ms).
B marks the measured best, P zerotune's pick. Meant for diagnosing on the fit half (the default) before a
mechanism is chosen; the test half is for reporting.

--accumulation separates what a micro-step costs from what an optimizer step costs: rows that differ only in
gradient accumulation (same model, hardware, layout, micro-batch) are fitted as step time = fixed + gas x
per-micro-step, measured and predicted alike (least squares), so a miss can be placed in the micro-step
(compute, tensor-parallel and pipeline terms) or in the once-per-step part (optimizer, gradient reduction).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from zerotune.predictor import Efficiency, Estimate, estimate
from zerotune.validate.accuracy import Comparison, _group_key, _speed
from zerotune.validate.published import (DEFAULT_DATA_DIR, Case, Half, Skip, framework_efficiency, read_rows, row_case,
                                         split_rows)

__all__ = ["Member", "Group", "groups", "format_group", "AccumulationFit", "accumulation_fits", "format_fit", "main"]


@dataclass(frozen=True)
class Member:
    case: Case
    speed: Comparison
    estimate: Estimate


@dataclass(frozen=True)
class Group:
    key: tuple[Any, ...]
    members: tuple[Member, ...]
    """Fastest measured first."""
    pick: Member
    """zerotune's first-ranked row (the first in file order among equal predictions, as validate.accuracy)."""

    @property
    def hit(self) -> bool:
        return self.pick.case.config == self.members[0].case.config

    @property
    def pick_share_of_best(self) -> float:
        return 1.0 if self.hit else self.pick.speed.measured / self.members[0].speed.measured


def groups(name: str, half: Half = "fit", eff: Efficiency = Efficiency()) -> list[Group]:
    """Groups of one data set's half with at least two distinct configurations, as validate.accuracy ranks them."""
    found: dict[tuple[Any, ...], list[Member]] = {}
    for row_id, row in split_rows(read_rows(DEFAULT_DATA_DIR / f"{name}.jsonl"), half):
        case = row_case(row, row_id)
        if isinstance(case, Skip):
            continue
        try:
            est = estimate(case.job, case.config, framework_efficiency(row, eff, case.config))
        except ValueError:
            continue
        speed = _speed(case, est)
        if isinstance(speed, Comparison):
            found.setdefault(_group_key(case, speed.metric), []).append(Member(case, speed, est))
    return [Group(key, tuple(sorted(members, key=lambda m: -m.speed.measured)),
                  max(members, key=lambda m: m.speed.predicted))
            for key, members in found.items() if len({repr(m.case.config) for m in members}) > 1]


def _line(member: Member, group: Group) -> str:
    cfg, par = member.case.config, member.case.row["parallel"]
    mark = ("B" if member is group.members[0] else " ") + ("P" if member is group.pick else " ")
    terms = " ".join(f"{term}={seconds * 1e3:.0f}" for term, seconds in member.estimate.time.breakdown_s.items()
                     if seconds >= 5e-4)
    s = member.speed
    return (f" {mark} tp{cfg.mp_size} pp{cfg.pp_size} dp{par['dp']} mb{cfg.train_micro_batch_size_per_gpu} "
            f"gas{cfg.gradient_accumulation_steps} zero{cfg.zero.stage} measured {s.measured:.4g} predicted "
            f"{s.predicted:.4g} ({(s.predicted / s.measured - 1) * 100:+.1f}%) | {terms}")


def format_group(group: Group) -> str:
    dims, hardware, world, seq, precision, global_batch, metric, _ = group.key
    head = (f"{'hit' if group.hit else 'MISS'} layers/hidden/heads/ffn/vocab {dims} on {world} x {hardware}, "
            f"seq {seq}, {precision}, global batch {global_batch}, {metric}: pick / best "
            f"{group.pick_share_of_best:.3f}")
    return "\n".join([head] + [_line(m, group) for m in group.members])


@dataclass(frozen=True)
class AccumulationFit:
    """Step time = fixed_s + gas x micro_s over the rows of one configuration that differ only in accumulation."""

    key: tuple[Any, ...]
    """(layers/hidden/heads/ffn/vocab, hardware, GPUs, tp, pp, dp, micro-batch, ZeRO stage)"""
    accumulations: tuple[int, ...]
    measured: tuple[float, float]
    """(per micro-step, per step) seconds"""
    predicted: tuple[float, float]


def _line_fit(gas: Sequence[int], seconds: Sequence[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through (gas, seconds)."""
    mean_g, mean_t = sum(gas) / len(gas), sum(seconds) / len(seconds)
    var = sum((g - mean_g) ** 2 for g in gas)
    slope = sum((g - mean_g) * (t - mean_t) for g, t in zip(gas, seconds)) / var
    return slope, mean_t - slope * mean_g


def accumulation_fits(name: str, half: Half = "fit", eff: Efficiency = Efficiency()) -> list[AccumulationFit]:
    """Per configuration with at least two accumulation counts, the measured and predicted split of a step into
    its per-micro-step and per-step parts (rows timed by step_time_s only)."""
    found: dict[tuple[Any, ...], list[tuple[int, float, float]]] = {}
    for row_id, row in split_rows(read_rows(DEFAULT_DATA_DIR / f"{name}.jsonl"), half):
        case = row_case(row, row_id)
        if isinstance(case, Skip) or "step_time_s" not in row["metrics"]:
            continue
        try:
            est = estimate(case.job, case.config, framework_efficiency(row, eff, case.config))
        except ValueError:
            continue
        cfg, m = case.config, case.job.model
        key = ((m.num_layers, m.hidden_size, m.num_heads, m.ffn_hidden_size, m.vocab_size), row["hardware"],
               case.job.cluster.world_size, cfg.mp_size, cfg.pp_size, row["parallel"]["dp"],
               cfg.train_micro_batch_size_per_gpu, cfg.zero.stage)
        found.setdefault(key, []).append((cfg.gradient_accumulation_steps, float(row["metrics"]["step_time_s"]),
                                          est.time.step_s))
    fits = []
    for key, points in found.items():
        gas = [p[0] for p in points]
        if len(set(gas)) < 2:
            continue
        fits.append(AccumulationFit(key, tuple(sorted(set(gas))), _line_fit(gas, [p[1] for p in points]),
                                    _line_fit(gas, [p[2] for p in points])))
    return sorted(fits, key=lambda f: f.key)


def format_fit(fit: AccumulationFit) -> str:
    dims, hardware, world, tp, pp, dp, micro, stage = fit.key
    (mm, ms), (pm, ps) = fit.measured, fit.predicted
    return (f"{dims} on {world} x {hardware} tp{tp} pp{pp} dp{dp} mb{micro} zero{stage} gas "
            f"{','.join(map(str, fit.accumulations))}: per micro-step measured {mm * 1e3:.1f} ms predicted "
            f"{pm * 1e3:.1f} ({(pm / mm - 1) * 100:+.0f}%); per step measured {ms * 1e3:.1f} ms predicted "
            f"{ps * 1e3:.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zerotune.validate.misses", description=__doc__.splitlines()[0])
    parser.add_argument("--half", choices=("fit", "test", "all"), default="fit")
    parser.add_argument("--data-set", default="vtrain_single", help="a published *.jsonl file's stem")
    parser.add_argument("--all-groups", action="store_true", help="print the groups ranked right too")
    parser.add_argument("--accumulation", action="store_true",
                        help="split each configuration's step time into per-micro-step and per-step parts")
    args = parser.parse_args(argv)
    if not (DEFAULT_DATA_DIR / f"{args.data_set}.jsonl").is_file():
        print(f"misses: error: no {args.data_set}.jsonl in {DEFAULT_DATA_DIR}", file=sys.stderr)
        return 2
    if args.accumulation:
        print("\n".join(format_fit(f) for f in accumulation_fits(args.data_set, args.half)))
        return 0
    found = groups(args.data_set, args.half)
    shown = [g for g in found if args.all_groups or not g.hit]
    print("\n\n".join(format_group(g) for g in shown))
    print(f"\n{args.data_set}, {args.half} half: measured best ranked first in {sum(g.hit for g in found)} of "
          f"{len(found)} groups")
    return 0


if __name__ == "__main__":
    sys.exit(main())
