"""Shared fixtures: jobs built from the catalogs."""

from __future__ import annotations

import pytest

from zerotune.predictor import ClusterSpec, Job, load_hardware, load_model


def make_job(model: str = "gpt2", hardware: str = "v100-32gb", num_nodes: int = 1, num_gpus: int = 8,
             seq_len: int = 512) -> Job:
    return Job(load_model(model), ClusterSpec(load_hardware(hardware), num_nodes, num_gpus), seq_len)


@pytest.fixture
def gpt2_job() -> Job:
    return make_job()
