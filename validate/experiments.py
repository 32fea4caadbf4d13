"""What one `tune` experiment runs: the user's command split into script, arguments and ds_config, the
arguments rewritten per `autotuning.arg_mappings`, and the experiment's ds_config.

Commands stay argument lists from the user's shell to the launcher: nothing here joins or parses a shell
string, so a user argument can never become a command.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from zerotune.calibrate.launch import read_hostfile
from zerotune.predictor import DSConfig, to_ds_config
from zerotune.predictor.catalog import read_user_text
from zerotune.predictor.dsconfig import AUTO, AutotuningConfig

__all__ = ["UserCommand", "read_ds_config", "read_hostfile", "filtered_resources", "model_info_ds_config", "model_from_num_params", "split_user_command", "rewrite_args", "check_arg_mappings", "batch_as_given", "trainer_arg_mappings", "experiment_ds_config",
           "optimal_ds_config", "BATCH_KEYS", "DS_CONFIG_FLAGS", "TRAINER_FLAGS"]

DS_CONFIG_FLAGS = ("--deepspeed_config", "--deepspeed")
"""How scripts receive the config path: deepspeed.add_config_arguments' --deepspeed_config, or the Hugging Face
Trainer's --deepspeed PATH (DeepSpeed's scheduler looks for the same two, autotuning/scheduler.py)."""
BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
"""The ds_config keys a tuned experiment changes that scripts also take from their own arguments."""
_BATCH_FLAG = re.compile(r"^--?[\w-]*(batch[_-]?size|micro[_-]?batch)[\w-]*(=.*)?$", re.IGNORECASE)
_ACCUM_FLAG = re.compile(r"^--?[\w-]*(accumulation|grad[_-]?accum)[\w-]*(=.*)?$", re.IGNORECASE)
TRAINER_FLAGS = ("--per_device_train_batch_size", "--gradient_accumulation_steps")
"""The Hugging Face TrainingArguments flags that fill BATCH_KEYS' "auto" values."""
_NOT_TRAINING = re.compile(r"eval|valid|test|infer", re.IGNORECASE)


@dataclass(frozen=True)
class UserCommand:
    """`user_script.py --deepspeed ds_config.json <user args>`, taken apart."""

    script: Path
    args: tuple[str, ...]
    """The user's arguments without the config flag and its path (the experiment's config path is added)."""
    ds_config_flag: str
    """The flag the script reads the config path from, kept as the user wrote it."""
    ds_config_path: Path


def _flag_value(argv: list[str], i: int) -> str | None:
    """The value given to argv[i] (`--flag value` or `--flag=value`), or None when it has none."""
    if "=" in argv[i]:
        return argv[i].split("=", 1)[1]
    if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
        return argv[i + 1]
    return None


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value the arguments give `flag` (`--flag value` or `--flag=value`), or None when they do not give it."""
    at = next((i for i, arg in enumerate(args) if arg == flag or arg.startswith(flag + "=")), None)
    return _flag_value(list(args), at) if at is not None else None


def split_user_command(script: str | Path, argv: Sequence[str]) -> UserCommand:
    """Find the ds_config path among the user's arguments. `--deepspeed` with no path after it is
    deepspeed.add_config_arguments' on/off switch and stays; the path then comes from --deepspeed_config."""
    argv = list(argv)
    for flag in DS_CONFIG_FLAGS:
        for i, arg in enumerate(argv):
            if arg != flag and not arg.startswith(flag + "="):
                continue
            value = _flag_value(argv, i)
            if value is None:
                continue
            rest = argv[:i] + argv[i + (1 if "=" in arg else 2):]
            for other in DS_CONFIG_FLAGS:  # a second ds_config: one of the two trains untuned
                again = next((j for j, a in enumerate(rest) if (a == other or a.startswith(other + "="))
                              and str(_flag_value(rest, j)).endswith(".json")), None)
                if again is not None:
                    raise ValueError(f"the script's arguments give two ds_configs, {flag} {value} and {other} "
                                     f"{_flag_value(rest, again)}: zerotune tunes the first and the script may read "
                                     f"the other; give one")
            return UserCommand(Path(script), tuple(rest), flag, Path(value))
    raise ValueError(f"no ds_config among the arguments of {script}: pass it as `--deepspeed ds_config.json` "
                     f"(or --deepspeed_config), as for deepspeed --autotuning")


def _config_value(doc: Mapping[str, Any], key: str) -> Any:
    """A key's value at the top level or in any section, as DeepSpeed's get_val_by_key finds it."""
    if key in doc:
        return doc[key]
    for value in doc.values():
        if isinstance(value, Mapping):
            found = _config_value(value, key)
            if found is not None:
                return found
    return None


