"""Hostile inputs a user can give zerotune: each must end in one line on stderr naming the field, exit 2.

Used by test_hostile_inputs.py. A case is the command line plus the files it refers to; `{tmp}` in the
command line and in the files is the case's own folder, where its files are written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from zerotune.predictor.catalog import data_dir

__all__ = ["Case", "CASES", "materialise"]


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    files: dict[str, str] = field(default_factory=dict)
    needle: str = ""
    """A word the error line must contain (the field or flag at fault)."""


def materialise(case: Case, tmp: Path) -> list[str]:
    for name, text in case.files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{tmp}", str(tmp)))
    return [arg.replace("{tmp}", str(tmp)) for arg in case.argv]


def _yaml(doc: dict[str, object]) -> str:
    return "".join(f"{k}: {v}\n" for k, v in doc.items())


def _catalog(kind: str, name: str) -> dict[str, str]:
    lines = (data_dir() / kind / f"{name}.yaml").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines)  # type: ignore[misc]


_HW = _catalog("hardware", "a100-80gb")
_MODEL = _catalog("models", "gpt2")
_HF = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}
_CSV_HEADER = ("model,hardware,num_nodes,num_gpus,zero_stage,micro_batch,grad_accum,seq_len,precision,status,"
               "throughput_samples_per_s,peak_memory_bytes")
_CSV_ROW = dict(model="gpt2", hardware="cpu", num_nodes="1", num_gpus="2", zero_stage="0", micro_batch="1",
                grad_accum="1", seq_len="128", precision="fp32", status="ok", throughput_samples_per_s="2.9",
                peak_memory_bytes="1851293696")


def _csv(**changes: str) -> str:
    row = {**_CSV_ROW, **changes}
    return _CSV_HEADER + "\n" + ",".join(row[c] for c in _CSV_HEADER.split(",")) + "\n"


def _predict(case_id: str, *flags: str, needle: str = "", **files: str) -> Case:
    return Case(f"predict-{case_id}", ("predict", *flags), dict(files), needle)


def _hardware_cases() -> list[Case]:
    """Every number of a hardware YAML out of range: negative, NaN, infinite, a string, the wrong unit."""
    out = []
    bad = {"neg": "-1", "nan": ".nan", "inf": ".inf", "text": "'989e12'"}
    numeric = [k for k in _HW if k not in ("name", "description", "kind", "source") and not k.endswith("_source")]
    for key in numeric:
        for tag, value in bad.items():
            if tag == "neg" or key in ("memory_gib", "bf16_tflops", "intra_node_latency_us", "gpus_per_node"):
                out.append(_predict(f"hw-{key}-{tag}", "--hardware", "{tmp}/hw.yaml", needle=key,
                                    **{"hw.yaml": _yaml({**_HW, key: value})}))
    wrong_unit = {"bf16_tflops": "9.89e+14", "memory_gib": "85899345920", "memory_bandwidth_gb_per_s": "2.039e+12",
                  "intra_node_latency_us": "8.0e+6", "gpus_per_node": "0", "runtime_reserved_gib": "90"}
    for key, value in wrong_unit.items():
        out.append(_predict(f"hw-{key}-unit", "--hardware", "{tmp}/hw.yaml", needle=key,
                            **{"hw.yaml": _yaml({**_HW, key: value})}))
    out.append(_predict("hw-gpus-fraction", "--hardware", "{tmp}/hw.yaml", needle="gpus_per_node",
                        **{"hw.yaml": _yaml({**_HW, "gpus_per_node": "1.5"})}))
    for tag, value in (("text", "'false'"), ("int", "0")):  # only YAML's true / false say it
        out.append(_predict(f"hw-comm_compute_overlap-{tag}", "--hardware", "{tmp}/hw.yaml",
                            needle="comm_compute_overlap", **{"hw.yaml": _yaml({**_HW, "comm_compute_overlap": value})}))
    out.append(_predict("hw-kind", "--hardware", "{tmp}/hw.yaml", needle="kind",
                        **{"hw.yaml": _yaml({**_HW, "kind": "tpu"})}))
    out.append(_predict("hw-name-path", "--hardware", "{tmp}/hw.yaml", needle="name",
                        **{"hw.yaml": _yaml({**_HW, "name": "../../evil"})}))
    out.append(_predict("hw-not-mapping", "--hardware", "{tmp}/hw.yaml", needle="hw.yaml", **{"hw.yaml": "- 1\n"}))
    out.append(_predict("hw-bad-yaml", "--hardware", "{tmp}/hw.yaml", needle="hw.yaml", **{"hw.yaml": "name: [\n"}))
    out.append(_predict("hw-unknown", "--hardware", "a100-90gb", needle="--hardware"))
    out.append(_predict("hw-missing-file", "--hardware", "{tmp}/none.yaml", needle="--hardware"))
    return out


def _model_cases() -> list[Case]:
    out = []
    for key, values in {"num_layers": ["0", "-3", "1000000000", ".nan", "'twelve'", "1.5"],
                        "hidden_size": ["-768", "1.0e+12", ".inf", "'wide'"], "num_heads": ["0", "7"],
                        "vocab_size": ["0", "1.0e+15", "'big'"], "ffn_hidden_size": ["-1"],
                        "max_position_embeddings": ["0", "'long'"],
                        # fields of other types, each once unchecked (a NaN table, an internal error, a flag
                        # written as text read as true)
                        "activation_scale": [".inf", "'x'"], "logits_grad_subnormal_share": ["'0.1'"],
                        "hooked_modules_per_layer": ["'x'", ".nan", "-1"], "embedding_size": ["'512'"],
                        "tied_embeddings": ["'no'"], "dropout": ["'false'"]}.items():
        for n, value in enumerate(values):
            out.append(_predict(f"model-{key}-{n}", "--model", "{tmp}/m.yaml", needle=key,
                                **{"m.yaml": _yaml({**_MODEL, key: value})}))
    for key, value in {"n_layer": 1e9, "n_embd": 0, "n_head": 0, "vocab_size": "big", "n_positions": 1e30,
                       "n_inner": -5}.items():
        out.append(_predict(f"hf-{key}-{value}", "--model", "{tmp}/config.json", needle=key,
                            **{"config.json": json.dumps({**_HF, key: value})}))
    out.append(_predict("hf-layers-neg", "--model", "{tmp}/config.json", needle="n_layer",
                        **{"config.json": json.dumps({**_HF, "n_layer": -1})}))
    out.append(_predict("hf-nan", "--model", "{tmp}/config.json", needle="n_layer",
                        **{"config.json": json.dumps({**_HF, "n_layer": float("nan")})}))
    out.append(_predict("hf-list", "--model", "{tmp}/config.json", needle="config.json", **{"config.json": "[1]"}))
    out.append(_predict("hf-malformed", "--model", "{tmp}/config.json", needle="config.json",
                        **{"config.json": "{"}))
    out.append(_predict("hf-missing-key", "--model", "{tmp}/config.json", needle="hidden_size",
                        **{"config.json": json.dumps({k: v for k, v in _HF.items() if k != "n_embd"})}))
    out.append(_predict("hf-flag-text", "--model", "{tmp}/config.json", needle="tie_word_embeddings",
                        **{"config.json": json.dumps({**_HF, "tie_word_embeddings": "false"})}))
    out.append(_predict("model-folder-empty", "--model", "{tmp}", needle="config.json"))
    out.append(_predict("model-unknown", "--model", "gtp2", needle="--model"))
    out.append(_predict("model-unknown-key", "--model", "{tmp}/m.yaml", needle="num_layer",
                        **{"m.yaml": _yaml({**_MODEL, "num_layer": "3"})}))
    return out


def _flag_cases() -> list[Case]:
    p, huge = _predict, "1" + "0" * 30
    return [
        p("num_gpus-0", "--num_gpus", "0", needle="--num_gpus"),
        p("num_gpus-neg", "--num_gpus", "-2", needle="--num_gpus"),
        p("num_gpus-text", "--num_gpus", "eight", needle="--num_gpus"),
        p("num_gpus-huge", "--num_gpus", huge, needle="--num_gpus"),
        p("num_gpus-over-node", "--hardware", "a100-80gb", "--num_gpus", "16", needle="--num_nodes"),
        p("num_nodes-0", "--num_nodes", "0", needle="--num_nodes"),
        p("num_nodes-empty-item", "--num_nodes", "1,,2", needle="--num_nodes"),
        p("num_nodes-huge", "--num_nodes", huge, needle="--num_nodes"),
        p("micro_batch-0", "--micro_batch", "0", needle="--micro_batch"),
        p("micro_batch-1e30", "--micro_batch", "1e30", needle="--micro_batch"),
        p("micro_batch-huge", "--micro_batch", huge, needle="--micro_batch"),
        p("micro_batch-huge-rank", "--micro_batch", huge, "--rank", needle="--micro_batch"),
        p("grad_accum-huge", "--grad_accum", "1" + "0" * 20, needle="--grad_accum"),
        p("seq_len-0", "--seq_len", "0", needle="--seq_len"),
        p("seq_len-over", "--seq_len", "4096", needle="--seq_len"),
        p("seq_len-huge-rope", "--model", "llama-2-7b", "--hardware", "a100-80gb", "--seq_len", "1" + "0" * 15,
          needle="--seq_len"),
        p("mp_size-heads", "--num_gpus", "5", "--hardware", "a100-80gb", "--mp_size", "5", needle="--mp_size"),
        p("mp_size-gpus", "--num_gpus", "2", "--mp_size", "4", needle="mp_size"),
        p("pp_size-layers", "--hardware", "v100-32gb", "--num_gpus", "16", "--pp_size", "16", needle="pipeline stages"),
        p("headroom-nan", "--headroom_gib", "nan", "--rank", needle="--headroom_gib"),
        p("headroom-inf", "--headroom_gib", "inf", "--rank", needle="--headroom_gib"),
        p("headroom-neg", "--headroom_gib", "-1", "--rank", needle="--headroom_gib"),
        p("top-0", "--top", "0", "--rank", needle="--top"),
        p("explore-bad", "--rank", "--explore", "zero4", needle="--explore"),
        p("zero-stage-4", "--zero_stage", "4", needle="--zero_stage"),
        p("precision-fp8", "--precision", "fp8", needle="--precision"),
        p("plot-no-rank", "--plot", "x.png", needle="--plot"),
        p("plot-a-folder", "--rank", "--plot", "{tmp}", needle="--plot"),  # was: exit 0, a hidden {tmp}/.png
        p("plot-format", "--rank", "--plot", "{tmp}/x.txt", needle="--plot"),
        p("plot-no-folder", "--rank", "--plot", "{tmp}/none/x.png", needle="--plot"),
        p("explore-empty", "--rank", "--explore", "", needle="--explore"),  # was: read as none
        p("deepspeed-empty", "--deepspeed", "", needle="--deepspeed"),  # was: predicted without a ds_config
        p("lists-both", "--num_nodes", "1,2", "--hardware", "v100-32gb,a100-80gb", needle="--num_nodes"),
        # a sweep where nothing fits anywhere: the single prediction's error (it had exited 0 with a table of dashes)
        p("sweep-nothing-fits", "--model", "llama-2-70b", "--hardware", "v100-16gb", "--num_nodes", "1,2", "--rank",
          needle="--num_nodes"),
        p("fp16-on-cpu", "--hardware", "cpu", "--num_gpus", "2", "--precision", "fp16", needle="fp16"),
        p("unknown-flag", "--gpus", "2", needle="--gpus"),
        p("deepspeed-missing", "--deepspeed", "{tmp}/none.json", needle="none.json"),
        p("profile-missing", "--profile", "{tmp}/none.json", needle="none.json"),
    ]


def _ds(case_id: str, doc: object, *flags: str, needle: str = "") -> Case:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    return _predict(f"ds-{case_id}", "--deepspeed", "{tmp}/ds.json", *flags, needle=needle, **{"ds.json": text})


def _ds_cases() -> list[Case]:
    mbs = "train_micro_batch_size_per_gpu"
    return [
        _ds("mbs-1e9", {mbs: 1e9}, needle=mbs),
        _ds("mbs-1e30", {mbs: 1e30}, needle=mbs),
        _ds("mbs-list-huge", {mbs: [1, 10**12]}, "--rank", needle=mbs),
        _ds("max-mbs-1e9", {"autotuning": {"max_train_micro_batch_size_per_gpu": 1e9}}, "--rank",
            needle="max_train_micro_batch_size_per_gpu"),
        _ds("max-mbs-1e30", {"autotuning": {"max_train_micro_batch_size_per_gpu": 1e30}}, "--rank",
            needle="max_train_micro_batch_size_per_gpu"),
        _ds("num-tuning-mbs-huge", {"autotuning": {"num_tuning_micro_batch_sizes": 10**9}}, "--rank",
            needle="num_tuning_micro_batch_sizes"),
        _ds("gas-1e18", {"gradient_accumulation_steps": 1e18}, needle="gradient_accumulation_steps"),
        _ds("gas-0", {"gradient_accumulation_steps": 0}, needle="gradient_accumulation_steps"),
        _ds("train-batch-mismatch", {"train_batch_size": 7, mbs: 2, "gradient_accumulation_steps": 1},
            needle="train_batch_size"),
        _ds("bucket-neg", {"zero_optimization": {"stage": 2, "reduce_bucket_size": -1}}, needle="reduce_bucket_size"),
        _ds("bucket-nan", '{"zero_optimization": {"stage": 2, "reduce_bucket_size": NaN}}',
            needle="reduce_bucket_size"),
        _ds("bucket-inf", '{"zero_optimization": {"stage": 2, "reduce_bucket_size": Infinity}}',
            needle="reduce_bucket_size"),
        _ds("bucket-text", {"zero_optimization": {"stage": 2, "allgather_bucket_size": "big"}},
            needle="allgather_bucket_size"),
        _ds("stage-4", {"zero_optimization": {"stage": 4}}, needle="stage"),
        _ds("stage-nan", '{"zero_optimization": {"stage": NaN}}', needle="stage"),
        _ds("zero-not-object", {"zero_optimization": 3}, needle="zero_optimization"),
        _ds("zero-unknown-key", {"zero_optimization": {"stage": 1, "overlap_com": True}}, needle="overlap_com"),
        _ds("offload-device", {"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}},
            needle="device"),
        _ds("pipeline-0", {"pipeline": {"stages": 0}}, needle="stages"),
        _ds("pipeline-huge", {"pipeline": {"stages": 10**12}}, needle="stages"),
        _ds("mp-0", {"autotuning": {"mp_size": 0}}, needle="mp_size"),
        _ds("mp-heads", {"autotuning": {"mp_size": 5}}, "--num_gpus", "5", "--hardware", "a100-80gb",
            needle="mp_size"),
        _ds("metric-bad", {"autotuning": {"metric": "speed"}}, needle="metric"),
        _ds("both-precisions", {"fp16": {"enabled": True}, "bf16": {"enabled": True}}, needle="bf16"),
        _ds("not-object", "[1, 2]", needle="ds_config"),
        _ds("malformed", "{\"train_batch_size\": ", needle="ds.json"),
        _ds("empty", "", needle="ds.json"),
        _ds("optimizer-bad", {"optimizer": "adam"}, needle="optimizer"),
        _ds("grad-dtype", {"data_types": {"grad_accum_dtype": "int8"}}, needle="grad_accum_dtype"),
        _ds("bool-text", {"zero_optimization": {"stage": 2, "overlap_comm": "yes"}}, needle="overlap_comm"),
        # sections DeepSpeed unpacks: null or a list stops its engine, and zerotune read them as absent
        _ds("zero-null", {"zero_optimization": None}, needle="zero_optimization"),
        _ds("zero-list", {"zero_optimization": []}, needle="zero_optimization"),
        _ds("pipeline-list", {"pipeline": []}, needle="pipeline"),
        _ds("checkpointing-null", {"activation_checkpointing": None}, needle="activation_checkpointing"),
        _ds("scheduler-text", {"scheduler": "warmup"}, needle="scheduler"),
        # values DeepSpeed refuses at start-up (its pydantic bounds, clip_grad_norm_'s number)
        _ds("offload-ratio", {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}},
            needle="ratio"),
        _ds("clipping-text", {"gradient_clipping": "1.0"}, needle="gradient_clipping"),
        # JSON that json.loads refuses past its decoder: nesting beyond the recursion limit, 4300+ digits
        _ds("deep-nesting", "[" * 100_000 + "]" * 100_000, needle="ds.json"),
        _ds("huge-integer", '{"train_micro_batch_size_per_gpu": ' + "9" * 5000 + "}", needle="ds.json"),
    ]


_EFFICIENCY_FIELDS = ("gemm_efficiency_scale", "intra_node_bandwidth_efficiency", "overlap_efficiency",
                      "allocator_slack_fraction", "zero3_module_hook_s", "step_overhead_s")


def _profile(efficiency: dict[str, object], uncertainty: str = '{"step_time_rel": 0.2, "peak_memory_rel": 0.05}') \
        -> str:
    """A profile for v100-32gb (predict's default hardware); `efficiency` values are written as given (NaN too)."""
    eff = "{" + ", ".join(f'"{k}": {v}' for k, v in efficiency.items()) + "}"
    quality = {"step_time_mape_before": None, "step_time_mape_in_sample": None, "step_time_mape_out_of_sample": None,
               "peak_memory_mape_before": None, "peak_memory_mape_in_sample": None,
               "peak_memory_mape_out_of_sample": None, "num_step_time": 0, "num_peak_memory": 0, "num_oom": 0,
               "num_folds": 0}
    return (f'{{"format": "zerotune-profile-1", "hardware": "v100-32gb", "created": "2026-01-01", "efficiency": {eff}, '
            f'"uncertainty": {uncertainty}, "fit_quality": {json.dumps(quality)}, '
            f'"fitted_on": {{"count": 0, "sources": [], "measurements": []}}, "environment": {{}}, "residual": null}}')


def _profile_cases() -> list[Case]:
    out = []
    for key in _EFFICIENCY_FIELDS:
        for tag, value in (("neg", "-1"), ("fifty", "50"), ("nan", "NaN"), ("inf", "Infinity")):
            if key in ("zero3_module_hook_s", "step_overhead_s") and tag == "fifty":
                continue  # 50 elements, or 50 s per step, are large but not impossible
            out.append(_predict(f"profile-{key}-{tag}", "--profile", "{tmp}/p.json", needle=key,
                                **{"p.json": _profile({key: value})}))
    out.append(_predict("profile-unknown-field", "--profile", "{tmp}/p.json", needle="compute_eficiency_max",
                        **{"p.json": _profile({"compute_eficiency_max": 0.5})}))
    out.append(_predict("profile-uncertainty-nan", "--profile", "{tmp}/p.json", needle="step_time_rel",
                        **{"p.json": _profile({}, '{"step_time_rel": NaN}')}))
    out.append(_predict("profile-uncertainty-neg", "--profile", "{tmp}/p.json", needle="step_time_rel",
                        **{"p.json": _profile({}, '{"step_time_rel": -0.5}')}))
    out.append(_predict("profile-not-json", "--profile", "{tmp}/p.json", needle="p.json", **{"p.json": "profile"}))
    out.append(_predict("profile-list", "--profile", "{tmp}/p.json", needle="p.json", **{"p.json": "[]"}))
    return out


def _calibrate(case_id: str, *flags: str, needle: str = "", **files: str) -> Case:
    return Case(f"calibrate-{case_id}", ("calibrate", "--hardware", "cpu", *flags), dict(files), needle)


def _from(case_id: str, text: str, *flags: str, needle: str = "", name: str = "t.csv") -> Case:
    return _calibrate(case_id, "--from", "{tmp}/" + name, "--out", "{tmp}/out/p.json", *flags, needle=needle,
                      **{name: text})


_BAD_COLUMNS = {"num_gpus": ["0", "-1", "1e30", "x", "3"], "micro_batch": ["0", "1e30", "1e9"], "grad_accum": ["0", "1e20"],
                "seq_len": ["0", "1e12"], "num_nodes": ["0", "1e30"],
                "throughput_samples_per_s": ["0", "-2", "nan", "inf", "fast"], "peak_memory_bytes": ["-1", "nan"],
                "zero_stage": ["4", "nan"], "precision": ["fp8"], "status": ["done"], "model": ["gtp2"],
                "hardware": ["cpuu"]}


def _dir_experiment(exp: dict[str, object], metrics: dict[str, object]) -> dict[str, str]:
    return {"d/z0_gas1_tmbspg1/exp.json": json.dumps(exp),
            "d/z0_gas1_tmbspg1/ds_config.json": json.dumps({"train_micro_batch_size_per_gpu": 1}),
            "d/z0_gas1_tmbspg1/metrics.json": json.dumps(metrics)}


def _calibrate_cases() -> list[Case]:
    row = _csv().splitlines()[1]
    out = [_from(f"col-{col}-{n}", _csv(**{col: value}), needle=col)
           for col, values in _BAD_COLUMNS.items() for n, value in enumerate(values)]
    folder = ("--from", "{tmp}/d", "--model", "gpt2", "--seq_len", "128", "--out", "{tmp}/p.json")
    out += [
        _from("empty-file", "", needle="t.csv"),
        _from("header-only", _CSV_HEADER + "\n", needle="t.csv"),
        _from("unknown-column", _CSV_HEADER + ",speed\n" + row + ",3\n", needle="speed"),
        _from("nul-byte", _CSV_HEADER + "\n" + row.replace("gpt2", "gp\0t2") + "\n", needle="t.csv"),
        _from("huge-field", _CSV_HEADER + "\n" + "x" * 200_000 + "," + row + "\n", needle="t.csv"),
        _from("short-row", _CSV_HEADER + "\ngpt2,cpu,1\n", needle="t.csv"),
        _from("long-row", _CSV_HEADER + "\n" + row + ",1,2\n", needle="t.csv"),
        _from("jsonl-malformed", "{\n", name="t.jsonl", needle="t.jsonl"),
        _from("jsonl-list", "[1]\n", name="t.jsonl", needle="t.jsonl"),
        _from("jsonl-record-bad", json.dumps({"ds_config": {}, "model": "gpt2"}) + "\n", name="t.jsonl",
              needle="t.jsonl"),
        _from("unknown-suffix", "x", name="t.txt", needle="t.txt"),
        _from("hardware-mismatch", _csv(hardware="v100-32gb"), needle="hardware"),
        _calibrate("from-missing", "--from", "{tmp}/none.csv", needle="none.csv"),
        _calibrate("from-empty-dir", *folder, needle="d", **{"d/readme": ""}),
        _calibrate("from-dir-no-model", "--from", "{tmp}/d", needle="--model", **{"d/readme": ""}),
        _calibrate("from-dir-bad-metrics", *folder, needle="throughput",
                   **_dir_experiment({"num_gpus": 2, "num_nodes": 1}, {"throughput": 0})),
        _calibrate("from-dir-bad-gpus", *folder, needle="num_gpus",
                   **_dir_experiment({"num_gpus": 0, "num_nodes": 1}, {"throughput": 3.0})),
        _calibrate("from-dir-text-gpus", *folder, needle="num_gpus",
                   **_dir_experiment({"num_gpus": "two", "num_nodes": 1}, {"throughput": 3.0})),
        _calibrate("max-probes", "--max_probes", "7", needle="--max_probes"),
        Case("calibrate-gpu-here", ("calibrate", "--hardware", "h200", "--out", "{tmp}/p.json"), {}, "--hardware"),
        _calibrate("timeout-nan", "--timeout_s", "nan", needle="--timeout_s"),
        _calibrate("timeout-neg", "--timeout_s", "-1", needle="--timeout_s"),
        _calibrate("num_gpus-over-node", "--num_gpus", "3", needle="--num_nodes"),
        _calibrate("num_nodes-no-hostfile", "--num_nodes", "2", needle="--hostfile"),
        # a hostfile read before anything runs, as tune reads it (was: microbenchmarks started, then pdsh)
        _calibrate("hostfile-empty", "--hostfile", "{tmp}/hosts", needle="--hostfile", **{"hosts": ""}),
        _calibrate("hostfile-twice", "--hostfile", "{tmp}/hosts", needle="twice",
                   **{"hosts": "a slots=2\na slots=2\n"}),
        _calibrate("hostfile-folder", "--hostfile", "{tmp}", needle="--hostfile"),
        _calibrate("hostfile-short", "--hostfile", "{tmp}/hosts", "--num_nodes", "2", needle="--num_nodes",
                   **{"hosts": "a slots=2\n"}),
        Case("calibrate-hw-missing", ("calibrate", "--hardware", "nosuch", "--from", "{tmp}/t.csv"),
             {"t.csv": _csv()}, "--hardware"),
        Case("calibrate-hw-name-path", ("calibrate", "--hardware", "{tmp}/hw.yaml", "--from", "{tmp}/t.csv"),
             {"t.csv": _csv(hardware="{tmp}/hw.yaml"), "hw.yaml": _yaml({**_HW, "name": "../../evil"})}, "name"),
        _calibrate("out-exists", "--from", "{tmp}/t.csv", "--out", "{tmp}/p.json", needle="--force",
                   **{"t.csv": _csv(), "p.json": "{}"}),
        # two finished rows, so that the fit is reached: one of them off by a unit error
        _from("throughput-absurd", _csv(throughput_samples_per_s="1e9") + _csv(micro_batch="2").splitlines()[1]
              + "\n", needle="t.csv:2"),
        _from("peak-above-gpu", _csv(hardware="a100-80gb", peak_memory_bytes="1e30")
              + _csv(hardware="a100-80gb", micro_batch="2").splitlines()[1] + "\n", "--hardware", "a100-80gb",
              needle="peak_memory_bytes"),
        _calibrate("from-empty", "--from", "", needle="--from"),  # was: a full calibration started instead
        _calibrate("out-empty", "--from", "{tmp}/t.csv", "--out", "", needle="--out", **{"t.csv": _csv()}),
        _calibrate("out-a-folder", "--from", "{tmp}/t.csv", "--out", "{tmp}/od", "--force", needle="--out",
                   **{"t.csv": _csv(), "od/x": ""}),
        _calibrate("out-shipped", "--from", "{tmp}/t.csv", "--out", str(data_dir() / "profiles" / "cpu.json"),
                   "--force", needle="data", **{"t.csv": _csv()}),
    ]
    return out


def _tune(case_id: str, *flags: str, needle: str = "", **files: str) -> Case:
    return Case(f"tune-{case_id}", ("tune", "--hardware", "cpu", *flags), dict(files), needle)


_DS = json.dumps({"train_micro_batch_size_per_gpu": [1, 2], "zero_optimization": {"stage": [0, 1]}})


def _tune_cases() -> list[Case]:
    ds, t, flag = {"ds.json": _DS}, _tune, ("--deepspeed", "{tmp}/ds.json")

    def with_ds(case_id: str, doc: dict[str, object], needle: str) -> Case:
        return t(case_id, *flag, needle=needle, **{"ds.json": json.dumps(doc)})
    return [
        t("nothing", needle="--deepspeed"),
        t("num_gpus-0", "--num_gpus", "0", *flag, needle="--num_gpus", **ds),
        t("num_gpus-neg", "--num_gpus", "-1", *flag, needle="--num_gpus", **ds),
        t("num_gpus-over-node", "--num_gpus", "4", *flag, needle="--num_nodes", **ds),
        t("num_nodes-no-hostfile", "--num_nodes", "2", *flag, needle="--hostfile", **ds),
        t("top_k-0", "--top_k", "0", *flag, needle="--top_k", **ds),
        t("top_k-text", "--top_k", "many", *flag, needle="--top_k", **ds),
        t("timeout-nan", "--timeout_s", "nan", *flag, needle="--timeout_s", **ds),
        t("timeout-inf", "--timeout_s", "inf", *flag, needle="--timeout_s", **ds),
        t("memory-cap-nan", "--memory_cap_gib", "nan", *flag, needle="--memory_cap_gib", **ds),
        t("memory-cap-inf", "--memory_cap_gib", "inf", *flag, needle="--memory_cap_gib", **ds),
        t("memory-cap-tiny", "--memory_cap_gib", "1e-9", *flag, needle="--memory_cap_gib", **ds),  # blamed the script
        t("seq_len-neg", "--seq_len", "-5", *flag, needle="--seq_len", **ds),
        t("explore-bad", "--explore", "zero4", *flag, needle="--explore", **ds),
        t("script-missing", "{tmp}/train.py", *flag, needle="train.py", **ds),
        t("ds-missing", "--deepspeed", "{tmp}/none.json", needle="none.json"),
        t("ds-malformed", *flag, needle="ds.json", **{"ds.json": "{"}),
        with_ds("ds-max-mbs-huge", {"autotuning": {"max_train_micro_batch_size_per_gpu": 1e9}},
                "max_train_micro_batch_size_per_gpu"),
        with_ds("ds-profile-steps", {"autotuning": {"start_profile_step": 5, "end_profile_step": 2}},
                "end_profile_step"),
        with_ds("ds-profile-steps-huge", {"autotuning": {"end_profile_step": 10**12}}, "end_profile_step"),
        with_ds("ds-trials-0", {"autotuning": {"tuner_num_trials": 0}}, "tuner_num_trials"),
        # the autotuning section's paths and maps, each once an internal error or the current folder written into
        with_ds("ds-results-dir-empty", {"autotuning": {"results_dir": ""}}, "results_dir"),
        with_ds("ds-results-dir-number", {"autotuning": {"results_dir": 5}}, "results_dir"),
        with_ds("ds-arg-mappings-list", {"autotuning": {"arg_mappings": ["--bs"]}}, "arg_mappings"),
        with_ds("ds-arg-mappings-number", {"autotuning": {"arg_mappings": {"train_micro_batch_size_per_gpu": 5}}},
                "arg_mappings"),
        with_ds("ds-tuner-type", {"autotuning": {"tuner_type": "bogus"}}, "tuner_type"),
        t("ds-results-dir-a-file", *flag, needle="results_dir",
          **{"ds.json": json.dumps({"autotuning": {"results_dir": "{tmp}/rf"}}), "rf": ""}),
        t("script-a-folder", "{tmp}/sub", *flag, needle="a folder", **ds, **{"sub/x": ""}),
        t("hardware-unknown", "--hardware", "gpu9000", *flag, needle="--hardware", **ds),
        # a GPU named on a machine without one (or told to train on its CPU): experiments ran and failed
        t("hardware-gpu-here", "--hardware", "h200", "--model", "gpt2", *flag, needle="--hardware", **ds),
        t("hostfile-missing", "--hostfile", "{tmp}/hosts", *flag, needle="hosts", **ds),
        t("hostfile-bad", "--hostfile", "{tmp}/hosts", *flag, needle="hosts", **{**ds, "hosts": "node1 slots=x\n"}),
        t("profile-missing", "--profile", "{tmp}/p.json", *flag, needle="p.json", **ds),
        t("profile-nan", "--profile", "{tmp}/p.json", *flag, needle="overlap_efficiency",
          **{**ds, "p.json": _profile({"overlap_efficiency": "NaN"}).replace("v100-32gb", "cpu")}),
        t("model-unknown", "--model", "gtp2", *flag, needle="--model", **ds),
    ]


def _record(**changes: object) -> str:
    """The shipped CPU profile's first measurement record, changed."""
    line = (data_dir() / "profiles" / "cpu.measurements.jsonl").read_text().splitlines()[0]
    return json.dumps({**json.loads(line), **changes}) + "\n"


def _fuzzed_cases() -> list[Case]:
    """Found by a fuzzing pass over the three verbs (2026-11-30): each was an internal error, a second line on stderr
    or a silent success."""
    mbs, zero = "train_micro_batch_size_per_gpu", "zero_optimization"
    hf_bert = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
               "intermediate_size": 256, "vocab_size": 1000, "max_position_embeddings": 128}
    records = [_from(f"record-{key}", _record(**{key: value}), needle=key, name="m.jsonl")
               for key, value in (("num_gpus_per_node", "2"), ("seq_len", "128"), ("model", 5), ("source", 5),
                                  ("step_s", True), ("forward_s", -1.0))]
    return records + [
        _ds("autotuning-list", {"autotuning": [1]}, needle="autotuning"),
        _ds("fp16-list-flag", {"fp16": [1]}, "--precision", "bf16", needle="fp16"),
        _ds("offload-text-flag", {zero: {"stage": 2, "offload_optimizer": "cpu"}}, "--offload_optimizer", "cpu",
            needle="offload_optimizer"),
        _ds("warning-then-error", {"trian_batch_size": 4, zero: {"stage": 9}}, needle="stage"),
        _ds("stage-auto", {zero: {"stage": "auto"}}, needle="stage"),
        _ds("stage-auto-rank", {zero: {"stage": "auto"}}, "--rank", needle="stage"),
        _ds("stage-all-and-5", {zero: {"stage": ["all", 5]}}, "--rank", needle="stage"),
        _ds("offload-device-false", {zero: {"stage": 2, "offload_optimizer": {"device": False}}}, needle="device"),
        _ds("cpu-offload-text", {zero: {"stage": 2, "cpu_offload": "yes"}}, needle="cpu_offload"),
        _ds("momentum-text", {"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": "0.9"}}},
            needle="momentum"),
        _ds("mbs-negative-rank", {mbs: -4}, "--rank", needle=mbs),
        _ds("train-batch-text-rank", {"train_batch_size": "16"}, "--rank", needle="train_batch_size"),
        _ds("gas-negative-rank", {"train_batch_size": 8, "gradient_accumulation_steps": -3}, "--rank",
            needle="gradient_accumulation_steps"),
        _ds("triple-mismatch-rank", {"train_batch_size": 7, mbs: 2, "gradient_accumulation_steps": 1}, "--rank",
            needle="train_batch_size"),
        _predict("hf-attn-config-text", "--model", "{tmp}/config.json", needle="attn_config",
                 **{"config.json": json.dumps({**_HF, "model_type": "mpt", "attn_config": "flash"})}),
        _predict("hf-type-vocab-huge", "--model", "{tmp}/config.json", needle="type_vocab_size",
                 **{"config.json": json.dumps({**hf_bert, "type_vocab_size": 1e30})}),
        _predict("hf-type-vocab-text", "--model", "{tmp}/config.json", needle="type_vocab_size",
                 **{"config.json": json.dumps({**hf_bert, "type_vocab_size": "two"})}),
        _predict("profile-empty", "--profile", "", needle="--profile"),
        _from("model-flag-vs-column", _csv(), "--model", "bert-base", needle="--model bert-base"),
        _ds("knob-empty-list-rank", {zero: {"stage": 2, "reduce_bucket_size": []}}, "--rank",
            needle="reduce_bucket_size"),
        _ds("min-above-max-rank", {"autotuning": {"max_train_batch_size": 2, "min_train_batch_size": 8}}, "--rank",
            needle="min_train_batch_size"),
        _predict("micro-batch-underscore", "--micro_batch", "1_0", needle="--micro_batch"),
        _predict("top-without-rank", "--top", "3", needle="--top"),
        *[_predict(f"profile-{key}", "--profile", "{tmp}/p.json", needle=key, **{"p.json": _profile({}).replace(a, b)})
          for key, a, b in (("hardware", '"hardware": "v100-32gb"', '"hardware": null'),
                            ("num_folds", '"num_folds": 0', '"num_folds": -3'))],
        _predict("plot-with-sweep", "--num_nodes", "1,2", "--rank", "--plot", "{tmp}/x.png", needle="--plot"),
        _from("seq-len-flag-vs-column", _csv(), "--seq_len", "512", needle="--seq_len 512"),
        _predict("explore-none-and-offload", "--rank", "--explore", "none,offload", needle="--explore"),
        _predict("hw-units-fraction", "--hardware", "{tmp}/hw.yaml", needle="num_compute_units",
                 **{"hw.yaml": _yaml({**_HW, "num_compute_units": "1.5"})}),
        *_fuzzed_tune_cases(),
    ]


