"""The published measurements kept in data/measurements/published: each record has a source, a known
layout and numeric metrics in SI units, so the accuracy report can read them without guessing."""

from __future__ import annotations

import json
import math

import pytest

from zerotune.predictor.catalog import data_dir, list_hardware

FILES = sorted((data_dir() / "measurements" / "published").glob("*.jsonl"))
KEYS = {"source", "value_quality", "model", "hardware", "num_gpus_total", "num_gpus_per_node", "parallel", "batch",
        "precision", "recompute", "framework", "metrics", "notes"}


def test_there_are_published_data_sets() -> None:
    assert len(FILES) >= 8


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_records_are_well_formed(path) -> None:
    hardware = set(list_hardware())
    for number, line in enumerate(path.read_text().splitlines(), 1):
        rec = json.loads(line)
        where = f"{path.name}:{number}"
        assert set(rec) == KEYS, where
        assert rec["source"].strip(), where
        assert rec["hardware"] is None or rec["hardware"] in hardware, where
        assert rec["metrics"], where
        for name, value in rec["metrics"].items():
            assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (where, name)
        par = rec["parallel"]
        if rec["num_gpus_total"] and all(par.get(k) for k in ("dp", "tp", "pp")):
            assert par["dp"] * par["tp"] * par["pp"] <= rec["num_gpus_total"], where
