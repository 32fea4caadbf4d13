"""The error model `tune`'s search corrects its predictions with: what a measurement says about the configurations
not yet run, of their step time (a Gaussian process over configurations) and of their memory (one unknown scale).

The step-time model errs in a structured way: a whole ZeRO stage, offload or checkpointing family is off together
(one collective misjudged, one kernel slower than its roofline) and the error drifts smoothly with micro-batch.
So the log of measured / predicted step time, e(c), is modelled as a Gaussian process over configurations c with
an additive kernel (Rasmussen & Williams 2006, sec. 4.2.4: sums of kernels are kernels):

    k(c, c') = s_shared^2                                        every configuration of the cluster
             + sum over factors f of s_factor^2 [f(c) == f(c')]  ZeRO stage, offload, checkpointing, tp, pp
             + s_family^2 [family(c) == family(c')]              all five factors equal
             + s_mb^2 [same family] exp(-(log2 mb - log2 mb')^2 / 2)   smooth in micro-batch
             + s_own^2 [c == c']                                 knobs the model does not tell apart, noise
             + s_slope^2 (log2 mb - m)(log2 mb' - m)             a trend in micro-batch common to the cluster

The slope term has no prior variance (the ranking's band is the prior's): it is turned on by measurements of one
family at two micro-batches whose errors differ, e.g. per-step costs (optimizer, gradient all-reduce) misjudged
against per-sample ones (the GEMMs) shift the error by the same amount per doubling of the micro-batch in every
family; m is the candidates' mean log2 micro-batch.

A measurement therefore corrects its own family most, the families that share a factor with it partly, and the
rest through the shared part. The prior's total standard deviation is the ranking's band: the uncertainty's
step_time_rel is the one-sided Z-sigma band, so before any measurement the optimistic bound is the ranking's
(zerotune.predictor.rank._band).

When measurements show errors larger than the prior allowed (a wrong or uncalibrated model), the variances are
re-estimated from them, in the three groups the errors can tell apart (_excess): common (the shared term and the
factors every candidate has in common: for the search they are one error), specific (the factors the candidates
differ in, the family) and within-family (micro-batch, own). Family means' spread gives the specific part, their
mean the common part (the method of moments); errors about their family's mean give the within-family part. One
family measured cannot tell the cluster's error from its family's, so an error beyond the prior is split evenly
between common and specific: the measured family's band shrinks to the within-family error, the correction
moves the others by about half the error, and their bands widen with the evidence that the model is off. One run
cannot tell those from its own micro-batch's error either (the profiling run at micro-batch 1, where per-step
costs weigh most), so while only one has been measured the error beyond the prior is split in three, the smooth
micro-batch term taking a third: a neighbouring micro-batch of the same family keeps a band. Seen on the CPU,
2026-11-27: after profiling runs at micro-batch 1 predicted 11-31% off, the first experiments' bands were +-5-6%
and they measured 12-26% off them (decoder, Llama-style and ViT scripts). Replay, seed 13: BLOOM's wrong model
92.1% -> 94.3% of choices within 3% of the best at 2.91 -> 2.93 experiments; the other data sets' choices the same
at +0.01 to +0.05 experiments. A
second family settles it: equal errors are common (the rest move with them and stay narrow), unequal ones are
specific (the rest stay wide and are run while they can beat the best). ZeRO stages are the exception to
"equal errors are common": each runs its own code (hooks, collectives, optimizer wrapper), and a stage is where the
uncalibrated model erred most (issue 12), so while the stages differ, the error beyond the prior adds a variance of
its 1 / (2 x stages measured) to the stage factor: two stages equally off leave a third one's band wide (replay,
deliberately wrong model: H200 grid 82.9% -> 90.5% of choices within 3% of the best at 3.03 -> 3.63 experiments,
CPU grid 71% -> 83%; the real model's figures and vTrain, whose groups share one stage, unchanged).

Memory: one unknown scale r of the predicted peak (need = r x predicted), a priori within 1 -+ MEMORY_Z x
memory_rel; a run that fits caps r, an OOM raises its floor; within a family an OOM also rules out the larger
micro-batches and a fit vouches for the smaller ones. A configuration is runnable with the probability
that r keeps it under capacity (uniform in log r), so micro-batches near the predicted limit stay candidates
and the limit moves when an experiment OOMs or fits where it was said not to. A run that recorded its peak (a GPU
experiment's ranks write it as they exit) pins r itself, tightly for its own family and loosely for the others
(candidate_memory_bounds): replay, H200 shapes grid, 2.80 -> 2.60 experiments a group with the real model (the
micro-batch past the limit is no longer run after a neighbour's peak), wrong models of the H200 grids 3.06 -> 2.93
and 3.09 -> 2.89, the choices the same.

Each observation has its own noise (noise_std): NOISE_STD for an experiment's window median, the standard error of
its median step for the profiling run, whose few short steps spread; the part of an error that noise explains
widens no prior. An OOM beyond the memory prior's edge moves the whole band up (the model is off) rather than
stopping at the edge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from zerotune.predictor.rank import Uncertainty
from zerotune.validate.candidates import MEASURED, NOISE_STD, Candidates, FamilyKey, Observation

__all__ = ["Posterior", "posterior", "prior_band", "difference_std", "memory_bounds", "candidate_memory_bounds",
           "fit_probability", "fit_probabilities", "BAND_Z", "MEMORY_Z", "SHARES", "MEASURED_MEMORY_REL",
           "MEASURED_MEMORY_OTHER_REL", "MEASURED_MEMORY_ABS"]

BAND_Z = 2.0
"""The ranking's band is this many standard deviations of the prior (one-sided 97.7%)."""
MEMORY_Z = 2.0
"""The memory scale's prior interval is 1 -+ MEMORY_Z x memory_rel."""
SHARES = {"shared": 0.48, "factor": 0.08, "family": 0.05, "mb": 0.065, "own": 0.005}
"""Each kernel term's share of the prior variance (each factor gets the factor share; 5 factors): most of
the error is common to the cluster (compute efficiency), the rest spread over what configurations share. Check
on the fit half (`python -m benchmarks.replay --error_shares`, uncalibrated model): common / family-specific /
within-family 0.39 / 0.25 / 0.36 on vTrain (72 groups), 0.34 / 0.52 / 0.14 on BLOOM (6), 0.97 / 0.03 / 0.00 on
the HF autotuning table (2); these shares give 0.72 / 0.21 / 0.07 to a group that differs only in tp and pp.
Within-family error is under-weighted against vTrain; doubling it raised the replay's accuracy and its
experiments alike (BLOOM 2.86 -> 3.43 a group), so it is kept. Within the family, most of it is the smooth
micro-batch term: a configuration's own term is for knobs the model does not tell apart (run-to-run noise is each
observation's noise_std), so a neighbour of a measured micro-batch (z1 mb30 beside a measured z1 mb32) keeps a band
of a few percent, not the +-8% that made the H200 head to head of 2026-11-27 run it (own 0.02 -> 0.005, mb 0.05 ->
0.065: replay seed 13 unchanged within 0.1 experiment a group, BLOOM 2.86 -> 2.79)."""
MEASURED_MEMORY_REL = 0.03
"""How far the memory model's scale r (measured over predicted, candidates.measured_memory_ratio) may differ
between a run whose peak was measured and another configuration of its family. On the three GPU grids
(data/measurements/gpu_grid, torch.cuda.max_memory_allocated) r lies within 0.85-1.11, and within a family it
moves by at most 2% between micro-batches of 4 and up."""
MEASURED_MEMORY_OTHER_REL = 0.10
"""The same for a configuration of another family: checkpointing puts r at 0.85-0.92 against 0.94-1.03 without
it, ZeRO-3 at micro-batch 1 at 1.09-1.11."""
MEASURED_MEMORY_ABS = 0.03
"""The fixed part of a measured peak's error, as a share of the device, divided by the share the run used: at
micro-batch 1 (2-50% of the device) r ranges over 0.87-1.11, with ZeRO-0 at 0.87-0.97 against 1.00-1.03 at its
larger micro-batches. The three widths are the narrowest of a grid (0.02-0.05, 0.08-0.15, 0.01-0.03) that, on the
fit-half models of the three grids (validate.published.model_half; 693 ordered pairs of runs of one model, the
first fitted and recorded its peak), said no run that ran out of memory fits whatever the scale and left at most
0.5% of the others outside the first's band (3, each a micro-batch 1 seen from a larger run). On the test-half
models, 573 pairs: none outside, no out-of-memory said to fit (`python -m benchmarks.replay --memory_check`)."""
_FACTORS = ((0,), (1, 2), (3,), (4,), (5,))
"""The family key's positions of each factor: stage, offload (both devices), checkpointing, tensor parallel,
pipeline parallel (separate mechanisms: TP's all-reduces in every layer, PP's bubble and stage-to-stage sends)."""
assert abs(SHARES["shared"] + len(_FACTORS) * SHARES["factor"] + SHARES["family"] + SHARES["mb"] + SHARES["own"]
           - 1.0) < 1e-9, "the kernel's shares must make up the prior variance"

