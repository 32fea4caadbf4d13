"""zerotune.calibrate.ingest: DeepSpeed autotuning folders and user tables become the Measurements they describe."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from zerotune.calibrate.ingest import TABLE_COLUMNS, read_measurements
from zerotune.calibrate.measurement import append_jsonl

FIXTURES = Path(__file__).parent / "fixtures"
AUTOTUNING = FIXTURES / "ds_autotuning_results"
CSV = FIXTURES / "measurements.csv"
HEADER = ("model,hardware,num_nodes,num_gpus,zero_stage,micro_batch,grad_accum,seq_len,precision,status,"
          "throughput_samples_per_s")


def _autotuning(path: Path = AUTOTUNING):
    return {m.source.split("/")[-1]: m for m in read_measurements(path, "gpt2-large", "a100-40gb", 1024)}


def test_autotuning_folder_reads_every_experiment_that_ran() -> None:
    runs = _autotuning()
    # The profiling run is not a timing; the six tuning experiments are (fixture README table).
    assert sorted(runs) == ["z1_gas1_tmbspg2", "z1_gas1_tmbspg4", "z1_gas1_tmbspg8", "z2_gas1_tmbspg4",
                            "z2_gas2_tmbspg2", "z3_gas1_tmbspg4"]
    assert {name: m.status for name, m in runs.items()} == {
        "z1_gas1_tmbspg2": "ok", "z1_gas1_tmbspg4": "ok", "z1_gas1_tmbspg8": "oom", "z2_gas1_tmbspg4": "ok",
        "z2_gas2_tmbspg2": "ok", "z3_gas1_tmbspg4": "failed"}
    for name, m in runs.items():  # the name encodes stage, accumulation and micro-batch
        assert name == f"z{m.config.zero.stage}_gas{m.config.gradient_accumulation_steps}_tmbspg" \
                       f"{m.config.train_micro_batch_size_per_gpu}"
        assert (m.num_nodes, m.num_gpus_per_node, m.seq_len, m.config.precision) == (1, 4, 1024, "fp16")


def test_autotuning_metrics_become_seconds() -> None:
    m = _autotuning()["z1_gas1_tmbspg4"]
    metrics = json.loads((AUTOTUNING / "autotuning_results/z1_gas1_tmbspg4/metrics.json").read_text())
    assert m.throughput_samples_per_s == metrics["throughput"] == pytest.approx(68.9245, rel=1e-5)
    assert m.step_s == pytest.approx(16 / 68.9245, rel=1e-5)  # 4 per GPU x 4 GPUs per step
    # metrics.json timers are microseconds (DeepSpeed scales millisecond means by 1000).
    assert m.forward_s == pytest.approx(metrics["fwd"] * 1e-6, rel=1e-9)
    assert m.backward_s == pytest.approx(metrics["bwd"] * 1e-6, rel=1e-9)
    gas2 = _autotuning()["z2_gas2_tmbspg2"]
    # The step timer is a mean over micro-steps: per optimizer step it counts gas times.
    assert gas2.samples_per_step == 16 and gas2.optimizer_s == pytest.approx(2 * 2109.294e-6, rel=1e-6)


def test_autotuning_failures_keep_their_reason() -> None:
    runs = _autotuning()
    assert runs["z1_gas1_tmbspg8"].reason.startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert "NCCL error" in runs["z3_gas1_tmbspg4"].reason
    assert runs["z1_gas1_tmbspg8"].throughput_samples_per_s is None


def test_autotuning_results_dir_itself_and_unstarted_experiments(tmp_path: Path) -> None:
    results = tmp_path / "autotuning_results"
    shutil.copytree(AUTOTUNING / "autotuning_results", results)
    (results / "z3_gas1_tmbspg4" / "stderr.log").unlink()  # scheduled, never launched
    with pytest.warns(UserWarning, match="never ran and are left out: z3_gas1_tmbspg4"):
        runs = _autotuning(results)
    assert len(runs) == 5


def test_autotuning_needs_model_hardware_and_seq_len() -> None:
    with pytest.raises(ValueError, match="does not record the model; pass --model"):
        read_measurements(AUTOTUNING, hardware="a100-40gb", seq_len=1024)
    with pytest.raises(ValueError, match="does not record the seq_len; pass --seq_len"):
        read_measurements(AUTOTUNING, model="gpt2-large", hardware="a100-40gb")
    # model_info.json counted 774M parameters: gpt2 (124M) is the wrong model.
    with pytest.raises(ValueError, match="pass the model the autotuning ran"):
        read_measurements(AUTOTUNING, "gpt2", "a100-40gb", 1024)


def test_csv_rows_become_measurements() -> None:
    rows = read_measurements(CSV)
    assert [m.status for m in rows] == ["ok"] * 5 + ["oom", "failed"]
    first, buckets, offload = rows[0], rows[1], rows[4]
    assert (first.model, first.hardware, first.world_size, first.seq_len) == ("gpt2", "cpu", 2, 128)
    assert first.throughput_samples_per_s == 2.91 and first.peak_memory_bytes == 1851293696
    assert first.measured_step_s == pytest.approx(2 / 2.91)
    assert (buckets.config.zero.stage, buckets.config.train_micro_batch_size_per_gpu,
            buckets.config.gradient_accumulation_steps) == (1, 2, 2)
    assert buckets.config.zero.reduce_bucket_size_elems == buckets.config.zero.allgather_bucket_size_elems == 5 * 10**7
    assert rows[3].config.precision == "bf16" and rows[3].config.activation_checkpointing.enabled
    assert rows[3].config.zero.overlap_comm  # DeepSpeed's stage-3 default when the column is empty
    assert offload.config.zero.offload_optimizer.device == "cpu"
    assert rows[5].reason == "capped at 20 GiB RSS: MemoryError" and rows[6].source == f"{CSV}:8"


def _csv(tmp_path: Path, *lines: str, header: str = HEADER) -> Path:
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


@pytest.mark.parametrize("row, message", [
    ("gpt2,cpu,1,2,4,1,1,128,fp32,ok,2.0", ":3: column zero_stage '4' is not one of 0, 1, 2, 3; fix the value"),
    ("gpt2,cpu,1,2,0,two,1,128,fp32,ok,2.0", ":3: column micro_batch 'two' is not an integer; fix the value"),
    ("gpt2,cpu,1,2,0,1,1,128,fp32,ok,", ":3: column throughput_samples_per_s is missing for a run with status ok"),
    ("gpt2,cpu,1,2,0,1,1,128,fp32,ok,-3", ":3: column throughput_samples_per_s -3.0 must be a positive number"),
    ("gpt2,cpu,1,2,0,1,1,128,fp8,ok,2.0", ":3: column precision 'fp8' is not one of fp32, fp16, bf16"),
    ("gpt2,cpu,1,2,0,1,1,128,fp32,crashed,", ":3: column status 'crashed' is not one of ok, oom, timeout, failed"),
    ("gtp2,cpu,1,2,0,1,1,128,fp32,ok,2.0", ":3: column model 'gtp2': .*did you mean 'gpt2'"),
    ("gpt2,cpu,0,2,0,1,1,128,fp32,ok,2.0", ":3: column num_nodes 0 is below 1; fix the value"),
    ("gpt2,cpu,1,2,0,1,1,,fp32,ok,2.0", ":3: column seq_len is missing; add a value"),
    ("gpt2,cpu,1,2,0,1,1,128,fp32,ok,2.0,7", ":3: more values than columns"),
])
def test_bad_csv_rows_give_one_line_errors(tmp_path: Path, row: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        read_measurements(_csv(tmp_path, "gpt2,cpu,1,2,0,1,1,128,fp32,ok,2.0", row))
    assert "\n" not in str(info.value) and str(info.value).startswith(str(tmp_path / "runs.csv"))


def test_unknown_column_and_caller_defaults(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=":1: unknown column 'zero_stgae' \\(did you mean 'zero_stage'\\?\\)"):
        read_measurements(_csv(tmp_path, header=HEADER.replace("zero_stage", "zero_stgae")))
    header = "num_nodes,num_gpus,zero_stage,micro_batch,grad_accum,precision,status,throughput_samples_per_s"
    rows = read_measurements(_csv(tmp_path, "1,2,2,4,1,fp32,ok,3.5", header=header), "gpt2", "cpu", 256)
    assert (rows[0].model, rows[0].hardware, rows[0].seq_len) == ("gpt2", "cpu", 256)
    assert set(header.split(",")) < set(TABLE_COLUMNS)


def test_jsonl_of_rows_and_of_measurement_records(tmp_path: Path) -> None:
    table = tmp_path / "rows.jsonl"
    table.write_text(json.dumps({"model": "gpt2", "hardware": "cpu", "num_nodes": 1, "num_gpus": 2, "zero_stage": 3,
                                 "micro_batch": 2, "grad_accum": 1, "seq_len": 128, "precision": "fp32",
                                 "status": "ok", "throughput_samples_per_s": 1.5}) + "\n")
    rows = read_measurements(table)
    assert rows[0].config.zero.stage == 3 and rows[0].source == f"{table}:1"
    records = tmp_path / "records.jsonl"
    append_jsonl(records, read_measurements(CSV))
    assert read_measurements(records) == read_measurements(CSV)
    with pytest.raises(ValueError, match="unknown kind of file"):
        read_measurements(FIXTURES / "ds_autotuning_results" / "README.md")


def test_a_csv_saved_by_excel_reads_like_any_other(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" starts the file with a byte-order mark, and Windows names it .CSV: the first column
    was read as '\\ufeffmodel' and refused as unknown."""
    excel = tmp_path / "runs.CSV"
    excel.write_bytes(b"\xef\xbb\xbf" + CSV.read_bytes())
    def rows(path: Path) -> list[object]:
        return [dataclasses.replace(m, source=m.source.split(":")[-1]) for m in read_measurements(path)]
    assert rows(excel) == rows(CSV) and len(rows(CSV)) > 1
