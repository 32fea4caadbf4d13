"""Loaded by Python at start-up in every process of `zerotune tune`'s profiling run (this folder is first on
PYTHONPATH only for that run, with ZEROTUNE_PROFILE_OUT naming where to write). The user's script is not changed.

When `deepspeed` is imported, `deepspeed.initialize` is wrapped; once it has built the engine:
- rank 0 writes <out>.model.json: calibrate/inspect_model.py's reading of engine.module (loaded by file path, so
  no zerotune package name enters the user's process);
- every rank writes <out>.rank<R>.json after each optimizer step: the first micro-batch's input shapes and the
  first block's input shape (forward pre-hooks), forward calls of the first block and of its first module with
  parameters, all and those inside the model's forward (more than one a micro-step there: blocks that share
  weights; the rest are activation checkpointing's recomputes in backward), the bytes the first
  block keeps for backward in its first forward (saved-tensor hooks; for a model without a repeated block, the
  whole model's, and its first forward's FLOPs: calibrate/site_counts.py, loaded by path too),
  calls to scaled_dot_product_attention and their dropout, wall
  seconds per optimizer step and the peak memory so far (CPU: peak resident set size, getrusage; accelerators:
  max_memory_allocated), and the optimizer the engine steps (its class and its fused / foreach settings); rank 0
  also times one matmul and one tensor copy before the first step (the device's pace today, against the
  calibration's); on the CPU, each backward's share of subnormal values in the logits' gradient (sampled).
Anything that goes wrong here is written down and never stops the user's run. Another sitecustomize further
along sys.path (a site's own) still runs, after this one.

`tune`'s experiments put this folder first on PYTHONPATH too, with ZEROTUNE_PEAK_OUT instead: nothing is patched,
and each rank writes <out>.rank<R>.json with its peak memory (as above) when the process exits (DeepSpeed's engine
ends an autotuning experiment with exit() once it has written its metrics, runtime/engine.py _autotuning_exit).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
_OUT = os.environ.get("ZEROTUNE_PROFILE_OUT", "")
_PEAK_OUT = os.environ.get("ZEROTUNE_PEAK_OUT", "")
KIB = 1024  # ru_maxrss is in KiB on Linux (getrusage(2))
MAX_LENGTHS = 256  # token inputs' lengths recorded per rank (each forward's; a profiling run makes a few)
SUBNORMAL_STRIDE = 97  # every 97th value of the logits' gradient is looked at: a sample, not a second pass over it


def _write(path: str, doc: dict[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as out:
        json.dump(doc, out, indent=1, default=str)
    os.replace(tmp, path)


def _by_path(name: str) -> Any:
    """A calibrate/ module loaded from its file, under a private name (no zerotune package enters the process)."""
    spec = importlib.util.spec_from_file_location(f"_zerotune_{name}", _HERE.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _inspect_module() -> Any:
    return _by_path("inspect_model")


def _paces() -> Any:
    """calibrate/site_paces.py: the matmul, copy, dropout and subnormal checks."""
    return _by_path("site_paces")


def _counts() -> Any:
    """calibrate/site_counts.py: the bytes a block keeps for backward and a model's forward FLOPs."""
    return _by_path("site_counts")


def _peak_memory_bytes() -> float:
    from deepspeed.accelerator import get_accelerator
    acc = get_accelerator()
    if acc.device_name() == "cpu":
        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB)
    return float(acc.max_memory_allocated())


def _after_checks() -> float | None:
    """After rank 0's matmul and copy checks (about 180 MB of buffers): an accelerator's peak is reset so that the
    steps' peak is the training's; the CPU's (getrusage's lifetime peak) cannot be, so the peak the checks reached is
    returned, and a rank whose steps never went above it has no training peak to report (validate/profiled.py)."""
    from deepspeed.accelerator import get_accelerator
    acc = get_accelerator()
    if acc.device_name() == "cpu":
        return _peak_memory_bytes()
    acc.reset_peak_memory_stats()
    return None


def _shapes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[dict[str, Any]]:
    import torch
    values = list(args) + list(kwargs.items())
    out = []
    for value in values:
        name, tensor = value if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) else ("", value)
        if isinstance(tensor, dict):  # a batch passed as one mapping
            out += _shapes((), tensor)
        elif isinstance(tensor, (list, tuple)):
            out += _shapes(tuple(tensor), {})
        elif isinstance(tensor, torch.Tensor):
            out.append({"name": name, "shape": list(tensor.shape), "dtype": str(tensor.dtype).replace("torch.", "")})
    return out