def rewrite_args(args: Sequence[str], arg_mappings: Mapping[str, str] | None,
                 ds_config: Mapping[str, Any]) -> tuple[str, ...]:
    """The user's arguments with each mapped flag set to the experiment's ds_config value (replaced where the
    user gave it, appended otherwise), as DeepSpeed's scheduler rewrites them; "auto" values are left alone."""
    out = list(args)
    for key, flag in (arg_mappings or {}).items():
        key, flag = key.strip(), flag.strip()
        value = _config_value(ds_config, key)
        if value is None or str(value) == "auto":
            continue
        for i, arg in enumerate(out):
            if arg.startswith(flag + "="):
                out[i] = f"{flag}={value}"
                break
            if arg == flag and i + 1 < len(out):
                out[i + 1] = str(value)
                break
        else:
            out += [flag, str(value)]
    return tuple(out)


TRAINER_DEFAULTS = (8, 1)
"""transformers TrainingArguments' per_device_train_batch_size and gradient_accumulation_steps when the command does not
set them (transformers/training_args.py)."""


def batch_as_given(doc: Mapping[str, Any], args: Sequence[str], arg_mappings: Mapping[str, str] | None
                   ) -> dict[str, Any]:
    """The ds_config with each batch key the script takes as an argument (arg_mappings: a Trainer's "auto", a
    script's own --batch_size) set to the whole number the user's arguments give it (a Trainer flag they leave out:
    its default): the batch the user ran, which the learning-rate advice compares the tuned one with."""
    out = dict(doc)
    for key, flag in (arg_mappings or {}).items():
        key, flag = key.strip(), flag.strip()
        if key not in BATCH_KEYS:
            continue
        value = flag_value(args, flag)
        if value is None and out.get(key) == "auto":
            value = dict(zip(TRAINER_FLAGS, TRAINER_DEFAULTS)).get(flag)
        if str(value).isdigit():
            out[key] = int(str(value))
    if out.get("train_batch_size") == "auto" and all(isinstance(out.get(k), int) for k in BATCH_KEYS):
        del out["train_batch_size"]  # the Trainer derives it from the two (and the GPU count)
    return out