@dataclass(frozen=True)
class Posterior:
    mean: np.ndarray
    """Posterior mean of log(measured / predicted step time), per candidate."""
    std: np.ndarray

# -- the error model -------------------------------------------------------------------------------------------

def prior_band(uncertainty: Uncertainty) -> float:
    """The ranking's step-time band on the log scale: BAND_Z standard deviations of the prior."""
    return -math.log(max(1.0 - uncertainty.step_time_rel, 1e-6))


def _prior_variance(uncertainty: Uncertainty) -> float:
    return (prior_band(uncertainty) / BAND_Z) ** 2


def _varying(families: Sequence[FamilyKey]) -> tuple[bool, ...]:
    """Per factor: whether the configurations differ in it (a factor they all share errs for all of them alike,
    so for the search it is part of the shared error)."""
    return tuple(len({tuple(f[p] for p in positions) for f in families}) > 1 for positions in _FACTORS)


def _excess(errors: np.ndarray, labels: Sequence[FamilyKey], log_mb: np.ndarray, prior: dict[str, float],
            noise_var: np.ndarray | None = None) -> dict[str, float]:
    """The common, slope, specific and within-family variances the measured errors call for (never below the
    prior's). Within families: the errors' deviations from their family's mean, regressed on log2 micro-batch,
    give the slope (one for the cluster) and, what the slope leaves, the within-family part. Between families:
    the spread of the family means gives the specific part, their mean the common part (the method of moments).
    A single family cannot tell whether the cluster or the family is off, so an error beyond the prior is split
    evenly between the two; a single run cannot tell either from its own micro-batch, so then the smooth
    micro-batch term takes a third ("micro_batch", added to that term's variance, not scaled like the within-family
    part: the run's own term would blur the run itself); with several families, the stage factor gets its own share
    of that excess ("stage", see the module docstring). Each error carries its measurement's noise (`noise_var`,
    per error): the part of the spread that noise explains calls for no wider prior."""
    noise_var = np.zeros(len(errors)) if noise_var is None else noise_var
    by_family: dict[FamilyKey, list[int]] = {}
    for i, label in enumerate(labels):
        by_family.setdefault(label, []).append(i)
    means = np.array([np.mean(errors[ix]) for ix in by_family.values()])
    dev_e = np.concatenate([errors[ix] - np.mean(errors[ix]) for ix in by_family.values()])
    dev_l = np.concatenate([log_mb[ix] - np.mean(log_mb[ix]) for ix in by_family.values()])
    dof, slope, within = len(errors) - len(means), prior["slope"], prior["within"]
    if float(dev_l @ dev_l) > 0:
        fitted = float(dev_e @ dev_l) / float(dev_l @ dev_l)
        slope, dev_e, dof = max(slope, fitted ** 2), dev_e - fitted * dev_l, dof - 1
    noise = float(np.mean(noise_var))
    if dof > 0:
        within = max(within, float(dev_e @ dev_e) / dof - noise)
    mean_noise = float(np.mean([np.mean(noise_var[ix]) / len(ix) for ix in by_family.values()]))
    mean = float(np.mean(means))
    if len(means) == 1:
        beyond = max(0.0, mean ** 2 - prior["common"] - prior["specific"] - within / len(errors) - mean_noise)
        parts = 3 if len(errors) == 1 else 2  # one run: its own micro-batch may be what is off
        return {"common": prior["common"] + beyond / parts, "specific": prior["specific"] + beyond / parts,
                "within": within, "slope": slope, "stage": 0.0, "micro_batch": beyond / parts if parts == 3 else 0.0}
    specific = max(prior["specific"], float(np.var(means, ddof=1)) - mean_noise)
    beyond = max(0.0, mean ** 2 - prior["common"] - prior["specific"] - mean_noise)
    return {"common": max(prior["common"], mean ** 2 - specific / len(means) - mean_noise / len(means)),
            "specific": specific, "within": within, "slope": slope,
            "stage": beyond / (2 * len({label[0] for label in labels})), "micro_batch": 0.0}


