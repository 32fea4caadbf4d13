"""zerotune's built-in workload (calibrate/workload.py) as DeepSpeed's autotuner can launch it.

DeepSpeed's autotuner does not pass a file to the user script: it replaces the value after
`--deepspeed_config` with the experiment's ds_config as URL-safe base64 JSON (autotuning/scheduler.py,
run_experiment), while calibrate/workload.py opens that value as a path. This wrapper decodes such a
value into a JSON file in a temporary folder and runs the workload unchanged; a value that names an
existing file is passed through, so the same script serves DeepSpeed's autotuner, `zerotune tune` and
the A/B re-measurements, and the three measure exactly the same training step.

    deepspeed --num_gpus 2 benchmarks/ds_workload.py --deepspeed_config <file or base64> --model M ...
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script, Python puts benchmarks/ first, not the repository root
    sys.path.insert(0, str(ROOT))

__all__ = ["config_argument_to_file", "main"]

CONFIG_FLAG = "--deepspeed_config"


def config_argument_to_file(value: str, folder: Path) -> Path:
    """The path of the ds_config `value` names: the file itself, or a file written from base64 JSON."""
    try:
        if Path(value).is_file():
            return Path(value)
    except OSError:  # a base64 string is longer than a file name may be (ENAMETOOLONG)
        pass
    try:
        doc = json.loads(base64.urlsafe_b64decode(value.encode()).decode())
    except (binascii.Error, UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{CONFIG_FLAG} {value[:40]!r}: neither a file nor base64 JSON; pass a ds_config.json "
                         f"path") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{CONFIG_FLAG}: the decoded ds_config is a {type(doc).__name__}, not a JSON object")
    path = folder / "ds_config.json"
    path.write_text(json.dumps(doc, indent=1))
    return path


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if CONFIG_FLAG not in args or args.index(CONFIG_FLAG) + 1 >= len(args):
        raise SystemExit(f"ds_workload: error: {CONFIG_FLAG} FILE_OR_BASE64 is required")
    at = args.index(CONFIG_FLAG) + 1
    from zerotune.calibrate import workload  # imports torch and deepspeed: only under the launcher
    with tempfile.TemporaryDirectory(prefix="zt_dsconfig_") as folder:
        args[at] = str(config_argument_to_file(args[at], Path(folder)))
        workload.main(args)


if __name__ == "__main__":
    main()
