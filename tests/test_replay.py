"""benchmarks.replay: the tuner's search played against a measured grid, the decisions made by the same code
`tune` runs (zerotune.validate.search.run_search), so a replay and a tune on a launcher answering from the grid run the
same experiments in the same order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.replay import Group, GridRow, replay, replay_group, wrong_model
from zerotune.calibrate.launch import LaunchSpec, RunResult
from zerotune.calibrate.measurement import Measurement
from zerotune.predictor import estimate, experiment_name, parse_ds_config
from zerotune.validate.experiments import UserCommand
from zerotune.validate.plan import build_job
from zerotune.validate.settings import BUILTIN_SCRIPT, TuneSettings
from zerotune.validate.tune import tune

TINY = str(Path(__file__).resolve().parent / "fixtures" / "tiny-gpt.yaml")
WORLD, SEQ_LEN = 2, 32
STAGES, MICRO = (0, 1), (2, 4, 8)
# The grid's "measured" step times: the prediction times a per-stage factor, so the model is right within a
# family and wrong between them (stage 1 measured 40% faster than predicted relative to stage 0).
FACTOR = {0: 1.0, 1: 0.6}


def _grid() -> Group:
    job = build_job(TINY, "cpu", 1, WORLD, SEQ_LEN)
    rows = []
    for stage in STAGES:
        for mb in MICRO:
            cfg = parse_ds_config({"train_micro_batch_size_per_gpu": mb, "zero_optimization": {"stage": stage}},
                                  world_size=WORLD)
            rows.append(GridRow(job, cfg, "ok", estimate(job, cfg).time.step_s * FACTOR[stage], f"z{stage} mb{mb}"))
    return Group("tiny", tuple(rows))


def test_replay_finds_the_measured_best_in_few_experiments() -> None:
    outcome = replay_group(_grid())
    assert outcome.within and outcome.choice == outcome.best
    assert outcome.num_experiments < len(_grid().rows)  # the stopping rule ended it, not exhaustion
    assert "stopped" in outcome.stop_reason


def test_wrong_models_are_seeded_and_within_their_range() -> None:
    rows = _grid().rows
    first, again = wrong_model(rows, 7), wrong_model(rows, 7)
    assert first == again
    factors = list(first.stage.values()) + list(first.offload.values()) + list(first.checkpointing.values())
    assert all(0.5 <= f <= 2.0 for f in factors)
    assert first.memory_scale in (pytest.approx(0.85), pytest.approx(1.15))
    result = replay([_grid()], "tiny", seed=3, draws=4)
    assert len(result.outcomes) == 4 and 0.0 <= result.within_share <= 1.0


@pytest.mark.parametrize("profiled", [False, True])
def test_a_replay_and_a_tune_on_the_same_grid_run_the_same_experiments(tmp_path: Path, profiled: bool) -> None:
    """With and without the profiling run's measurement to start from: `tune` given the grid's row of it (as
    profile_model hands it over, a measurement made before the search) runs what the replay's search runs."""
    group = _grid()
    measured = {experiment_name(r.config): r.step_s for r in group.rows}
    calls: list[str] = []

    def grid_launcher(spec: LaunchSpec) -> RunResult:
        name = experiment_name(parse_ds_config({k: v for k, v in spec.ds_config.items() if k != "autotuning"},
                                               world_size=WORLD))
        calls.append(name)
        spec.run_dir.mkdir(parents=True, exist_ok=True)
        metrics = {"step_s": measured[name]}
        (spec.run_dir / "metrics.json").write_text(json.dumps(metrics))
        return RunResult("ok", "", 0, 1.0, spec.run_dir, metrics)

    doc = {"train_micro_batch_size_per_gpu": list(MICRO), "zero_optimization": {"stage": list(STAGES)},
           "autotuning": {"fast": True, "results_dir": str(tmp_path / "r"), "exps_dir": str(tmp_path / "e")}}
    settings = TuneSettings(UserCommand(BUILTIN_SCRIPT, (), "--deepspeed_config", tmp_path / "ds.json"), doc, TINY,
                            "cpu", WORLD, seq_len=SEQ_LEN, explore=())
    first = min(group.rows, key=lambda r: (r.config.zero.stage, r.config.train_micro_batch_size_per_gpu))
    initial = (Measurement(TINY, "cpu", 1, WORLD, SEQ_LEN, first.config, "ok", step_s=first.step_s,
                           source="the profiling run"),) if profiled else ()
    outcome = tune(settings, grid_launcher, log=lambda _: None, initial=initial)
    replayed = replay_group(group, profiling_run=profiled)
    assert replayed.profiled == profiled
    assert len(calls) == replayed.num_experiments
    if profiled:  # measured already: the search starts elsewhere
        assert calls[0] != experiment_name(first.config)
    assert outcome.best is not None and outcome.best.name == replayed.choice


def test_replay_figures_on_the_small_grids_hold() -> None:
    # Figures of `python -m benchmarks.replay` (2026-11-25, search of issue 13 with a second ZeRO stage run before
    # stopping): ds_autotuning_hf_v100 real 100% of 8 groups within 3% (2.38 experiments), wrong 95% of 80
    # (2.06); the CPU grid real within in 4 experiments (one per ZeRO stage: the CPU model is off by up to 2x between
    # stages), in 2 since ZeRO-3 is held to its ZeRO-2 sibling (2026-11-27: z0 micro-batch 8, then z1 micro-batch 8;
    # ZeRO-3 at 8, which the CPU profile ranked 2% above ZeRO-2, is not run). Pinned with a little slack.
    from benchmarks.replay import data_sets
    sets = dict(data_sets())
    hf = sets["ds_autotuning_hf_v100"]()
    real, wrong = replay(hf, "hf", 8), replay(hf, "hf", 8, seed=13, draws=10)
    assert real.within_share == 1.0 and real.mean_experiments <= 2.5
    assert wrong.within_share >= 0.9 and wrong.mean_experiments <= 2.2
    cpu = [name for name in sets if name.startswith("cpu_grid_zt-gpt-small")]
    if cpu:
        outcome = replay(sets[cpu[0]](), "cpu", 8)
        assert outcome.within_share == 1.0 and outcome.max_experiments <= 3


