"""Run a planned grid of DeepSpeed training configurations on one GPU, in one process, one row per run.

Standalone on purpose (torch, deepspeed and transformers only, no zerotune import): it runs on a bare GPU
machine where zerotune is not installed. `benchmarks.gpu_grid` writes the plan and reads the rows back.

    python benchmarks/gpu_grid_worker.py --plan plan.json --out rows.jsonl --deadline 1764170000

Each run builds its Hugging Face model from a config (random weights, on the device), wraps it with
deepspeed.initialize (world size 1, NCCL) and trains on random tokens. Per run: step seconds (median over the
timed steps, the device synchronised after each), forward / backward / step seconds (extra steps synchronised
between the phases), torch.cuda max_memory_allocated and max_memory_reserved since the model was built, status
(ok, oom, failed) and a one-line reason. Rows already in --out are skipped, so a crashed process is restarted
from the next run (`--restart`); a run left running when the process died is recorded as failed.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import logging
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch

WARMUP_STEPS = 2
TIMED_STEPS = 10
PHASE_STEPS = 2
OFFLOAD_TIMED_STEPS = 5
WATCHDOG_MIN_S = 90.0  # a run past max(this, 4 x its budget) is taken as hung: the process exits, the driver restarts it
OFFLOAD_WATCHDOG_S = 300.0  # the first offload run also waits for DeepSpeedCPUAdam's build
LEAK_LIMIT_BYTES = 2 << 30  # memory still allocated after a run's clean-up: restart the process
GPT2_SHAPES = {"gpt2": (12, 768, 12), "gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20),
               "gpt2-xl": (48, 1600, 25),  # (n_layer, n_embd, n_head) of openai-community's config.json files
               "gpt2-tiny": (2, 64, 4)}  # the tests' CPU run of this worker
CHAIN_MAX_STEP_S = 2.0  # a doubling chain stops after a step this long: the next size would take twice that


CLASSIFIERS = {"bert-large", "bert-base", "distilbert-base", "deberta-v2-xlarge"}
"""Architectures built for sequence classification with two labels (their batches carry one label a sample)."""


def _hf_config(arch: str) -> Any:
    """The run's transformers config: the published model's config.json, written out (nothing is downloaded)."""
    import transformers as tf
    if arch in GPT2_SHAPES:
        layers, width, heads = GPT2_SHAPES[arch]
        return tf.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, n_positions=1024, vocab_size=50257)
    if arch in ("bert-large", "bert-base"):
        layers, width, heads = (24, 1024, 16) if arch == "bert-large" else (12, 768, 12)
        return tf.BertConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                             intermediate_size=4 * width, vocab_size=30522, max_position_embeddings=512, num_labels=2)
    if arch == "distilbert-base":  # distilbert-base-uncased config.json
        return tf.DistilBertConfig(n_layers=6, dim=768, n_heads=12, hidden_dim=3072, vocab_size=30522,
                                   max_position_embeddings=512, num_labels=2)
    if arch == "deberta-v2-xlarge":  # microsoft/deberta-v2-xlarge config.json
        return tf.DebertaV2Config(hidden_size=1536, num_hidden_layers=24, num_attention_heads=24,
                                  intermediate_size=6144, vocab_size=128100, max_position_embeddings=512,
                                  type_vocab_size=0, relative_attention=True, position_buckets=256,
                                  pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True,
                                  conv_kernel_size=3, conv_act="gelu", position_biased_input=False,
                                  layer_norm_eps=1e-7, num_labels=2)
    if arch == "gpt-neo-1.3b":  # EleutherAI/gpt-neo-1.3B config.json: global and local (window 256) layers alternate
        return tf.GPTNeoConfig(num_layers=24, hidden_size=2048, num_heads=16, vocab_size=50257,
                               max_position_embeddings=2048, attention_types=[[["global", "local"], 12]],
                               window_size=256, embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0)
    if arch == "qwen2-250m":  # tests/fixtures/scripts/qwen2_loop.py's default shape
        return tf.Qwen2Config(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4,
                              intermediate_size=2816, vocab_size=32000, max_position_embeddings=1024,
                              tie_word_embeddings=False)
    if arch == "llama-3.2-1b":  # meta-llama/Llama-3.2-1B config.json
        return tf.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                              num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
                              max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5)
    raise ValueError(f"unknown arch {arch!r}")


def hf_model(arch: str, attn: str) -> torch.nn.Module:
    """The run's model, randomly initialised on the current device (fp32; DeepSpeed casts it)."""
    import transformers as tf
    auto = tf.AutoModelForSequenceClassification if arch in CLASSIFIERS else tf.AutoModelForCausalLM
    return auto.from_config(_hf_config(arch), attn_implementation=attn)


