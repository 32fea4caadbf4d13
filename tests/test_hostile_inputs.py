"""Every user mistake in the hostile-input table ends the same way: exit 2, one line on stderr naming the field
at fault, no traceback, nothing written outside the run's own folder (issue 16)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_cases import CASES, Case, materialise
from hypothesis import example, given, settings
from hypothesis import strategies as st

import zerotune.calibrate.run
import zerotune.validate.tune
from zerotune.predictor import parse_ds_config
from zerotune.predictor.catalog import data_dir
from zerotune.predictor.space import space_from_ds_config
from zerotune.cli import main

REPO = Path(__file__).resolve().parent.parent


def _snapshot() -> dict[str, tuple[int, int]]:
    """Size and modification time of every file under data/ and at the repository's top level."""
    files = [p for p in data_dir().rglob("*") if p.is_file()] + [p for p in REPO.iterdir() if p.is_file()]
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in files} | {
        str(p): (0, 0) for p in REPO.iterdir()}


class _Reached(BaseException):
    """Raised if a hostile case gets as far as running something: its checks came too late."""


def _refuse_to_run(*args: object, **kwargs: object) -> None:
    raise _Reached("a hostile input reached a run")


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZEROTUNE_HOME", str(tmp_path / "home"))
    for module, name in ((zerotune.validate.tune, "_search"), (zerotune.validate.tune, "profile_model"),
                         (zerotune.calibrate.run, "run_microbenchmarks")):
        monkeypatch.setattr(module, name, _refuse_to_run)
    return tmp_path


def _run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors
        return int(exc.code or 0)


def test_the_table_is_wide() -> None:
    assert len(CASES) >= 100
    verbs = {case.argv[0] for case in CASES}
    assert verbs == {"predict", "calibrate", "tune"}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_line_and_exit_2(case: Case, sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _snapshot()
    rc = _run(materialise(case, sandbox))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("zerotune: error: "), err
    assert case.needle in lines[0], f"the error does not name {case.needle!r}: {lines[0]}"
    assert "Traceback" not in err and "internal error" not in err
    assert _snapshot() == before, "a file outside the case's folder was written"


@pytest.mark.parametrize("case_id", ["predict-num_gpus-over-node", "calibrate-huge-field", "tune-timeout-nan",
                                     "predict-ds-max-mbs-1e9"])
def test_hostile_input_as_a_user_runs_it(case_id: str, tmp_path: Path) -> None:
    """The same through the installed entry point's module, in a fresh interpreter."""
    case = next(c for c in CASES if c.id == case_id)
    env = {**os.environ, "PYTHONPATH": str(REPO), "ZEROTUNE_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "zerotune.cli", *materialise(case, tmp_path)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and case.needle in proc.stderr


def test_an_unexpected_error_is_one_line_with_where_to_report(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("float division by zero")
    monkeypatch.setattr("zerotune.validate.plan.single", broken)
    assert main(["predict"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error: ZeroDivisionError" in err and "report" in err
    assert main(["predict", "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


_INNER_KEYS = ["stage", "reduce_bucket_size", "offload_optimizer", "offload_param", "overlap_comm", "device", "enabled",
               "mp_size", "stages", "type", "params", "momentum", "metric", "max_train_micro_batch_size_per_gpu",
               "start_profile_step", "grad_accum_dtype", "partition_activations", "cpu_offload", "fast"]
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5) | st.just("auto"),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_INNER_KEYS), inner,
                                                                                  max_size=3),
                     max_leaves=8)
_KEYS = ["train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size", "zero_optimization",
         "fp16", "bf16", "autotuning", "pipeline", "optimizer", "activation_checkpointing", "data_types"]


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(_KEYS), _JSON, max_size=4), st.integers(1, 64))
@example({"optimizer": {"type": "", "params": True}}, 1)  # found by CI's draw: optimizer.params not an object
def test_any_ds_config_is_parsed_or_refused_with_a_value_error(doc: dict[str, object], world_size: int) -> None:
    try:
        parse_ds_config(doc, world_size=world_size, hidden_size=768)
    except ValueError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_KEYS), _JSON, max_size=4), st.integers(1, 64))
def test_any_tuning_space_is_read_or_refused_with_a_value_error(doc: dict[str, object], world_size: int) -> None:
    try:
        space_from_ds_config(doc, world_size=world_size, hidden_size=768)
    except ValueError:
        pass


def test_a_train_batch_size_beyond_int64_is_refused_in_one_line() -> None:
    # Found by the property test above (CI, 2026-11-27): train_batch_size 2**63 overflowed the space's int64 grid
    # (OverflowError from numpy) instead of naming the key
    with pytest.raises(ValueError, match="ds_config train_batch_size .* is above the .* zerotune accepts"):
        space_from_ds_config({"train_batch_size": 2**63}, world_size=1, hidden_size=768)


@pytest.mark.parametrize("flag, name, text", [
    ("--hardware", "hw.yaml", "name: x\n"), ("--deepspeed", "ds.json", "{}"), ("--model", "config.json", "{}")])
def test_a_file_saved_as_utf16_is_named_in_one_line(flag: str, name: str, text: str, sandbox: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Some Windows editors save UTF-16: the decoder's own message had named neither the file nor the fix."""
    (sandbox / name).write_text(text, encoding="utf-16")
    assert _run(["predict", flag, str(sandbox / name)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{name}: not UTF-8 text" in err and "save the file as UTF-8" in err