def _hooks(engine: Any, state: dict[str, Any], blocks: Any) -> None:
    import torch
    import torch.nn.functional as F
    counts = _counts()

    # Only training forwards count: an evaluation pass (engine.eval() under torch.no_grad(), every N steps or at
    # step 0) runs the same modules without gradients, and counted as forwards it hid the recomputation of a script
    # that checkpoints its blocks (12 training forwards and 32 evaluation ones read as no checkpointing). Told apart
    # at the model's own forward: inside a training one a checkpointed block runs without gradients too
    # (torch.utils.checkpoint and deepspeed.checkpointing run it under no_grad and again in backward).
    def pre_forward(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        state["in_eval"] = not torch.is_grad_enabled()
        if state["in_eval"]:
            return
        state["forward_calls"] += 1
        state["in_forward"] = True
        state["step_start"] = state["step_start"] or time.perf_counter()
        if state["inputs"] is not None and len(state["input_lengths"]) >= MAX_LENGTHS:
            return
        shapes = _shapes(args, kwargs)
        if state["inputs"] is None:
            state["inputs"] = shapes
        # every forward's token length: a collator that pads each batch to its longest sample changes it
        vectors = bool(shapes) and len(shapes[0]["shape"]) >= 3 and shapes[0]["dtype"].startswith(("float", "bfloat"))
        ids = None if vectors else next(  # after frames or images, integer tensors are targets, not token ids
            (s["shape"] for s in shapes if len(s["shape"]) == 2 and s["dtype"].startswith(("int", "uint"))), None)
        if ids is not None and len(state["input_lengths"]) < MAX_LENGTHS:
            state["input_lengths"].append(int(ids[1]))
    def post_forward(*_: Any) -> None:
        state["in_forward"] = state["in_eval"] = False
    engine.module.register_forward_pre_hook(pre_forward, with_kwargs=True)
    engine.module.register_forward_hook(post_forward)
    if blocks is not None:
        def count(_module: Any, args: tuple[Any, ...]) -> None:
            if state.get("in_eval"):
                return
            state["block_calls"] += 1
            state["block_forward_calls"] += bool(state.get("in_forward"))  # not a recompute in backward
            if state.get("block_input") is None:
                state["block_input"] = _shapes(args[:1], {})
        blocks[0].register_forward_pre_hook(count)
        inner = next((m for m in blocks[0].modules()
                      if m is not blocks[0] and next(m.parameters(recurse=False), None) is not None), None)
        if inner is not None:  # a script that checkpoints inside its block (torch.utils.checkpoint of a method)
            def count_inner(*_: Any) -> None:  # recomputes this module without calling the block again
                if state.get("in_eval"):
                    return
                state["inner_calls"] += 1
                state["inner_forward_calls"] += bool(state.get("in_forward"))
            inner.register_forward_pre_hook(count_inner)
        counts.count_saved(engine.module, blocks[0], state, "block")
    else:  # no repeated block to read: what the whole model costs per sample stands in for its structure
        counts.count_saved(engine.module, engine.module, state, "model")
        try:
            counts.count_flops(engine.module, state)
        except Exception as exc:  # noqa: BLE001 - a torch without the counter loses the count, not the run
            state["model_forward_flops_error"] = f"{type(exc).__name__}: {exc}"
    sdpa = F.scaled_dot_product_attention

    @functools.wraps(sdpa)
    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        if state.get("in_eval"):
            return sdpa(*args, **kwargs)
        state["sdpa_calls"] += 1
        query, key = kwargs.get("query", args[0] if args else None), kwargs.get("key", args[1] if len(args) > 1 else None)
        if state.get("sdpa_shapes") is None and isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor):
            state["sdpa_shapes"] = [list(query.shape), list(key.shape)]
        dropout = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
        state["sdpa_dropout_p"] = max(state["sdpa_dropout_p"], float(dropout or 0.0))
        return sdpa(*args, **kwargs)
    F.scaled_dot_product_attention = counted  # multi_head_attention_forward looks it up in F's globals
    _watch_embedding_projection(engine.module, state)