def test_error_shares_split_a_per_stage_error_into_the_family_specific_part() -> None:
    from benchmarks.replay import error_shares
    from zerotune.validate.calibration import load_profile_for
    eff, _ = load_profile_for("cpu")  # measured = the replay's own prediction x one factor per stage
    rows = tuple(GridRow(r.job, r.config, "ok", estimate(r.job, r.config, eff).time.step_s
                         * FACTOR[r.config.zero.stage], r.source) for r in _grid().rows)
    shares = error_shares([Group("per-stage", rows)])
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["within"] < 1e-6 and shares["specific"] == pytest.approx(0.5, abs=0.01)  # +-log(0.6)/2 about
    # a mean of log(0.6)/2: common and specific equal


def test_a_megatron_group_replays_with_its_runtime_efficiency() -> None:
    # vTrain's Megatron-DeepSpeed rows take framework_efficiency (Megatron's own optimizer and fused kernels); the
    # replay hands it the row's framework, layout and hardware, and the group's choice comes back.
    from benchmarks.replay import DEFAULT_DATA_DIR, published_groups, replay_group
    group = published_groups(DEFAULT_DATA_DIR / "vtrain_single.jsonl", "fit")[0]
    assert group.rows[0].framework is not None and group.rows[0].framework["hardware"]
    outcome = replay_group(group)
    assert outcome.num_experiments >= 1 and 0.0 < outcome.choice_over_best <= 1.0


def test_the_search_finds_the_best_when_the_model_is_deliberately_wrong() -> None:
    # Issue 13's robustness target, on the CPU grid and the H200 grid (`python -m benchmarks.replay`, seed 13,
    # 2026-11-27 at c686fe9): each ZeRO stage's and each offload / checkpointing family's predictions scaled by a
    # seeded factor in [0.5, 2], memory +-15%; 92% and 92.4% of the choices within 3% of the best measured, at 2.66
    # and 3.23 experiments. Before the bounds of validate/bounds.py and the 3x stage error: 83% (3.17) and 90.5%
    # (3.56). Pinned at the target (90%) and a little over the experiments. With each run's measured peak memory
    # in the memory model (2026-11-28): H200 grid 3.06 -> 2.93 experiments, shapes grid 3.09 -> 2.89, choices
    # within 3% unchanged (92.4%, 97%); pinned at issue 13's target of 3.
    from benchmarks.replay import DRAWS, MIN_WRONG_OUTCOMES, data_sets
    sets = dict(data_sets())
    names = [n for n in sets if n.startswith("cpu_grid_zt-gpt-small")] + ["gpu_grid/h200_grid"]
    names += ["gpu_grid/h200_shapes_grid"]
    for name, most in zip(names, (2.8, 3.0, 3.0)):
        groups = sets[name]()
        draws = max(DRAWS, -(-MIN_WRONG_OUTCOMES // len(groups)))
        wrong = replay(groups, name, 8, seed=13, draws=draws)
        assert wrong.within_share >= 0.9 and wrong.mean_experiments <= most, (name, wrong.within_share,
                                                                              wrong.mean_experiments)


def test_measured_peaks_bound_the_memory_scale_as_the_gpu_grids_ran() -> None:
    """`python -m benchmarks.replay --memory_check` (2026-11-28): from each run that fitted and recorded its peak
    (torch.cuda.max_memory_allocated), the band it gives the memory scale of every other run of the same model.
    No run that ran out of memory was said to fit whatever the scale; of 1,266 pairs, 3 fitted outside the band,
    each a micro-batch 1 seen from a larger run, where the allocator's fixed blocks weigh most."""
    from benchmarks.replay import data_sets, memory_band_check
    checks = [memory_band_check(load()) for name, load in data_sets() if name.startswith("gpu_grid/")]
    assert sum(c.pairs for c in checks) > 1000
    assert not [pair for c in checks for pair in c.oom_sure_to_fit]
    outside = [pair for c in checks for pair in c.outside]
    assert len(outside) <= 3 and all(other.endswith("tmbspg1") for _, other in outside), outside


def test_measured_peaks_spare_experiments_that_would_run_out_of_memory() -> None:
    """The shapes grid with the real model: its runs' peaks pin the memory scale, so the micro-batch past the limit
    (Qwen2-250M's 128, DeBERTa-v2-xlarge's 64: predicted at 1.03-1.09 of the device, out of memory) is not run once
    a neighbour's peak is known; 2.80 -> 2.60 experiments a group, every choice the measured best either way."""
    from benchmarks.replay import data_sets
    groups = dict(data_sets())["gpu_grid/h200_shapes_grid"]()
    blind = [replay_group(g, 8, measure_memory=False) for g in groups]
    seen = [replay_group(g, 8) for g in groups]
    assert all(o.within for o in blind + seen)
    assert sum(o.num_experiments for o in seen) < sum(o.num_experiments for o in blind)
