"""validate.misses lists the groups the ranking gets wrong, the same groups validate.accuracy counts."""

from __future__ import annotations

from zerotune.validate.accuracy import DEFAULT_DATA_DIR, read_rows, score_rows, split_rows
from zerotune.validate.misses import accumulation_fits, format_fit, format_group, groups, main


def test_misses_agree_with_the_accuracy_report() -> None:
    # BLOOM's test half: 8 comparable groups, the measured best ranked first in 4 (validate.accuracy --half test)
    found = groups("bloom_tr11", "test")
    score = score_rows("bloom_tr11", split_rows(read_rows(DEFAULT_DATA_DIR / "bloom_tr11.jsonl"), "test"))
    assert len(found) == len(score.rankings) == 8
    assert sum(g.hit for g in found) == sum(r.picked_best for r in score.rankings)
    assert sorted(g.pick_share_of_best for g in found) == sorted(r.pick_share_of_best for r in score.rankings)
    miss = next(g for g in found if not g.hit)
    text = format_group(miss)
    assert text.startswith("MISS") and "\n B" in text and "P " in text and "pipeline_bubble=" in text
    measured = [m.speed.measured for m in miss.members]
    assert measured == sorted(measured, reverse=True)


def test_unknown_data_set_is_a_one_line_error(capsys) -> None:
    assert main(["--data-set", "no_such_set"]) == 2
    assert "no_such_set.jsonl" in capsys.readouterr().err


def test_accumulation_split_separates_micro_step_from_step() -> None:
    # vTrain's 12-layer, 1024-wide model on 2 A100s, tp1 pp1 dp2 micro-batch 1, accumulation 2/4/8/16
    # (vtrain_single.jsonl, fit half): the measured step times lie on one line, ~42.8 ms per micro-step and
    # ~6.8 ms per step; the model's step time is affine in the accumulation, so its fit is exact.
    fits = {f.key: f for f in accumulation_fits("vtrain_single", "fit")}
    fit = fits[((12, 1024, 16, 4096, 50257), "a100-80gb", 2, 1, 1, 2, 1, 0)]
    assert fit.accumulations == (2, 4, 8, 16)
    assert abs(fit.measured[0] - 0.0428) < 0.002 and abs(fit.measured[1] - 0.0068) < 0.002
    assert 0.5 < fit.predicted[0] / fit.measured[0] < 2
    assert "per micro-step measured 42.8 ms" in format_fit(fit)
    assert all(len(f.accumulations) >= 2 for f in fits.values())