_PROJECTIONS = ("linear", "matmul", "mm", "bmm", "addmm", "einsum", "__matmul__", "__rmatmul__")
"""Functions a head projects with: F.linear (nn.Linear's forward calls it), torch.matmul / mm / einsum and the @
operator (`x @ wte.weight.T`). An embedding lookup takes the table too, through F.embedding, not these."""


def _scores(args: Any) -> bool:
    """Whether a matmul's operands are attention's scores product: (..., s, d) x (..., d, s), at least 3-D, the
    same sequence on both sides and d <= s (where d = s the scores times the values match too, and say the same)."""
    import torch
    if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]):
        return False
    a, b = args[0], args[1]
    return (a.dim() >= 3 and b.dim() == a.dim() and a.shape[-1] == b.shape[-2] and a.shape[-2] == b.shape[-1]
            and a.shape[-1] <= a.shape[-2])


def _watch_embedding_projection(module: Any, state: dict[str, Any]) -> None:
    """Counts projections onto an nn.Embedding's table during the first forward: a head tied by projecting with
    the embedding itself (GPT-2 style `F.linear(x, wte.weight)`, or `x @ wte.weight.T`) has no Linear module to
    read. A torch function mode (torch.overrides.TorchFunctionMode) sees every torch function and Tensor method
    call; an argument whose storage is a table's (a transpose is a view of it) is a projection. The table is
    looked up at each call, so ZeRO-3's gathered weights count too. Sharing the table's storage is not enough:
    ZeRO-1 and -2 make every parameter a view into one flat buffer (stage_1_and_2.py, the bit16 groups' flattened
    partitions), so an argument counts only where its first element lies inside the table's own bytes. The mode is
    left after the first forward so later steps are timed without it.

    It also records the first attention-shaped matmul (q @ k^T: (..., s, d) x (..., d, s)), whose last dimension
    is the head width where no module attribute names the heads."""
    import torch
    from torch.overrides import TorchFunctionMode

    embeddings = [m for m in module.modules() if isinstance(m, torch.nn.Embedding)]

    def on_table(arg: Any) -> bool:
        if isinstance(arg, (list, tuple)):
            return any(on_table(a) for a in arg)
        if not isinstance(arg, torch.Tensor) or arg.numel() == 0:
            return False
        ptr = arg.data_ptr()
        return any(e.weight.numel() and e.weight.data_ptr() <= ptr
                   < e.weight.data_ptr() + e.weight.numel() * e.weight.element_size() for e in embeddings)

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            name = getattr(func, "__name__", "")
            if name in _PROJECTIONS:
                if on_table(args):
                    state["embedding_projections"] += 1
                if state.get("attention_matmul") is None and _scores(args):
                    state["attention_matmul"] = list(args[0].shape)
            return func(*args, **(kwargs or {}))

    watch = Watch()

    def restore(*_: Any) -> None:
        watch.__exit__(None, None, None)
        handle.remove()
    state["embedding_projections"] = 0
    watch.__enter__()
    handle = module.register_forward_hook(restore)


def _wrap_step(engine: Any, state: dict[str, Any], path: str) -> None:
    step = engine.step

    @functools.wraps(step)
    def timed(*args: Any, **kwargs: Any) -> Any:
        boundary = bool(engine.is_gradient_accumulation_boundary())
        try:
            return step(*args, **kwargs)
        finally:  # DeepSpeed's autotuning exits inside step at end_profile_step (runtime/engine.py _autotuning_exit)
            if boundary:
                now = time.perf_counter()
                state["step_s"].append(now - state["step_start"])
                state["step_start"] = now
                state["peak_memory_bytes"] = _peak_memory_bytes()
                state["micro_steps_per_step"] = int(engine.gradient_accumulation_steps())
                state["train_micro_batch_size_per_gpu"] = int(engine.train_micro_batch_size_per_gpu())
                state["engine_config"] = {"zero_stage": int(engine.zero_optimization_stage()),
                                          "gradient_accumulation_steps": int(engine.gradient_accumulation_steps()),
                                          "autotuning": bool(engine.autotuning_enabled())}
                _write(path, state)
    engine.step = timed