def _fuzzed_tune_cases() -> list[Case]:
    ds = {"train_micro_batch_size_per_gpu": [1, 2], "zero_optimization": {"stage": [0, 1]}}
    mapped = {**ds, "autotuning": {"arg_mappings": {"train_micro_batch_size_per_gpu": "--batch_size"}}}
    files = {"ds.json": json.dumps(mapped), "ds2.json": json.dumps(ds), "train.py": "print(1)\n"}
    run = ("--model", "zt-gpt-small", "{tmp}/train.py")
    return [
        _tune("profile-window-empty", "--deepspeed", "{tmp}/ds.json", needle="end_profile_step",
              **{"ds.json": json.dumps({**ds, "autotuning": {"start_profile_step": 0, "end_profile_step": 0}})}),
        _tune("master-port-huge", "--master_port", "70000", "--deepspeed", "{tmp}/ds.json", needle="--master_port",
              **{"ds.json": json.dumps(ds)}),
        _tune("explore-none-and-offload", "--explore", "none,offload", "--deepspeed", "{tmp}/ds.json",
              needle="--explore", **{"ds.json": json.dumps(ds)}),
        _tune("two-ds-configs", *run, "--deepspeed_config", "{tmp}/ds.json", "--deepspeed", "{tmp}/ds2.json",
              needle="two ds_configs", **files),
        _tune("mapped-arg-twice", *run, "--deepspeed", "{tmp}/ds.json", "--batch_size", "4", "--batch_size", "8",
              needle="--batch_size", **files),
    ]


CASES: list[Case] = (_hardware_cases() + _model_cases() + _flag_cases() + _ds_cases() + _profile_cases()
                     + _calibrate_cases() + _tune_cases() + _fuzzed_cases())