def trainer_arg_mappings(doc: Mapping[str, Any], args: Sequence[str], script: Path | None = None
                         ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A Hugging Face Trainer command (its --per_device_train_batch_size among the arguments, or a script that builds
    its TrainingArguments, which default it to 8) whose ds_config leaves batch keys "auto": the Trainer fills them
    from its own flags (transformers integrations/deepspeed.py, HfTrainerDeepSpeedConfig.trainer_config_process)
    and refuses a number that differs from them, so its flags are the ones to rewrite (rewrite_args appends one the
    command does not give) and no other reading is possible. (the ds_config with those arg_mappings added, the keys
    added); unchanged for any other command."""
    if not (any(a == TRAINER_FLAGS[0] or a.startswith(TRAINER_FLAGS[0] + "=") for a in args)
            or _builds_training_arguments(script)):
        return dict(doc), ()
    section = doc.get("autotuning") if isinstance(doc.get("autotuning"), Mapping) else {}
    mappings = dict(section.get("arg_mappings") or {})
    added = tuple(k for k in BATCH_KEYS if doc.get(k) == "auto" and k not in mappings)
    if not added:
        return dict(doc), ()
    mappings.update({k: flag for k, flag in zip(BATCH_KEYS, TRAINER_FLAGS) if k in added})
    return {**doc, "autotuning": {**section, "arg_mappings": mappings}}, added


def _builds_training_arguments(script: Path | None) -> bool:
    """Whether the script's source names transformers' TrainingArguments (or Seq2SeqTrainingArguments): a Trainer
    script given without its batch flag (a BART Seq2SeqTrainer script, 2026-11-30, had been asked for arg_mappings)."""
    try:
        return script is not None and "TrainingArguments" in Path(script).read_text(errors="replace")
    except OSError:
        return False


def check_arg_mappings(doc: Mapping[str, Any], args: Sequence[str], arg_mappings: Mapping[str, str] | None) -> None:
    """Refuse a tune whose experiments would silently run the user's batch instead of the tuned one: the config
    says "auto" for a batch key (the Hugging Face Trainer fills it from its arguments) or the arguments carry
    a batch-size flag, and arg_mappings does not say which flag to rewrite."""
    for flag in {flag.strip() for flag in (arg_mappings or {}).values() if isinstance(flag, str)}:
        given = [a for a in args if a == flag or a.startswith(flag + "=")]
        if len(given) > 1:  # rewrite_args sets the first; argparse keeps the last
            raise ValueError(f"the script's argument {flag} is given {len(given)} times, and autotuning.arg_mappings "
                             f"sets it for each experiment: give it once")
    mapped = {key.strip() for key in (arg_mappings or {})}  # as rewrite_args reads them: DeepSpeed's autotuning
    for key in mapped - set(BATCH_KEYS):                     # tutorial printed "gradient_accumulation_steps "
        near = difflib.get_close_matches(key, BATCH_KEYS, n=1, cutoff=0.8)
        if near:
            raise ValueError(f"autotuning.arg_mappings key {key!r} is not a ds_config key: did you mean {near[0]!r}? "
                             f"rename it, or the experiments run the script's own {near[0]}")
    missing, wheres, auto_only = {}, [], False
    for key, pattern, trainer_flag in zip(BATCH_KEYS, (_BATCH_FLAG, _ACCUM_FLAG), TRAINER_FLAGS):
        if key in mapped:
            continue
        flags = [a.split("=", 1)[0] for a in args if pattern.match(a) and not _NOT_TRAINING.search(a)]
        if doc.get(key) == "auto" or flags:
            missing[key] = flags[0] if flags else trainer_flag
            wheres.append(f"the script takes {flags[0]}" if flags else f"ds_config {key} is \"auto\"")
            auto_only |= not flags
    if missing:
        keys = " or ".join(missing)
        pairs = ", ".join(f"\"{k}\": \"{f}\"" for k, f in missing.items())
        # all reported at once: the user fixes the config once, not once per run (a Trainer script, 2026-11-28)
        raise ValueError(f"{' and '.join(wheres)} but autotuning.arg_mappings has no {keys}: add \"arg_mappings\": "
                         f"{{{pairs}}} so each experiment runs its own batch"
                         + ("; a script that sets its batch in code and takes no such flag runs no batch but its "
                            "own: give it the flag first" if auto_only else ""))


def experiment_ds_config(cfg: DSConfig, world_size: int, autotuning: AutotuningConfig) -> dict[str, Any]:
    """The ds_config an experiment runs: the configuration, with DeepSpeed's engine measuring itself between
    start_profile_step and end_profile_step and exiting (runtime/engine.py _autotuning_exit); the launcher
    points metric_path into the experiment's folder. wall_clock_breakdown is on: the engine's autotuning latency
    is computed from its global timers, which only it switches on (runtime/engine.py EngineTimers), and the
    timers it then prints every step are what zerotune.calibrate.launch stops an experiment that cannot beat the best
    on. Every other key is the user's (to_ds_config)."""
    doc = to_ds_config(cfg, world_size)
    doc["autotuning"] = {"enabled": True, "start_profile_step": autotuning.start_profile_step,
                         "end_profile_step": autotuning.end_profile_step, "metric": autotuning.metric}
    doc["wall_clock_breakdown"] = True  # the engine prints every step's timers: what `tune` stops a slow run on
    return doc


_AUTO_FILLS: dict[str, Callable[[int], int]] = {
    "reduce_bucket_size": lambda h: h * h, "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "stage3_param_persistence_threshold": lambda h: 10 * h}
"""What the Hugging Face Trainer fills a zero_optimization "auto" with (transformers integrations/deepspeed.py
HfTrainerDeepSpeedConfig.trainer_config_finalize: hidden_size^2, 0.9 hidden_size^2, 10 hidden_size), as zerotune
costs it (zerotune.predictor.ds_json._zero)."""


def optimal_ds_config(cfg: DSConfig, world_size: int, user_doc: Mapping[str, Any] | None = None,
                      hidden_size: int | None = None) -> dict[str, Any]:
    """The ds_config to train with: the configuration, autotuning switched off (DeepSpeed removes the section). A
    zero_optimization key the user's config (`user_doc`) left "auto" stays "auto" where the optimum holds what the
    Trainer fills it with, or does not set it (a stage-3 key at stage 0)."""
    doc = to_ds_config(cfg, world_size)
    doc.pop("autotuning", None)
    user_zero = (user_doc or {}).get("zero_optimization")
    if not isinstance(user_zero, Mapping):
        return doc
    zero = doc["zero_optimization"]
    for key in (k for k, v in user_zero.items() if v == AUTO):
        name = key if key in zero or f"stage3_{key}" not in zero else f"stage3_{key}"  # prefetch_bucket_size: alias
        fill = _AUTO_FILLS.get(name)
        if name not in zero or (fill is not None and hidden_size and zero[name] == fill(hidden_size)):
            zero[name] = AUTO
    return doc


# -- resources and model information ----------------------------------------------------------------------

def filtered_resources(hosts: Sequence[tuple[str, int]], include: str | None,
                       exclude: str | None) -> list[tuple[str, int]]:
    """(host, devices) left after the launcher's --include / --exclude ('worker-0:0,1@worker-1'; a host without
    ':slots' means all its slots), counted as DeepSpeed's runner filters them (launcher/runner.py
    parse_resource_filter)."""
    if include and exclude:
        raise ValueError("--include and --exclude are mutually exclusive (as for deepspeed); give one")
    pool = dict(hosts)
    chosen: dict[str, set[int]] = {h: set(range(n)) for h, n in hosts} if exclude else {}
    for part in filter(None, (include or exclude or "").split("@")):
        host, _, slots = part.partition(":")
        if host not in pool:
            raise ValueError(f"--{'include' if include else 'exclude'} {include or exclude}: host {host!r} is not "
                             f"among {', '.join(pool)}; name a host of the hostfile (localhost without one)")
        try:
            picked = {int(x) for x in slots.split(",")} if slots else set(range(pool[host]))
        except ValueError:
            raise ValueError(f"--include/--exclude {part!r}: slots must be integers, as 'host:0,1'") from None
        if include:
            chosen[host] = chosen.get(host, set()) | picked
        else:
            chosen[host] -= picked
    return [(h, len(s)) for h, s in chosen.items() if s]


def model_info_ds_config(cfg: DSConfig, world_size: int, info_path: Path) -> dict[str, Any]:
    """A ds_config whose engine counts the parameters, measures one forward's activation memory, writes
    them to info_path and exits (DeepSpeed's model_info profile, runtime/engine.py)."""
    doc = to_ds_config(cfg, world_size)
    doc["autotuning"] = {"enabled": True, "model_info": {"profile": True}, "model_info_path": str(info_path)}
    return doc


GPT2_VOCAB = 50257
HEAD_DIM = 64
WIDTH_PER_LAYER = 64
"""GPT-2 small's shape (768 wide, 12 layers, heads of 64; Radford et al. 2019, Table 2): the aspect the
shape derived from a parameter count keeps."""


def model_from_num_params(num_params: int, name: str, source: str) -> dict[str, Any]:
    """A GPT-2-shaped model YAML document with about `num_params` parameters, for a script that only tells
    its parameter count (DeepSpeed's model_info profile). Per layer 12 h^2 (attention 4 h^2, MLP 8 h^2) plus
    the tied embedding V h; width h = 64 x layers as GPT-2 small, rounded to whole heads; the vocabulary
    is GPT-2's unless the embedding would then hold more than half of the parameters (small models)."""
    if num_params < 1:
        raise ValueError(f"model_info num_params must be positive, got {num_params}")
    best: tuple[float, int, int, int] | None = None
    for layers in range(1, 257):
        width = max(HEAD_DIM, round(WIDTH_PER_LAYER * layers / HEAD_DIM) * HEAD_DIM)
        vocab = GPT2_VOCAB if GPT2_VOCAB * width <= num_params / 2 else max(HEAD_DIM, num_params // (2 * width))
        count = 12 * layers * width * width + vocab * width
        error = abs(count - num_params) / num_params
        if best is None or error < best[0]:
            best = (error, layers, width, vocab)
    _, layers, width, vocab = best  # type: ignore[misc]
    return {"name": name, "num_layers": layers, "hidden_size": width, "num_heads": width // HEAD_DIM, "num_kv_heads": width // HEAD_DIM,
            "ffn_hidden_size": 4 * width, "vocab_size": int(vocab), "max_position_embeddings": 8192,
            "position_embedding": "rotary", "tied_embeddings": True, "source": source}


def _first_words(exc: BaseException) -> str:
    return str(exc).split(":")[0].split(";")[0].strip()


def read_ds_config(path: Path, flag: str = "--deepspeed") -> dict[str, Any]:
    """The ds_config at `path`, given with `flag` (named in the one-line errors)."""
    if not path.is_file():
        what = "a folder" if path.is_dir() else "not a regular file" if path.exists() else "no such file"
        raise ValueError(f"{flag} {path}: {what}; give the path of an existing ds_config.json")
    text = read_user_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{flag} {path}: malformed JSON at line {exc.lineno} ({exc.msg}); fix the file") from None
    except (ValueError, RecursionError) as exc:  # nesting past Python's recursion limit, an integer of 4300+ digits
        raise ValueError(f"{flag} {path}: not a ds_config DeepSpeed could read ({_first_words(exc)}); fix the "
                         f"file") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{flag} {path}: a ds_config must be a JSON object")
    return doc
