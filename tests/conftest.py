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


@pytest.fixture
def budget_ends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every configuration counts as able to win, so the budget alone ends the search: for tests of what
    happens around the experiments (resume, overwrite, the optimal config), not of the stopping rule."""
    import zerotune.validate.search
    monkeypatch.setattr(zerotune.validate.search, "MIN_GAIN_REL", -0.99)
