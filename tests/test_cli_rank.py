"""`zerotune predict --rank` and the what-if sweeps as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_cli import zerotune

JOB = ["--model", "gpt2-large", "--hardware", "v100-32gb", "--num_gpus", "16", "--precision", "fp16"]
SINGLE_KEYS = {"name", "model", "hardware", "config", "memory", "time", "throughput_samples_per_s", "latency_ms",
               "tflops_per_gpu", "tokens_per_s", "mfu", "calibrated"}


def test_rank_json_entries_have_the_single_prediction_keys() -> None:
    out = zerotune("predict", *JOB, "--rank", "--top", "10", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    entries = doc["ranking"]
    assert len(entries) == 10 and doc["num_fit"] <= doc["num_configs"]
    for entry in entries:
        assert SINGLE_KEYS <= set(entry)
        assert entry["memory"]["fits"] and entry["metric_low"] <= entry["metric_value"] <= entry["metric_high"]
        assert sum(entry["time"]["breakdown"].values()) == pytest.approx(entry["time"]["step_s"], rel=1e-9)
    values = [e["throughput_samples_per_s"] for e in entries]
    assert values == sorted(values, reverse=True)
    assert len({e["name"] for e in entries}) == 10


def test_rank_table_and_ds_config_lists() -> None:
    out = zerotune("predict", *JOB, "--rank", "--top", "5")
    assert out.returncode == 0, out.stderr
    assert "configurations fit" in out.stdout and "samples/s" in out.stdout
    assert len([line for line in out.stdout.splitlines() if line[:3].strip().isdigit()]) == 5


def test_rank_reads_lists_from_the_ds_config(tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": [1, 2], "fp16": {"enabled": True},
                               "zero_optimization": {"stage": [1, 2]}, "autotuning": {"metric": "latency"}}))
    out = zerotune("predict", "--model", "gpt2-large", "--num_gpus", "16", "--deepspeed", str(cfg), "--rank",
                   "--explore", "none", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["metric"] == "latency"
    assert {e["config"]["zero_optimization"]["stage"] for e in doc["ranking"]} <= {1, 2}
    assert {e["config"]["train_micro_batch_size_per_gpu"] for e in doc["ranking"]} <= {1, 2}
    latencies = [e["latency_ms"] for e in doc["ranking"]]
    assert latencies == sorted(latencies)


def test_scaling_sweep_reports_efficiency_per_size() -> None:
    out = zerotune("predict", "--model", "gpt2-xl", "--hardware", "a100-80gb", "--num_gpus", "8", "--zero_stage",
                   "2", "--micro_batch", "4", "--precision", "bf16", "--num_nodes", "1,2,4,8", "--json")
    assert out.returncode == 0, out.stderr
    points = json.loads(out.stdout)["scaling"]
    assert [p["num_nodes"] for p in points] == [1, 2, 4, 8]
    assert points[0]["scaling_efficiency"] == pytest.approx(1.0)
    # Going from NVLink inside a node to the inter-node network costs efficiency; it never exceeds linear.
    assert all(0 < p["scaling_efficiency"] <= 1.0 + 1e-9 for p in points)
    assert points[1]["scaling_efficiency"] < 1.0
    text = zerotune("predict", "--model", "gpt2-xl", "--hardware", "a100-80gb", "--num_gpus", "8", "--rank",
                    "--precision", "bf16", "--num_nodes", "1,2")
    assert text.returncode == 0 and "scaling" in text.stdout, text.stderr


def test_hardware_swap_side_by_side() -> None:
    out = zerotune("predict", "--model", "llama-2-7b", "--num_gpus", "8", "--precision", "bf16", "--rank",
                   "--hardware", "a100-80gb,h100-80gb", "--json")
    assert out.returncode == 0, out.stderr
    points = json.loads(out.stdout)["hardware_comparison"]
    assert [p["hardware"] for p in points] == ["a100-80gb", "h100-80gb"]
    assert points[1]["throughput_samples_per_s"] > points[0]["throughput_samples_per_s"]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    png = tmp_path / "space.png"
    out = zerotune("predict", *JOB, "--rank", "--top", "3", "--plot", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args,needle", [
    (["--rank", "--num_nodes", "1,2", "--hardware", "a100-80gb,h100-80gb"], "one at a time"),
    (["--plot", "x.png"], "--rank"),
    (["--rank", "--explore", "nvme"], "--explore"),
    (["--num_nodes", "1,0"], "--num_nodes"),
])
def test_rank_usage_errors_are_one_line(args, needle) -> None:
    out = zerotune("predict", "--model", "gpt2", *args)
    assert out.returncode == 2
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_nothing_fits_says_what_comes_closest() -> None:
    out = zerotune("predict", "--model", "llama-2-70b", "--hardware", "v100-16gb", "--num_gpus", "2",
                   "--precision", "fp16", "--rank", "--explore", "none", "--zero_stage", "1")
    assert out.returncode == 2
    assert "least memory" in out.stderr and len(out.stderr.strip().splitlines()) == 1
