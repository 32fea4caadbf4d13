"""zerotune.calibrate.microbench: the document shape the fitting code reads, nccl-tests' bus bandwidth, a real quick run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from zerotune.calibrate.microbench import bus_bandwidth_bytes_per_s, collective_sizes_bytes, matmul_shapes

REPO = Path(__file__).resolve().parent.parent
CPU_ENV = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}


def test_bus_bandwidth_follows_nccl_tests() -> None:
    # nccl-tests PERFORMANCE.md: all_reduce busbw = algbw x 2(n-1)/n; all_gather / reduce_scatter x (n-1)/n
    assert bus_bandwidth_bytes_per_s("all_reduce", 1e9, 1.0, 8) == pytest.approx(1.75e9)
    assert bus_bandwidth_bytes_per_s("all_gather", 1e9, 1.0, 8) == pytest.approx(0.875e9)
    assert bus_bandwidth_bytes_per_s("reduce_scatter", 1e9, 0.5, 2) == pytest.approx(1e9)


def test_quick_mode_is_a_subset_of_few_sizes() -> None:
    assert len(matmul_shapes(True)) <= 3 and len(collective_sizes_bytes(True)) <= 3
    assert max(collective_sizes_bytes(False)) == 256 * 2**20  # large enough to be bandwidth-bound


def test_importing_microbench_pulls_in_no_torch() -> None:
    code = "import sys, zerotune.calibrate.microbench, zerotune.calibrate.launch, zerotune.calibrate.probe; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


@pytest.mark.deepspeed
def test_quick_run_on_two_cpu_ranks(tmp_path: Path) -> None:
    from zerotune.calibrate.microbench import run_microbenchmarks
    doc = run_microbenchmarks(tmp_path / "mb", num_gpus=2, quick=True, env=CPU_ENV, timeout_s=300)
    assert doc["device"] == "cpu"
    assert {r["dtype"] for r in doc["matmul"]} >= {"fp32", "bf16"}
    for r in doc["matmul"]:
        assert set(r) == {"m", "n", "k", "dtype", "seconds", "flops_per_s"}
        assert r["flops_per_s"] == pytest.approx(2 * r["m"] * r["n"] * r["k"] / r["seconds"])
    fp32 = max(r["flops_per_s"] for r in doc["matmul"] if r["dtype"] == "fp32")
    # one AVX-512 core: data/hardware/cpu.yaml peak 0.17 TFLOP/s (measured 0.144 at 2048^3); loose bounds for
    # a shared machine and other x86 CPUs
    assert 5e9 < fp32 < 1e12
    assert {(r["op"], r["num_ranks"], r["link"]) for r in doc["collectives"]} == {
        (op, 2, "intra_node") for op in ("all_reduce", "all_gather", "reduce_scatter")}
    assert len(doc["collectives"]) == 3 * len(collective_sizes_bytes(True))
    # gloo over loopback: cpu.yaml measured 1.0 GB/s at 256 MiB; 16 MiB should reach tens of MB/s at least
    big = [r for r in doc["collectives"] if r["bytes"] == 16 * 2**20]
    assert all(1e7 < r["bus_bandwidth_bytes_per_s"] < 1e11 for r in big)
    # cpu.yaml: single-thread copy 23 GB/s read+write; accept a shared, slower or faster host
    assert 1e9 < doc["memory_bandwidth_bytes_per_s"] < 2e11
    assert 5e8 < doc["host_to_device_bytes_per_s"] < 2e11
    assert doc["environment"]["deepspeed"] and doc["environment"]["accelerator"] == "cpu"
