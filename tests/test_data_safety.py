"""Shipped files under data/ are never overwritten; user profiles go to the path given or the user profile folder;
tune says which profile it uses; names read from inputs never steer a write (issue 16)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

import zerotune.calibrate.run
from zerotune.calibrate.profiles import load_profile, shipped_profile_path
from zerotune.predictor import load_hardware, model_from_hf_config
from zerotune.predictor.catalog import data_dir
from zerotune.cli import main
from zerotune.validate.settings import TuneSettings
from zerotune.validate.calibration import calibration_for

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "tests" / "fixtures" / "measurements.csv"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ZEROTUNE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def test_calibrate_from_a_table_writes_the_user_folder_named_by_hardware(home: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    shipped = shipped_profile_path("cpu").read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["calibrate", "--hardware", "cpu", "--from", str(TABLE)]) == 0
    assert "a100-40gb left out" in capsys.readouterr().err  # the table's one row of another device
    written = home / "profiles" / "cpu.json"
    assert load_profile(written).hardware == "cpu"
    assert shipped_profile_path("cpu").read_bytes() == shipped
    assert main(["calibrate", "--hardware", "cpu", "--from", str(TABLE)]) == 2  # exists: needs --force
    assert "--force" in capsys.readouterr().err
    assert main(["calibrate", "--hardware", "cpu", "--from", str(TABLE), "--force"]) == 0


def test_tune_says_which_profile_it_uses(home: Path) -> None:
    settings = TuneSettings(command=None, doc={}, model="", hardware="cpu", num_gpus=2)  # type: ignore[arg-type]
    said: list[str] = []
    calibration_for(settings, said.append)
    assert str(shipped_profile_path("cpu")) in said[0]
    (home / "profiles").mkdir(parents=True)
    shutil.copy(shipped_profile_path("cpu"), home / "profiles" / "cpu.json")
    said.clear()
    calibration_for(settings, said.append)
    assert str(home / "profiles" / "cpu.json") in said[0]  # the user's own calibration, said out loud
    calibration_for(TuneSettings(command=None, doc={}, model="", hardware="v100-16gb", num_gpus=2),  # type: ignore[arg-type]
                  said.append)
    assert "no calibration profile" in said[-1]


def test_a_hardware_name_cannot_steer_a_write(tmp_path: Path) -> None:
    text = (data_dir() / "hardware" / "cpu.yaml").read_text().replace("name: cpu", "name: ../../evil")
    (tmp_path / "hw.yaml").write_text(text)
    with pytest.raises(ValueError, match="name '../../evil'"):
        load_hardware(str(tmp_path / "hw.yaml"))


def test_calibrate_without_num_gpus_takes_the_node_size(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`zerotune calibrate --hardware cpu` without --num_gpus read a field that does not exist (AttributeError)."""
    seen: dict[str, object] = {}

    class Stop(Exception):
        pass

    def stop(run_dir: Path, **kwargs: object) -> None:
        seen.update(kwargs)
        raise Stop
    monkeypatch.setattr(zerotune.calibrate.run, "run_microbenchmarks", stop)
    with pytest.raises(Stop):
        zerotune.calibrate.run.measure(hardware="cpu", num_gpus=None, num_nodes=None, hostfile=None, model=None, seq_len=None,
                              quick=True, max_probes=1, timeout_s=60, progress=lambda line: None,
                              run_root=tmp_path)
    assert seen["num_gpus"] == load_hardware("cpu").num_devices_per_node


@pytest.mark.parametrize("file,doc,name", [
    ("models/config.json", {"model_type": "llama"}, "llama-models"),
    ("models/tiny-llama.json", {"model_type": "llama"}, "tiny-llama"),
    ("models/config.json", {"model_type": "llama", "_name_or_path": "meta-llama/Llama-2-7b-hf"},
     "meta-llama/Llama-2-7b-hf"),
])
def test_a_hugging_face_config_is_named_from_its_file(tmp_path: Path, file: str, doc: dict[str, str],
                                                      name: str) -> None:
    path = tmp_path / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**doc, "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 64}))
    assert model_from_hf_config(path).name == name
