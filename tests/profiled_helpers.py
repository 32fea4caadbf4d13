"""Helpers of the profiling-run tests (test_profiled*.py): the fixture scripts as modules, the files the profiling hook
writes, the site itself and the bytes autograd saves in a block."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from zerotune.validate.profiled import model_yaml
from zerotune.validate.site_env import PROFILING_SITE

torch = pytest.importorskip("torch")
from zerotune.calibrate.inspect_model import describe  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent / "fixtures" / "scripts"


def fixture_script(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(f"fixture_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def write_profile(prefix: Path, model: torch.nn.Module, inputs: list[dict], **rank0) -> None:
    Path(f"{prefix}.model.json").write_text(json.dumps(describe(model), default=str))
    state = {"rank": 0, "inputs": inputs, "forward_calls": 3, "block_calls": 3, "sdpa_calls": 0, "sdpa_dropout_p": 0.0,
             "step_s": [2.0, 1.0, 1.2], "peak_memory_bytes": 1e9, "peak_memory_kind": "peak RSS", **rank0}
    Path(f"{prefix}.rank0.json").write_text(json.dumps(state))
    Path(f"{prefix}.rank1.json").write_text(json.dumps({**state, "rank": 1, "peak_memory_bytes": 1.5e9}))


def profiled_yaml(tmp_path: Path, run) -> Path:  # type: ignore[no-untyped-def]
    path = tmp_path / "model_profiled.yaml"
    path.write_text(model_yaml(run, "test"))
    return path


def profiling_site_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("zt_profiling_site", PROFILING_SITE / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(site)  # type: ignore[union-attr]
    return site


def saved_bytes_per_block(model: torch.nn.Module, blocks: list[torch.nn.Module], **inputs: torch.Tensor) -> list[int]:
    """Bytes autograd saves inside each of `blocks` in one forward (as calibrate/profiling_site counts them: each
    storage once)."""
    seen: list[dict[int, int]] = [{} for _ in blocks]
    handles = []
    for block, saved in zip(blocks, seen):
        def pack(t: torch.Tensor, saved: dict[int, int] = saved) -> torch.Tensor:
            saved[t.data_ptr()] = t.numel() * t.element_size()
            return t
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        handles += [block.register_forward_pre_hook(lambda *_, h=hooks: h.__enter__()),
                    block.register_forward_hook(lambda *_, h=hooks: h.__exit__(None, None, None))]
    model(**inputs)
    for handle in handles:
        handle.remove()
    return [sum(saved.values()) for saved in seen]