def _batch(run: dict[str, Any], model: torch.nn.Module, device: torch.device) -> dict[str, torch.Tensor]:
    shape = (run["micro_batch"], run["seq_len"])
    ids = torch.randint(0, model.config.vocab_size, shape, device=device)
    if run["arch"] in CLASSIFIERS:
        return {"input_ids": ids, "labels": torch.randint(0, 2, (shape[0],), device=device)}
    return {"input_ids": ids, "labels": ids}


CUDA = torch.cuda.is_available()


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def _allocated() -> int:
    return torch.cuda.memory_allocated() if CUDA else 0


def _train(engine: Any, batch: dict[str, torch.Tensor], gas: int, phases: dict[str, list[float]] | None) -> None:
    """One optimizer step of `gas` micro-steps; with phases, the device synchronised around each phase."""
    for _ in range(gas):
        t0 = time.perf_counter()
        loss = engine(**batch).loss
        if phases is not None:
            _sync()
            t1 = time.perf_counter()
            phases["forward_s"].append(t1 - t0)
        engine.backward(loss)
        if phases is not None:
            _sync()
            t2 = time.perf_counter()
            phases["backward_s"].append(t2 - t1)
        t3 = time.perf_counter()
        engine.step()
        if phases is not None:
            _sync()
            phases["step_s"].append(time.perf_counter() - t3)


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text[:300]


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def run_one(run: dict[str, Any]) -> dict[str, Any]:
    import deepspeed
    device = torch.device("cuda", 0) if CUDA else torch.device("cpu")
    gc.collect()
    if CUDA:
        torch.cuda.set_device(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = _allocated()
    row: dict[str, Any] = {"id": run["id"], "status": "failed", "reason": ""}
    engine = model = batch = None
    started = time.perf_counter()
    try:
        with torch.device(device):
            model = hf_model(run["arch"], run["attn"])
        if run["checkpointing"]:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                               config=run["ds_config"])
        batch = _batch(run, model, device)
        gas = run["ds_config"]["gradient_accumulation_steps"]
        timed = OFFLOAD_TIMED_STEPS if run.get("offload") else TIMED_STEPS
        for _ in range(WARMUP_STEPS):
            _train(engine, batch, gas, None)
        _sync()
        steps = []
        for _ in range(timed):
            t0 = time.perf_counter()
            _train(engine, batch, gas, None)
            _sync()
            steps.append(time.perf_counter() - t0)
        phases: dict[str, list[float]] = {"forward_s": [], "backward_s": [], "step_s": []}
        for _ in range(PHASE_STEPS):
            _train(engine, batch, gas, phases)
        median = statistics.median(steps)
        spread = statistics.stdev(steps) / len(steps) ** 0.5 / median if len(steps) > 1 else None
        row.update(status="ok", step_s=median, step_s_rel_error=spread, steps=steps,
                   forward_s=statistics.mean(phases["forward_s"]), backward_s=statistics.mean(phases["backward_s"]),
                   optimizer_s=statistics.mean(phases["step_s"]) * gas,
                   optimizer_class=type(engine.optimizer).__name__,
                   basic_optimizer=type(getattr(engine, "basic_optimizer", None)).__name__,
                   num_params=sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters()))
    except Exception as exc:  # noqa: BLE001 - every failure becomes a row
        row.update(status="oom" if _is_oom(exc) else "failed", reason=_one_line(exc))
        if not _is_oom(exc):
            row["traceback"] = traceback.format_exc()[-2000:]
    row["peak_memory_bytes"] = torch.cuda.max_memory_allocated() - base if CUDA else None
    row["reserved_memory_bytes"] = torch.cuda.max_memory_reserved() if CUDA else None
    row["wall_s"] = time.perf_counter() - started
    try:
        if engine is not None and hasattr(engine, "destroy"):
            engine.destroy()
    except Exception:  # noqa: BLE001 - clean-up is best effort; the leak check below decides
        pass
    del engine, model, batch
    sys.last_traceback = sys.last_value = None
    gc.collect()
    if CUDA:
        torch.cuda.empty_cache()
    row["left_allocated_bytes"] = _allocated() - base
    return row


