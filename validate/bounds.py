"""Bounds from DeepSpeed's structure on what a configuration not yet run can measure, whatever the model predicts:
a configuration that adds work to a lighter sibling is never faster than it, and on a GPU without pipeline
stages a family's smaller micro-batch is never faster than a larger one (dominated)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from zerotune.validate.candidates import MEASURED, NOISE_STD, Candidates, FamilyKey, Observation

__all__ = ["dominated", "shadowed"]


def _lighter(family: FamilyKey) -> list[FamilyKey]:
    """The families that run the same step as `family` with one of its additions taken away: ZeRO-2 for ZeRO-3
    (without parameter offload, which only ZeRO-3 has), no checkpointing, no optimizer or parameter offload."""
    stage, opt, param, ckpt, tp, pp = family
    out = []
    if stage == 3:
        out.append((2, opt, "none", ckpt, tp, pp))
    if ckpt:
        out.append((stage, opt, param, False, tp, pp))
    if opt != "none":
        out.append((stage, "none", param, ckpt, tp, pp))
    if param != "none":
        out.append((stage, opt, "none", ckpt, tp, pp))
    return out


def _weight(family: FamilyKey) -> int:
    """How many of _lighter's additions a family carries: a lighter family always carries fewer."""
    return (family[0] == 3) + (family[1] != "none") + (family[2] != "none") + bool(family[3])


@dataclass(frozen=True)
class _Siblings:
    """Candidates' lighter siblings (the configurations of a _lighter family at the same micro-batch and
    accumulation), computed once per Candidates: a bf16 script's space of 77,824 configurations had spent over ten
    minutes in the first choice recomputing them (2026-11-29)."""

    group: np.ndarray
    """Per candidate, its group: its family, micro-batch and samples per step (gain)."""
    levels: list[tuple[np.ndarray, np.ndarray]]
    """Per family weight, lightest first, so that a bound chains (ZeRO-3 with checkpointing held to ZeRO-3
    without, itself held to ZeRO-2): (the candidates that have lighter siblings, per candidate the groups those
    siblings form, padded with len(groups), an empty group)."""


def _siblings(cands: Candidates) -> _Siblings:
    cached = _CACHE.get(id(cands))
    if cached is not None and cached[0] is cands:
        return cached[1]
    index = {f: k for k, f in enumerate(cands.families)}
    groups: dict[tuple[int, int, float], int] = {}
    group = np.array([groups.setdefault((k, mb, round(gain, 9)), len(groups)) for k, mb, gain in
                      zip(cands.family.tolist(), cands.micro_batch.tolist(), cands.gain.tolist())], dtype=int)
    levels: dict[int, list[tuple[int, list[int]]]] = {}
    for k in sorted(range(len(cands.families)), key=lambda k: _weight(cands.families[k])):
        lighter = [index[f] for f in _lighter(cands.families[k]) if f in index]
        if not lighter:
            continue
        for i in np.flatnonzero(cands.family == k).tolist():
            key = (int(cands.micro_batch[i]), round(float(cands.gain[i]), 9))
            found = [groups[(f, *key)] for f in lighter if (f, *key) in groups]
            if found:
                levels.setdefault(_weight(cands.families[k]), []).append((i, found))
    padded = []
    for weight in sorted(levels):
        rows = levels[weight]
        width = max(len(found) for _, found in rows)
        table = np.full((len(rows), width), len(groups), dtype=int)
        for r, (_, found) in enumerate(rows):
            table[r, :len(found)] = found
        padded.append((np.array([i for i, _ in rows], dtype=int), table))
    out = _Siblings(group, padded)
    _CACHE.clear()  # one search at a time: keep the latest only
    _CACHE[id(cands)] = (cands, out)
    return out


_CACHE: dict[int, tuple[Candidates, _Siblings]] = {}


def shadowed(cands: Candidates, open_: np.ndarray, p_fit: np.ndarray) -> np.ndarray:
    """Per candidate: whether a lighter sibling (_Siblings) is still to run and likely fits (p_fit >= 0.5).
    That sibling is at least as fast (dominated's bounds), so it runs first: a near-tie in the predictions (the CPU
    profile's ZeRO-3 at micro-batch 16 within 0.1% of ZeRO-2's) had the search run ZeRO-3 before ZeRO-2
    (2026-11-28, an LSTM script's tune over stages 0-3)."""
    siblings = _siblings(cands)
    out = np.zeros(len(cands), dtype=bool)
    if not siblings.levels:
        return out
    waiting = np.zeros(int(siblings.group.max()) + 2, dtype=bool)  # per group, and the empty one
    np.logical_or.at(waiting, siblings.group, open_ & (p_fit >= 0.5))
    for idx, groups in siblings.levels:
        out[idx] = waiting[groups].any(axis=1)
    return out