@dataclass(frozen=True)
class _Variances:
    """The kernel's terms (see the module docstring); slope per octave of micro-batch away from `centre`."""

    shared: float
    factor: tuple[float, ...]
    """Per factor of _FACTORS."""
    family: float
    mb: float
    own: float
    slope: float
    centre: float
    """The candidates' mean log2 micro-batch, where the slope term adds nothing."""

    def total(self, micro_batch: np.ndarray) -> np.ndarray:
        """Prior variance of each configuration (the slope term grows with the distance from the centre)."""
        rest = self.shared + sum(self.factor) + self.family + self.mb + self.own
        return rest + self.slope * (np.log2(micro_batch.astype(float)) - self.centre) ** 2


def _variances(uncertainty: Uncertainty, families: Sequence[FamilyKey], centre: float,
               errors: np.ndarray | None = None, labels: Sequence[FamilyKey] = (),
               log_mb: np.ndarray | None = None, noise_var: np.ndarray | None = None) -> _Variances:
    """Each kernel term's variance: the prior's shares of the ranking's band (its shared_rel part to the shared term
    alone, the rest by SHARES), scaled where the measured errors
    (`errors`, of configurations of families `labels`) exceed them (_excess). Terms are grouped as the errors can
    tell them apart: common (shared, and the factors every configuration of `families` has in common), slope
    (per octave of micro-batch from `centre`, the log2 micro-batch where it adds nothing), specific (the factors
    they differ in, the family) and within-family (micro-batch, own)."""
    total = _prior_variance(uncertainty)
    shared = min(_prior_variance(Uncertainty(step_time_rel=uncertainty.shared_rel)), total)
    varying = _varying(families)
    base = {term: share * (total - shared) for term, share in SHARES.items()}
    base["shared"] += shared  # a model the calibration was not fitted on: one offset for all its configurations
    prior = {"common": base["shared"] + base["factor"] * varying.count(False),
             "specific": base["factor"] * varying.count(True) + base["family"], "within": base["mb"] + base["own"],
             "slope": uncertainty.slope_rel ** 2}
    scale, slope, stage, micro_batch = {k: 1.0 for k in prior}, prior["slope"], 0.0, 0.0
    if errors is not None and log_mb is not None and len(errors):
        excess = _excess(errors, labels, log_mb, prior, noise_var)
        slope, stage = excess.pop("slope"), excess.pop("stage") * varying[0]
        micro_batch = excess.pop("micro_batch")
        scale = {k: v / prior[k] for k, v in excess.items()}
    factor = [base["factor"] * scale["specific" if v else "common"] for v in varying]
    factor[0] += stage
    return _Variances(shared=base["shared"] * scale["common"], factor=tuple(factor),
                      family=base["family"] * scale["specific"], mb=base["mb"] * scale["within"] + micro_batch,
                      own=base["own"] * scale["within"], slope=slope, centre=centre)


