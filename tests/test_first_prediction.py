"""benchmarks.first_prediction reads back what `zerotune tune` logs about its first predictions."""

from __future__ import annotations

import math

from benchmarks.first_prediction import SCRIPT_LIST, SCRIPTS, ds_config, read_log, tune_command

# Lines as `zerotune tune` wrote them on 2026-11-27 (the decoder script, --top_k 1), with the lines between them.
LOG = """zerotune tune: calibration profile /work/main/data/profiles/cpu.json
zerotune tune: profiling run z0_gas1_tmbspg1: measured 8.161 samples/s, predicted 9.136 (band 7.92-10.79); the \
predictions are corrected with it, weighted as a measurement within +-5% (its steps spread)
zerotune tune: experiment 1 (at most 1) z0_gas1_tmbspg6 (predicted throughput 15.37, band 13.98-16.9)
  -> ok: throughput 19.4
"""


def test_the_log_gives_both_predictions_their_bands_and_whether_the_measurement_fell_inside() -> None:
    profiling, first = read_log(LOG)
    assert profiling is not None and first is not None
    assert (profiling.config, profiling.measured, profiling.predicted) == ("z0_gas1_tmbspg1", 8.161, 9.136)
    assert profiling.inside and profiling.log_error == math.log(8.161 / 9.136)
    assert (first.config, first.measured, first.low, first.high) == ("z0_gas1_tmbspg6", 19.4, 13.98, 16.9)
    assert not first.inside  # 19.4 above 16.9
    stopped = LOG.replace("  -> ok: throughput 19.4", "  -> stopped: stopped early after 2 of 5 timed steps")
    assert read_log(stopped)[1] is None  # an experiment stopped early measured no throughput to compare
    assert read_log(stopped + "zerotune tune: experiment 2 (at most 2) z1_gas1_tmbspg6 (predicted throughput 9, "
                              "band 8-10)\n  -> ok: throughput 9.5\n")[1] is None  # nor does a later one stand in
    assert read_log("zerotune: error: training script x.py: no such file") == (None, None)


def test_each_script_gets_the_flags_of_its_style_and_nothing_the_autotuner_is_not_given() -> None:
    for script in SCRIPT_LIST:
        assert (SCRIPTS / script.file).is_file()
        cmd, doc = tune_command(script, SCRIPTS / "ds.json"), ds_config(script)
        assert "--model" not in cmd and "--seq_len" not in cmd and doc["zero_optimization"]["stage"] == [0, 1]
        if script.style == "trainer":
            assert cmd[cmd.index("--deepspeed") + 1].endswith("ds.json") and doc["train_batch_size"] == "auto"
            assert doc["autotuning"]["arg_mappings"]["train_micro_batch_size_per_gpu"] == "--per_device_train_batch_size"
        elif script.style == "flag":
            assert doc["autotuning"]["arg_mappings"] == {"train_micro_batch_size_per_gpu": "--batch_size"}
        else:
            assert cmd[cmd.index("--deepspeed") + 1] == "--deepspeed_config"