def _optimizer(engine: Any) -> dict[str, Any]:
    """The torch optimizer under DeepSpeed's wrappers: the script's own or the one the optimizer section built."""
    opt = getattr(engine, "basic_optimizer", None) or getattr(engine, "client_optimizer", None)
    if opt is None:
        return {}
    defaults = getattr(opt, "defaults", None) or {}
    kind = type(opt)
    return {"class": f"{kind.__module__}.{kind.__qualname__}", "fused": defaults.get("fused"),
            "foreach": defaults.get("foreach")}


def _recheck_matmul(engine: Any, state: dict[str, Any], path: str) -> None:
    """At exit of rank 0, after the run's timed steps: the matmul check again, and the faster of the two kept. A
    shared machine's pace has slow spells of seconds: on this project's CPU VM (2026-11-29) one check before the
    first step read 77 and another 83 GFLOP/s where every other run that day read 90-96, and the tune paced every
    GEMM by it (a first experiment +22% and +25% off). A slow spell rarely spans both checks; a slower machine slows
    both."""
    try:
        first = state["matmul"]
        again = _paces().matmul_rate(engine)
        if again["m"] == first.get("m") and again["flops_per_s"] > first["flops_per_s"]:
            state["matmul"] = {**again, "first_flops_per_s": first["flops_per_s"]}
            _write(path, state)
    except Exception:  # noqa: BLE001 - a failed check keeps the first one, never fails the user's run
        pass


def _watch_logits_gradients(state: dict[str, Any]) -> None:
    """On the CPU: the share of subnormal values (nonzero, below the dtype's smallest normal) in the gradient of every
    cross-entropy's input, the logits, sampled every SUBNORMAL_STRIDE-th value. A CPU multiplies subnormal operands
    through microcode assists, so the logits' backward GEMMs slow with this share (ModelSpec.
    logits_grad_subnormal_share). torch.nn.functional.cross_entropy is wrapped, which nn.CrossEntropyLoss and
    transformers' losses call by attribute; a script that imported the function itself before deepspeed.initialize
    is not seen, and its share stays unread (0)."""
    import torch
    import torch.nn.functional as functional

    cross_entropy = functional.cross_entropy
    state["logits_grad_subnormal_shares"] = []

    def record(grad: torch.Tensor) -> None:
        sample = grad.detach().reshape(-1)[::SUBNORMAL_STRIDE]
        if sample.is_floating_point() and sample.numel():
            tiny = torch.finfo(sample.dtype).tiny
            share = ((sample != 0) & (sample.abs() < tiny)).float().mean()
            state["logits_grad_subnormal_shares"].append(round(float(share), 6))

    @functools.wraps(cross_entropy)
    def watched(input: Any, *args: Any, **kwargs: Any) -> Any:
        if (isinstance(input, torch.Tensor) and input.requires_grad
                and len(state["logits_grad_subnormal_shares"]) < MAX_LENGTHS):
            input.register_hook(record)
        return cross_entropy(input, *args, **kwargs)
    functional.cross_entropy = watched


