"""predictor, calibrate and validate must be this repository's packages: configobj installs a top-level
`validate` module, and a stale install could shadow any of them."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("package", ["predictor", "calibrate", "validate"])
def test_package_resolves_to_this_repository(package: str) -> None:
    module = importlib.import_module(package)
    assert Path(module.__file__).resolve().parent == REPO / package


def test_predictor_imports_without_torch_or_deepspeed() -> None:
    # `predict` must run on a laptop: importing the predictor and the CLI pulls in no heavy package.
    code = ("import sys, predictor, zerotune.cli; "
            "heavy = [m for m in ('torch', 'deepspeed', 'xgboost', 'lightgbm') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == ""