def _family_kernel(fa: Sequence[FamilyKey], fb: Sequence[FamilyKey], var: _Variances) -> np.ndarray:
    """The family-level part of the kernel (shared + factors + family) between two lists of families."""
    a, b = np.array(fa, dtype=object), np.array(fb, dtype=object)
    k = np.full((len(fa), len(fb)), var.shared)
    for positions, factor_var in zip(_FACTORS, var.factor):
        same = np.ones_like(k, dtype=bool)
        for p in positions:
            same &= a[:, p][:, None] == b[:, p][None, :]
        k += factor_var * same
    same_family = np.array([[x == y for y in fb] for x in fa], dtype=bool).reshape(len(fa), len(fb))
    return k + var.family * same_family


def _kernel(fam_a: np.ndarray, mb_a: np.ndarray, fam_b: np.ndarray, mb_b: np.ndarray, fam_k: np.ndarray,
            var: _Variances) -> np.ndarray:
    """k between configurations given as (family index, micro-batch); fam_k is the family-level kernel."""
    same = fam_a[:, None] == fam_b[None, :]
    la, lb = np.log2(mb_a.astype(float)), np.log2(mb_b.astype(float))
    dist = la[:, None] - lb[None, :]
    slope = var.slope * np.outer(la - var.centre, lb - var.centre)
    return fam_k[np.ix_(fam_a, fam_b)] + var.mb * same * np.exp(-0.5 * dist ** 2) + slope


def posterior(cands: Candidates, observations: Sequence[Observation], uncertainty: Uncertainty) -> Posterior:
    """The corrected log step-time error of every candidate, given the measured ones."""
    return _conditioned(cands, observations, uncertainty)[0]


