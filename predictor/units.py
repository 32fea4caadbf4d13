"""The one place that owns unit constants: everything inside zerotune is SI (bytes, seconds, FLOP/s)."""

__all__ = ["KIB", "MIB", "GIB", "GB", "TERA", "GIGA", "MICRO", "NANO", "bytes_to_gib", "bytes_to_gb"]

KIB = 1024
MIB = 1024**2
GIB = 1024**3
GB = 1e9  # decimal gigabyte: datasheets and the ZeRO paper count memory in 1e9 bytes
GIGA = 1e9
TERA = 1e12
MICRO = 1e-6
NANO = 1e-9


def bytes_to_gib(num_bytes: float) -> float:
    return num_bytes / GIB


def bytes_to_gb(num_bytes: float) -> float:
    return num_bytes / GB
