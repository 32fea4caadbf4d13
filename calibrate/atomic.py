"""Files written whole or not at all: a temporary file beside the target, flushed to disk, then renamed over it,
so a reader (or a crash) never sees half a profile, metrics file or results record. The one writer for all."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_text_atomic", "write_json_atomic"]


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, doc: Any, indent: int = 2) -> None:
    """One JSON document; NaN and infinities are refused (ValueError), never written as non-JSON."""
    write_text_atomic(path, json.dumps(doc, indent=indent, allow_nan=False) + "\n")