def _ends_chain(row: dict[str, Any]) -> bool:
    """A doubling chain goes no further after a run that did not fit, failed, or was already slow."""
    return row["status"] != "ok" or row.get("step_s", 0) > CHAIN_MAX_STEP_S


def _hung(run_id: str, limit: float) -> None:
    print(f"{run_id}: no result after {limit:.0f} s, taken as hung; exiting", flush=True)
    os._exit(4)


def environment(path: Path) -> None:
    """GPU, driver and library versions, and two ceilings measured here: a large bf16 matmul and a device copy."""
    import subprocess
    import deepspeed
    import transformers
    env: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "deepspeed": deepspeed.__version__,
                           "transformers": transformers.__version__, "python": sys.version.split()[0]}
    if CUDA:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, memory_bytes=props.total_memory, multiprocessors=props.multi_processor_count)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, check=False)
        env["nvidia_smi"] = smi.stdout.strip()
        n = 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        _sync()
        t0 = time.perf_counter()
        for _ in range(10):
            a @ b
        _sync()
        env["bf16_matmul_8192_tflops"] = 10 * 2 * n**3 / (time.perf_counter() - t0) / 1e12
        x = torch.empty(1 << 30, device="cuda", dtype=torch.float32)
        y = torch.empty_like(x)
        y.copy_(x)
        _sync()
        t0 = time.perf_counter()
        for _ in range(10):
            y.copy_(x)
        _sync()
        env["copy_gb_per_s_read_plus_write"] = 10 * 2 * x.numel() * 4 / (time.perf_counter() - t0) / 1e9
        del a, b, x, y
        torch.cuda.empty_cache()
    path.write_text(json.dumps(env, indent=1) + "\n")
    print(json.dumps(env), flush=True)


def _append(out: Path, row: dict[str, Any]) -> None:
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plan", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--deadline", type=float, default=float("inf"), help="Unix time after which no run starts")
    p.add_argument("--only", default="", help="comma-separated run ids (default: all)")
    p.add_argument("--env", type=Path, help="write the environment JSON here and exit")
    args = p.parse_args(argv)
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    if args.env:
        environment(args.env)
        return 0
    if not (args.plan and args.out):
        p.error("--plan and --out are required (or --env)")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    runs = json.loads(args.plan.read_text())["runs"]
    only = {s for s in args.only.split(",") if s}
    inflight = args.out.with_suffix(".inflight")
    if inflight.exists():  # the previous process died inside this run
        _append(args.out, {"id": inflight.read_text().strip(), "status": "failed",
                           "reason": "the worker process died during this run"})
        inflight.unlink()
    rows = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()] if args.out.exists() else []
    rows = [r for r in rows if r.get("status") != "skipped"]  # a run skipped for an earlier deadline runs now
    done = {r["id"] for r in rows}
    by_id = {r["id"]: r for r in runs}
    stopped = {by_id[r["id"]]["chain"] for r in rows if r["id"] in by_id and _ends_chain(r)}
    for run in runs:
        if run["id"] in done or (only and run["id"] not in only):
            continue
        if run.get("chain") and run["chain"] in stopped:
            continue
        if time.time() + run.get("budget_s", 10) > args.deadline:
            _append(args.out, {"id": run["id"], "status": "skipped", "reason": "deadline"})
            continue
        inflight.write_text(run["id"])
        limit = OFFLOAD_WATCHDOG_S if run.get("offload") else max(WATCHDOG_MIN_S, 4 * run.get("budget_s", 10))
        watchdog = threading.Timer(limit, _hung, (run["id"], limit))
        watchdog.start()
        row = run_one(run)
        watchdog.cancel()
        _append(args.out, row)
        inflight.unlink()
        peak = (row["peak_memory_bytes"] or 0) / 2**30
        print(f"{row['id']}: {row['status']} step {row.get('step_s')} peak {peak:.2f} GiB "
              f"wall {row['wall_s']:.1f} s {row['reason'][:120]}", flush=True)
        if run.get("chain") and _ends_chain(row):
            stopped.add(run["chain"])
        if row["left_allocated_bytes"] > LEAK_LIMIT_BYTES:
            print(f"{row['left_allocated_bytes'] / 2**30:.1f} GiB left allocated: restarting", flush=True)
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