def difference_std(cands: Candidates, observations: Sequence[Observation], uncertainty: Uncertainty,
                   index: int) -> np.ndarray:
    """Per candidate, the posterior standard deviation of its log step-time error less candidate `index`'s:
    sqrt(var_a + var_b - 2 cov(a, b)), unfloored. Small for a measured configuration's neighbour, whose error is
    mostly the measured one's, whatever noise that measurement carried (Posterior.std alone is floored at the
    noise, and it is the difference that decides whether the neighbour can beat it)."""
    _, variance, cov = _conditioned(cands, observations, uncertainty, index)
    return np.sqrt(np.maximum(variance + variance[index] - 2 * cov, 0.0))


def _conditioned(cands: Candidates, observations: Sequence[Observation], uncertainty: Uncertainty,
                 index: int | None = None) -> tuple[Posterior, np.ndarray, np.ndarray]:
    """(the posterior, the posterior variance unfloored, and when `index` is given the posterior covariance of every
    candidate with it, else an empty array)."""
    ok = [o for o in observations if o.status in MEASURED and o.step_s]
    errors = np.array([math.log(o.step_s / o.predicted_step_s) for o in ok])  # type: ignore[operator]
    families = list(cands.families) + [o.family for o in ok if o.family not in cands.families]
    obs_mb = np.array([o.micro_batch for o in ok])
    centre = float(np.mean(np.log2(cands.micro_batch.astype(float)))) if len(cands) else 0.0
    noise_var = np.array([o.noise_std for o in ok]) ** 2
    var = _variances(uncertainty, families, centre, errors, [o.family for o in ok], np.log2(obs_mb.astype(float)),
                     noise_var)
    prior_var = var.total(cands.micro_batch)
    fam_k = _family_kernel(families, families, var)
    cov = np.empty(0)
    if index is not None:
        at = np.array([index])
        cov = _kernel(cands.family, cands.micro_batch, cands.family[at], cands.micro_batch[at], fam_k, var)[:, 0]
        cov[index] += var.own
    if not ok:
        return Posterior(np.zeros(len(cands)), np.sqrt(prior_var)), prior_var, cov
    lookup = {f: i for i, f in enumerate(families)}
    obs_fam = np.array([lookup[o.family] for o in ok])
    k_oo = _kernel(obs_fam, obs_mb, obs_fam, obs_mb, fam_k, var)
    k_oo += np.diag(var.own + noise_var)
    chol = np.linalg.cholesky(k_oo)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, errors))
    k_co = _kernel(cands.family, cands.micro_batch, obs_fam, obs_mb, fam_k, var)
    v = np.linalg.solve(chol, k_co.T)
    variance = prior_var - np.sum(v ** 2, axis=0)
    if index is not None:
        cov = cov - v.T @ v[:, index]
    return Posterior(k_co @ alpha, np.sqrt(np.maximum(variance, NOISE_STD ** 2))), variance, cov

# -- memory ---------------------------------------------------------------------------------------------------

def memory_bounds(observations: Sequence[Observation], uncertainty: Uncertainty) -> tuple[float, float]:
    """(lowest, highest) scale r of predicted peak memory that the runs so far allow."""
    prior_low, prior_high = 1.0 - MEMORY_Z * uncertainty.memory_rel, 1.0 + MEMORY_Z * uncertainty.memory_rel
    low, high = prior_low, prior_high
    for o in (o for o in observations if o.memory_ratio > 0 and o.status == "oom"):
        if 1.0 / o.memory_ratio <= prior_high:
            low = max(low, 1.0 / o.memory_ratio)
        else:
            # An OOM the prior said could not happen: the model is off beyond its band (seen: host RAM that both
            # CPU ranks share counted once). The band moves up to start at the OOM, keeping its width, rather than
            # stopping at its edge, where a configuration one sample smaller would count as sure to fit.
            low = max(low, 1.0 / o.memory_ratio)
            high = max(high, low * prior_high / prior_low)
    # A fit moves the upper edge (not past the prior's lower one), after the OOMs have moved the band: a run that
    # fitted below an OOM that moved it bounds it from above (micro-batch 6 fitted under the cap where 8 did not:
    # 7 lies between them, not at the moved band's bottom).
    for o in (o for o in observations if o.memory_ratio > 0 and o.status in MEASURED):
        high = min(high, max(1.0 / o.memory_ratio, prior_low))
    return (low, high) if low <= high else (high, low)  # contradicting runs (allocator noise): keep both edges


