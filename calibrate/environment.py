"""What a measurement ran on: software versions, accelerator and host, as one JSON-ready dict.

Stored beside every run (run_dir/environment.json) and in calibration profiles, so a profile says which
torch / DeepSpeed / NCCL and which device it was fitted on. torch and deepspeed are imported lazily and
may be missing: their versions are then None. Without the device query (a launch's run folder) nothing is
imported: the versions come from the installed packages' metadata, which costs milliseconds where importing
torch and DeepSpeed in the tuning process cost 1.4-2.3 s before its first launch (this project's CPU VM).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import platform
import socket
import sys
from typing import Any

__all__ = ["collect_environment"]


def _no_versions() -> dict[str, Any]:
    return {"python": platform.python_version(), "torch": None, "deepspeed": None, "nccl": None, "cuda": None}


def _installed_versions() -> dict[str, Any]:
    """The versions from the packages' metadata; CUDA from torch's local version tag (2.11.0+cu130 -> 13.0), NCCL
    only where torch is already imported."""
    out = _no_versions()
    for name in ("torch", "deepspeed"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    tag = (out["torch"] or "").partition("+")[2]
    if tag.startswith("cu") and tag[2:].isdigit() and len(tag) >= 5:
        out["cuda"] = f"{tag[2:-1]}.{tag[-1]}"
    if "torch" in sys.modules:
        out.update({k: v for k, v in _versions().items() if k in ("cuda", "nccl") and v is not None})
    return out


def _versions() -> dict[str, Any]:
    out = _no_versions()
    try:
        import torch
    except ImportError:
        return out
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        version = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    try:
        import deepspeed
    except ImportError:
        return out
    out["deepspeed"] = deepspeed.__version__
    return out


def _device() -> dict[str, Any]:
    """The accelerator DeepSpeed picks (DS_ACCELERATOR or auto-detection): name, count, memory of device 0."""
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        return {"accelerator": None}
    acc = get_accelerator()
    info: dict[str, Any] = {"accelerator": acc.device_name(), "communication_backend": acc.communication_backend_name(),
                            "device_count": acc.device_count(), "device_memory_bytes": acc.total_memory()}
    name = acc.device_name()
    if name == "cuda":
        import torch
        info["device_name"] = torch.cuda.get_device_name(0)
    elif name == "hpu":  # Habana's torch bridge names the card; the HCCL version comes with the SynapseAI stack
        import habana_frameworks.torch.hpu as hpu  # type: ignore[import-not-found]
        info["device_name"] = hpu.get_device_name()
    else:
        info["device_name"] = _cpu_model()
    return info


def _cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux); platform.processor() is often empty there."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect_environment(query_device: bool = True) -> dict[str, Any]:
    """Versions, host and (unless query_device is False, which avoids touching the accelerator and importing
    torch or DeepSpeed) the device."""
    env: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(), "platform": platform.platform(), "executable": sys.executable,
        **(_versions() if query_device else _installed_versions()),
    }
    if query_device:
        env.update(_device())
    return env