def _attach(engine: Any) -> None:
    rank = int(getattr(engine, "global_rank", 0))
    state: dict[str, Any] = {"rank": rank, "inputs": None, "input_lengths": [], "block_input": None, "forward_calls": 0,
                             "block_calls": 0, "inner_calls": 0, "block_forward_calls": 0, "inner_forward_calls": 0,
                             "in_forward": False,
                             "sdpa_calls": 0, "sdpa_shapes": None, "attention_matmul": None,
                             "sdpa_dropout_p": 0.0, "block_saved_bytes": 0, "block_saved_calls": 0, "model_saved_bytes": 0,
                             "model_saved_calls": 0, "model_forward_flops": 0, "model_forward_ops": 0, "step_s": [],
                             "step_start": 0.0, "peak_memory_bytes": None,
                             "peak_memory_kind": "", "world_size": int(getattr(engine, "world_size", 1)),
                             "optimizer": _optimizer(engine)}
    from deepspeed.accelerator import get_accelerator
    inspect = _inspect_module()
    blocks = inspect.find_blocks(engine.module)
    doc: dict[str, Any] = {}
    if rank == 0:
        try:
            doc = inspect.describe(engine.module)
        except Exception as exc:  # noqa: BLE001 - an unreadable model is reported, the user's run goes on
            doc = {"structure": None, "error": f"{type(exc).__name__}: {exc}"}
        try:
            state["matmul"] = _paces().matmul_rate(engine)
        except Exception as exc:  # noqa: BLE001 - a failed speed check loses the check, never the user's run
            state["matmul"] = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            state["copy"] = _paces().copy_rate()
        except Exception as exc:  # noqa: BLE001 - as above
            state["copy"] = {"error": f"{type(exc).__name__}: {exc}"}
        if get_accelerator().device_name() == "cpu":
            try:
                state["subnormal"] = _paces().subnormal_rate()
            except Exception as exc:  # noqa: BLE001 - as above
                state["subnormal"] = {"error": f"{type(exc).__name__}: {exc}"}
        state["checks_peak_memory_bytes"] = _after_checks()
        _write(f"{_OUT}.model.json", doc)
    state["peak_memory_kind"] = ("peak RSS of the rank's process (getrusage)" if get_accelerator().device_name() == "cpu"
                                 else "max_memory_allocated")
    if rank == 0 and not inspect.readable(doc):  # what the model costs stands in for what could not be read
        blocks, state["stand_in"] = None, True
    _hooks(engine, state, blocks[1] if blocks else None)
    if get_accelerator().device_name() == "cpu":
        _watch_logits_gradients(state)
    _wrap_step(engine, state, f"{_OUT}.rank{rank}.json")
    if rank == 0 and "flops_per_s" in (state.get("matmul") or {}):
        import atexit
        atexit.register(_recheck_matmul, engine, state, f"{_OUT}.rank{rank}.json")


def _patch(deepspeed: Any) -> None:
    initialize = deepspeed.initialize

    @functools.wraps(initialize)
    def profiled(*args: Any, **kwargs: Any) -> Any:
        model = kwargs.get("model", args[1] if len(args) > 1 else None)
        if type(model).__name__ == "PipelineModule":  # deepspeed.initialize(args=None, model=None, ...)
            _write(f"{_OUT}.pipeline.json", {"num_stages": int(getattr(model, "num_stages", 0) or 0)})
        result = initialize(*args, **kwargs)
        try:
            _attach(result[0])
        except Exception as exc:  # noqa: BLE001 - the profile is lost, never the user's run
            _write(f"{_OUT}.error{os.getpid()}.json", {"error": f"{type(exc).__name__}: {exc}"})
        return result
    deepspeed.initialize = profiled


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds `deepspeed` through the other finders, then patches it right after its own code has run. It stays on
    sys.meta_path until then: availability checks (transformers' is_deepspeed_available calls
    importlib.util.find_spec) ask for a spec they never execute."""

    def __init__(self) -> None:
        self._looking = False

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "deepspeed" or self._looking:
            return None
        self._looking = True  # importlib.util.find_spec asks every finder, this one included
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._looking = False
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def patched(module: Any) -> None:
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _patch(module)
        spec.loader.exec_module = patched  # type: ignore[method-assign]
        return spec


def _chain() -> None:
    """Run the next sitecustomize on sys.path, which this one shadows."""
    for entry in sys.path:
        candidate = Path(entry or ".") / "sitecustomize.py"
        if candidate.resolve().parent == _HERE or not candidate.is_file():
            continue
        spec = importlib.util.spec_from_file_location("_site_sitecustomize", candidate)
        if spec and spec.loader:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        return


def _write_peak() -> None:
    """At exit of an experiment's rank: its peak memory (nothing where DeepSpeed never started)."""
    if "deepspeed" not in sys.modules:
        return
    try:
        from deepspeed.accelerator import get_accelerator
        kind = "RSS" if get_accelerator().device_name() == "cpu" else "max_memory_allocated"
        _write(f"{_PEAK_OUT}.rank{os.environ.get('RANK', '0')}.json",
               {"peak_memory_bytes": _peak_memory_bytes(), "peak_memory_kind": kind})
    except Exception:  # noqa: BLE001 - never the user's run's failure
        pass


if _OUT:
    if "deepspeed" in sys.modules:
        _patch(sys.modules["deepspeed"])
    else:
        sys.meta_path.insert(0, _PatchOnImport())
elif _PEAK_OUT:
    import atexit
    atexit.register(_write_peak)
_chain()