def candidate_memory_bounds(cands: Candidates, observations: Sequence[Observation],
                            uncertainty: Uncertainty) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate, (lowest, highest) scale r of its predicted peak memory. Without a measured peak, the same
    for all: memory_bounds. Runs that recorded their peak (Observation.measured_memory_ratio) narrow it: each run's
    r is its measured over its predicted ratio, within MEASURED_MEMORY_REL for its own family and
    MEASURED_MEMORY_OTHER_REL for the rest, plus MEASURED_MEMORY_ABS of the device over the share the run used
    (a run that filled a few percent of the device says little of the scale at the top); the runs' bands
    intersect, what ran out of memory or fitted still bounds them, and where they fall outside the prior's band
    they stand alone."""
    low, high = memory_bounds(observations, uncertainty)
    runs = [(o.family, o.measured_memory_ratio / o.memory_ratio, o.measured_memory_ratio) for o in observations
            if o.status in MEASURED and o.measured_memory_ratio and o.memory_ratio > 0]
    if not runs:
        return np.full(len(cands), low), np.full(len(cands), high)
    lo, hi = np.zeros(len(cands)), np.full(len(cands), np.inf)
    for family, r, used in runs:
        same = cands.family == (cands.families.index(family) if family in cands.families else -1)
        width = np.where(same, MEASURED_MEMORY_REL, MEASURED_MEMORY_OTHER_REL) + MEASURED_MEMORY_ABS / used
        lo, hi = np.maximum(lo, r * np.maximum(1.0 - width, 0.0)), np.minimum(hi, r * (1.0 + width))
    ooms = [1.0 / o.memory_ratio for o in observations if o.memory_ratio > 0 and o.status == "oom"]
    fits = [1.0 / o.memory_ratio for o in observations if o.memory_ratio > 0 and o.status in MEASURED]
    lo = np.maximum(lo, max(ooms)) if ooms else lo
    hi = np.minimum(hi, min(fits)) if fits else hi
    swap = lo > hi  # contradicting runs: keep both edges
    lo, hi = np.where(swap, hi, lo), np.where(swap, lo, hi)
    # Within the prior's band where they overlap (a peak of another family does not widen it: GPT-Neo-1.3B on the
    # H100 grid, whose calibrated band had ruled out micro-batch 4, ran it after micro-batch 1's peak); the
    # measurement alone where they do not (a model off beyond its band).
    inner_lo, inner_hi = np.maximum(lo, low), np.minimum(hi, high)
    overlap = inner_lo <= inner_hi
    return np.where(overlap, inner_lo, lo), np.where(overlap, inner_hi, hi)


def fit_probabilities(cands: Candidates, observations: Sequence[Observation], uncertainty: Uncertainty) -> np.ndarray:
    """Each candidate's probability of fitting in memory after the runs so far."""
    return _monotone(cands, observations, fit_probability(cands.memory_ratio,
                                                          candidate_memory_bounds(cands, observations, uncertainty)))


def _monotone(cands: Candidates, observations: Sequence[Observation], p_fit: np.ndarray) -> np.ndarray:
    """Within a family memory grows with micro-batch: an OOM rules out its family's larger micro-batches, a run
    that fitted vouches for the smaller ones."""
    p_fit = p_fit.copy()
    for o in observations:
        if o.family not in cands.families:
            continue
        same = cands.family == cands.families.index(o.family)
        if o.status == "oom":
            p_fit[same & (cands.micro_batch >= o.micro_batch)] = 0.0
        elif o.status in MEASURED:
            p_fit[same & (cands.micro_batch <= o.micro_batch)] = 1.0
    return p_fit


def fit_probability(memory_ratio: np.ndarray, bounds: tuple[float | np.ndarray, float | np.ndarray]) -> np.ndarray:
    """P(r x predicted <= capacity) for r log-uniform within the bounds (one pair for all, or one per candidate)."""
    low, high = np.log(np.asarray(bounds[0], dtype=float)), np.log(np.asarray(bounds[1], dtype=float))
    limit = -np.log(np.maximum(memory_ratio, 1e-12))  # log of the largest r that still fits
    span = high - low
    uniform = np.clip((limit - low) / np.maximum(span, 1e-9), 0.0, 1.0)
    return np.where(span < 1e-9, (limit >= low).astype(float), uniform)
