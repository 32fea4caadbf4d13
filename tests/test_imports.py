"""One import name, `zerotune`, resolving to this repository; no module that shadows the standard library; the
predictor importable without torch."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("predictor", "calibrate", "validate")


@pytest.mark.parametrize("package", PACKAGES)
def test_package_resolves_to_this_repository(package: str) -> None:
    module = importlib.import_module(f"zerotune.{package}")
    assert Path(module.__file__).resolve().parent == REPO / package


def test_no_module_shadows_the_standard_library() -> None:
    # A script run from one of these folders puts the folder first on sys.path (calibrate/workload.py is
    # launched that way), where a module named like a standard one would replace it.
    names = {p.stem for package in PACKAGES for p in (REPO / package).glob("*.py")} | {"cli"}
    assert not names & set(sys.stdlib_module_names), names & set(sys.stdlib_module_names)


def test_predictor_imports_without_torch_or_deepspeed() -> None:
    # `predict` must run on a laptop: importing the predictor and the CLI pulls in no heavy package.
    code = ("import sys, zerotune, zerotune.predictor, zerotune.cli; "
            "heavy = [m for m in ('torch', 'deepspeed', 'xgboost', 'lightgbm') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == ""
