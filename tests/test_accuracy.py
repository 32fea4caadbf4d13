"""The accuracy report against published measurements: every row is scored or skipped with a reason, the
scorer is exact when predictions are exact, ranking detects a wrong first pick, and the uncalibrated
errors stay below the bounds measured when the report was written (regression guards, not targets)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from zerotune.predictor import Efficiency, estimate
from zerotune.predictor.zero_mechanics import wrapper_bytes_per_param
from zerotune.predictor.flops import micro_batch_flops
from zerotune.validate.accuracy import (DEFAULT_DATA_DIR, MEGATRON_WRAPPER_BYTES_PER_PARAM, Case, Comparison, DataSetScore, Skip, format_markdown, main,
                               model_half, model_spec, rank_groups, read_rows, row_case, score_dir, score_rows,
                               framework_efficiency, split_rows)

TEMPLATE: dict[str, Any] = {
    "source": "synthetic (tests/test_accuracy.py)", "value_quality": "synthetic",
    "model": {"name": "tiny-gpt", "num_layers": 4, "hidden_size": 512, "num_heads": 8, "ffn_hidden_size": 2048,
              "vocab_size": 8000, "num_params": None},
    "hardware": "a100-80gb", "num_gpus_total": 16, "num_gpus_per_node": 8,
    "parallel": {"dp": 16, "tp": 1, "pp": 1, "zero_stage": 2, "sequence_parallel": False, "offload": "none"},
    "batch": {"micro_batch": 4, "global_batch": 128, "grad_accum": 2, "seq_len": 1024},
    "precision": "bf16", "recompute": "none", "framework": "DeepSpeed", "metrics": {"step_time_s": 1.0},
    "notes": "",
}


def make_row(**changes: Any) -> dict[str, Any]:
    """TEMPLATE with top-level keys replaced and nested ones merged ({'batch': {'micro_batch': 8}})."""
    row = copy.deepcopy(TEMPLATE)
    for key, value in changes.items():
        row[key] = {**row[key], **value} if isinstance(value, dict) and key != "metrics" else value
    return row


def case_of(row: dict[str, Any], row_id: str = "synthetic:1") -> Case:
    case = row_case(row, row_id)
    assert isinstance(case, Case), case
    return case


@pytest.fixture(scope="module")
def scores() -> dict[str, DataSetScore]:
    """Every row of every data set (both halves)."""
    return {s.name: s for s in score_dir(half="all")}


@pytest.fixture(scope="module")
def test_half() -> dict[str, DataSetScore]:
    """The held-out models only: what the regression guards and the report measure."""
    return {s.name: s for s in score_dir()}


# -- every row accounted for ------------------------------------------------------------------------------

def test_every_published_row_is_scored_or_skipped_with_a_reason(scores) -> None:
    assert len(scores) == len(list(DEFAULT_DATA_DIR.glob("*.jsonl")))
    for s in scores.values():
        scored_ids = {c.row_id for c in s.speed + s.memory} | {v.row_id for v in s.verdicts}
        skipped_ids = {k.row_id for k in s.skipped}
        assert not scored_ids & skipped_ids, s.name
        assert len(scored_ids) + len(skipped_ids) == s.num_rows, s.name
        assert all(k.reason.strip() for k in s.skipped + s.metric_skips), s.name


def test_pipeline_parallel_rows_are_scored(scores) -> None:
    # vTrain's grids are all expressible now that the predictor models 1F1B pipeline stages.
    for name in ("vtrain_single", "vtrain_multi"):
        rows = dict(read_rows(DEFAULT_DATA_DIR / f"{name}.jsonl"))
        pipelined = {row_id for row_id, row in rows.items() if (row["parallel"]["pp"] or 1) > 1}
        skipped = {k.row_id for k in scores[name].skipped}
        assert pipelined and not pipelined & skipped, name


def test_extension_only_rows_are_skipped_for_that_reason(scores) -> None:
    # Korthikanti Table 4 and Fig. 7 hold only the README's extension keys, which a scorer skips.
    assert scores["korthikanti2022_table4_layer_time"].num_scored == 0
    assert all("extension metrics" in k.reason for k in scores["korthikanti2022_table4_layer_time"].skipped)


# -- regression guards on the shipped data (uncalibrated Efficiency defaults) ---------------------------------

# (data set, measured speed MAPE % on the test half when written, bound), operator-level model (ops.py),
# uncalibrated: bloom 47 rows, Korthikanti Table 5 2 rows, llm-foundry 102, vtrain 720 + 62, the HF models on
# 16 V100 23 rows (their ZeRO stage costs are modelled beside this; BERT runs in fp32 there). Megatron rows run
# Megatron's GPT (not the Hugging Face entry their dimensions match), with its tensor-parallel all-reduces.
# Re-measured with DeepSpeed's pipeline partition and p2p transfers, the forward tail after host-bound blocks
# and Megatron's optimizer for rows without ZeRO (python -m zerotune.validate.accuracy --half test): BLOOM
# 11.9 -> 9.9, vTrain single 11.2 -> 9.8 (bounds tightened); Korthikanti 23.8 -> 26.5 and vTrain multi
# 13.6 -> 15.0 (their pipelines now pay the activation transfers between nodes that the model did not charge;
# both were already predicted slow), bounds kept. A data-parallel ring across nodes then ran over one NIC per
# rank a node, and FSDP gathered a flat parameter a block (links.data_parallel_link, zero_mechanics.fsdp_units): llm-foundry
# 16.5 -> 11.2 (bound tightened), BLOOM 10.0 -> 9.8, vTrain multi 15.0 -> 14.6; flash attention at
# FlashAttention-2's rate on Hopper (hardware flash_attention_tflops): llm-foundry 11.2 -> 8.9.
SPEED_BOUNDS = [("bloom_tr11", 9.8, 12.0), ("korthikanti2022_table5", 26.5, 27.0),
                ("llmfoundry_mpt_fsdp", 8.9, 11.0), ("vtrain_multi", 14.6, 16.0), ("vtrain_single", 9.8, 12.0),
                ("ds_autotuning_hf_v100", 29.2, 34.0)]


@pytest.mark.parametrize("name,measured_pct,bound_pct", SPEED_BOUNDS, ids=[b[0] for b in SPEED_BOUNDS])
def test_speed_mape_stays_below_the_measured_bound(test_half, name, measured_pct, bound_pct) -> None:
    assert test_half[name].speed, name
    assert test_half[name].speed_mape_pct < bound_pct, (name, test_half[name].speed_mape_pct, measured_pct)


def test_memory_mape_stays_below_the_measured_bound(scores) -> None:
    # BLOOM nvidia-smi peaks (70 rows with pipelines, GB at 1e9): 19.7% when written (7.6% on the 5 rows
    # without). Korthikanti Fig. 1 (4 rows, 3 with pipelines): activations 11.8% when written (0.2% for the
    # unpipelined 22B, TP=8: their eq. 2), because the first stage is charged the last stage's logits too;
    # model states 10.6% (their bars are read from a figure).
    assert scores["bloom_tr11"].memory_mape_pct("peak memory") < 24.0
    korthikanti = scores["korthikanti2022_activation_memory"]
    assert korthikanti.memory_mape_pct("activation_memory_bytes") < 15.0
    assert korthikanti.memory_mape_pct("model_state_memory_bytes") < 12.0


def test_fit_verdicts_agree_where_measured(scores) -> None:
    # Every scored BLOOM / vTrain / Korthikanti run trained and zerotune says it fits (100% when written).
    for name in ("bloom_tr11", "vtrain_single", "korthikanti2022_table5"):
        assert scores[name].verdict_agreement == 1.0, name
    # vTrain multi: 106/109. The three GPT-3.6B runs on one 80 GB A100 each (no ZeRO, no model parallelism)
    # trained under Megatron, whose optimizer holds 18 bytes per parameter; DeepSpeed's FP16_Optimizer holds 24
    # at its step (8 of transient fp32 gradients, fp16/fused_optimizer.py:282-291), 84 GiB, which is what
    # zerotune models.
    assert scores["vtrain_multi"].verdict_agreement >= 106 / 109
    # ZeRO Table 2's largest trained models: their model states fit the V100's 32 GB (10/10).
    assert scores["zero2020_table2_max_model_size"].verdict_agreement == 1.0
    # llm-foundry runs with flash attention (its notes say so, and the scorer then predicts flash), no dropout and
    # flash-attn's fused cross-entropy (model_spec): 209/209 agree when written; 98/209 with HF's fp32 loss (14
    # bytes a logit, 43 GiB for MPT-7B at 65,536 tokens a GPU, which ran) and dropout masks, 26/209 with eager
    # attention besides.
    assert scores["llmfoundry_mpt_fsdp"].verdict_agreement == 1.0


def test_ranking_guard_on_vtrain_single(test_half) -> None:
    # 72 groups of the test half (same model, GPUs and global batch, pipelined layouts included); zerotune's
    # first pick is the measured best in 52 (72%) and reaches 97.9% of the best's throughput on average
    # (python -m zerotune.validate.accuracy --half test), with DeepSpeed's per-stage runtime costs
    # (zero_mechanics.py) charged to these Megatron-DeepSpeed runs (before Megatron's tensor-parallel costs and
    # stage-aware bubble: 40 / 72 and 95.1%; before the forward tail and Megatron's optimizer: 49 / 72, 96.2%;
    # before that optimizer's traffic replaced FP16_Optimizer's cast and flattening: 48 / 72, 96.6%).
    s = test_half["vtrain_single"]
    assert len(s.rankings) == 72
    assert s.ranked_first_share >= 0.70
    assert sum(g.pick_share_of_best for g in s.rankings) / len(s.rankings) >= 0.975


def test_megatron_optimizer_moves_fewer_bytes_than_fp16_optimizer() -> None:
    # A Megatron row without ZeRO: its optimizer's traffic around Adam is the norm, unscale and copy back (18 B
    # per parameter) instead of FP16_Optimizer's 32 (cast to fp32 and flattening too); the per-step cost
    # vTrain measured at dp 1 (tp 2-8, 20-layer 2048-wide model, validate.misses --accumulation --half fit) is
    # ~0.67 of the 62 B model before, so the change is in the measured direction.
    row = make_row(framework="Megatron-DeepSpeed", precision="fp16", parallel={"zero_stage": None})
    case = case_of(row)
    base = Efficiency()
    megatron = framework_efficiency(row, base, case.config)
    assert wrapper_bytes_per_param(case.config) == 32
    total = megatron.optimizer_bytes_per_param + wrapper_bytes_per_param(case.config)  # what the step model reads
    assert total == base.optimizer_bytes_per_param + MEGATRON_WRAPPER_BYTES_PER_PARAM == 30 + 18
    assert megatron.tensor_sync_check_s == 0.0
    assert framework_efficiency(row, base).optimizer_bytes_per_param == base.optimizer_bytes_per_param
    deepspeed = make_row(framework="DeepSpeed", precision="fp16", parallel={"zero_stage": 0})
    assert framework_efficiency(deepspeed, base, case_of(deepspeed).config) == base


def test_ranking_guard_on_bloom(test_half) -> None:
    # 8 groups of BLOOM's test half (384 A100s, 2048 sequences a step, different tp / pp / micro-batch): the first
    # pick is the measured best in 4 and reaches 90.6% of the best on average (--half test); 2 / 8 and 88.9%
    # before the busiest stage followed DeepSpeed's type:transformer partition (the last stage, beside the
    # 250k-vocabulary logits, runs floor(L / pp) blocks).
    s = test_half["bloom_tr11"]
    assert len(s.rankings) == 8
    assert s.ranked_first_share >= 0.5
    assert sum(g.pick_share_of_best for g in s.rankings) / len(s.rankings) >= 0.90


def test_megatron_rows_run_megatrons_gpt_not_the_hugging_face_entry() -> None:
    # vTrain's GPT-h1024-L24 has GPT-2 medium's dimensions, but Megatron runs its own GPT: fused GeLU, not
    # Hugging Face's eight-kernel gelu_new (the catalog's gpt2-medium); an HF row keeps the catalog entry.
    fields = {"name": "GPT-h1024-L24", "num_layers": 24, "hidden_size": 1024, "num_heads": 16,
              "ffn_hidden_size": 4096, "vocab_size": 50257}
    megatron = model_spec(fields, 1024, "test", "Megatron-DeepSpeed")
    hugging_face = model_spec({**fields, "name": "gpt2-medium"}, 1024, "test", "DeepSpeed (Hugging Face)")
    assert megatron.activation == "gelu" and megatron.name == "GPT-h1024-L24"
    assert hugging_face.name == "gpt2-medium" and hugging_face.activation == "gelu_new"


# -- the scorer itself, on constructed rows ---------------------------------------------------------------

def exact_rows() -> list[tuple[str, dict[str, Any]]]:
    """Rows whose measured values are zerotune's own predictions, in each metric's unit."""
    rows = []
    for number, micro in enumerate((1, 2, 4, 8), 1):
        row = make_row(batch={"micro_batch": micro, "grad_accum": 8 // micro})  # global batch 128 in all
        est = estimate(case_of(row).job, case_of(row).config)
        row["metrics"] = {"step_time_s": est.time.step_s, "peak_memory_bytes": est.memory.total_bytes}
        rows.append((f"exact:{number}", row))
    row = make_row(recompute="full", notes="TFLOPs counts activation recompute")
    case = case_of(row)
    est, flops = estimate(case.job, case.config), micro_batch_flops(case.job.model, 4, 1024, recompute=True)
    hardware_flops_per_gpu = est.flops_per_gpu * flops.total_flops / flops.model_flops
    rows.append(("exact:5", {**row, "metrics": {"tflops_per_gpu": hardware_flops_per_gpu / 1e12}}))
    return rows


def test_exact_predictions_score_zero_error_and_full_agreement() -> None:
    s = score_rows("exact", exact_rows())
    assert s.num_scored == 5 and not s.skipped
    assert s.speed_mape_pct == pytest.approx(0.0, abs=1e-9)
    assert len(s.speed) == 5 and len(s.memory) == 4 and len(s.verdicts) == 5
    assert s.memory_mape_pct("peak memory") == pytest.approx(0.0, abs=1e-9)
    assert s.verdict_agreement == 1.0
    assert len(s.rankings) == 1 and s.rankings[0].picked_best and s.rankings[0].pick_share_of_best == 1.0


def test_ranking_detects_a_wrong_first_pick() -> None:
    cases = [case_of(make_row(batch={"micro_batch": m, "grad_accum": 8 // m}), f"r:{i}")
             for i, m in enumerate((1, 2, 4))]
    speeds = [Comparison(f"r:{i}", "samples/s", measured, predicted)
              for i, (measured, predicted) in enumerate([(100.0, 300.0), (150.0, 200.0), (120.0, 100.0)])]
    wrong, = rank_groups(cases, speeds)
    assert (wrong.best_measured, wrong.best_predicted, wrong.picked_best) == ("r:1", "r:0", False)
    assert wrong.pick_share_of_best == pytest.approx(100.0 / 150.0)
    right = [Comparison(c.row_id, c.metric, c.measured, c.measured) for c in speeds]
    assert rank_groups(cases, right)[0].picked_best


def test_hardware_flops_count_recompute_only_where_the_notes_say_so() -> None:
    counted = make_row(recompute="full", metrics={"tflops_per_gpu": 100.0}, notes="counts recompute")
    model_only = {**counted, "notes": "Model TFLOP (excludes recompute)"}
    silent = {**counted, "notes": "nothing said"}
    by_notes = {notes: score_rows("t", [("t:1", row)]) for notes, row in
                (("counted", counted), ("model", model_only), ("silent", silent))}
    ratio = by_notes["counted"].speed[0].predicted / by_notes["model"].speed[0].predicted
    assert 1.0 < ratio <= 4 / 3  # one more forward of the blocks over forward + backward (3 forwards)
    assert not by_notes["silent"].speed and "recompute" in by_notes["silent"].metric_skips[0].reason


@pytest.mark.parametrize("changes,reason", [
    ({"precision": "fp8"}, "fp8"),
    ({"recompute": "selective"}, "selective"),
    ({"parallel": {"sequence_parallel": True}}, "sequence parallelism"),
    ({"hardware": "tpu-v9"}, "not in the catalog"),
    ({"model": {"num_layers": None}}, "num_layers not given"),
    ({"batch": {"micro_batch": None}}, "micro_batch not given"),
    ({"parallel": {"dp": 8}}, "num_gpus_total"),
], ids=["fp8", "selective", "sp", "hardware", "layers", "micro", "layout"])
def test_rows_zerotune_cannot_express_name_the_reason(changes, reason) -> None:
    skip = row_case(make_row(**changes), "s:1")
    assert isinstance(skip, Skip) and reason in skip.reason


def test_gaps_are_filled_as_documented() -> None:
    # Null precision on an A100 (fp16 peak == bf16 peak) predicts as 16-bit; null zero_stage is Megatron's DP.
    case = case_of(make_row(precision=None, parallel={"zero_stage": None}, batch={"grad_accum": None}))
    assert case.config.precision == "fp16" and case.config.zero.stage == 0
    assert case.config.gradient_accumulation_steps == 2  # global 128 / (micro 4 x dp 16)
    # Llama 3.1 8B has Llama 3 8B's dimensions: the catalog entry brings GQA, SwiGLU and RMSNorm.
    llama = case_of(make_row(model={"name": "Llama-3.1-8B", "num_layers": 32, "hidden_size": 4096,
                                    "num_heads": 32, "ffn_hidden_size": 14336, "vocab_size": 128256}))
    assert (llama.job.model.num_kv_heads, llama.job.model.gated_mlp, llama.job.model.norm) == (8, True, "rmsnorm")


def test_cli_prints_and_writes_the_table(tmp_path: Path, capsys) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "exact.jsonl").write_text("".join(json.dumps(row) + "\n" for _, row in exact_rows()))
    assert main(["--data", str(data), "--markdown", str(tmp_path / "report.md"), "--half", "all"]) == 0
    printed = capsys.readouterr().out
    table = format_markdown(score_dir(data, half="all"))
    assert printed == (tmp_path / "report.md").read_text() == "Models scored: all half\n\n" + table
    assert "| exact | 5 | 5 | 0 |" in printed
    assert main(["--data", str(tmp_path / "empty")]) == 2
    assert "no *.jsonl files" in capsys.readouterr().err


def test_accuracy_module_imports_no_torch() -> None:
    code = "import sys, zerotune.validate.accuracy; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent.parent).returncode == 0


def test_a_run_zerotune_calls_out_of_memory_is_a_disagreeing_verdict() -> None:
    # 512 sequences of 8192 tokens per GPU without recompute need terabytes of activations (Korthikanti eq. 2).
    row = make_row(batch={"micro_batch": 512, "grad_accum": 1, "global_batch": 8192, "seq_len": 8192})
    s = score_rows("oom", [("oom:1", row)])
    assert s.verdicts[0].measured_fits and not s.verdicts[0].predicted_fits and s.verdict_agreement == 0.0


# -- the split by model ----------------------------------------------------------------------------------

def test_every_data_set_splits_by_model_into_two_disjoint_halves() -> None:
    for path in sorted(DEFAULT_DATA_DIR.glob("*.jsonl")):
        rows = read_rows(path)
        fit, test = split_rows(rows, "fit"), split_rows(rows, "test")
        assert len(fit) + len(test) == len(rows), path.name
        fit_models = {row["model"]["name"] for _, row in fit}
        test_models = {row["model"]["name"] for _, row in test}
        assert not fit_models & test_models, path.name  # no model on both sides
        if len(fit_models | test_models) > 1:
            assert fit_models and test_models, path.name


def test_split_is_fixed_by_model_name() -> None:
    # the GPT-2 large table of seed 002 is held out; the split cannot drift with row order
    names = ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base-cased", "bert-large-uncased",
             "distilbert-base-uncased", "deberta-v2-xxlarge"]
    assert model_half(names, "gpt2-large") == "test" == model_half(list(reversed(names)), "gpt2-large")
    assert model_half(names, "gpt2") == "fit"


def test_report_defaults_to_the_test_half(capsys) -> None:
    assert main([]) == 0
    assert capsys.readouterr().out.startswith("Models scored: test half")


def test_fsdp_across_nodes_runs_its_gathers_over_every_nic() -> None:
    # llm-foundry's MPT-13B on 16, 32 and 64 H100s (two to eight DGX nodes, FSDP full shard, micro-batch 2, no
    # recompute; data/measurements/published/llmfoundry_mpt_fsdp.jsonl, test half): with each ring over one 50 GB/s
    # NIC the gathers and reduce-scatters could not hide and throughput was predicted 56-64% low; over the eight
    # NICs a ring of eight ranks a node crosses the network with (links.data_parallel_link), within 10%.
    rows = [(rid, r) for rid, r in split_rows(read_rows(DEFAULT_DATA_DIR / "llmfoundry_mpt_fsdp.jsonl"), "test")
            if r["model"]["name"] == "MPT-13b" and r["hardware"] == "h100-80gb" and r["num_gpus_total"] in (16, 32, 64)]
    assert len(rows) == 3
    for rid, row in rows:
        score = score_rows("llmfoundry_mpt_fsdp", [(rid, row)])
        assert len(score.speed) == 1 and score.speed_mape_pct < 10.0, (rid, score.speed_mape_pct)


def test_fsdp_gathers_one_flat_parameter_per_block() -> None:
    # FSDP wrapped per block gathers the block's flat parameter in one call (torch/distributed/fsdp/_flat_param.py),
    # where DeepSpeed's ZeRO-3 gathers per module: llm-foundry's MPT-7B on 512 H100s (64 nodes, FULL_SHARD,
    # micro-batch 6; llmfoundry_mpt_fsdp.jsonl, fit half) paid 193 ring latencies a forward as DeepSpeed modules and
    # was predicted 36% slow; as 33 units (32 blocks and the rest), within 10%.
    from zerotune.predictor.step_time import data_parallel_collectives
    rows = [(rid, r) for rid, r in split_rows(read_rows(DEFAULT_DATA_DIR / "llmfoundry_mpt_fsdp.jsonl"), "fit")
            if r["model"]["name"] == "MPT-7b" and r["hardware"] == "h100-80gb" and r["num_gpus_total"] == 512]
    assert len(rows) == 1
    rid, row = rows[0]
    case = row_case(row, rid)
    assert not isinstance(case, Skip)
    eff = framework_efficiency(row, Efficiency(), case.config)
    gathers = [c for c in data_parallel_collectives(case.job, case.config, eff) if c.kind == "all_gather"]
    assert [c.num_buckets for c in gathers] == [case.job.model.num_layers + 1, case.job.model.num_layers]
    assert score_rows("llmfoundry_mpt_fsdp", rows).speed_mape_pct < 10.0


def test_flash_attention_runs_at_flashattention2s_rate_on_hopper() -> None:
    # llm-foundry's MPT-760M on 8 H100s (flash attention, ALiBi: every score tile; llmfoundry_mpt_fsdp.jsonl, test
    # half): at 512 tokens within 5%, but the longer the sequence the more optimistic the prediction while attention
    # ran at the GEMM rate, +46% at 32k tokens. FlashAttention-2 reaches 335 TFLOPs/s on an H100 against 794.5 for a
    # GEMM (Dao 2023, sec. 4.1; data/hardware/h100-80gb.yaml flash_attention_tflops); at that rate, within 15%.
    rows = [(rid, r) for rid, r in split_rows(read_rows(DEFAULT_DATA_DIR / "llmfoundry_mpt_fsdp.jsonl"), "test")
            if r["model"]["name"] == "MPT-760m" and r["hardware"] == "h100-80gb" and r["num_gpus_total"] == 8]
    long_rows = [x for x in rows if x[1]["batch"]["seq_len"] >= 8192]
    assert len(long_rows) == 3
    for rid, row in long_rows:
        score = score_rows("llmfoundry_mpt_fsdp", [(rid, row)])
        assert len(score.speed) == 1 and score.speed_mape_pct < 15.0, (rid, score.speed_mape_pct)
