"""A regular (non-editable) install, as a user gets it from `pip install .`: one import name, the catalogs as
package data, and nothing that another distribution can overwrite (configobj installs a top-level `validate`)."""

from __future__ import annotations

import json
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (the machine's numpy, scipy ... visible beneath it) with zerotune installed from the source
    tree by `pip install .`, then configobj beside it; the venv's python."""
    root = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(root)
    python = root / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps"]
    subprocess.run([*pip, str(REPO)], check=True, capture_output=True, cwd=root)
    subprocess.run([*pip, "configobj"], check=True, capture_output=True, cwd=root)
    return python


def _run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_regular_install_predicts_every_catalog_model(installed: Path, tmp_path: Path) -> None:
    code = ("import json, zerotune, zerotune.cli; from pathlib import Path; "
            "print(json.dumps([str(Path(zerotune.__file__).parent), zerotune.list_models()]))")
    out = _run(installed, "-c", code, cwd=tmp_path)
    where, models = json.loads(out.stdout)
    assert Path(where).is_relative_to(installed.parent.parent), "the venv's copy, not the repository"
    assert len(models) >= 15, models
    zerotune = installed.parent / "zerotune"
    for model in models:
        run = subprocess.run([str(zerotune), "predict", "--model", model, "--hardware", "a100-80gb",
                              "--num_gpus", "8", "--zero_stage", "3", "--micro_batch", "1", "--seq_len", "512",
                              "--precision", "bf16", "--json"], capture_output=True, text=True, cwd=tmp_path)
        assert run.returncode == 0, (model, run.stderr)
        assert json.loads(run.stdout)["memory"]["total_bytes"] > 0


def test_only_one_top_level_package(installed: Path, tmp_path: Path) -> None:
    shown = _run(installed, "-m", "pip", "show", "-f", "zerotune", cwd=tmp_path).stdout
    files = [line.strip() for line in shown.split("Files:", 1)[1].splitlines() if line.strip()]
    tops = {f.split("/")[0] for f in files if not f.startswith("..") and ".dist-info" not in f}
    assert tops == {"zerotune"}, tops


def test_configobj_beside_it_changes_nothing(installed: Path, tmp_path: Path) -> None:
    code = ("import validate, zerotune.validate.tune, zerotune.calibrate.profiles; "
            "print(hasattr(validate, 'Validator'), zerotune.validate.tune.__name__)")
    out = _run(installed, "-c", code, cwd=tmp_path)
    assert out.stdout.split() == ["True", "zerotune.validate.tune"], out.stderr
