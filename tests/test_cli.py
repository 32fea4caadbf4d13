"""`zerotune predict` as a user runs it: the table, the JSON, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = ["--model", "gpt2-large", "--hardware", "v100-32gb", "--num_gpus", "16", "--zero_stage", "1",
           "--micro_batch", "3"]


def zerotune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zerotune.cli", *args], capture_output=True, text=True)


def test_predict_prints_breakdown_and_verdict() -> None:
    out = zerotune("predict", *EXAMPLE)
    assert out.returncode == 0, out.stderr
    for term in ("parameters", "gradients", "optimizer_states", "activations", "logits", "comm_buckets", "total"):
        assert term in out.stdout
    assert re.search(r"^(FITS|DOES NOT FIT): headroom [+-]\d+\.\d\d GiB", out.stdout, re.M)
    assert "z1_gas1_tmbspg3" in out.stdout


def test_predict_json_has_the_documented_keys() -> None:
    out = zerotune("predict", *EXAMPLE, "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["name"] == "z1_gas1_tmbspg3"
    assert doc["config"]["train_micro_batch_size_per_gpu"] == 3 and doc["config"]["zero_optimization"]["stage"] == 1
    mem = doc["memory"]
    assert sum(mem["breakdown"].values()) == pytest.approx(mem["total_bytes"], rel=1e-9)
    assert mem["fits"] == (mem["total_bytes"] <= mem["capacity_bytes"])
    time = doc["time"]
    assert sum(time["breakdown"].values()) == pytest.approx(time["step_s"], rel=1e-9)
    assert doc["throughput_samples_per_s"] == pytest.approx(48 / time["step_s"], rel=1e-9)  # train_batch_size 48
    assert doc["tflops_per_gpu"] > 0 and doc["latency_ms"] == pytest.approx(time["step_s"] * 1e3)


def test_flags_override_the_ds_config(tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 32, "zero_optimization": {"stage": 3}, "fp16": {"enabled": True}}))
    doc = json.loads(zerotune("predict", "--deepspeed", str(cfg), "--num_gpus", "8", "--micro_batch", "2",
                              "--zero_stage", "2", "--json").stdout)
    # DeepSpeed keeps train_batch_size and derives the accumulation: 32 / (2 x 8 GPUs) = 2
    assert doc["name"] == "z2_gas2_tmbspg2" and doc["precision"] == "fp16"
    assert doc["config"]["train_batch_size"] == 32


def test_a_micro_batch_flag_that_does_not_divide_the_global_batch_is_refused(tmp_path: Path) -> None:
    """A flag that changes one of the batch pair keeps the ds_config's train_batch_size, as DeepSpeed would (it was
    dropped silently: --micro_batch 3 on 2 GPUs predicted a global batch of 6 for a ds_config of 16)."""
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2,
                               "gradient_accumulation_steps": 4}))
    result = zerotune("predict", "--deepspeed", str(cfg), "--num_gpus", "2", "--micro_batch", "3")
    assert result.returncode == 2 and "train_batch_size 16" in result.stderr
    doc = json.loads(zerotune("predict", "--deepspeed", str(cfg), "--num_gpus", "2", "--grad_accum", "2",
                              "--json").stdout)
    assert doc["name"] == "z0_gas2_tmbspg4" and doc["config"]["train_batch_size"] == 16
    both = json.loads(zerotune("predict", "--deepspeed", str(cfg), "--num_gpus", "2", "--micro_batch", "3",
                               "--grad_accum", "1", "--json").stdout)
    assert both["config"]["train_batch_size"] == 6  # both given: the global batch follows them


def test_hugging_face_config_json_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 12, "n_embd": 768,
                                                      "n_head": 12, "vocab_size": 50257, "n_positions": 1024}))
    doc = json.loads(zerotune("predict", "--model", str(tmp_path / "config.json"), "--json").stdout)
    assert doc["model"]["num_params"] == 124_439_808
    folder = json.loads(zerotune("predict", "--model", str(tmp_path), "--json").stdout)  # as from_pretrained
    assert folder["model"]["num_params"] == 124_439_808


def _bad_ds_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "ds_config.json"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case, args, needle", [
    ("unknown model", ["--model", "gpt3-large"], "--model 'gpt3-large': unknown model"),
    ("unknown GPU", ["--hardware", "a100-90gb"], "--hardware 'a100-90gb': unknown hardware"),
    ("micro-batch 0", ["--micro_batch", "0"], "--micro_batch must be at least 1"),
    ("missing file", ["--deepspeed", "/nonexistent/ds.json"], "no such file"),
    ("bf16 on V100", ["--precision", "bf16", "--hardware", "v100-32gb"], "no bf16 support"),
    ("sequence too long", ["--seq_len", "4096"], "exceeds gpt2's max_position_embeddings 1024"),
])
def test_bad_flags_give_one_line_and_exit_2(case: str, args: list[str], needle: str) -> None:
    out = zerotune("predict", *args)
    assert out.returncode == 2, case
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("case, text, needle", [
    ("malformed JSON", '{"zero_optimization": {"stage": 2,}}', "malformed JSON at line 1"),
    ("inconsistent batch", '{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, '
                           '"gradient_accumulation_steps": 1}', "train_batch_size 10 != train_micro_batch_size"),
    ("unknown zero key", '{"zero_optimization": {"stage": 2, "overlap_com": true}}', "did you mean 'overlap_comm'"),
    ("not an object", '[1, 2]', "must be a JSON object"),
])
def test_bad_ds_config_gives_one_line_and_exit_2(tmp_path: Path, case: str, text: str, needle: str) -> None:
    out = zerotune("predict", "--deepspeed", _bad_ds_config(tmp_path, text))
    assert out.returncode == 2, case
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr, out.stderr


def test_unknown_top_level_key_warns_and_still_predicts(tmp_path: Path) -> None:
    out = zerotune("predict", "--deepspeed", _bad_ds_config(tmp_path, '{"steps_per_prnt": 10}'))
    assert out.returncode == 0
    assert "warning" in out.stderr and "steps_per_print" in out.stderr


def test_a_warning_is_printed_once_however_often_the_ds_config_is_parsed(tmp_path: Path) -> None:
    """A Hugging Face Trainer's ds_config ("auto" precision) is parsed for the space and for every variant; the user
    reads its warning once."""
    doc = {"train_micro_batch_size_per_gpu": [1, 2], "zero_optimization": {"stage": [1, 2, 3]},
           "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}
    out = zerotune("predict", "--rank", "--deepspeed", _bad_ds_config(tmp_path, json.dumps(doc)))
    assert out.returncode == 0, out.stderr
    for name in ("fp16", "bf16"):
        assert out.stderr.count(f'ds_config {name}.enabled is "auto"') == 1


@pytest.mark.parametrize("signum, code", [("SIGTERM", 143), ("SIGHUP", 129)])
def test_a_terminated_verb_exits_128_plus_the_signal_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str], signum: str,
                                                                 code: int) -> None:
    """SIGTERM (`timeout`, a scheduler's limit) and SIGHUP reach a verb as Ctrl-C's KeyboardInterrupt does, so the
    launcher's clean-up runs (calibrate.launch.terminate_as_interrupt); the CLI says so in one line, no traceback,
    and exits as a shell reports a signal (128 + its number); afterwards the signal's handler is what it was."""
    import os
    import signal

    import zerotune.cli as cli
    before = signal.getsignal(getattr(signal, signum))

    def killed(_args: object) -> int:
        os.kill(os.getpid(), getattr(signal, signum))
        return 0
    monkeypatch.setitem(cli.__dict__, "_predict", killed)
    assert cli.main(["predict", "--model", "gpt2"]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted" in err and "Traceback" not in err
    assert signal.getsignal(getattr(signal, signum)) == before
