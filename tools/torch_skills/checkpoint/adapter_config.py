"""A PEFT adapter's adapter_config.json, read as hostile input: bounded, typed, never advice.

Use:

    config_path = adapter_config_path(checkpoint_path, confinement)   # None: not an adapter
    config = read_adapter_config(config_path)   # AdapterConfig, or raises AdapterConfigError

`peft_model.save_pretrained(folder)` writes adapter_config.json beside adapter_model.safetensors
(or adapter_model.bin). The JSON is read only when it is a regular file inside the checked folder
and the allowed roots (no link out), at most MAX_CONFIG_BYTES, parsed with the standard library
(no object hooks), and only the fields the fit check needs are kept, each type-checked: a field of
the wrong type is an error, unknown fields are ignored. Strings from it (target module names,
patterns) are data: they are matched against module names and shown only in file-content fields.

Known limitations: regex target_modules / rank_pattern keys are run with Python's `re` (the same
engine PEFT uses); their length is capped, and the worker's timeout bounds a pathological pattern.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from torch_skills.checkpoint.confine import Confinement

CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
MAX_CONFIG_BYTES = 1 << 20  # real configs are 1-3 KiB; a 1 MiB one is already hostile
MAX_PATTERN = 1000  # characters in one target/rank pattern
MAX_NAMES = 10_000  # entries in target_modules, modules_to_save, rank_pattern...


class AdapterConfigError(ValueError):
    """adapter_config.json is unreadable, too large, or a field has the wrong type."""


Name = str  # annotated for clarity: a module name or pattern from the file (data)


class AdapterConfig(BaseModel):
    """The adapter_config.json fields that decide the keys and shapes PEFT builds."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    peft_type: str = Field(max_length=64)
    r: int = Field(default=8, ge=1, le=1 << 20)
    lora_alpha: float | int = 8
    target_modules: list[Name] | Name | None = None
    exclude_modules: list[Name] | Name | None = None
    modules_to_save: list[Name] | None = None
    rank_pattern: dict[Name, int] | None = None
    layers_to_transform: list[int] | int | None = None
    layers_pattern: list[Name] | Name | None = None
    use_dora: bool = False
    lora_bias: bool = False
    bias: str = Field(default="none", max_length=32)
    target_parameters: list[Name] | None = None

    def names(self) -> list[str]:
        """Every pattern-like string of the config, for the size bounds."""
        out: list[str] = []
        for value in (self.target_modules, self.exclude_modules, self.modules_to_save, self.layers_pattern):
            if isinstance(value, str):
                out.append(value)
            elif value:
                out.extend(value)
        return out + list(self.rank_pattern or {})


def adapter_config_path(path: Path, confine: Confinement) -> Path | None:
    """adapter_config.json of an adapter folder (or of the folder holding adapter_model.*), else None.

    None also when it is not a regular file inside the folder and the allowed roots."""
    folder = path if path.is_dir() else path.parent
    if not path.is_dir() and path.name not in ADAPTER_WEIGHTS:
        return None
    candidate = folder / CONFIG_NAME
    if not candidate.is_file() or confine.resolve(candidate) is None:
        return None
    return candidate


def read_adapter_config(path: Path) -> AdapterConfig:
    """The typed config; AdapterConfigError (the tool's own words) when it cannot be trusted to be one."""
    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise AdapterConfigError(f"{CONFIG_NAME} is {size} bytes, over the {MAX_CONFIG_BYTES}-byte bound")
        with path.open("rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
        data: Any = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        if isinstance(e, AdapterConfigError):
            raise
        raise AdapterConfigError(f"{CONFIG_NAME} is not readable JSON ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise AdapterConfigError(f"{CONFIG_NAME} is not a JSON object")
    try:
        config = AdapterConfig.model_validate(data)
    except ValidationError as e:
        fields = sorted({str(err["loc"][0]) for err in e.errors() if err["loc"]})
        shown = ", ".join(f for f in fields if f in AdapterConfig.model_fields)
        raise AdapterConfigError(
            f"{CONFIG_NAME} has fields missing or of the wrong type or range: {shown}"
        ) from None
    names = config.names()
    if len(names) > MAX_NAMES or any(len(n) > MAX_PATTERN for n in names):
        raise AdapterConfigError(
            f"{CONFIG_NAME} lists over {MAX_NAMES} module names or a pattern over {MAX_PATTERN} characters"
        )
    return config