def dominated(cands: Candidates, observations: Sequence[Observation], goodness: np.ndarray, bound: np.ndarray,
               p_fit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(goodness, optimistic bound) held to what DeepSpeed's structure allows, whatever the model predicts.

    A configuration that runs a lighter sibling's step plus more work, at the same micro-batch and accumulation
    (_Siblings), is never faster than it; its one way to win is a micro-batch the sibling cannot fit.
    - ZeRO-3 against ZeRO-2: ZeRO-3 runs what ZeRO-2 runs (the same forward and backward, gradients
      reduce-scattered from the same buckets into each rank's partition, the same partitioned optimizer step;
      DeepSpeed 0.19 runtime/zero/stage3.py and stage_1_and_2.py, both reduce_independent_p_g_buckets_and_
      remove_grads) and adds a gather and a release of every module's parameters in forward and again in
      backward, through hooks on every module (runtime/zero/parameter_offload.py setup_zero_stage3_hooks,
      partitioned_param_coordinator.py fetch_sub_module / release_sub_module). In every measured grid here
      ZeRO-3's step was 1.10-3.0x ZeRO-2's on the GPU and at least 0.985x on the CPU (noise, micro-batch 1).
    - Activation checkpointing against none: the backward runs each checkpointed block's forward again
      (runtime/activation_checkpointing/checkpointing.py CheckpointFunction.backward calls ctx.run_function
      again; torch.utils.checkpoint alike) and nothing is removed. Measured (both H200 grids, 5 pairs):
      0.67-0.83x the throughput.
    - Optimizer or parameter offload against none: the optimizer step runs on the host (DeepSpeedCPUAdam) and
      gradients and parameters cross the host link (stage_1_and_2.py async_inplace_copy_grad_to_fp32_buffer_from_
      gpu, stage3.py partition_grads' offload_fp32_gradients); the step's device work is still done. Measured
      (H200 grid, 3 pairs): 0.32-0.48x.
    So a candidate is held to its lighter siblings (the best of them): to a sibling's measurement (within
    NOISE_STD) where it ran, to its prediction and band where it likely fits and has not run; a sibling that ran
    out of memory (or likely does not fit) leaves it open. A model that predicts the heavier one faster (the
    deliberately wrong model of benchmarks.replay; the CPU profile put ZeRO-3 at micro-batch 8 2% above ZeRO-2)
    spends no experiment on it.

    A smaller micro-batch of a measured family without pipeline stages (Candidates.larger_batch_better): the
    work per sample is the same and the per-micro-step and per-step costs (launches, hooks, the optimizer step,
    the gradient reduction) are spread over fewer samples, so its throughput is at most the larger one's. Of
    the GPU grids' 799 pairs of one family without pipeline stages (benchmarks.replay's data sets: vTrain, the
    16-V100 table, both H200 grids) none ran more than 2% faster at the smaller micro-batch; with pipeline stages
    at a fixed global batch some did (the bubble's share grows as accumulation shrinks: vTrain and BLOOM, up to
    1.29x), and on the CPU too (Candidates.larger_batch_better), so those are left alone."""
    measured = {o.index: float(cands.gain[o.index]) - math.log(o.step_s) for o in observations
                if o.index is not None and o.status in MEASURED and o.step_s}
    ran = {o.index for o in observations if o.index is not None}
    goodness, bound = goodness.copy(), bound.copy()

    def cap_of(j: int) -> tuple[float, float] | None:
        """What candidate j bounds: its measurement where it ran, its (held) prediction and band where it likely
        fits and has not run; nothing where it ran out of memory or likely does not fit."""
        if j in measured:
            return measured[j], measured[j] + NOISE_STD
        return (float(goodness[j]), float(bound[j])) if j not in ran and p_fit[j] >= 0.5 else None

    def hold(i: int, caps: list[tuple[float, float]]) -> bool:
        g, b = min(goodness[i], min(c[0] for c in caps)), min(bound[i], min(c[1] for c in caps))
        changed = g < goodness[i] or b < bound[i]
        goodness[i], bound[i] = g, b
        return changed

    families = [k for k, f in enumerate(cands.families) if f[5] == 1] if cands.larger_batch_better else []
    siblings = _siblings(cands)
    n_groups = int(siblings.group.max()) + 1 if len(cands) else 0
    measured_mask = np.zeros(len(cands), dtype=bool)
    measured_value = np.zeros(len(cands))
    for j, value in measured.items():
        measured_mask[j], measured_value[j] = True, value
    ran_mask = np.zeros(len(cands), dtype=bool)
    ran_mask[list(ran)] = True
    for _ in range(4):  # until the chains settle (a ZeRO-3 micro-batch below one held to its ZeRO-2 sibling)
        changed = False
        for k in families:  # each micro-batch held to the next larger one, from the largest down
            members = np.flatnonzero(cands.family == k)
            order = members[np.argsort(-cands.micro_batch[members], kind="stable")].tolist()
            above: list[tuple[float, float]] = []  # the tightest cap from the larger micro-batches, once any
            for _, same_mb in itertools.groupby(order, key=lambda i: cands.micro_batch[i]):
                at = list(same_mb)
                if above:
                    for i in at:
                        changed |= i not in measured and hold(i, above)
                caps = above + [c for c in map(cap_of, at) if c is not None]
                above = [(min(c[0] for c in caps), min(c[1] for c in caps))] if caps else []
        for idx, groups in siblings.levels:  # lightest first: a level's siblings were all held before it
            # each group's best cap (cap_of, vectorised): its measurement, else its held prediction and band
            # where it likely fits and has not run; -inf where it bounds nothing
            open_cap = ~ran_mask & (p_fit >= 0.5)
            low = np.where(measured_mask, measured_value, np.where(open_cap, goodness, -np.inf))
            high = np.where(measured_mask, measured_value + NOISE_STD, np.where(open_cap, bound, -np.inf))
            best_low = np.full(n_groups + 1, -np.inf)
            best_high = np.full(n_groups + 1, -np.inf)
            np.maximum.at(best_low, siblings.group, low)
            np.maximum.at(best_high, siblings.group, high)
            cap_low, cap_high = best_low[groups].max(axis=1), best_high[groups].max(axis=1)
            held = (cap_low > -np.inf) & ~measured_mask[idx]
            g = np.where(held, np.minimum(goodness[idx], cap_low), goodness[idx])
            b = np.where(held, np.minimum(bound[idx], cap_high), bound[idx])
            changed |= bool(np.any(g < goodness[idx]) or np.any(b < bound[idx]))
            goodness[idx], bound[idx] = g, b
        if not changed:
            break
    return goodness, bound
